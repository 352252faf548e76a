"""Statistics mode: each float output's mean, std, L2 and bits hash, recorded beside the counts.

The oracle is a FULL_TENSOR recording of the same deterministic program: every
output's whole value, from which :func:`nanscope.format.statistics.statistics_of`
recomputes what the FULL_HEALTH recording with ``statistics=True`` must hold. Both
PyTorch recorders are checked (the native one where it can be built).
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import nanscope
from nanscope.format.statistics import Statistics, bits_hash, statistics_of
from nanscope.reader import Execution, GraphExecutionTrace

from ..helpers import torch_recorder

DT_BFLOAT16 = 14

RECORDERS = ["python", "native"]


@pytest.fixture(params=RECORDERS)
def recorder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which PyTorch recorder the test records with (the native one where it builds)."""
    if request.param == "native" and torch_recorder() != "native":
        pytest.skip("the native recorder is not in use")
    monkeypatch.setenv("NANSCOPE_TORCH_RECORDER", request.param)
    return str(request.param)


def program() -> None:
    """A small training loop with the outputs statistics must cover: float32 layers,
    a bfloat16 round trip, a float64 op, broadcast and transposed views, -inf, NaN."""
    torch.manual_seed(0)  # the layers' initialisation, recorded too
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(12, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 4)
    )
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + 0.05)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 12, generator=g) * 2 + 1
    y = torch.randint(0, 4, (8,), generator=g)
    for _ in range(2):
        h = model(x)
        h = h.bfloat16().float() + h.t().t() * 0.5  # a bfloat16 output, a transposed view
        loss = torch.nn.functional.cross_entropy(h, y) + h.double().mean().float() * 0
        loss.backward()
        opt.step()
        opt.zero_grad()
    col = x[:, :1].expand(8, 12) * 1.5  # an op's input broadcast
    logs = torch.log(torch.relu(col - 1.0))  # -inf where relu gave 0, NaN nowhere
    torch.sqrt(logs)  # NaN for the negative logs
    torch.zeros(3, 5)  # all zeros: mean, std 0


def record(logdir: Path, mode: str, statistics: bool, run: Callable[[], None] = program) -> None:
    with nanscope.enable_dump_debug_info(
        logdir, mode, circular_buffer_size=-1, statistics=statistics
    ):
        run()


def _close(got: float, want: float, scale: float) -> bool:
    if math.isnan(want):
        return math.isnan(got)
    return abs(got - want) <= 1e-9 * max(abs(want), scale, 1e-30)


def expected(value: np.ndarray, dtype: int) -> Statistics:
    """The statistics a recorder must give an output whose FULL_TENSOR value is ``value``
    (a bfloat16 output is read back widened to float32, exactly: its bits are restored)."""
    want = statistics_of(value)
    if dtype == DT_BFLOAT16:
        bits = torch.from_numpy(np.array(value)).bfloat16().view(torch.int16)
        want = want._replace(hash=bits_hash(bits.numpy()))
    return want


def compare(with_stats: list[Execution], full: list[Execution]) -> int:
    """Checks every output's statistics against its FULL_TENSOR value; returns how many."""
    assert [e.op_type for e in with_stats] == [e.op_type for e in full]
    checked = 0
    for a, b in zip(with_stats, full, strict=True):
        summaries = a.debug_tensor_values or ()
        for slot, summary in enumerate(summaries):
            if summary is None or len(summary) < 11:
                continue
            # Every output with a FULL_HEALTH summary has its statistics.
            assert slot < len(a.output_statistics), (a.op_type, slot)
            got = a.output_statistics[slot]
            assert got is not None, (a.op_type, slot)
            value = (b.tensor_values or ())[slot] if b.tensor_values else None
            if not isinstance(value, np.ndarray):
                continue
            want = expected(value, int(summary[2]))
            finite = value[np.isfinite(value)].astype(np.float64)
            rms = float(np.sqrt(np.mean(np.square(finite)))) if finite.size else 0.0
            where = f"{a.op_type} output {slot}: {got} != {want}"
            assert got.hash == want.hash, where
            assert _close(got.mean, want.mean, rms), where
            assert _close(got.std, want.std, rms), where
            assert _close(got.l2, want.l2, want.l2), where
            checked += 1
    return checked


