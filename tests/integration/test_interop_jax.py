"""Interoperability of a JAX dump: TensorFlow's reader and TensorBoard's Debugger V2 plugin.

``tests/programs/jax_mlp.py`` trains a small MLP for two steps with a jitted
``jax.value_and_grad`` step and a hand-written SGD update, whose cross-entropy takes the
log of a zero (-inf, then NaN), then runs a jitted ``predict`` and two eager ops; it is
recorded in FULL_HEALTH with everything kept (:func:`tests.helpers.jax_mlp_dump`).

``tensorflow.python.debug.lib.debug_events_reader.DebugDataReader`` must read it all: one
graph per jitted function, one op per jaxpr equation (op types are JAX primitive names,
inputs ``producer:slot``), executions with their graph ids, graph execution traces whose
summaries hold the counts this module computes on its own, stack frames and source files.
Those counts come from evaluating the same jaxprs one equation at a time, eagerly, with
recording off, and counting each float value's elements with numpy; the loss's ``log`` is
also computed by hand in numpy. TensorBoard's real Debugger V2 plugin then serves the
same dump over HTTP (runs, alerts, executions, graph execution digests, op info).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("tensorflow")

import jax
from jax.extend.core import DropVar, Literal
from tensorflow.python.debug.lib.debug_events_reader import DebugDataReader

from tests.programs import jax_mlp

from ..helpers import JAX_MLP, jax_mlp_dump, marked_line
from .test_interop_tensorboard import (
    RUN,
    Dump,
    Server,
    start_tensorboard,
    stop_tensorboard,
    wait_for_tensorboard,
)

pytestmark = pytest.mark.tf

PROGRAM = str(JAX_MLP)
FULL_HEALTH = 4  # TensorFlow's TensorDebugMode enum
F32 = 1  # TensorFlow's DT_FLOAT
# Primitives whose sub-jaxpr nanscope records in place (their ops in the caller's graph).
CALL_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")
LOOPS = ("scan", "while", "cond")
# What the program runs, in order: (op type, graph name or "" for an eager primitive).
EXECUTIONS = [
    ("train_step", "train_step"),
    ("train_step", "train_step"),
    ("predict", "predict"),
    ("log", ""),
    ("exp", ""),
]


def line_of(marker: str) -> int:
    """The line of the program that ends with ``# SITE:<marker>``."""
    return marked_line(PROGRAM, f"# SITE:{marker}")


# -- what the dump must hold, computed here ----------------------------------------------------


def counts(value: Any) -> list[float]:
    """TensorFlow's FULL_HEALTH slots 2..10 of a float tensor: dtype, rank, size, -inf,
    +inf, NaN, negative, zero, positive."""
    a = np.asarray(value)
    assert a.dtype == np.float32, a.dtype
    flat = a.ravel().astype(np.float64)
    finite = flat[np.isfinite(flat)]
    return [
        F32, a.ndim, flat.size,
        int(np.isneginf(flat).sum()), int(np.isposinf(flat).sum()), int(np.isnan(flat).sum()),
        int((finite < 0).sum()), int((finite == 0).sum()), int((finite > 0).sum()),
    ]  # fmt: skip


@dataclass
class Value:
    """One summarised value of a run of a jitted function: a trace the dump must hold."""

    op_name: str
    op_type: str
    slot: int
    value: np.ndarray


@dataclass
class Call:
    """A jitted function's run, evaluated equation by equation."""

    arg_names: list[str]  # the arguments' paths, as JAX names them ("params['w1']")
    ops: list[tuple[str, str]]  # (op name, op type) of each argument and equation, in order
    values: list[Value]  # every float value, in the order the program computed them
    outputs: list[np.ndarray]


