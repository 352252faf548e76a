"""Finding the trace of a graph op nearest an event, held against a scan of every trace."""

from __future__ import annotations

import random
from pathlib import Path

from nanscope.analysis._dataflow import nearest_trace
from nanscope.events import DumpWriter, Graph, GraphOp, TraceEvent
from nanscope.reader import TRACES, DumpReader

from ..helpers import full_health

OPS = ("a", "b", "c")


def scan(
    reader: DumpReader, graph: str, op: str, slot: int | None, near: int, later: bool
) -> int | None:
    """The oracle: every trace looked at, in order."""
    rows = reader.index(TRACES)
    hits = [
        i
        for i in range(len(rows))
        if reader.string(int(rows["graph"][i])) == graph
        and reader.string(int(rows["name"][i])) == op
        and (slot is None or int(rows["slot"][i]) == slot)
        and (i > near if later else i <= near)
    ]
    if not hits:
        return None
    return hits[0] if later else hits[-1]


def test_nearest_trace_matches_a_scan_of_every_trace(tmp_path: Path) -> None:
    rng = random.Random(0)
    w = DumpWriter(tmp_path, "FULL_HEALTH", circular_buffer_size=-1)
    for g in ("g1", "g2"):
        w.write_graph(Graph(g, g))
        for op in OPS:
            w.write_graph_op(GraphOp(g, "Op", op, g, output_tensor_ids=[1, 2]))
    for _ in range(600):
        # Some ops are rare (c) and one slot of them rarer, so that searches run far.
        op = rng.choices(OPS, weights=(10, 5, 1))[0]
        out = 1 if op == "c" and rng.random() < 0.2 else 0
        w.write_trace(TraceEvent(rng.choice(("g1", "g2")), op, out, full_health()))
    w.close()
    reader = DumpReader(tmp_path)
    n = reader.num_graph_execution_traces()
    assert n == 600
    checked = 0
    for _ in range(400):
        graph, op = rng.choice(("g1", "g2", "g3")), rng.choice((*OPS, "d"))
        slot: int | None = rng.choice((None, 0, 1))
        near, later = rng.randrange(-1, n + 1), rng.random() < 0.5
        want = scan(reader, graph, op, slot, near, later)
        assert nearest_trace(reader, 0, graph, op, slot, near, later) == want, (
            graph,
            op,
            slot,
            near,
            later,
        )
        checked += want is not None
    assert checked > 100  # many questions have an answer (g3 and d never do)
    assert nearest_trace(reader, 1, "g1", "a", None, 300, False) is None  # no such process
