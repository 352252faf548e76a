"""torch.compile under nanscope: graphs, traces computed inside compiled code, reports."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
import torch

import nanscope
from nanscope.analysis import analyze
from nanscope.backends.torch.session import TorchDumpSession
from nanscope.backends.torch.summaries import DTYPE_ENUM
from nanscope.reader import EXECUTIONS, TRACES, DumpReader, GraphExecutionTrace

from ..helpers import marked_line, summaries_of

pytestmark = pytest.mark.torch

THIS_FILE = os.path.abspath(__file__)


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: Any) -> Any:
        h = torch.relu(self.fc1(x))  # mlp: hidden
        return torch.log(torch.softmax(self.fc2(h), dim=1))  # mlp: log


class LogOfZero(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: Any) -> Any:
        return torch.log(torch.relu(self.fc(x)))  # forward nan: log


class SqrtOfZero(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: Any) -> Any:
        return torch.sqrt(torch.relu(self.fc(x))).sum()  # backward nan: sqrt


class WithBreak(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 4)

    def forward(self, x: Any) -> Any:
        h = torch.tanh(self.a(x))
        torch._dynamo.graph_break()
        return self.b(h)


def data(batch: int = 6) -> Any:
    g = torch.Generator().manual_seed(1)
    return torch.randn(batch, 8, generator=g)


def fresh(cls: type, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    return cls()


def run(
    logdir: Path,
    model: Any,
    steps: int = 2,
    mode: str = "FULL_HEALTH",
    compiled: bool = True,
    batches: list[int] | None = None,
    loss: Callable[[Any], Any] | None = None,
    **options: Any,
) -> DumpReader:
    """``steps`` training steps of ``model`` (compiled or not) under nanscope; the dump."""
    fn = torch.compile(model) if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    options.setdefault("circular_buffer_size", -1)
    with nanscope.enable_dump_debug_info(logdir, mode, **options):
        for i in range(steps):
            x = data(batches[i] if batches else 6)
            out = fn(x)
            (loss(out) if loss else out.sum()).backward()
            opt.step()
            opt.zero_grad()
    return nanscope.open_dump(logdir)


def traces_of(dump: DumpReader, op_name: str, graph_kind: str = "forward") -> list[Any]:
    out = []
    for i in range(dump.num_graph_execution_traces()):
        tr = dump.trace(i)
        graph = dump.graph(tr.graph_id)
        if tr.op_name == op_name and graph is not None and graph.name.endswith(graph_kind):
            out.append(tr)
    return out


def summary(tr: GraphExecutionTrace) -> np.ndarray | None:
    return tr.debug_tensor_value if tr.debug_tensor_value is not None else tr.tensor_value


def recorded_summary(tr: GraphExecutionTrace) -> np.ndarray:
    """:func:`summary` where the mode records one; the test fails where there is none."""
    value = summary(tr)
    assert value is not None, tr.op_name
    return value


@pytest.fixture(scope="module")
def mlp_dump(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with run(tmp_path_factory.mktemp("mlp"), fresh(MLP)) as dump:
        yield dump


@pytest.fixture(scope="module")
def mlp_eager_dump(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with run(tmp_path_factory.mktemp("mlp_eager"), fresh(MLP), compiled=False) as dump:
        yield dump


# -- graphs and ops ---------------------------------------------------------------------------


def test_forward_and_backward_graphs_are_recorded(mlp_dump: DumpReader) -> None:
    calls = [
        mlp_dump.execution(i)
        for i in range(mlp_dump.num_executions())
        if mlp_dump.execution(i).graph_id
    ]
    # One execution per graph call: forward and backward, two steps.
    assert [c.op_type.rsplit(" ", 1)[-1] for c in calls] == ["forward", "backward"] * 2
    assert [c.phase for c in calls] == [1, 2, 1, 2]
    assert len({c.graph_id for c in calls}) == 2
    for c in calls:
        graph = mlp_dump.graph(c.graph_id)
        assert graph is not None and graph.name == c.op_type
    # The extern kernels that the compiled graphs call are not recorded again as eager ops.
    eager = {mlp_dump.execution(i).op_type for i in range(mlp_dump.num_executions())}
    assert not eager & {"aten.mm.out", "aten.addmm.out", "aten.mm.default", "aten.addmm.default"}


def test_graph_ops_link_inputs_module_paths_and_lines(mlp_dump: DumpReader) -> None:
    hidden = marked_line(THIS_FILE, "# mlp: hidden")
    log_line = marked_line(THIS_FILE, "# mlp: log")
    (fw,) = {t.graph_id for t in traces_of(mlp_dump, "log")}
    graph = mlp_dump.graph(fw)
    assert graph is not None
    names = set(graph.ops)
    for op in graph.ops.values():
        for producer, _slot in op.inputs:
            assert producer in names, (op.op_name, producer)
    addmm = mlp_dump.graph_op(fw, "addmm")
    assert addmm is not None and addmm.op_type == "aten.addmm.default"
    assert addmm.module_path == "fc1 (Linear)"
    assert [(f.file_path, f.lineno) for f in mlp_dump.stack(addmm)][-1] == (THIS_FILE, hidden)
    log = mlp_dump.graph_op(fw, "log")
    assert log is not None and log.inputs == [("div", 0)]
    assert mlp_dump.stack(log)[-1].lineno == log_line
    # Backward ops point at the forward line that made them.
    (bw,) = {t.graph_id for t in traces_of(mlp_dump, "mm", "backward")}
    bgraph = mlp_dump.graph(bw)
    assert bgraph is not None
    lines = {
        mlp_dump.stack_frames(op.forward_stack_frame_ids)[-1].lineno
        for op in bgraph.ops.values()
        if op.forward_stack_frame_ids
    }
    assert {hidden, log_line} <= lines


def test_traces_match_eager_counts(mlp_dump: DumpReader, mlp_eager_dump: DumpReader) -> None:
    eager: dict[str, list[np.ndarray | None]] = {}
    for i in range(mlp_eager_dump.num_executions()):
        ex = mlp_eager_dump.execution(i)
        if ex.op_type in ("aten.log.default", "aten.relu.default") and ex.phase == 1:
            eager.setdefault(ex.op_type, []).append(summaries_of(ex)[0])
    for op_name, op_type in (("log", "aten.log.default"), ("relu", "aten.relu.default")):
        compiled = [summary(t) for t in traces_of(mlp_dump, op_name)]
        assert len(compiled) == len(eager[op_type]) == 2
        for c, e in zip(compiled, eager[op_type], strict=True):
            np.testing.assert_array_equal(c, e)


# -- NaN origins --------------------------------------------------------------------------------


def test_nan_born_in_forward_graph_is_reported_with_its_line(tmp_path: Path) -> None:
    with run(tmp_path, fresh(LogOfZero), steps=1) as dump:
        result = analyze(dump)
        origin = result.origin
        assert origin is not None and origin.kind == TRACES
        assert origin.op_type == "aten.log.default" and origin.op_name == "log"
        assert origin.source is not None
        assert origin.source.line == marked_line(THIS_FILE, "# forward nan: log")
        assert origin.counts is not None and origin.counts.neg_inf is not None
        assert origin.counts.neg_inf > 0
        assert "zero" in origin.explanation
        # The same counts as eager execution of the same model on the same data.
        m = fresh(LogOfZero)
        y = m(data())
        assert origin.counts.neg_inf == int(torch.isneginf(y).sum())


def test_nan_born_in_backward_graph_points_at_the_forward_line(tmp_path: Path) -> None:
    with run(tmp_path, fresh(SqrtOfZero), steps=1, loss=lambda out: out) as dump:
        origin = analyze(dump).origin
        assert origin is not None and origin.kind == TRACES
        assert origin.graph_name.endswith("backward")
        assert origin.forward_source is not None
        assert origin.forward_source.line == marked_line(THIS_FILE, "# backward nan: sqrt")
        # Eager autograd makes the same +inf gradient count.
        m = fresh(SqrtOfZero)
        x = data()
        h = torch.relu(m.fc(x)).detach().requires_grad_()
        torch.sqrt(h).sum().backward()
        assert h.grad is not None
        assert origin.counts is not None
        assert origin.counts.pos_inf == int(torch.isposinf(h.grad).sum()) > 0


@pytest.mark.parametrize("counts", ["native", "in-graph"])
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("mode", ["FULL_HEALTH", "CONCISE_HEALTH", "CURT_HEALTH"])
def test_counts_of_every_class_are_exact(
    tmp_path: Path, mode: str, dynamic: bool, counts: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In-graph reductions: with static sizes the graph leaves NaN to the size less the other
    # counts; symbolic sizes count it. nanscope_graph::counts (CPU, with the native extension)
    # counts every class. All give eager's counts, each class present in one tensor, also in
    # a transposed (strided) output and a bfloat16 one.
    from nanscope.backends.torch.compiled import rewrite

    monkeypatch.setattr(rewrite, "USE_NATIVE_COUNTS", counts == "native")
    native_calls: list[int] = []
    add_native = rewrite._add_native_counts

    def spy(graph: Any, plan: Any, op: Any) -> Any:
        native_calls.append(len(plan.traces))
        return add_native(graph, plan, op)

    monkeypatch.setattr(rewrite, "_add_native_counts", spy)
    x = torch.tensor(
        [[-np.inf, np.inf, np.nan, -2.0, 0.0, 3.0, 5.0], [np.nan, -1.0, 0.0, 0.0, np.inf, 1.0, 2.0]]
    )

    def f(x: Any) -> Any:
        y = x * 2.0
        return torch.relu(y) - x, (y + 1.0).t() - 4.0, x.to(torch.bfloat16) - 1.0

    fn = torch.compile(f, dynamic=dynamic)
    with nanscope.enable_dump_debug_info(tmp_path, mode, circular_buffer_size=-1) as session:
        fn(x)
    # The native counts are used exactly where asked for and the native recorder is on.
    assert isinstance(session._session, TorchDumpSession)
    assert bool(native_calls) == (counts == "native" and session._session.recorder == "native")

    def expected(y: np.ndarray, dtype: int = 1) -> list[float]:
        ninf, pinf, nan = np.sum(y == -np.inf), np.sum(y == np.inf), np.sum(np.isnan(y))
        neg, zero, pos = np.sum(y < 0) - ninf, np.sum(y == 0), np.sum(y > 0) - pinf
        if mode == "FULL_HEALTH":
            return [-1, -1, dtype, y.ndim, y.size, ninf, pinf, nan, neg, zero, pos]
        if mode == "CONCISE_HEALTH":
            return [-1, y.size, ninf, pinf, nan]
        return [-1, float(ninf + pinf + nan > 0)]

    y = (x * 2.0).numpy()
    with nanscope.open_dump(tmp_path) as dump:
        (mul,) = traces_of(dump, "mul", "inference")
        np.testing.assert_array_equal(summary(mul), expected(y))
        values = [recorded_summary(dump.trace(i)) for i in range(dump.num_graph_execution_traces())]
    # The transposed (y + 1) - 4 and the bfloat16 x - 1 (small integers: exact in bfloat16).
    bf16 = DTYPE_ENUM[torch.bfloat16]
    for v in (expected((y + 1.0).T - 4.0), expected(x.numpy() - 1.0, bf16)):
        assert any(np.array_equal(v, w) for w in values), (v, values)


# -- graph breaks, shapes, modes, filters ---------------------------------------------------------


def test_graph_break_gives_two_graphs_and_eager_ops_in_between(tmp_path: Path) -> None:
    with run(tmp_path, fresh(WithBreak), steps=1) as dump:
        calls = [dump.execution(i) for i in range(dump.num_executions())]
        graph_calls = [c for c in calls if c.graph_id]
        forward = {c.graph_id for c in graph_calls if c.op_type.endswith("forward")}
        assert len(forward) == 2
        assert len({c.graph_id for c in graph_calls if c.op_type.endswith("backward")}) == 2
        ops = {op.op_type for g in forward for op in dump.graph(g).ops.values()}  # type: ignore[union-attr]
        assert "aten.tanh.default" in ops
        # The loss outside the compiled function is recorded by the eager recorder.
        assert any(c.op_type == "aten.sum.default" for c in calls)
        # The second graph's input is the first graph's output (tensor ids link them).
        first, second = [c for c in graph_calls if c.op_type.endswith("forward")]
        assert set(first.output_tensor_ids) & set(second.input_tensor_ids)


def test_new_shapes_make_new_graphs(tmp_path: Path) -> None:
    with run(tmp_path, fresh(MLP), steps=3, batches=[5, 7, 9]) as dump:
        logs = traces_of(dump, "log")
        assert [recorded_summary(t)[4] for t in logs] == [20, 28, 36]  # 4 classes each
        assert len({t.graph_id for t in logs}) == 2  # static, then dynamic shapes
        shapes = [recorded_summary(t)[3] for t in logs]
        assert shapes == [2, 2, 2]


@pytest.mark.parametrize(
    "mode", ["NO_TENSOR", "CURT_HEALTH", "CONCISE_HEALTH", "SHAPE", "FULL_TENSOR"]
)
def test_every_mode(tmp_path: Path, mode: str, mlp_eager_dump: DumpReader) -> None:
    with run(tmp_path, fresh(MLP), steps=1, mode=mode) as dump:
        (log,) = traces_of(dump, "log")
        value = summary(log)
        if mode == "NO_TENSOR":
            assert value is None or value.size == 0
        elif mode == "CURT_HEALTH":
            np.testing.assert_array_equal(value, [-1, 0])
        elif mode == "CONCISE_HEALTH":
            np.testing.assert_array_equal(value, [-1, 24, 0, 0, 0])
        elif mode == "SHAPE":
            np.testing.assert_array_equal(value, [-1, 1, 2, 24, 6, 4, 0, 0, 0, 0])
        else:
            expected = fresh(MLP)(data()).detach().numpy()
            assert value is not None
            np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-6)
        n_traces = dump.num_graph_execution_traces()
        assert n_traces > 20


def test_op_regex_and_dtypes_limit_the_traces_not_the_graph(tmp_path: Path) -> None:
    with run(tmp_path, fresh(MLP), steps=1, op_regex=r"aten\.(log|relu)\.") as dump:
        names = {dump.trace(i).op_name for i in range(dump.num_graph_execution_traces())}
        assert names == {"log", "relu"}
        graphs = {dump.trace(i).graph_id for i in range(dump.num_graph_execution_traces())}
        (g,) = graphs
        assert len(dump.graph(g).ops) > 10  # type: ignore[union-attr]
    with run(tmp_path / "dt", fresh(MLP), steps=1, tensor_dtypes=[torch.float64]) as dump:
        assert dump.num_graph_execution_traces() == 0


def test_circular_buffer_keeps_the_last_traces(tmp_path: Path) -> None:
    with run(tmp_path, fresh(MLP), steps=3, circular_buffer_size=15) as dump:
        assert dump.num_graph_execution_traces() == 15
        assert dump.num_executions() <= 15


def test_disabling_restores_plain_compilation(tmp_path: Path) -> None:
    from torch._inductor import compile_fx as cfx

    before = cfx.compile_fx
    with nanscope.enable_dump_debug_info(tmp_path):
        assert cfx.compile_fx is not before
    assert cfx.compile_fx is before
    model: MLP = fresh(MLP)
    y = torch.compile(model)(data())
    np.testing.assert_allclose(y.detach().numpy(), model(data()).detach().numpy(), rtol=1e-5)


# -- a Transformer block ----------------------------------------------------------------------


def test_transformer_block(tmp_path: Path) -> None:
    torch.manual_seed(0)
    block = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    x = torch.randn(2, 8, 32)
    eager_out = block(x).detach()
    fn = torch.compile(block)
    with nanscope.enable_dump_debug_info(tmp_path, circular_buffer_size=-1):
        fn(x).sum().backward()
    with nanscope.open_dump(tmp_path) as dump:
        calls = [
            dump.execution(i) for i in range(dump.num_executions()) if dump.execution(i).graph_id
        ]
        assert [c.op_type.rsplit(" ", 1)[-1] for c in calls] == ["forward", "backward"]
        fw = dump.graph(calls[0].graph_id)
        assert fw is not None
        paths = {op.module_path for op in fw.ops.values()}
        assert "linear1 (Linear)" in paths
        assert any(p.startswith("self_attn") for p in paths)
        assert dump.num_graph_execution_traces() > 50
        assert dump.nonfinite(TRACES).size == 0
        # The forward call's output summary is the eager output's.
        out = summaries_of(calls[0])[0]
        assert out is not None
        assert out[4] == eager_out.numel()
        assert out[8] == int((eager_out < 0).sum()) and out[10] == int((eager_out > 0).sum())
        assert dump.num(EXECUTIONS) == dump.num_executions()


def test_report_and_gui_api_show_the_compiled_origin(tmp_path: Path) -> None:
    """`nanscope report` and the GUI's graph-structure route on a NaN born in a compiled graph."""
    import json
    import subprocess
    import sys

    from nanscope.server.api import ROUTES
    from nanscope.server.query import Query
    from nanscope.server.runs import RunSet

    run(tmp_path, fresh(LogOfZero), steps=1).close()
    report = subprocess.run(
        [sys.executable, "-m", "nanscope", "report", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert report.returncode == 1, report.stderr
    origin = json.loads(report.stdout)["origin"]
    assert (origin["kind"], origin["op_type"], origin["op_name"]) == (
        "graph_execution_trace", "aten.log.default", "log",
    )  # fmt: skip
    assert origin["source"]["line"] == marked_line(THIS_FILE, "# forward nan: log")

    runs = RunSet(tmp_path)
    alerts = ROUTES["/api/alerts"](runs, Query({}), {})
    assert alerts["first"] == {"kind": TRACES, "index": origin["index"]}
    tr = ROUTES["/api/traces/<int:index>"](runs, Query({}), {"index": origin["index"]})
    op = ROUTES["/api/graph_op"](
        runs,
        Query({"graph_id": tr["graph_id"], "op_name": "log", "near": str(origin["index"])}),
        {},
    )
    assert op["op"]["op_type"] == "aten.log.default"
    assert [i["op_name"] for i in op["inputs"]] and all(i["op_type"] for i in op["inputs"])
    # Its producer (the softmax/division feeding the log) was traced just before it.
    assert any(i["trace_index"] is not None and i["trace_index"] < origin["index"]
               for i in op["inputs"])  # fmt: skip
    # From the producer, the log is a consumer, traced at the origin.
    (producer,) = [i for i in op["inputs"] if i["trace_index"] is not None]
    up = ROUTES["/api/graph_op"](
        runs,
        Query({"graph_id": tr["graph_id"], "op_name": producer["op_name"],
               "near": str(producer["trace_index"])}),
        {},
    )  # fmt: skip
    assert {"op_name": "log", "trace_index": origin["index"]}.items() <= next(
        c for c in up["consumers"] if c["op_name"] == "log"
    ).items()
    frames = [f for f in tr["stack"] if f["user"]]
    assert frames and frames[-1]["line"] == origin["source"]["line"]
    src = ROUTES["/api/source"](runs, Query({"file": str(frames[-1]["file_index"])}), {})
    assert "# forward nan: log" in "".join(t for _, t in src["lines"][frames[-1]["line"] - 1])