def evaluate(fn: Any, *args: Any) -> Call:
    """Run the closed jaxpr that ``jax.jit`` compiles for ``fn(*args)`` one equation at a
    time, eagerly. Ops are named as the JAX backend documents: arguments after their paths,
    each equation ``<primitive>_<n>`` in order (a nested call's equations inlined, numbered
    after it), loops absent from this program."""
    (eqn,) = jax.make_jaxpr(fn)(*args).eqns
    closed = eqn.params["jaxpr"]
    names = list(closed.jaxpr.debug_info.arg_names)
    call = Call(names, [], [], [])
    n = 0

    def record(op_name: str, op_type: str, slot: int, value: Any) -> None:
        if np.issubdtype(np.asarray(value).dtype, np.floating):
            call.values.append(Value(op_name, op_type, slot, np.asarray(value)))

    def run(jaxpr: Any, consts: Sequence[Any], invals: Sequence[Any], top: bool) -> list[Any]:
        nonlocal n
        env: dict[Any, Any] = {}

        def read(v: Any) -> Any:
            return v.val if isinstance(v, Literal) else env[v]

        assert not (top and jaxpr.constvars), "the program's jaxprs capture no constants"
        for v, x in zip(jaxpr.constvars, consts, strict=True):
            env[v] = x
        for i, (v, x) in enumerate(zip(jaxpr.invars, invals, strict=True)):
            env[v] = x
            if top:
                call.ops.append((names[i], "Placeholder"))
                record(names[i], "Placeholder", 0, x)
        for e in jaxpr.eqns:
            prim = e.primitive.name
            assert prim not in LOOPS, prim
            n += 1
            op_name = f"{prim}_{n}"
            call.ops.append((op_name, prim))
            ins = [read(v) for v in e.invars]
            sub = next((e.params[k] for k in CALL_PARAMS if k in e.params), None)
            if sub is not None:
                inner, inner_consts = (
                    (sub.jaxpr, sub.consts) if hasattr(sub, "jaxpr") else (sub, ())
                )
                outs = run(inner, inner_consts, ins[len(ins) - len(inner.invars) :], False)
            else:
                with e.ctx.manager:
                    out = e.primitive.bind(*ins, **e.params)
                outs = list(out) if e.primitive.multiple_results else [out]
                for slot, (v, o) in enumerate(zip(e.outvars, outs, strict=True)):
                    if not isinstance(v, DropVar):
                        record(op_name, prim, slot, o)
            for v, o in zip(e.outvars, outs, strict=True):
                env[v] = o
        return [read(v) for v in jaxpr.outvars]

    with jax.default_device(jax.devices("cpu")[0]):
        flat = jax.tree.leaves(args)
        outs = run(closed.jaxpr, closed.consts, flat, True)
    call.outputs = [np.asarray(o) for o in outs]
    return call


@dataclass
class Expected:
    calls: list[Call]  # train_step, train_step, predict
    eager: list[tuple[np.ndarray, np.ndarray]]  # log, exp: (input, output)

    @property
    def traces(self) -> list[tuple[str, Value]]:
        """(graph name, value) of every trace, in the order the dump holds them."""
        names = [op for op, graph in EXECUTIONS if graph]
        return [(g, v) for g, c in zip(names, self.calls, strict=True) for v in c.values]


@pytest.fixture(scope="module")
def expected() -> Expected:
    params: Any = jax_mlp.init_params()
    x, y = jax_mlp.data()
    calls = []
    with jax.default_device(jax.devices("cpu")[0]):
        for _ in range(jax_mlp.STEPS):
            calls.append(evaluate(jax_mlp.train_step, params, x, y))
            params, _ = jax_mlp.train_step(params, x, y)
        calls.append(evaluate(jax_mlp.predict_jit, params, x))
        log_labels = np.asarray(jax.numpy.log(y))
        probs = np.asarray(jax.numpy.exp(log_labels))
    return Expected(calls, [(y, log_labels), (log_labels, probs)])


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return jax_mlp_dump(tmp_path_factory)


@pytest.fixture(scope="module")
def reader(dump: Path) -> Iterator[DebugDataReader]:
    with DebugDataReader(str(dump)) as r:
        r.update()
        yield r


