"""Structure-aware fuzzing (atheris) of what a dump's records claim: shapes, dtypes, sizes.

``fuzz_reader.py`` damages bytes, which CRCs mostly catch. This target keeps every record
well framed (valid CRCs, valid protobuf) and changes only the numbers the reader could be
tempted to believe: a ``TensorProto``'s dims, dtype, content length and typed values, the
slots of a summary vector (NaN, infinities, 2**60, a rank of 10**18), an execution's mode and
``num_outputs``, a wall time, the slot in a graph op's input name. The dump is then read as
``fuzz_reader.py`` reads it, plus every event's detail, its values (``/api/tensor``) and the
text and JSON reports. A crash, a 5xx answer, JSON that is not strict, or memory over the
RSS limit is a finding.

    python fuzz/fuzz_claims.py -max_total_time=3600 -rss_limit_mb=1024
    python fuzz/fuzz_claims.py -runs=400            # what tests/integration/test_fuzz.py runs
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import atheris
import numpy as np

with atheris.instrument_imports(include=["nanscope"]):
    from nanscope.analysis import analyze
    from nanscope.events import DumpWriter, ExecutionEvent, Graph, GraphOp, TraceEvent
    from nanscope.format import files
    from nanscope.format.proto import debug_event_pb2 as pb
    from nanscope.format.proto.tensor_pb2 import TensorProto
    from nanscope.format.records import frame
    from nanscope.reader import EXECUTIONS, TRACES, UNREADABLE, DumpReader
    from nanscope.report import console_for, render_text, report_json
    from nanscope.server.api import ROUTES
    from nanscope.server.query import ApiError, Query
    from nanscope.server.runs import RunSet

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import iter_payloads, write_small_dump

WORK = Path(tempfile.mkdtemp(prefix="nanscope-fuzz-claims-"))
DUMP = WORK / "dump"

# Numbers that have broken readers: zero, one, the edges of int32 and int64, the size of a
# tensor nobody has, and for summary slots the floats that are not counts.
INTS = (0, 1, 2, 3, 7, 11, 255, 12000, 2**31 - 1, 2**31, 2**32, 2**40, 2**53, 2**62, 2**63 - 1)
FLOATS = (0.0, 1.0, -1.0, 6.0, 2.5, 254.0, 255.0, 1e18, 2.0**53, 2.0**60, 1e300,
          math.nan, math.inf, -math.inf)  # fmt: skip


def _templates() -> dict[str, dict[str, bytes]]:
    """Small valid dumps written by nanscope's writer, in a health mode and in FULL_TENSOR."""
    out: dict[str, dict[str, bytes]] = {}
    health = WORK / "health"
    write_small_dump(health, n=4, bad=(2,))
    full = WORK / "full"
    w = DumpWriter(full, "FULL_TENSOR", circular_buffer_size=-1)
    stack = w.capture_stack()
    w.write_graph(Graph("g", "loss"))
    w.write_graph_op(GraphOp("g", "Log", "Log", "loss", input_names=["x:0"], stack=stack))
    values: list[np.ndarray] = [
        np.array([[1.0, -np.inf, 0.0], [2.0, np.nan, 3.0]], dtype=np.float32),
        np.arange(6, dtype=np.float16),
        np.array([1, 2, 3], dtype=np.int32),
        np.array([True, False]),
    ]
    for i, v in enumerate(values):
        w.write_execution(ExecutionEvent("Log", [i + 1], [i + 10], summaries=[v], stack=stack))
        w.write_trace(TraceEvent("g", "Log", 0, v, step=i))
    w.close()
    for name, root in (("health", health), ("full", full)):
        out[name] = {p.name: p.read_bytes() for p in root.iterdir()}
    return out


TEMPLATES = _templates()


def _int(fdp: atheris.FuzzedDataProvider) -> int:
    if fdp.ConsumeBool():
        return INTS[fdp.ConsumeIntInRange(0, len(INTS) - 1)]
    return int(fdp.ConsumeIntInRange(0, 2**20))


def _float(fdp: atheris.FuzzedDataProvider) -> float:
    if fdp.ConsumeBool():
        return FLOATS[fdp.ConsumeIntInRange(0, len(FLOATS) - 1)]
    return float(fdp.ConsumeRegularFloat())


