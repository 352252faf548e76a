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
- ``sources``: the recorded source files.
"""

from nanscope.server.provider.events import NotFound

__all__ = ["NotFound"]