def test_the_program_takes_the_log_of_zero(expected: Expected) -> None:
    """The oracle's ground: in numpy, one probability of the first step is exactly 0 and
    one exactly 1; the log op's counts, evaluated equation by equation, agree."""
    params = jax_mlp.init_params()
    x, y = jax_mlp.data()
    h = np.maximum(x @ params["w1"] + params["b1"], 0)
    logits = h @ params["w2"] + params["b2"]
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    with np.errstate(divide="ignore"):
        log_p = np.log(z / z.sum(axis=-1, keepdims=True))
    want = [F32, 2, y.size, 1, 0, 0, y.size - 2, 1, 0]
    assert counts(log_p) == want
    (log,) = [v for v in expected.calls[0].values if v.op_type == "log"]
    assert counts(log.value) == want
    assert np.isnan(expected.calls[0].outputs[-1])  # the loss


# -- TensorFlow's reader -----------------------------------------------------------------------


def test_tf_reads_one_graph_per_jitted_function(reader: DebugDataReader) -> None:
    graphs = {g.name: g for g in reader.outermost_graphs()}
    jitted = {graph for _, graph in EXECUTIONS if graph}
    assert set(graphs) == jitted, "eager primitives make no graphs"
    for g in graphs.values():
        assert g.outer_graph_id is None and g.inner_graph_ids == []
        assert reader.graph_by_id(g.graph_id) is g
    assert reader.device_name_map() == {1: "/job:localhost/replica:0/task:0/device:CPU:0"}


def test_tf_reads_the_graph_op_creations(reader: DebugDataReader, expected: Expected) -> None:
    """One op per argument and equation, of the primitive's type, wired ``producer:slot``."""
    graphs = {g.name: g.graph_id for g in reader.outermost_graphs()}
    for name, call in (("train_step", expected.calls[0]), ("predict", expected.calls[2])):
        graph_id = graphs[name]
        digests = [d for d in reader.graph_op_digests() if d.graph_id == graph_id]
        assert [(d.op_name, d.op_type) for d in digests] == call.ops, name
        graph = reader.graph_by_id(graph_id)
        for d in digests:
            assert graph.get_op_creation_digest(d.op_name) is d
            for inp in d.input_names or ():
                producer, slot = inp.rsplit(":", 1)
                assert graph.get_op_creation_digest(producer) is not None, (d.op_name, inp)
                assert int(slot) >= 0
        # The function's arguments, by their paths: Placeholders first.
        placeholders = [d.op_name for d in digests if d.op_type == "Placeholder"]
        assert placeholders == call.arg_names
        assert [d.op_name for d in digests[: len(placeholders)]] == placeholders

    # The log of the loss: fed by the softmax's division, read by the labels' product.
    graph = reader.graph_by_id(graphs["train_step"])
    (log,) = reader.graph_op_digests(op_type="log")
    assert log.graph_id == graphs["train_step"]
    (producer,) = log.input_names
    assert graph.get_op_creation_digest(producer.split(":")[0]).op_type == "div"
    consumers = graph.get_op_consumers(log.op_name)
    assert [graph.get_op_creation_digest(c).op_type for _, c, _ in consumers] == ["mul"]
    (mul,) = [graph.get_op_creation_digest(c) for _, c, _ in consumers]
    assert "y:0" in mul.input_names
    # TensorFlow counts an op's outputs by its symbolic tensor ids.
    assert log.num_outputs == 1
    assert len(log.output_tensor_ids) == 1


