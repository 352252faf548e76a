"""The dump writer: encoding, circular buffers, the protected origin window, flushing."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import numpy as np
import pytest

import nanscope
from nanscope.events import DumpWriter, ExecutionEvent, Graph, GraphOp, Phase, TraceEvent
from nanscope.events._encode import Encoder
from nanscope.format import files
from nanscope.format.modes import TensorDebugMode
from nanscope.format.proto import debug_event_pb2 as pb
from tests.helpers import iter_payloads, summary_to_proto


def full_health(nonfinite: int = 0, size: int = 10) -> np.ndarray:
    return np.array([-1, -1, 1, 1, size, nonfinite, 0, 0, 3, 3, size - 6 - nonfinite], dtype=float)


def events_in(path: Path) -> list[pb.DebugEvent]:
    return [pb.DebugEvent.FromString(p) for p in iter_payloads(path.read_bytes(), str(path))]


def only_set(logdir: Path) -> files.FileSet:
    (fs,) = files.discover(logdir)
    return fs


def test_hand_encoded_execution_equals_protobuf() -> None:
    stacks: list[tuple[str, ...]] = [("1", "2", "a")]
    enc = Encoder(TensorDebugMode.FULL_HEALTH, "host", stacks)
    v = full_health(2)
    ev = ExecutionEvent(
        op_type="aten.mul.Tensor",
        output_tensor_ids=[7],
        input_tensor_ids=[5, -1],
        output_device_ids=[1],
        summaries=[v, None],
        input_summaries=[v],
        num_outputs=2,
        stack=0,
        module_path="model.fc2",
        phase=Phase.BACKWARD,
        step=3,
        forward_sequence=12,
        forward_stack=0,
    )
    payload, h, _ = enc.execution(ev, sequence=42, wall_time=1234.5)
    expected = pb.DebugEvent(wall_time=1234.5, step=3)
    ex = expected.execution
    ex.op_type = "aten.mul.Tensor"
    ex.num_outputs = 2
    ex.input_tensor_ids.extend([5, -1])
    ex.output_tensor_ids.append(7)
    ex.tensor_debug_mode = pb.FULL_HEALTH
    ex.tensor_protos.append(summary_to_proto(v))
    ex.tensor_protos.add()
    ex.code_location.host_name = "host"
    ex.code_location.stack_frame_ids.extend(["1", "2", "a"])
    ex.output_tensor_device_ids.append(1)
    ex.module_path = "model.fc2"
    ex.phase = pb.PHASE_BACKWARD
    ex.forward_sequence = 12
    ex.forward_code_location.CopyFrom(ex.code_location)
    ex.sequence = 42
    ex.input_tensor_protos.append(summary_to_proto(v))
    assert payload == expected.SerializeToString()
    assert h.nonfinite == 1 and h.neg_inf == 2 and h.size == 10


@pytest.mark.parametrize("batch", [False, True])
def test_hand_encoded_trace_equals_protobuf(batch: bool) -> None:
    enc = Encoder(TensorDebugMode.CONCISE_HEALTH, "host", [])
    v = np.array([3, 8, 0, 1, 0], dtype=float)
    if batch:
        payloads, health = enc.trace_batch("g", ["op"], [1], v[None, :], "dev", 2, 9, 5.0)
        payload = payloads[0]
        assert health[0].tolist() == [8, 0, 1, 0, 1]
    else:
        payload = enc.trace(TraceEvent("g", "op", 1, v, "dev", step=2), 9, 5.0)
    expected = pb.DebugEvent(wall_time=5.0, step=2)
    tr = expected.graph_execution_trace
    tr.tfdbg_context_id, tr.op_name, tr.output_slot = "g", "op", 1
    tr.tensor_debug_mode = pb.CONCISE_HEALTH
    tr.tensor_proto.CopyFrom(summary_to_proto(v))
    tr.device_name = "dev"
    tr.sequence = 9
    assert payload == expected.SerializeToString()


def test_files_metadata_and_interning(tmp_path: Path) -> None:
    with DumpWriter(tmp_path, "CURT_HEALTH", -1, framework="unit", rank=3, run_id="r1") as w:
        for _ in range(3):
            sid = w.capture_stack()  # the same line three times: one stack
            w.write_execution(ExecutionEvent("op", [1], summaries=[np.array([-1, 0.0])], stack=sid))
        assert w.register_device("cpu") == 1 and w.register_device("gpu") == 2
        assert w.register_device("cpu") == 1
    fs = only_set(tmp_path)
    # <host>-rank<R>-pid<P>-<random tag>: two processes of one rank never share a name.
    assert re.fullmatch(rf".+-rank3-pid{os.getpid()}-[0-9a-f]{{6}}", fs.host), fs.host
    (meta,) = events_in(fs.path("metadata"))
    md = meta.debug_metadata
    assert (md.file_version, md.tfdbg_run_id, md.framework) == ("debug.Event:1", "r1", "unit")
    assert md.process_rank == 3 and md.tensor_debug_mode == pb.CURT_HEALTH
    frames = events_in(fs.path("stack_frames"))
    sources = events_in(fs.path("source_files"))
    # Each frame and file written once, files before the frames that use them.
    assert len({f.stack_frame_with_id.id for f in frames}) == len(frames)
    paths = [s.source_file.file_path for s in sources]
    assert len(set(paths)) == len(paths) and __file__ in paths
    mine = sources[paths.index(__file__)].source_file
    assert mine.lines == Path(__file__).read_text().splitlines()  # the user's file is snapshotted
    assert all(
        not s.source_file.lines for s in sources if "site-packages" in s.source_file.file_path
    )
    execs = events_in(fs.path("execution"))
    assert (
        len(execs) == 3
        and len({tuple(e.execution.code_location.stack_frame_ids) for e in execs}) == 1
    )
    assert [e.execution.sequence for e in execs] == [1, 2, 3]
    devices = [e.debugged_device for e in events_in(fs.path("graphs"))]
    assert [(d.device_id, d.device_name) for d in devices] == [(1, "cpu"), (2, "gpu")]


def test_circular_buffer_keeps_last_n_like_tensorflow(tmp_path: Path) -> None:
    with DumpWriter(tmp_path, "FULL_HEALTH", 5, origin_window=2) as w:
        for i in range(20):
            w.write_execution(ExecutionEvent("op", [i], summaries=[full_health()]))
    seqs = [e.execution.sequence for e in events_in(only_set(tmp_path).path("execution"))]
    assert seqs == list(range(16, 21))


def test_first_nonfinite_event_and_its_window_survive_eviction(tmp_path: Path) -> None:
    with DumpWriter(tmp_path, "FULL_HEALTH", 5, origin_window=2) as w:
        for i in range(1, 101):
            w.write_execution(ExecutionEvent("op", [i], summaries=[full_health(i in (40, 41, 90))]))
            w.write_trace(TraceEvent("g", "op", 0, full_health(i >= 60)))
    fs = only_set(tmp_path)
    seqs = [e.execution.sequence for e in events_in(fs.path("execution"))]
    # 2 before the first non-finite (#40), #40, 2 after, then the 5 most recent.
    assert seqs == [38, 39, 40, 41, 42, 96, 97, 98, 99, 100]
    tseqs = [e.graph_execution_trace.sequence for e in events_in(fs.path("graph_execution_traces"))]
    assert tseqs == [58, 59, 60, 61, 62, 96, 97, 98, 99, 100]


def test_origin_window_early_in_run_keeps_older_events_up_to_capacity(tmp_path: Path) -> None:
    # The run ends right after the first NaN: nothing TensorFlow would keep is lost.
    with DumpWriter(tmp_path, "FULL_HEALTH", 5, origin_window=1) as w:
        for i in range(1, 9):
            w.write_execution(ExecutionEvent("op", [i], summaries=[full_health(i == 8)]))
    seqs = [e.execution.sequence for e in events_in(only_set(tmp_path).path("execution"))]
    assert seqs == [3, 4, 5, 6, 7, 8]


def test_negative_buffer_keeps_everything(tmp_path: Path) -> None:
    with DumpWriter(tmp_path, "NO_TENSOR", -1) as w:
        for i in range(2000):
            w.write_execution(ExecutionEvent("op", [i]))
    assert len(events_in(only_set(tmp_path).path("execution"))) == 2000


def test_many_threads_write_concurrently(tmp_path: Path) -> None:
    with DumpWriter(tmp_path, "FULL_HEALTH", -1) as w:

        def work(k: int) -> None:
            for i in range(500):
                w.write_execution(ExecutionEvent(f"op{k}", [i], summaries=[full_health()]))
                w.write_trace(TraceEvent("g", f"n{k}", 0, full_health()))

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    fs = only_set(tmp_path)
    execs = events_in(fs.path("execution"))
    assert sorted(e.execution.sequence for e in execs) == list(range(1, 2001))
    assert len(events_in(fs.path("graph_execution_traces"))) == 2000


def test_a_closed_writer_leaves_no_thread_behind(tmp_path: Path) -> None:
    """Recording switched on and off many times in one process (a notebook, a trainer's
    callback) must not leave a thread per session; nor may a writer's thread outlive its
    close, where it could still be running when the interpreter shuts down."""
    before = set(threading.enumerate())  # other tests' threads may come and go

    def ours() -> list[str]:
        return sorted(
            t.name
            for t in threading.enumerate()
            if t not in before and t.name.startswith("nanscope-")
        )

    for i in range(5):
        with DumpWriter(tmp_path / str(i), "FULL_HEALTH", -1) as w:
            w.write_execution(ExecutionEvent("op", [1], summaries=[full_health()]))
            assert {"nanscope-disk", "nanscope-writer"} <= set(ours())
    for _ in range(100):  # the disk thread returns just after the writer's last wait
        if not ours():
            break
        threading.Event().wait(0.02)
    assert ours() == []
    assert all(len(events_in(only_set(tmp_path / str(i)).path("execution"))) == 1 for i in range(5))


def test_flush_makes_events_readable_while_running(tmp_path: Path) -> None:
    w = DumpWriter(tmp_path, "FULL_HEALTH", 100, flush_interval=3600)
    try:
        w.write_graph(Graph("g", "f"))
        w.write_graph_op(GraphOp("g", "Log", "Log"))
        w.write_execution(ExecutionEvent("op", [1], summaries=[full_health(1)]))
        assert w.flush()
        with nanscope.open_dump(tmp_path) as r:
            assert r.num_executions() == 1 and r.first_nonfinite() is not None
            assert r.graph_op("g", "Log") is not None
        w.write_execution(ExecutionEvent("op", [2], summaries=[full_health()]))
        assert w.flush()
        with nanscope.open_dump(tmp_path) as r:
            assert r.num_executions() == 2
    finally:
        w.close()


def test_graph_ops_without_tensor_ids_get_symbolic_ones(tmp_path: Path) -> None:
    """TensorFlow's reader counts an op's outputs by its ``output_tensor_ids``: an op written
    with none (a JAX equation, an FX node) gets one fresh id per output; given ids are kept."""
    with DumpWriter(tmp_path, "FULL_HEALTH", -1) as w:
        w.write_graph(Graph("g", "f"))
        w.write_graph_op(GraphOp("g", "Placeholder", "x"))
        w.write_graph_op(GraphOp("g", "split", "split_1", input_names=["x:0"], num_outputs=3))
        w.write_graph_op(GraphOp("g", "Log", "Log", output_tensor_ids=[70]))
        w.write_graph_op(GraphOp("g", "NoOp", "init", num_outputs=0))
        w.write_graph_op(GraphOp("g", "neg", "neg_2", input_names=["split_1:2"]))
    with nanscope.open_dump(tmp_path) as r:
        ops = {name: r.graph_op("g", name) for name in ("x", "split_1", "Log", "init", "neg_2")}
        ids = {name: (op.num_outputs, op.output_tensor_ids) for name, op in ops.items() if op}
    assert ids == {
        "x": (1, (1,)),
        "split_1": (3, (2, 3, 4)),
        "Log": (1, (70,)),
        "init": (0, ()),
        "neg_2": (1, (5,)),
    }


def test_periodic_flush_without_any_call(tmp_path: Path) -> None:
    w = DumpWriter(tmp_path, "FULL_HEALTH", -1, flush_interval=0.1)
    try:
        w.write_execution(ExecutionEvent("op", [1], summaries=[full_health()]))
        deadline = threading.Event()
        for _ in range(50):
            with nanscope.open_dump(tmp_path) as r:
                if r.num_executions() == 1:
                    break
            deadline.wait(0.05)
        else:
            pytest.fail("the event never reached the disk without a flush call")
    finally:
        w.close()


def test_unknown_mode_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown tensor debug mode 'FULLHEALTH'"):
        DumpWriter(tmp_path, "FULLHEALTH")


@pytest.mark.parametrize("capacity", [-1, 3])
def test_batched_traces_reach_the_file(tmp_path: Path, capacity: int) -> None:
    m = np.stack([full_health(i % 2) for i in range(5)])
    with DumpWriter(tmp_path, "FULL_HEALTH", capacity, origin_window=0) as w:
        first = w.write_traces("g", [f"n{i}" for i in range(5)], [0] * 5, m, step=7)
    assert first == 1
    traces = [
        e.graph_execution_trace
        for e in events_in(only_set(tmp_path).path("graph_execution_traces"))
    ]
    expected = [1, 2, 3, 4, 5] if capacity < 0 else [2, 3, 4, 5]  # the origin (#2) and the last 3
    assert [t.sequence for t in traces] == expected
    assert [t.op_name for t in traces] == [f"n{s - 1}" for s in expected]
    assert traces[-1].tensor_proto.tensor_content == m[4].tobytes()
