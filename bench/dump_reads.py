"""The read tasks bench/reader.py and bench/scale.py time, each in a fresh child.

A child imports one reader (nanscope, or TensorFlow's ``DebugDataReader``), opens
the dump and runs one task on it; it reports its import time separately, the
open and query times, and its peak memory. ``cold`` is open + query. TensorFlow
has no index of non-finite events: its first alert is found by reading the
traces one by one until one has Inf/NaN counts.
"""

from __future__ import annotations

import time
from typing import Any

from harness import nanscope_location, peak_rss_mib, with_peak_memory

PAGE = 200


def page_offset(n: int) -> int:
    """Where the page task reads: at 90% of ``n`` traces, a whole page if there is room."""
    return max(0, min(int(0.9 * n), n - PAGE))


def _open(impl: str, dump: str, out: dict[str, Any]) -> tuple[Any, int]:
    """Open ``dump`` and build the index; returns the reader and its number of traces."""
    if impl == "nanscope":
        import nanscope

        r: Any = nanscope.open_dump(dump)
        # The index came from the sidecar when no record had to be decoded.
        out["sidecar_used"] = r.decoded_for_index() == 0
    else:
        from tensorflow.python.debug.lib.debug_events_reader import DebugDataReader

        r = DebugDataReader(dump)
        r.update()
    n: int = r.num_graph_execution_traces()
    out["num_traces"] = n
    out["num_executions"] = r.num_executions()
    return r, n


def _tf_first_nonfinite(r: Any) -> tuple[int, Any] | None:
    """TensorFlow's first trace with Inf/NaN counts, and its index, read one by one."""
    for i, digest in enumerate(r.graph_execution_traces(digest=True)):
        tr = r.read_graph_execution_trace(digest)
        v = tr.debug_tensor_value
        if v is not None and v[5] + v[6] + v[7] > 0:
            return i, tr
    return None


def _read_page(impl: str, r: Any, offset: int, out: dict[str, Any]) -> None:
    """Decode ``PAGE`` traces from ``offset``: their number, first op and a checksum."""
    if impl == "nanscope":
        page = r.traces(offset, offset + PAGE)
        values = [p.debug_tensor_value.tolist() for p in page]
    else:
        page = r.graph_execution_traces(begin=offset, end=offset + PAGE)
        values = [list(p.debug_tensor_value) for p in page]
    out["count"] = len(page)
    out["first_op"] = page[0].op_name if page else None
    out["checksum"] = float(sum(sum(v) for v in values))


def child_read(cfg: dict[str, Any]) -> dict[str, Any]:
    """bench/reader.py's tasks on a one-rank dump: ``import``, ``open``, ``first``, ``page``.

    ``first`` is the first non-finite graph execution trace; ``page`` reads at
    :func:`page_offset` of ``cfg["traces"]``.
    """
    impl, task, dump = cfg["impl"], cfg["task"], cfg["dump"]
    offset = page_offset(cfg["traces"])
    perf = time.perf_counter
    t0 = perf()
    if impl == "nanscope":
        import nanscope  # noqa: F401
    else:
        from tensorflow.python.debug.lib.debug_events_reader import DebugDataReader  # noqa: F401
    out: dict[str, Any] = {
        "impl": impl,
        "task": task,
        "import_s": perf() - t0,
        "rss_after_import_mib": peak_rss_mib(),
    }
    if task == "import":
        return with_peak_memory(out)

    t = perf()
    r, _ = _open(impl, dump, out)
    out["open_s"] = perf() - t

    t = perf()
    if task == "first":
        if impl == "nanscope":
            ref = r.first_nonfinite("graph_execution_trace")
            found = (ref.index, r.trace(ref.index)) if ref is not None else None
        else:
            found = _tf_first_nonfinite(r)
        out["index"] = found[0] if found else None
        out["op_name"] = found[1].op_name if found else None
        out["value"] = [float(x) for x in found[1].debug_tensor_value] if found else None
    elif task == "page":
        _read_page(impl, r, offset, out)
    out["query_s"] = perf() - t
    out["cold_s"] = out["open_s"] + out["query_s"]
    return with_peak_memory(out)


def child_read_ranks(cfg: dict[str, Any]) -> dict[str, Any]:
    """bench/scale.py's tasks on a multi-rank dump: ``open``, ``first``, ``page``, ``analyze``.

    ``first`` is the first non-finite event of any kind (TensorFlow: of the
    traces); ``analyze`` is nanscope's root-cause analysis (nanscope only).
    """
    impl, task, dump = cfg["impl"], cfg["task"], cfg["dump"]
    perf = time.perf_counter
    t0 = perf()
    if impl == "nanscope":
        from nanscope.analysis import analyze
        from nanscope.reader import TRACES
    else:
        from tensorflow.python.debug.lib.debug_events_reader import DebugDataReader  # noqa: F401
    out: dict[str, Any] = {"impl": impl, "task": task, "import_s": perf() - t0}
    if impl == "nanscope":
        out["nanscope"] = nanscope_location()
    out["rss_after_import_mib"] = peak_rss_mib()

    t = perf()
    r, n = _open(impl, dump, out)
    if impl == "nanscope":
        out["processes"] = len(r.processes)
        out["source_files"] = [len(r.source_files(p)) for p in range(len(r.processes))]
    out["open_s"] = perf() - t
    out["rss_after_open_mib"] = peak_rss_mib()

    t = perf()
    if task == "first":
        if impl == "nanscope":
            ref = r.first_nonfinite()
            if ref is not None:
                ev = r.trace(ref.index) if ref.kind == TRACES else r.execution(ref.index)
                out["kind"] = ref.kind
                out["rank"] = r.processes[ref.process].rank
                out["step"] = ev.step
                out["op_name"] = ev.op_name if ref.kind == TRACES else ev.op_type
                values = ev.debug_tensor_value if ref.kind == TRACES else ev.debug_tensor_values[0]
                out["value"] = values.tolist()
        elif (found := _tf_first_nonfinite(r)) is not None:
            i, tr = found
            out["kind"], out["index"] = "graph_execution_trace", i
            out["op_name"], out["value"] = tr.op_name, [float(x) for x in tr.debug_tensor_value]
    elif task == "page":
        out["offset"] = page_offset(n)
        _read_page(impl, r, out["offset"], out)
    elif task == "analyze":
        from nanscope.report import headline

        a = analyze(r)
        o = a.origin
        out["alerts"] = a.alerts.total
        out["headline"] = headline(a)
        out["origin_kind"] = a.origin_kind
        out["chain"] = len(a.chain)
        if o is not None:
            out["op_name"], out["rank"], out["step"] = o.op_name, o.rank, o.step
            out["explanation"] = o.explanation
            out["source"] = f"{o.source.file}:{o.source.line}" if o.source else None
            out["code"] = o.source.code if o.source else None
            out["stack_depth"] = len(o.stack)
    out["query_s"] = perf() - t
    out["cold_s"] = out["open_s"] + out["query_s"]
    return with_peak_memory(out)


CHILDREN = {"read": child_read, "read-ranks": child_read_ranks}