def test_tf_reads_the_executions(reader: DebugDataReader, expected: Expected) -> None:
    graphs = {g.name: g.graph_id for g in reader.outermost_graphs()}
    executions = reader.executions()
    assert [(e.op_type, e.graph_id) for e in executions] == [
        (op, graphs[g] if g else "") for op, g in EXECUTIONS
    ]
    outputs = [c.outputs for c in expected.calls] + [[out] for _, out in expected.eager]
    for i, (e, want) in enumerate(zip(executions, outputs, strict=True)):
        assert e.tensor_debug_mode == FULL_HEALTH, i
        assert e.num_outputs == len(want) == len(e.output_tensor_ids), i
        assert e.output_tensor_device_ids == (1,) * len(want), i
        assert e.debug_tensor_values is not None, i
        got = [list(v[2:]) for v in e.debug_tensor_values]
        assert got == [counts(o) for o in want], i
    # Tensor ids: the second step takes the first step's new parameters, the eager exp
    # the eager log's output; what came from numpy has none (-1).
    first, second, predict, log, exp = executions
    n_params = len(jax_mlp.init_params())
    assert first.input_tensor_ids == (-1,) * (n_params + 2)
    assert second.input_tensor_ids == (*first.output_tensor_ids[:n_params], -1, -1)
    assert predict.input_tensor_ids == (*second.output_tensor_ids[:n_params], -1)
    assert exp.input_tensor_ids == log.output_tensor_ids
    ids = [t for e in executions for t in e.output_tensor_ids]
    assert len(set(ids)) == len(ids)
    assert [d.op_type for d in reader.executions(digest=True)] == [op for op, _ in EXECUTIONS]


def test_tf_reads_the_traces_with_the_counts_computed_here(
    reader: DebugDataReader, expected: Expected
) -> None:
    graphs = {g.graph_id: g.name for g in reader.outermost_graphs()}
    want = expected.traces
    traces = reader.graph_execution_traces()
    assert len(traces) == reader.num_graph_execution_traces() == len(want)
    for i, (t, (graph, v)) in enumerate(zip(traces, want, strict=True)):
        where = f"trace {i}: {graph}/{v.op_name}"
        assert graphs[t.graph_id] == graph, where
        assert (t.op_name, t.op_type, t.output_slot) == (v.op_name, v.op_type, v.slot), where
        assert t.graph_ids == (t.graph_id,), where
        assert t.tensor_debug_mode == FULL_HEALTH, where
        assert t.device_name == "/job:localhost/replica:0/task:0/device:CPU:0", where
        assert list(t.debug_tensor_value[2:]) == counts(v.value), where
    digests = reader.graph_execution_traces(digest=True)
    assert [(d.op_name, d.op_type) for d in digests] == [(v.op_name, v.op_type) for _, v in want]
    # The first -inf is the log's, in the first step; the first NaN the product after it.
    bad = [(t.op_type, t.debug_tensor_value[5:8]) for t in traces if any(t.debug_tensor_value[5:8])]
    assert bad[0] == ("log", (1.0, 0.0, 0.0))
    assert bad[1] == ("mul", (0.0, 0.0, 1.0))
    # Each trace is of a symbolic tensor of its graph (TensorFlow resolves it by op and slot).
    for t in traces[:20]:
        assert isinstance(reader.graph_execution_trace_to_tensor_id(t), int)


def test_tf_reads_stack_frames_and_source_files(reader: DebugDataReader) -> None:
    executions = reader.executions()
    sites = ["train_step", "train_step", "predict", "eager_log", "eager_exp"]
    for e, site in zip(executions, sites, strict=True):
        host, frames = reader.read_execution_stack_trace(e)
        user = [f for f in frames if f[0] == PROGRAM]
        # Outermost first: the module's main() call, then the line in main() that ran it.
        assert user[-1] == (PROGRAM, line_of(site), "main"), (e.op_type, user)
        assert user[0][2] == "<module>"
        assert host == e.host_name

    # The log's creation: the jnp.log line of loss_fn, called from train_step.
    (log,) = reader.graph_op_digests(op_type="log")
    host, frames = reader.read_graph_op_creation_stack_trace(log)
    assert frames[-1] == (PROGRAM, line_of("log"), "loss_fn")
    assert frames[-2][0] == PROGRAM and frames[-2][2] == "train_step"

    files = reader.source_file_list()
    assert (host, PROGRAM) in files
    lines = reader.source_lines(host, PROGRAM)
    assert lines == Path(PROGRAM).read_text().splitlines()
    assert "jnp.log(p)" in lines[line_of("log") - 1]


# -- TensorBoard's Debugger V2 plugin ----------------------------------------------------------