def test_each_float_output_s_statistics_match_its_values(tmp_path: Path, recorder: str) -> None:
    record(tmp_path / "stats", "FULL_HEALTH", statistics=True)
    record(tmp_path / "full", "FULL_TENSOR", statistics=False)
    a = nanscope.open_dump(tmp_path / "stats").executions()
    b = nanscope.open_dump(tmp_path / "full").executions()
    checked = compare(a, b)
    assert checked >= 100, checked
    # The program's kinds of output were all among them.
    kinds = {
        (e.op_type, int(s[2])) for e in a for s in (e.debug_tensor_values or ()) if s is not None
    }
    assert ("aten._to_copy.default", DT_BFLOAT16) in kinds
    assert any(e.op_type == "aten.log.default" for e in a)
    logs = next(e for e in a if e.op_type == "aten.log.default")
    st = logs.output_statistics[0]
    assert st is not None and math.isfinite(st.mean) and st.hash is not None


def test_without_statistics_nothing_is_added(tmp_path: Path, recorder: str) -> None:
    record(tmp_path, "FULL_HEALTH", statistics=False)
    executions = nanscope.open_dump(tmp_path).executions()
    assert executions and all(e.output_statistics == () for e in executions)
    assert all("statistics" not in o for e in executions for o in e.outputs_json())


def test_statistics_reach_json(tmp_path: Path, recorder: str) -> None:
    def run() -> None:
        torch.arange(6, dtype=torch.float32).reshape(2, 3) * 2

    record(tmp_path, "FULL_HEALTH", statistics=True, run=run)
    last = nanscope.open_dump(tmp_path).executions()[-1]
    (out,) = last.outputs_json()
    values = np.arange(6, dtype=np.float32) * 2
    assert out["statistics"] == {
        "mean": pytest.approx(5.0),
        "std": pytest.approx(float(values.std())),
        "l2": pytest.approx(float(np.sqrt((values.astype(np.float64) ** 2).sum()))),
        "hash": f"{bits_hash(values):013x}",
    }


@pytest.mark.parametrize(
    "mode", ["CURT_HEALTH", "CONCISE_HEALTH", "SHAPE", "FULL_TENSOR", "NO_TENSOR"]
)
def test_statistics_need_full_health(tmp_path: Path, mode: str) -> None:
    with pytest.raises(ValueError, match="statistics=True needs tensor_debug_mode='FULL_HEALTH'"):
        nanscope.enable_dump_debug_info(tmp_path, mode, statistics=True)


def test_tensorflow_reads_a_dump_with_statistics(tmp_path: Path, recorder: str) -> None:
    """TensorFlow's own reader ignores the field: it reads the executions and their
    eleven-slot summaries as it always has."""
    pytest.importorskip("tensorflow")
    from tensorflow.python.debug.lib.debug_events_reader import DebugDataReader

    record(tmp_path, "FULL_HEALTH", statistics=True)
    ours = nanscope.open_dump(tmp_path).executions()
    assert any(e.output_statistics for e in ours)
    with DebugDataReader(str(tmp_path)) as reader:
        reader.update()
        theirs = reader.executions(digest=False)
    assert [e.op_type for e in theirs] == [e.op_type for e in ours]
    for e, o in zip(theirs, ours, strict=True):
        want = [None if s is None else list(s) for s in o.debug_tensor_values or ()]
        got = [None if v is None else list(v) for v in e.debug_tensor_values or ()]
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            if w is not None and g is not None:
                assert len(g) == 11
                np.testing.assert_array_equal(np.array(g[1:]), np.array(w[1:]))


LAYOUTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "contiguous": lambda x: x * 1,
    "transposed": lambda x: x.t() * 1,  # an op's non-contiguous result
    "strided copy": lambda x: x[::2, 1::3].clone(),
    "expanded": lambda x: x[:, :1].expand(64, 40),  # a broadcast view: each element 40 times
    "transposed view": lambda x: x.t(),
    "negated view": lambda x: torch._neg_view(x),  # the memory's values, negated
    "empty": lambda x: x[:0] * 1,
    "scalar": lambda x: x.sum(),
}
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def oracle(t: torch.Tensor) -> Statistics:
    """``statistics_of`` of a tensor's values; the hash over its own dtype's bits."""
    values = t.detach().resolve_neg().contiguous()
    want = statistics_of(values.double().numpy())
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[values.element_size()]
    return want._replace(hash=bits_hash(values.view(bits).numpy()))


