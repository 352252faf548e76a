"""The data the HTTP API serves, shaped from a run's reader into JSON-ready values.

Between :class:`~nanscope.reader.DumpReader` (which reads) and ``server/api.py`` (which
parses a request's parameters and routes it), as TensorBoard's debugger_v2 plugin sits over
its data provider. Functions take the :class:`~nanscope.server.runs.Run` (for its caches)
and its open reader, with parameters already checked, and return dicts the API sends as
they are; what the run does not hold raises :class:`NotFound`.

- ``rows``: the event lists, their filters (``Filter``, ``select``) and list rows;
- ``timeline``: each event's status, and buckets of them;
- ``summary``: the run list, alerts, analysis, ranks and headroom;
- ``events``: one event in detail, a graph op, a tensor's values;
- ``sources``: the recorded source files;
- ``sentinel``: a sentinel's per-step history (buckets, each trip's lead-up, its replay's run);
- ``diff``: two runs compared (``nanscope.analysis.diff``), side by side at the parted op.
"""

from nanscope.server.provider.events import NotFound

__all__ = ["NotFound"]