@dataclass
class Booting:
    proc: subprocess.Popen[bytes]
    base: str
    logdir: Path
    log: Path


@pytest.fixture(scope="module", autouse=True)
def _tensorboard_booting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Booting | None]:
    """TensorBoard, started first over an empty folder: it boots (importing TensorFlow takes
    seconds) while the program is recorded and the expected counts computed."""
    if importlib.util.find_spec("tensorboard") is None:
        yield None
        return
    root = tmp_path_factory.mktemp("tensorboard")
    logdir, log = root / "dump", root / "tensorboard.log"
    logdir.mkdir()
    proc, base = start_tensorboard(logdir, log)
    try:
        yield Booting(proc, base, logdir, log)
    finally:
        stop_tensorboard(proc)


def publish(dump: Path, logdir: Path) -> None:
    """Copy a finished dump into TensorBoard's folder, its ``.metadata`` last: TensorFlow's
    reader finds a file set by it, so it never sees one half copied."""
    files = sorted(dump.iterdir(), key=lambda f: f.suffix == ".metadata")
    for f in files:
        shutil.copyfile(f, logdir / (f.name + ".part"))
        os.replace(logdir / (f.name + ".part"), logdir / f.name)


@pytest.fixture(scope="module")
def tensorboard(
    _tensorboard_booting: Booting | None, dump: Path, reader: DebugDataReader
) -> Server:
    boot = _tensorboard_booting
    if boot is None:
        pytest.skip("needs tensorboard")
    publish(dump, boot.logdir)
    server = Server(boot.base, Dump(boot.logdir, reader.executions()[0].host_name), boot.log)
    wait_for_tensorboard(boot.proc, server)
    return server


def test_tensorboard_lists_the_run(tensorboard: Server) -> None:
    runs = tensorboard.get("runs")
    assert list(runs) == [RUN]
    assert runs[RUN]["start_time"] > 0


def test_tensorboard_alerts_on_the_inf_and_nan(tensorboard: Server, expected: Expected) -> None:
    """One alert per output with Inf/NaN: of executions (a training step's five outputs, the
    eager log's) and of graph execution traces."""
    outputs = [c.outputs for c in expected.calls] + [[out] for _, out in expected.eager]
    bad_outputs = [(i, slot) for i, outs in enumerate(outputs) for slot, o in enumerate(outs)
                   if not np.isfinite(o).all()]  # fmt: skip
    bad_traces = [i for i, (_, v) in enumerate(expected.traces) if not np.isfinite(v.value).all()]
    total = len(bad_outputs) + len(bad_traces)
    answer = tensorboard.poll(
        "alerts", lambda a: a["num_alerts"] >= total, run=RUN, begin=0, end=-1
    )
    assert answer["num_alerts"] == total
    assert answer["alerts_breakdown"] == {"InfNanAlert": total}
    alerts = answer["alerts"]
    assert sorted((a["execution_index"], a["output_slot"]) for a in alerts
                  if a["execution_index"] is not None) == bad_outputs  # fmt: skip
    by_trace = {a["graph_execution_trace_index"]: a for a in alerts
                if a["graph_execution_trace_index"] is not None}  # fmt: skip
    assert sorted(by_trace) == bad_traces
    first = by_trace[bad_traces[0]]
    assert (first["op_type"], first["num_neg_inf"], first["num_nan"]) == ("log", 1, 0)
    (log,) = [a for a in alerts if a["execution_index"] == EXECUTIONS.index(("log", ""))]
    labels = expected.eager[0][0]
    assert (log["op_type"], log["num_neg_inf"], log["size"]) == (
        "log", int((labels == 0).sum()), labels.size,
    )  # fmt: skip