def mutate_tensor(fdp: atheris.FuzzedDataProvider, p: TensorProto) -> None:
    """Change one claim of ``p``: its shape, dtype, content length, typed values or a slot."""
    how = fdp.ConsumeIntInRange(0, 6)
    if how == 0:  # the shape: a few dims of interesting sizes, or very many
        del p.tensor_shape.dim[:]
        n = 300 if fdp.ConsumeIntInRange(0, 15) == 0 else fdp.ConsumeIntInRange(0, 6)
        for _ in range(n):
            p.tensor_shape.dim.add(size=_int(fdp) if n < 10 else 1)
    elif how == 1:  # the dtype, known or not
        p.dtype = fdp.ConsumeIntInRange(0, 40)
    elif how == 2:  # the content: cut short or lengthened
        content = p.tensor_content
        cut = fdp.ConsumeIntInRange(0, len(content) + 16)
        p.tensor_content = content[:cut] + b"\x00" * max(0, cut - len(content))
    elif how == 3:  # typed values instead of content: few values for the shape
        p.tensor_content = b""
        k = fdp.ConsumeIntInRange(0, 3)
        field = fdp.ConsumeIntInRange(0, 4)
        if field == 0:
            p.float_val.extend([_float(fdp)] * k)
        elif field == 1:
            p.double_val.extend([_float(fdp)] * k)
        elif field == 2:
            p.half_val.extend([fdp.ConsumeIntInRange(0, 65535)] * k)
        elif field == 3:
            p.int_val.extend([fdp.ConsumeIntInRange(-(2**31), 2**31 - 1)] * k)
        else:
            p.string_val.extend([b"x"] * k)
    elif how == 4:  # one slot of a float64 vector (a summary's count, rank, dim or dtype)
        vector = bytearray(p.tensor_content)
        if len(vector) >= 8:
            slot = fdp.ConsumeIntInRange(0, len(vector) // 8 - 1)
            vector[8 * slot : 8 * slot + 8] = np.float64(_float(fdp)).tobytes()
            p.tensor_content = bytes(vector)
    elif how == 5:  # the shape alone says 12000x12000
        del p.tensor_shape.dim[:]
        p.tensor_shape.dim.add(size=12000)
        p.tensor_shape.dim.add(size=12000)
    else:
        p.Clear()


def mutate_event(fdp: atheris.FuzzedDataProvider, event: pb.DebugEvent) -> None:
    what = event.WhichOneof("what")
    how = fdp.ConsumeIntInRange(0, 4)
    if how == 0:
        event.wall_time = _float(fdp)
    elif what == "execution":
        ex = event.execution
        if how == 1:
            ex.tensor_debug_mode = fdp.ConsumeIntInRange(0, 9)
        elif how == 2:
            ex.num_outputs = min(_int(fdp), 2**31 - 1)
            if fdp.ConsumeBool():
                del ex.output_tensor_ids[:]
        else:
            protos = ex.tensor_protos if how == 3 else ex.input_tensor_protos
            if not protos:
                protos.add().CopyFrom(ex.tensor_protos[0] if ex.tensor_protos else TensorProto())
            mutate_tensor(fdp, protos[fdp.ConsumeIntInRange(0, len(protos) - 1)])
    elif what == "graph_execution_trace":
        tr = event.graph_execution_trace
        if how == 1:
            tr.tensor_debug_mode = fdp.ConsumeIntInRange(0, 9)
        else:
            mutate_tensor(fdp, tr.tensor_proto)
    elif what == "graph_op_creation":
        slot = "9" * fdp.ConsumeIntInRange(1, 5000) if fdp.ConsumeBool() else "²"
        event.graph_op_creation.input_names.append(f"x:{slot}")


def crafted(data: bytes) -> None:
    """A copy of a template whose records say what the input makes them say, all well framed."""
    fdp = atheris.FuzzedDataProvider(data)
    template = TEMPLATES["full" if fdp.ConsumeBool() else "health"]
    if DUMP.exists():
        shutil.rmtree(DUMP)
    DUMP.mkdir()
    targets = sorted(
        n for n in template if n.endswith((".execution", ".graph_execution_traces", ".graphs"))
    )
    events = {
        n: [pb.DebugEvent.FromString(p) for p in iter_payloads(template[n], n)] for n in targets
    }
    for _ in range(fdp.ConsumeIntInRange(1, 4)):
        name = targets[fdp.ConsumeIntInRange(0, len(targets) - 1)]
        if events[name]:
            mutate_event(fdp, events[name][fdp.ConsumeIntInRange(0, len(events[name]) - 1)])
    keep_sidecars = fdp.ConsumeBool()  # a sidecar that disagrees must be noticed, not trusted
    for name, blob in template.items():
        if name.endswith(files.INDEX_SUFFIX) and not keep_sidecars:
            continue
        if name in events:
            blob = b"".join(frame(e.SerializeToString()) for e in events[name])
        (DUMP / name).write_bytes(blob)


def strict(value: object) -> None:
    """What the server and ``report --json`` send must be strict JSON."""
    json.dumps(value, allow_nan=False)


def call(runs: RunSet, route: str, params: dict[str, str], args: dict[str, int]) -> None:
    try:
        strict(ROUTES[route](runs, Query(params), args))
    except ApiError as exc:  # a clear refusal, never a server error
        assert 400 <= exc.status < 500, (route, exc.status, exc.message)


def read_everything() -> None:
    with DumpReader(DUMP) as reader:
        counts = {kind: reader.num(kind) for kind in (EXECUTIONS, TRACES)}
        for kind, get in ((EXECUTIONS, reader.execution), (TRACES, reader.trace)):
            for i in range(counts[kind]):
                with contextlib.suppress(*UNREADABLE):
                    event = get(i)
                    strict(event.to_json())
                    strict(event.outputs_json())
        analysis = analyze(reader)
        strict(report_json(analysis))
        render_text(analysis, console_for(io.StringIO()))
    runs = RunSet(DUMP.parent, refresh_interval=0.0)
    run = {"run": "dump"}
    for route in ("/api/runs", "/api/alerts", "/api/analysis", "/api/executions", "/api/traces",
                  "/api/timeline", "/api/source_files"):  # fmt: skip
        call(runs, route, run, {})
    for kind, detail in ((EXECUTIONS, "/api/executions/<int:index>"),
                         (TRACES, "/api/traces/<int:index>")):  # fmt: skip
        for i in range(min(counts[kind], 8)):
            call(runs, detail, run, {"index": i})
            for slot in (0, 1):
                params = {**run, "kind": kind, "index": str(i), "slot": str(slot)}
                call(runs, "/api/tensor", params, {})
    runs.close()


def test_one_input(data: bytes) -> None:
    crafted(data)
    read_everything()


def main() -> None:
    atheris.Setup([*sys.argv, "-timeout=20"], test_one_input)
    try:
        atheris.Fuzz()
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
