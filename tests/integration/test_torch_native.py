"""The native PyTorch recorder: choosing it, threads, forked workers, summaries against numpy."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
import torch

import nanscope
from nanscope.backends.torch.native import native_library
from nanscope.backends.torch.session import TorchDumpSession
from nanscope.reader import Execution

from ..helpers import summaries_of, summary_of, torch_recorder

needs_native = pytest.mark.skipif(
    torch_recorder() != "native", reason="the native recorder is not in use"
)


def test_the_recorder_is_chosen_by_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NANSCOPE_TORCH_RECORDER", "python")
    with nanscope.enable_dump_debug_info(tmp_path / "a") as s:
        assert isinstance(s._session, TorchDumpSession)
        assert s._session.recorder == "python"
    monkeypatch.setenv("NANSCOPE_TORCH_RECORDER", "fast")
    with pytest.raises(ValueError, match="use auto, native or python"):
        nanscope.enable_dump_debug_info(tmp_path / "b")
    monkeypatch.delenv("NANSCOPE_TORCH_RECORDER")
    with nanscope.enable_dump_debug_info(tmp_path / "c") as s:
        assert isinstance(s._session, TorchDumpSession)
        assert s._session.recorder == torch_recorder()


@needs_native
def test_ci_builds_the_native_recorder() -> None:
    # `make test` builds it first; a machine that cannot falls back, loudly.
    assert native_library() is not None


LAYOUTS = {
    "contiguous": lambda x: x * 1,
    "transposed": lambda x: x.t() * 1,  # an op's non-contiguous result
    "strided copy": lambda x: x[::2, 1::3].clone(),
    "expanded input": lambda x: x[:, :1].expand(64, 40) * 1,
    "transposed view": lambda x: x.t(),  # a view: counted in memory order, or from its base
    "empty": lambda x: x[:0] * 1,
    "scalar": lambda x: x.sum(),
}
FLOAT_DTYPES = {torch.float32: 1, torch.float64: 2, torch.float16: 19, torch.bfloat16: 14}


@needs_native
@pytest.mark.parametrize("dtype", list(FLOAT_DTYPES), ids=str)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_summaries_match_numpy(tmp_path: Path, dtype: torch.dtype, layout: str) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 48, generator=g)
    x[3, 5], x[7, 1], x[9, 0], x[0, 0] = float("nan"), float("inf"), float("-inf"), 0.0
    x = x.to(dtype)
    with nanscope.enable_dump_debug_info(tmp_path, "FULL_HEALTH", circular_buffer_size=-1):
        out = LAYOUTS[layout](x)
    last = nanscope.open_dump(tmp_path).executions()[-1]
    (got,) = summaries_of(last)
    v = out.double().numpy().ravel()
    want = [
        -1, -1, FLOAT_DTYPES[dtype], out.dim(), v.size,
        np.count_nonzero(np.isneginf(v)), np.count_nonzero(np.isposinf(v)),
        np.count_nonzero(np.isnan(v)), np.count_nonzero(np.isfinite(v) & (v < 0)),
        np.count_nonzero(v == 0), np.count_nonzero(np.isfinite(v) & (v > 0)),
    ]  # fmt: skip
    np.testing.assert_array_equal(got, np.array(want, dtype=np.float64))


# Values at the edges of the count kernel's bit tricks: both zeros, the smallest and
# largest finite magnitudes, both infinities and NaNs of both signs.
EDGES = np.array(
    [0.0, -0.0, 1e-45, -1e-45, 1.17e-38, -3.4028235e38, 3.4028235e38, np.inf, -np.inf,
     np.nan, -np.nan, 1.0, -2.5],
    dtype=np.float32,
)  # fmt: skip


LENGTHS = [1, 13, 15, 16, 17, 63, 64, 65, 127, 1000, 100_003]


def _edge_values(n: int) -> np.ndarray:
    """``n`` float32 values of every magnitude, with the edges at the start, in the middle
    and at the end (the tail after the last whole step), and all of them inside the steps."""
    rng = np.random.default_rng(n)
    v = (rng.standard_normal(n) * 10.0 ** rng.integers(-40, 38, n)).astype(np.float32)
    for at in (0, n // 2, n - 1):
        v[at] = EDGES[(at * 7 + n) % len(EDGES)]
    v[rng.integers(0, n, n // 10)] = 0.0
    if n >= 2 * len(EDGES):
        v[n // 2 : n // 2 + len(EDGES)] = EDGES
    return v


def _assert_counts_match(execution: Execution, v: np.ndarray) -> None:
    """The execution's FULL_HEALTH counts and its output's ranges, against numpy's."""
    w = v.astype(np.float64)
    finite = w[np.isfinite(w)]
    want = [
        np.count_nonzero(np.isneginf(w)), np.count_nonzero(np.isposinf(w)),
        np.count_nonzero(np.isnan(w)), np.count_nonzero(finite < 0),
        np.count_nonzero(w == 0), np.count_nonzero(finite > 0),
    ]  # fmt: skip
    np.testing.assert_array_equal(summary_of(execution)[5:11], np.array(want, dtype=np.float64))
    nonzero = np.abs(finite[finite != 0])
    hi = float(np.abs(finite).max()) if finite.size else 0.0
    lo = float(nonzero.min()) if nonzero.size else float("inf")
    assert execution.output_ranges[0] == (hi, lo), (len(v), execution.output_ranges[0], hi, lo)