def assert_matches(got: Statistics | None, want: Statistics, where: str) -> None:
    assert got is not None, where
    assert got.hash == want.hash, where
    for name in ("mean", "std", "l2"):
        g, w = getattr(got, name), getattr(want, name)
        assert (math.isnan(g) and math.isnan(w)) or g == pytest.approx(w, rel=1e-6, abs=1e-9), (
            f"{where}: {name} {g} != {w}"
        )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layouts_and_dtypes(tmp_path: Path, recorder: str, dtype: torch.dtype, layout: str) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 48, generator=g) * 3 + 2
    x[3, 5], x[7, 1], x[9, 0], x[0, 0] = float("nan"), float("inf"), float("-inf"), 0.0
    x = x.to(dtype)

    out: list[torch.Tensor] = []
    with nanscope.enable_dump_debug_info(
        tmp_path, "FULL_HEALTH", circular_buffer_size=-1, statistics=True
    ):
        out.append(LAYOUTS[layout](x))
    last = nanscope.open_dump(tmp_path).executions()[-1]
    (got,) = last.output_statistics
    assert_matches(got, oracle(out[0]), f"{layout} {dtype}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "layout", ["contiguous", "transposed view", "expanded", "negated view", "empty"]
)
def test_device_statistics_agree(dtype: torch.dtype, layout: str) -> None:
    """The accelerator path's torch ops (run here on the CPU) give the same numbers."""
    from nanscope.backends.torch.summaries import device_statistics, without_broadcast

    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 48, generator=g) * 3 - 1
    x[3, 5], x[7, 1] = float("nan"), float("-inf")
    t = LAYOUTS[layout](x.to(dtype))
    base, repeats = without_broadcast(t)
    mean, std, l2, h = device_statistics(base.reshape(-1), repeats).tolist()
    assert_matches(Statistics(mean, std, l2, int(h)), oracle(t), f"{layout} {dtype}")


def _nanscope_run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nanscope", "run", *args], cwd=cwd, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip


def test_nanscope_run_statistics(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\nx = torch.arange(4.0)\ny = x * 3\n")
    out = _nanscope_run("--logdir", "d", "--statistics", str(script), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    mul = next(
        e for e in nanscope.open_dump(tmp_path / "d").executions() if e.op_type == "aten.mul.Tensor"
    )
    assert_matches(mul.output_statistics[0], oracle(torch.arange(4.0) * 3), "mul")
    bad = _nanscope_run(
        "--logdir", "e", "--statistics", "--mode", "SHAPE", str(script), cwd=tmp_path
    )
    assert bad.returncode != 0
    assert (
        "--statistics goes with --mode FULL_HEALTH (the default), not with --mode SHAPE"
        in bad.stderr
    )
    assert not (tmp_path / "e").exists()


class _Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        return torch.log(torch.softmax(self.fc2(h).t().t(), dim=1))


def _compiled_program() -> None:
    torch.manual_seed(0)
    model = _Small()
    step = torch.compile(model)
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(2)) * 2
    step(x).sum().backward()


def _by_graph_op(
    traces: list[GraphExecutionTrace],
) -> dict[tuple[int, str, int], GraphExecutionTrace]:
    """Traces by (the graph's place among the dump's graphs, op name, output slot)."""
    graphs: dict[str, int] = {}
    out = {}
    for t in traces:
        g = graphs.setdefault(t.graph_id, len(graphs))
        out[(g, t.op_name, t.output_slot)] = t
    return out


@pytest.mark.parametrize("counts", ["native", "aten"])
def test_compiled_graphs_record_statistics(
    tmp_path: Path, counts: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each traced value of a torch.compile graph, and the graph call's outputs, carry
    their statistics; checked against the values a FULL_TENSOR recording of the same
    compiled program holds."""
    from nanscope.backends.torch.compiled import rewrite

    if counts == "aten":
        monkeypatch.setattr(rewrite, "USE_NATIVE_COUNTS", False)
    elif torch_recorder() != "native":
        pytest.skip("the native recorder is not in use")
    record(tmp_path / "stats", "FULL_HEALTH", statistics=True, run=_compiled_program)
    record(tmp_path / "full", "FULL_TENSOR", statistics=False, run=_compiled_program)
    a = nanscope.open_dump(tmp_path / "stats").traces()
    b = _by_graph_op(nanscope.open_dump(tmp_path / "full").traces())
    assert len(a) >= 10
    for key, got in _by_graph_op(a).items():
        # FULL_TENSOR traces every value, FULL_HEALTH the float ones: all of these.
        full = b[key]
        assert got.debug_tensor_value is not None and len(got.debug_tensor_value) == 11
        assert full.tensor_value is not None
        (st,) = got.output_statistics
        assert_matches(st, oracle(torch.from_numpy(np.array(full.tensor_value))), got.op_name)
    calls = [e for e in nanscope.open_dump(tmp_path / "stats").executions() if e.graph_id]
    assert calls and any(any(s is not None for s in e.output_statistics) for e in calls)