def test_tensorboard_serves_the_executions(tensorboard: Server, expected: Expected) -> None:
    n = len(EXECUTIONS)
    digests = tensorboard.poll(
        "execution/digests", lambda a: a["num_digests"] >= n, run=RUN, begin=0, end=-1
    )
    assert [d["op_type"] for d in digests["execution_digests"]] == [op for op, _ in EXECUTIONS]
    data = tensorboard.get("execution/data", run=RUN, begin=0, end=-1)["executions"]
    graph_names = {d["graph_id"]: name for d, (_, name) in zip(data, EXECUTIONS, strict=True)}
    assert [graph_names[d["graph_id"]] for d in data] == [g for _, g in EXECUTIONS]
    outputs = [c.outputs for c in expected.calls] + [[out] for _, out in expected.eager]
    for d, want in zip(data, outputs, strict=True):
        assert d["tensor_debug_mode"] == FULL_HEALTH
        assert [v[2:] for v in d["debug_tensor_values"]] == [counts(o) for o in want]
        assert d["stack_frame_ids"]
    frames = tensorboard.get(
        "stack_frames/stack_frames", run=RUN, stack_frame_ids=",".join(data[0]["stack_frame_ids"])
    )["stack_frames"]
    assert [PROGRAM, line_of("train_step"), "main"] in [f[1:] for f in frames]


def test_tensorboard_serves_the_graph_execution_digests(
    tensorboard: Server, expected: Expected, reader: DebugDataReader
) -> None:
    want = expected.traces
    answer = tensorboard.poll(
        "graph_execution/digests", lambda a: a["num_digests"] >= len(want), run=RUN, begin=0, end=-1
    )
    assert answer["num_digests"] == len(want)
    graph_ids = {g.name: g.graph_id for g in reader.outermost_graphs()}
    assert [(d["op_name"], d["op_type"], d["graph_id"]) for d in answer["graph_execution_digests"]
            ] == [(v.op_name, v.op_type, graph_ids[g]) for g, v in want]  # fmt: skip
    # The log's trace, in full.
    index = next(i for i, (_, v) in enumerate(want) if v.op_type == "log")
    (got,) = tensorboard.get("graph_execution/data", run=RUN, begin=index, end=index + 1)[
        "graph_executions"
    ]
    assert got["op_name"] == want[index][1].op_name
    assert got["graph_ids"] == [graph_ids["train_step"]]
    assert got["debug_tensor_value"][2:] == counts(want[index][1].value)


def test_tensorboard_serves_the_op_info(tensorboard: Server, reader: DebugDataReader) -> None:
    (log,) = reader.graph_op_digests(op_type="log")
    graph = reader.graph_by_id(log.graph_id)
    info = tensorboard.poll("graphs/op_info", lambda a: True, run=RUN, graph_id=log.graph_id,
                            op_name=log.op_name)  # fmt: skip
    assert (info["op_type"], info["op_name"]) == ("log", log.op_name)
    assert info["graph_ids"] == [log.graph_id]
    assert info["num_outputs"] == 1
    assert [i["op_name"] for i in info["inputs"]] == [log.input_names[0].split(":")[0]]
    assert info["inputs"][0]["data"]["op_type"] == "div"
    consumers = [c for slot in info["consumers"] for c in slot]
    assert [c["data"]["op_type"] for c in consumers] == ["mul"]
    assert [c["op_name"] for c in consumers] == [
        n for _, n, _ in graph.get_op_consumers(log.op_name)
    ]
    stack = tensorboard.get(
        "stack_frames/stack_frames", run=RUN, stack_frame_ids=",".join(info["stack_frame_ids"])
    )["stack_frames"]
    assert stack[-1][1:] == [PROGRAM, line_of("log"), "loss_fn"]

    graph_info = tensorboard.get("graphs/graph_info", run=RUN, graph_id=log.graph_id)
    assert graph_info["name"] == "train_step"
    assert graph_info["outer_graph_id"] is None and graph_info["inner_graph_ids"] == []


def test_tensorboard_serves_the_source_file(tensorboard: Server) -> None:
    host = tensorboard.dump.host_name
    files = tensorboard.poll("source_files/list", lambda a: [host, PROGRAM] in a, run=RUN)
    content = tensorboard.get("source_files/file", run=RUN, index=files.index([host, PROGRAM]))
    assert content["lines"] == Path(PROGRAM).read_text().splitlines()