@needs_native
@pytest.mark.parametrize("n", LENGTHS)
def test_counts_and_ranges_of_float32_match_numpy_at_every_length(tmp_path: Path, n: int) -> None:
    """The float32 count loop this CPU uses (16 values a step with AVX-512, 8 with AVX2, a
    tail after) against numpy: counts and the largest and smallest non-zero finite |x|."""
    v = _edge_values(n)
    x = torch.from_numpy(v.copy())
    with nanscope.enable_dump_debug_info(tmp_path, "FULL_HEALTH", circular_buffer_size=-1):
        x.clone()
    last = nanscope.open_dump(tmp_path).executions()[-1]
    assert last.op_type == "aten.clone.default"
    _assert_counts_match(last, v)


@needs_native
@pytest.mark.parametrize("isa", ["avx512", "avx2", "portable"])
def test_each_count_loop_matches_numpy(tmp_path: Path, isa: str) -> None:
    """Each of the float32 count loops, chosen by NANSCOPE_COUNT_ISA, on every length: the
    loops a machine of another kind would use are tested here too. (A CPU without the
    instructions runs the portable loops instead.)"""
    values = {n: _edge_values(n) for n in LENGTHS}
    np.savez(tmp_path / "values.npz", *(values[n] for n in LENGTHS))  # arr_0, arr_1, ...
    script = f"""
import numpy as np, torch, nanscope
data = np.load({str(tmp_path / "values.npz")!r})
xs = [torch.from_numpy(data[f"arr_{{i}}"].copy()) for i in range({len(LENGTHS)})]
with nanscope.enable_dump_debug_info({str(tmp_path / "dump")!r}, "FULL_HEALTH", circular_buffer_size=-1):
    for x in xs:
        x.clone()
"""
    env = {**os.environ, "NANSCOPE_COUNT_ISA": isa, "NANSCOPE_TORCH_RECORDER": "native"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    clones = [
        e for e in nanscope.open_dump(tmp_path / "dump").executions()
        if e.op_type == "aten.clone.default"
    ]  # fmt: skip
    assert len(clones) == len(LENGTHS)
    for n, execution in zip(LENGTHS, clones, strict=True):
        _assert_counts_match(execution, values[n])


@needs_native
def test_threads_started_before_recording_are_recorded(tmp_path: Path) -> None:
    go, done = threading.Event(), threading.Event()

    def worker() -> None:
        go.wait(10)
        torch.log(torch.zeros(3))  # -inf, on a thread that predates recording
        done.set()

    t = threading.Thread(target=worker)
    t.start()
    with nanscope.enable_dump_debug_info(tmp_path, "FULL_HEALTH"):
        go.set()
        assert done.wait(10)
    t.join()
    r = nanscope.open_dump(tmp_path)
    first = r.first_nonfinite(nanscope.reader.EXECUTIONS)
    assert first is not None and r.execution(first.index).op_type == "aten.log.default"


def _profiled_ops(fn: object) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()  # type: ignore[operator]
    return [e.name for e in prof.events()]


@needs_native
def test_each_op_is_recorded_once_and_the_profiler_sees_ops_again_after_recording(
    tmp_path: Path,
) -> None:
    """The recording thread records by its dispatch key with RecordFunction off (so that
    the RecordFunction callback does not see its ops a second time); a thread started
    while recording does the same. Once recording ends, torch.profiler sees that thread's
    ops again."""
    x = torch.ones(3)

    def work() -> None:
        torch.exp(x)
        torch.log(x)

    with nanscope.enable_dump_debug_info(tmp_path, "FULL_HEALTH"):
        work()
        t = threading.Thread(target=work)
        t.start()
        t.join()
    ops = [e.op_type for e in nanscope.open_dump(tmp_path).executions()]
    assert ops.count("aten.exp.default") == 2 and ops.count("aten.log.default") == 2
    assert "aten::exp" in _profiled_ops(work)


@needs_native
def test_an_inf_born_under_vmap_is_found_with_the_whole_batch_counted(tmp_path: Path) -> None:
    """Under vmap an op's output is a batched wrapper without memory of its own: the
    recorder counts the batch it wraps, so a -inf born there is the first Inf/NaN (it
    was recorded with no summary before, and lost once its inputs were asked for)."""
    x = torch.randn(5, 3)
    zero_rows = torch.tensor([0, 2])
    x[zero_rows] = 0.0
    with nanscope.enable_dump_debug_info(tmp_path, "FULL_HEALTH"):
        torch.func.vmap(lambda r: torch.log(r * r).sum())(x)
    r = nanscope.open_dump(tmp_path)
    first = r.first_nonfinite(nanscope.reader.EXECUTIONS)
    assert first is not None
    log = r.execution(first.index)
    assert log.op_type == "aten.log.default"
    oracle = torch.log(x * x)  # the same op without vmap: the whole batch
    row = summary_of(log)
    assert row[4] == oracle.numel()
    assert row[5] == int(torch.isneginf(oracle).sum()) == 6


@needs_native
def test_dataloader_workers_are_not_recorded_and_do_not_hang(tmp_path: Path) -> None:
    program = f"""
import torch, nanscope
from torch.utils.data import DataLoader, Dataset

class Squares(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return torch.full((4,), float(i)).sqrt()  # ops in the forked worker

with nanscope.enable_dump_debug_info({str(tmp_path)!r}, "FULL_HEALTH", circular_buffer_size=-1):
    total = 0.0
    for batch in DataLoader(Squares(), batch_size=8, num_workers=2):
        total += float(batch.sum())
print("total", total)
"""
    proc = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "total" in proc.stdout
    ops = [e.op_type for e in nanscope.open_dump(tmp_path).executions()]
    assert "aten.sum.default" in ops  # the main process's ops
    assert "aten.sqrt.default" not in ops  # the workers' ops (other processes)


@needs_native
@pytest.mark.parametrize(
    "mode", ["NO_TENSOR", "CURT_HEALTH", "CONCISE_HEALTH", "FULL_HEALTH", "SHAPE", "FULL_TENSOR"]
)
def test_records_encoded_in_cpp_are_canonical_protobuf(tmp_path: Path, mode: str) -> None:
    """The C++ encoder writes exactly what protobuf itself would for the same message."""
    from nanscope.format.files import EXECUTION
    from nanscope.format.proto import debug_event_pb2 as pb
    from tests.helpers import iter_payloads

    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 6)
    with nanscope.enable_dump_debug_info(tmp_path, mode, circular_buffer_size=-1):
        for _ in range(3):
            loss = torch.log(torch.softmax(model(x), 1) * 0).sum()  # -inf: input summaries too
            opt.zero_grad()
            loss.backward()
            opt.step()
    (path,) = tmp_path.glob(f"*{EXECUTION}")
    payloads = list(iter_payloads(path.read_bytes(), str(path)))
    assert len(payloads) > 50
    events = [pb.DebugEvent.FromString(p) for p in payloads]
    for p, ev in zip(payloads, events, strict=True):
        assert ev.SerializeToString() == p
    execs = nanscope.open_dump(tmp_path).executions()
    assert [e.sequence for e in execs] == list(range(1, len(execs) + 1))
    assert {e.phase for e in execs} == {1, 2, 3} and any(e.forward_sequence for e in execs)
    assert any(e.module_path == "0 (Linear)" for e in execs)


