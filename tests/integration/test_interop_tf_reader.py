"""Interoperability: dumps written by nanscope's DumpWriter, read by TensorFlow's own reader.

Every test writes a dump with :class:`nanscope.events.DumpWriter` and reads it
back with ``tensorflow.python.debug.lib.debug_events_reader.DebugDataReader``
(the reader behind TensorBoard's Debugger V2 plugin), then checks that
TensorFlow sees exactly what was written: executions, graph execution traces,
graphs, devices, stack frames and source files.

Expected summary vectors are computed here from the tensors themselves, in the
layouts TensorFlow's ``DebugNumericSummaryV2`` op produces, so the tests do not
take nanscope's word for the format.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tensorflow")
from tensorflow.core.protobuf import debug_event_pb2
from tensorflow.python.debug.lib.debug_events_reader import DebugDataReader

import nanscope
from nanscope.events import DumpWriter, ExecutionEvent, Graph, GraphOp, Phase, TraceEvent

from ..helpers import marked_line

pytestmark = pytest.mark.tf

THIS_FILE = os.path.abspath(__file__)
CPU = "/job:localhost/replica:0/task:0/device:CPU:0"
GPU = "/job:localhost/replica:0/task:0/device:GPU:0"
MODES = ["NO_TENSOR", "CURT_HEALTH", "CONCISE_HEALTH", "FULL_HEALTH", "SHAPE", "FULL_TENSOR"]
SUMMARY_MODES = ("CURT_HEALTH", "CONCISE_HEALTH", "FULL_HEALTH", "SHAPE")
DTYPE_ENUM = {np.dtype(np.float32): 1, np.dtype(np.float64): 2, np.dtype(np.int64): 9}


# -- expected summaries ------------------------------------------------------------------------


def summarize(mode: str, tensor_id: int, array: np.ndarray | None) -> np.ndarray | None:
    """What the writer is handed for one output in ``mode`` (TensorFlow's layouts)."""
    if array is None or mode == "NO_TENSOR":
        return None
    if mode == "FULL_TENSOR":
        return array
    flat = array.ravel().astype(np.float64)
    neg_inf = int(np.isneginf(flat).sum())
    pos_inf = int(np.isposinf(flat).sum())
    nan = int(np.isnan(flat).sum())
    finite = flat[np.isfinite(flat)]
    if mode == "CURT_HEALTH":
        vec = [tensor_id, float(neg_inf + pos_inf + nan > 0)]
    elif mode == "CONCISE_HEALTH":
        vec = [tensor_id, flat.size, neg_inf, pos_inf, nan]
    elif mode == "FULL_HEALTH":
        vec = [
            tensor_id, -1, DTYPE_ENUM[array.dtype], array.ndim, flat.size,
            neg_inf, pos_inf, nan,
            int((finite < 0).sum()), int((finite == 0).sum()), int((finite > 0).sum()),
        ]  # fmt: skip
    elif mode == "SHAPE":
        dims = [*array.shape, 0, 0, 0, 0, 0, 0][:6]
        vec = [tensor_id, DTYPE_ENUM[array.dtype], array.ndim, flat.size, *dims]
    else:
        raise AssertionError(mode)
    return np.asarray(vec, dtype=np.float64)


def with_ranges(mode: str, summary: np.ndarray | None, array: np.ndarray | None) -> Any:
    """A FULL_HEALTH summary with the largest and smallest non-zero finite |x| appended."""
    if mode != "FULL_HEALTH" or summary is None or array is None:
        return summary
    mag = np.abs(array[np.isfinite(array)].astype(np.float64))
    nonzero = mag[mag > 0]
    hi = float(mag.max()) if mag.size else 0.0
    lo = float(nonzero.min()) if nonzero.size else math.inf
    return np.concatenate([summary, [hi, lo]])


def summary_row(mode: str, tensor_id: int, array: np.ndarray) -> np.ndarray:
    """One row of a ``write_traces`` matrix: :func:`summarize` in a mode that makes a vector."""
    row = summarize(mode, tensor_id, array)
    assert row is not None, mode
    return row


def mode_enum(mode: str) -> int:
    return int(debug_event_pb2.TensorDebugMode.Value(mode))


# -- stack sites -------------------------------------------------------------------------------
# Two different functions of this file capture the stacks that events carry;
# each line is found again by the marker comment at its end.


def _forward_site(writer: DumpWriter) -> int:
    return writer.capture_stack()  # SITE:forward


def _backward_site(writer: DumpWriter) -> int:
    return writer.capture_stack()  # SITE:backward


def line_of(marker: str) -> int:
    """The line of this file that ends with ``# SITE:<marker>``."""
    return marked_line(THIS_FILE, f"# SITE:{marker}")


# -- what a dump holds -------------------------------------------------------------------------


@dataclass
class WrittenExecution:
    op_type: str
    input_ids: list[int]
    output_ids: list[int]
    device_ids: list[int]
    values: list[np.ndarray | None]  # the output tensors (None: a non-float output)
    summaries: list[np.ndarray | None]  # tfdbg2 slots of what the writer got, one per output
    site: str  # "forward" or "backward"
    graph_id: str = ""


@dataclass
class WrittenTrace:
    graph_ids: tuple[str, ...]  # outermost first
    op_name: str
    op_type: str
    output_slot: int
    value: np.ndarray
    summary: np.ndarray | None  # what the writer got (a row of the matrix for write_traces)
    device_name: str

    @property
    def graph_id(self) -> str:
        return self.graph_ids[-1]


@dataclass
class Written:
    mode: str
    host_name: str
    run_id: str
    executions: list[WrittenExecution] = field(default_factory=list)
    traces: list[WrittenTrace] = field(default_factory=list)


# The graphs: "loss" (g0) holds the cond branch "cond_true" (g1).
GRAPH_OPS = {
    # op name: (graph id, op type, inputs, output tensor ids)
    "probs": ("g0", "Placeholder", [], [101]),
    "Log": ("g0", "Log", ["probs:0"], [102]),
    "Neg": ("g0", "Neg", ["Log:0"], [103]),
    "x": ("g1", "Placeholder", [], [201]),
    "Sqrt": ("g1", "Sqrt", ["x:0"], [202]),
}
GRAPH_NAMES = {"g0": "loss", "g1": "cond_true"}


def _f32(*values: float) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def _write_graphs(w: DumpWriter, stack: int) -> None:
    w.write_graph(Graph(graph_id="g0", graph_name="loss", outer_graph_id=""))
    w.write_graph(Graph(graph_id="g1", graph_name="cond_true", outer_graph_id="g0"))
    for op_name, (graph_id, op_type, inputs, out_ids) in GRAPH_OPS.items():
        w.write_graph_op(
            GraphOp(
                graph_id=graph_id,
                op_type=op_type,
                op_name=op_name,
                graph_name=GRAPH_NAMES[graph_id],
                input_names=inputs,
                num_outputs=len(out_ids),
                output_tensor_ids=out_ids,
                stack=stack,
            )
        )


def _write_dump(logdir: Path, mode: str) -> Written:
    """A dump in ``mode`` with healthy, -inf and NaN executions, graphs and traces."""
    w = DumpWriter(logdir, mode, circular_buffer_size=-1, framework="test")
    written = Written(mode, w.host_name, w.run_id)
    stacks = {
        "forward": _forward_site(w),  # SITE:call-forward
        "backward": _backward_site(w),  # SITE:call-backward
    }
    cpu = w.register_device(CPU)
    gpu = w.register_device(GPU)
    _write_graphs(w, stacks["forward"])

    # Executions: (op type, inputs, outputs, devices, values, site, phase, graph id)
    plan: list[
        tuple[str, list[int], list[int], list[int], list[np.ndarray | None], str, Phase, str]
    ]
    plan = [
        ("aten.exp.default", [1], [2], [cpu], [np.array([[0.5, 1.0], [2.0, -1.0]], np.float32)],
         "forward", Phase.FORWARD, ""),
        ("aten.log.default", [2], [3], [cpu], [_f32(-np.inf, 0.0, 0.75, -2.0)],
         "forward", Phase.FORWARD, ""),
        # Two outputs: float values and int64 indices (no summary for the latter).
        ("aten.max.dim", [3], [4, 5], [cpu, cpu], [_f32(1.5, 0.0), None],
         "forward", Phase.FORWARD, ""),
        # A call of the graph "loss".
        ("__inference_loss_7", [4], [6], [gpu], [_f32(np.nan, 1.0, np.nan)],
         "backward", Phase.BACKWARD, "g0"),
        ("aten.sqrt.default", [6], [7], [gpu], [_f32(np.inf, -0.0, np.nan, 3.0, -4.0)],
         "backward", Phase.BACKWARD, ""),
    ]  # fmt: skip
    for step, (op_type, ins, outs, devs, values, site, phase, graph_id) in enumerate(plan):
        summaries = [summarize(mode, tid, v) for tid, v in zip(outs, values, strict=True)]
        # FULL_HEALTH as the recorders hand it over: the ranges after tfdbg2's 11 slots,
        # which the writer puts in output_ranges (1008), a field TensorFlow must ignore.
        handed = [with_ranges(mode, sm, v) for sm, v in zip(summaries, values, strict=True)]
        w.write_execution(
            ExecutionEvent(
                op_type=op_type,
                input_tensor_ids=ins,
                output_tensor_ids=outs,
                output_device_ids=devs,
                summaries=[] if mode == "NO_TENSOR" else handed,
                stack=stacks[site],
                module_path="model.fc",
                phase=phase,
                step=step,
                graph_id=graph_id,
            )
        )
        written.executions.append(
            WrittenExecution(op_type, ins, outs, devs, values, summaries, site, graph_id)
        )

    # Traces one at a time: a -inf in the outer graph, a NaN in the nested one.
    for graph_ids, op_name, value, device in [
        (("g0",), "Log", _f32(-np.inf, -0.5), GPU),
        (("g0", "g1"), "Sqrt", _f32(np.nan, 2.0), GPU),
    ]:
        tensor_id = GRAPH_OPS[op_name][3][0]
        summary = summarize(mode, tensor_id, value)
        w.write_trace(
            TraceEvent(
                graph_id=graph_ids[-1],
                op_name=op_name,
                output_slot=0,
                summary=summary,
                device_name=device,
            )
        )
        op_type = GRAPH_OPS[op_name][1]
        written.traces.append(WrittenTrace(graph_ids, op_name, op_type, 0, value, summary, device))

    # Traces in the batch form: one row per traced tensor of one graph call.
    batch = [("probs", _f32(0.25, 0.5)), ("Neg", _f32(1.5, 0.75))]
    if mode == "NO_TENSOR":
        matrix = np.zeros((len(batch), 0))
    elif mode == "FULL_TENSOR":  # a full-value row: the tensor as float64
        matrix = np.stack([v.astype(np.float64) for _, v in batch])
    else:
        matrix = np.stack([summary_row(mode, GRAPH_OPS[n][3][0], v) for n, v in batch])
    w.write_traces("g0", [n for n, _ in batch], [0, 0], matrix, device_name=CPU)
    for (op_name, value), row in zip(batch, matrix, strict=True):
        summary = None if mode == "NO_TENSOR" else row
        op_type = GRAPH_OPS[op_name][1]
        written.traces.append(WrittenTrace(("g0",), op_name, op_type, 0, value, summary, CPU))

    w.close()
    return written


def _open_tf(logdir: Path) -> DebugDataReader:
    reader = DebugDataReader(str(logdir))
    reader.update()
    return reader


# -- one dump per mode, everything TensorFlow can see of it ------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_tf_reads_executions(tmp_path: Path, mode: str) -> None:
    written = _write_dump(tmp_path, mode)
    with _open_tf(tmp_path) as reader:
        assert reader.tfdbg_run_id() == written.run_id
        assert reader.num_executions() == len(written.executions)
        executions = reader.executions()
        for i, (got, want) in enumerate(zip(executions, written.executions, strict=True)):
            where = f"execution {i} ({want.op_type})"
            assert got.op_type == want.op_type, where
            assert got.graph_id == want.graph_id, where
            assert got.num_outputs == len(want.output_ids), where
            assert got.input_tensor_ids == tuple(want.input_ids), where
            assert got.output_tensor_ids == tuple(want.output_ids), where
            assert got.output_tensor_device_ids == tuple(want.device_ids), where
            assert got.tensor_debug_mode == mode_enum(mode), where
            assert got.host_name == written.host_name, where

            if mode in SUMMARY_MODES:
                # One entry per output; None for the non-float output.
                got_values = [None if v is None else list(v) for v in got.debug_tensor_values]
                want_values = [None if s is None else s.tolist() for s in want.summaries]
                assert got_values == want_values, where
            else:
                assert got.debug_tensor_values is None, where

            tensors = reader.execution_to_tensor_values(got)
            if mode == "FULL_TENSOR":
                assert len(tensors) == len(want.values), where
                for t, v in zip(tensors, want.values, strict=True):
                    if v is None:
                        assert t is None, where
                    else:
                        assert t.dtype == v.dtype and t.shape == v.shape, where
                        np.testing.assert_array_equal(t, v, err_msg=where)
            elif mode == "NO_TENSOR":
                assert tensors == [], where

        # The digests (what TensorBoard lists) agree with the full records.
        digests = reader.executions(digest=True)
        assert [d.op_type for d in digests] == [e.op_type for e in written.executions]


@pytest.mark.parametrize("mode", MODES)
def test_tf_reads_stack_traces_and_source_files(tmp_path: Path, mode: str) -> None:
    written = _write_dump(tmp_path, mode)
    forward_site = (THIS_FILE, line_of("forward"), "_forward_site")
    backward_site = (THIS_FILE, line_of("backward"), "_backward_site")
    callers = {
        "forward": (THIS_FILE, line_of("call-forward"), "_write_dump"),
        "backward": (THIS_FILE, line_of("call-backward"), "_write_dump"),
    }
    with _open_tf(tmp_path) as reader:
        for execution, want in zip(reader.executions(), written.executions, strict=True):
            host, frames = reader.read_execution_stack_trace(execution)
            assert host == written.host_name
            # Outermost first: ... -> this test -> _write_dump -> the site.
            assert frames[-1] == (forward_site if want.site == "forward" else backward_site)
            assert frames[-2] == callers[want.site]
            assert frames[-3][0] == THIS_FILE
            assert frames[-3][2] == "test_tf_reads_stack_traces_and_source_files"
            assert all(isinstance(line, int) and line > 0 for _, line, _ in frames)

        # Graph ops carry the stack of their creation too.
        (log_op,) = [d for d in reader.graph_op_digests() if d.op_name == "Log"]
        host, frames = reader.read_graph_op_creation_stack_trace(log_op)
        assert host == written.host_name
        assert frames[-1] == forward_site

        # The source file list holds this file, with its lines.
        files = reader.source_file_list()
        assert (written.host_name, THIS_FILE) in files
        lines = reader.source_lines(written.host_name, THIS_FILE)
        assert lines == Path(THIS_FILE).read_text().splitlines()
        assert (
            lines[line_of("forward") - 1].strip() == "return writer.capture_stack()  # SITE:forward"
        )


@pytest.mark.parametrize("mode", MODES)
def test_tf_reads_traces(tmp_path: Path, mode: str) -> None:
    written = _write_dump(tmp_path, mode)
    with _open_tf(tmp_path) as reader:
        assert reader.num_graph_execution_traces() == len(written.traces)
        traces = reader.graph_execution_traces()
        for i, (got, want) in enumerate(zip(traces, written.traces, strict=True)):
            where = f"trace {i} ({want.op_name})"
            assert got.op_name == want.op_name, where
            assert got.op_type == want.op_type, where  # resolved through the graph
            assert got.output_slot == want.output_slot, where
            assert got.graph_id == want.graph_id, where
            assert tuple(got.graph_ids) == want.graph_ids, where
            assert got.tensor_debug_mode == mode_enum(mode), where
            assert got.device_name == want.device_name, where
            if mode in SUMMARY_MODES:
                assert want.summary is not None
                assert got.debug_tensor_value == tuple(want.summary.tolist()), where
            else:
                assert got.debug_tensor_value is None, where
            if mode == "FULL_TENSOR":
                value = reader.graph_execution_trace_to_tensor_value(got)
                assert want.summary is not None
                assert value.dtype == want.summary.dtype, where
                np.testing.assert_array_equal(value, want.summary, err_msg=where)
            # The symbolic tensor the trace is of, by the graph's own bookkeeping.
            tensor_id = reader.graph_execution_trace_to_tensor_id(got)
            assert tensor_id == GRAPH_OPS[want.op_name][3][want.output_slot], where

        digests = reader.graph_execution_traces(digest=True)
        assert [(d.op_name, d.op_type) for d in digests] == [
            (t.op_name, t.op_type) for t in written.traces
        ]


@pytest.mark.parametrize("mode", MODES)
def test_tf_reads_graphs_and_devices(tmp_path: Path, mode: str) -> None:
    _write_dump(tmp_path, mode)
    with _open_tf(tmp_path) as reader:
        outermost = reader.outermost_graphs()
        assert [g.graph_id for g in outermost] == ["g0"]
        outer = reader.graph_by_id("g0")
        assert outer.name == "loss"
        assert outer.outer_graph_id is None
        assert outer.inner_graph_ids == ["g1"]
        inner = reader.graph_by_id("g1")
        assert inner.name == "cond_true"
        assert inner.outer_graph_id == "g0"
        assert inner.inner_graph_ids == []

        for op_name, (graph_id, op_type, inputs, out_ids) in GRAPH_OPS.items():
            digest = reader.graph_by_id(graph_id).get_op_creation_digest(op_name)
            assert digest.op_type == op_type
            assert digest.graph_id == graph_id
            assert digest.input_names == (tuple(inputs) or None)  # TF's way to say "none"
            assert digest.output_tensor_ids == tuple(out_ids)
            assert digest.num_outputs == len(out_ids)
        assert outer.get_op_consumers("probs") == [(0, "Log", 0)]
        assert outer.get_op_consumers("Log") == [(0, "Neg", 0)]
        assert inner.get_op_consumers("x") == [(0, "Sqrt", 0)]
        assert [d.op_name for d in reader.graph_op_digests(op_type="Placeholder")] == ["probs", "x"]

        assert reader.device_name_map() == {1: CPU, 2: GPU}
        assert reader.device_name_by_id(1) == CPU


@pytest.mark.parametrize("mode", MODES)
def test_nanscope_and_tf_readers_agree(tmp_path: Path, mode: str) -> None:
    written = _write_dump(tmp_path, mode)
    ours = nanscope.open_dump(tmp_path)
    with _open_tf(tmp_path) as reader:
        assert ours.num_executions() == reader.num_executions() == len(written.executions)
        assert ours.num_graph_execution_traces() == reader.num_graph_execution_traces()
        assert [ours.execution(i).op_type for i in range(ours.num_executions())] == [
            e.op_type for e in reader.executions(digest=True)
        ]
        if mode == "FULL_HEALTH":
            # The ranges TensorFlow skipped are nanscope's to read, output by output.
            for i, want in enumerate(written.executions):
                expected = [r[11:].tolist() if (r := with_ranges(mode, sm, v)) is not None else None
                            for sm, v in zip(want.summaries, want.values, strict=True)]  # fmt: skip
                got = [list(r) if r is not None else None for r in ours.execution(i).output_ranges]
                assert got == expected, want.op_type
        assert [ours.trace(i).op_type for i in range(ours.num_graph_execution_traces())] == [
            t.op_type for t in reader.graph_execution_traces(digest=True)
        ]


@pytest.mark.parametrize("form", ["write_trace", "write_traces"])
def test_no_tensor_traces_hold_tf_placeholder(tmp_path: Path, form: str) -> None:
    """In NO_TENSOR mode TensorFlow stores an empty float32 tensor of shape [0] per trace."""
    w = DumpWriter(tmp_path, "NO_TENSOR", circular_buffer_size=-1, framework="test")
    _write_graphs(w, _forward_site(w))
    if form == "write_trace":
        w.write_trace(TraceEvent(graph_id="g0", op_name="Log", device_name=CPU))
    else:
        w.write_traces("g0", ["Log"], [0], np.zeros((1, 0)), device_name=CPU)
    w.close()
    with _open_tf(tmp_path) as reader:
        (trace,) = reader.graph_execution_traces()
        assert trace.debug_tensor_value is None
        value = reader.graph_execution_trace_to_tensor_value(trace)
        assert value is not None, "TensorFlow cannot parse the trace's tensor_proto"
        assert value.dtype == np.float32 and value.shape == (0,)


# -- a circular dump ---------------------------------------------------------------------------


@pytest.mark.parametrize("origin_window", [2, 100])
def test_tf_reads_circular_dump(tmp_path: Path, origin_window: int) -> None:
    """20 executions and traces into buffers of 5, the 8th of each non-finite."""
    w = DumpWriter(
        tmp_path, "FULL_HEALTH", circular_buffer_size=5, framework="test",
        origin_window=origin_window,
    )  # fmt: skip
    stack = _forward_site(w)
    dev = w.register_device(CPU)
    _write_graphs(w, stack)
    bad_id = 8
    for tensor_id in range(1, 21):
        value = _f32(1.0, np.nan) if tensor_id == bad_id else _f32(1.0, 2.0)
        w.write_execution(
            ExecutionEvent(
                op_type=f"op{tensor_id:02d}",
                input_tensor_ids=[tensor_id - 1],
                output_tensor_ids=[tensor_id],
                output_device_ids=[dev],
                summaries=[summarize("FULL_HEALTH", tensor_id, value)],
                stack=stack,
                step=tensor_id,
            )
        )
        op_name = "Log" if tensor_id == bad_id else "Neg"
        w.write_trace(
            TraceEvent(
                graph_id="g0",
                op_name=op_name,
                summary=summarize("FULL_HEALTH", 1000 + tensor_id, value),
                device_name=CPU,
                step=tensor_id,
            )
        )
    w.close()

    ours = nanscope.open_dump(tmp_path)
    with _open_tf(tmp_path) as reader:
        executions = reader.executions()
        kept = [e.output_tensor_ids[0] for e in executions]
        assert bad_id in kept
        assert kept == sorted(kept)
        assert kept[-5:] == [16, 17, 18, 19, 20]  # the most recent ones, as in TensorFlow
        assert len(kept) < 20  # the oldest ones are gone
        (bad,) = [e for e in executions if e.output_tensor_ids == (bad_id,)]
        assert bad.debug_tensor_values[0][7] == 1.0  # one NaN

        traces = reader.graph_execution_traces()
        kept_traces = [int(t.debug_tensor_value[0]) - 1000 for t in traces]
        assert bad_id in kept_traces
        assert kept_traces[-5:] == [16, 17, 18, 19, 20]
        (bad_trace,) = [t for t in traces if t.op_name == "Log"]
        assert bad_trace.op_type == "Log"
        assert bad_trace.debug_tensor_value[7] == 1.0

        # Both readers see the same events.
        assert [ours.execution(i).op_type for i in range(ours.num_executions())] == [
            e.op_type for e in executions
        ]
        assert ours.num_graph_execution_traces() == len(traces)


# -- a multi-process dump ----------------------------------------------------------------------


def test_tf_reads_multi_process_dump(tmp_path: Path) -> None:
    """Two ranks of one run write two file sets into one directory.

    TensorFlow's reader takes executions, graphs and stack frames from the
    earliest file set only, and traces from all file sets.
    """
    counts = {0: (3, 2), 1: (4, 3)}  # rank: (executions, traces)
    writers = {}
    for rank in (0, 1):
        writers[rank] = DumpWriter(
            tmp_path, "CONCISE_HEALTH", circular_buffer_size=-1, framework="test",
            run_id="interop-run", rank=rank, world_size=2,
        )  # fmt: skip
        time.sleep(0.01)  # rank 0's file set is the earliest
    for rank, w in writers.items():
        stack = _backward_site(w)
        dev = w.register_device(f"/job:worker/replica:0/task:{rank}/device:CPU:0")
        _write_graphs(w, stack)  # the same program: the same graph on every rank
        n_exec, n_traces = counts[rank]
        for i in range(n_exec):
            value = _f32(-np.inf, 1.0) if i == 1 else _f32(1.0, 2.0)
            w.write_execution(
                ExecutionEvent(
                    op_type=f"rank{rank}.op{i}",
                    input_tensor_ids=[i],
                    output_tensor_ids=[i + 1],
                    output_device_ids=[dev],
                    summaries=[summarize("CONCISE_HEALTH", i + 1, value)],
                    stack=stack,
                )
            )
        matrix = np.stack(
            [summary_row("CONCISE_HEALTH", 100 * rank + i, _f32(1.0)) for i in range(n_traces)]
        )
        w.write_traces("g0", ["Neg"] * n_traces, [0] * n_traces, matrix, device_name=CPU)
    for w in writers.values():
        w.close()

    assert len(list(tmp_path.glob("*.metadata"))) == 2
    with _open_tf(tmp_path) as reader:
        assert reader.tfdbg_run_id() == "interop-run"
        assert reader.num_executions() == counts[0][0]
        assert [e.op_type for e in reader.executions(digest=True)] == [
            f"rank0.op{i}" for i in range(counts[0][0])
        ]
        assert reader.device_name_map() == {1: "/job:worker/replica:0/task:0/device:CPU:0"}
        _, frames = reader.read_execution_stack_trace(reader.executions()[0])
        assert frames[-1] == (THIS_FILE, line_of("backward"), "_backward_site")

        traces = reader.graph_execution_traces()
        assert len(traces) == counts[0][1] + counts[1][1]
        assert sorted(int(t.debug_tensor_value[0]) for t in traces) == [0, 1, 100, 101, 102]
        assert {t.op_type for t in traces} == {"Neg"}
        assert {t.locator[0] for t in traces} == {0, 1}  # from both file sets