@needs_native
def test_batches_framed_in_cpp_agree_with_their_records(tmp_path: Path) -> None:
    """The C++ half frames records, builds their sidecar rows and combines the range
    history's updates per module, phase and step: all as the Python writer would, event
    by event, from the records themselves."""
    from nanscope.events._history import RangeHistory
    from nanscope.format import sidecar
    from nanscope.format.files import EXECUTION, INDEX_SUFFIX, RANGES
    from nanscope.format.headroom import combine
    from tests.helpers import iter_payloads

    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 6)
    with nanscope.enable_dump_debug_info(tmp_path, "FULL_HEALTH", circular_buffer_size=-1) as s:
        for step in range(6):
            s.set_step(step)
            scale = 0.0 if step == 4 else 1.0  # -inf at step 4: non-finite rows too
            loss = torch.log(torch.softmax(model(x), 1) * scale).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    # The sidecar as written, chunk by chunk (the reader would check it against the records).
    (index,) = tmp_path.glob(f"*{EXECUTION}{INDEX_SUFFIX}")
    tables, strings = [], [""]
    for payload in iter_payloads(index.read_bytes(), str(index)):
        table, new = sidecar.decode_chunk(payload)
        tables.append(table) if table is not None else strings.extend(new or [])
    rows = np.concatenate(tables)
    (data,) = tmp_path.glob(f"*{EXECUTION}")
    framed = data.read_bytes()
    assert int(rows["offset"][-1] + rows["length"][-1]) == len(framed)
    assert (rows["offset"][1:] == rows["offset"][:-1] + rows["length"][:-1]).all()
    execs = nanscope.open_dump(tmp_path).executions()
    assert len(execs) == len(rows) > 100
    history = RangeHistory()
    for row, e in zip(rows, execs, strict=True):
        assert strings[int(row["name"])] == e.op_type
        assert (int(row["sequence"]), int(row["step"]), int(row["phase"])) == (
            e.sequence, e.step, e.phase,
        )  # fmt: skip
        assert int(row["slot"]) == e.num_outputs
        h = e.health
        assert (int(row["size"]), int(row["neg_inf"]), int(row["pos_inf"]), int(row["nan"])) == (
            h.size, h.neg_inf, h.pos_inf, h.nan,
        )  # fmt: skip
        dtypes = [int(v[2]) if v is not None else 0 for v in e.debug_tensor_values or ()]
        ranges = combine(dtypes, e.output_ranges)
        if ranges.dtype:
            history.add(e.module_path, e.phase, e.step, ranges.amax, ranges.amin, ranges.dtype)
    assert int((rows["nonfinite"] == 1).sum()) > 0
    (path,) = tmp_path.glob(f"*{RANGES}")
    assert path.read_bytes() == history.to_bytes()
