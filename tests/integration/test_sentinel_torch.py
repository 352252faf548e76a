"""The PyTorch sentinel on real programs made to diverge late, held against independent oracles.

* nanoGPT's hand-written loop (tests/programs/real/nanogpt.py), trained at lr 1e-3 until
  a learning-rate spike: the sentinel trips at the step where a plain run's loss first
  goes non-finite (read from the plain run's own output), and the replay's cause (op
  type, file, line) is the cause of a full recording of the same run (FULL_HEALTH,
  every event kept);
* a learning rate of inf makes the optimizer step itself write Inf/NaN: with
  ``snapshot_state`` the step is replayed and an optimizer op named; without, the trip
  says how to get a replay;
* a classifier whose batch 250 holds a 0 fed to ``log`` (tests/programs/real/mlp_late.py):
  ``on_nan="skip"`` drops that step and trains to the end with finite parameters and
  buffers; a fault on the first execution only is "not reproduced";
* healthy runs never trip: nanoGPT's -inf attention mask, GradScaler's skipped steps.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import nanscope  # noqa: E402
import nanscope.sentinel as sentinel  # noqa: E402
from nanscope.sentinel import SentinelTripped, read_history  # noqa: E402
from nanscope.sentinel._replay import NOT_REPRODUCED, analyse_replay  # noqa: E402
from tests.oracle import load_program  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NANOGPT = ROOT / "tests" / "programs" / "real" / "nanogpt.py"
MLP_LATE = ROOT / "tests" / "programs" / "real" / "mlp_late.py"
DIVERGE_AT = 100  # nanoGPT trains 100 steps at lr 1e-3, then the spike
POISON_AT = 250  # mlp_late's batch with the 0


def _run(program: Path, argv: list[str]) -> tuple[str, BaseException | None, Any]:
    """``main(argv)`` of a program: its output, what it raised, what it returned."""
    out = io.StringIO()
    raised: BaseException | None = None
    result = None
    with contextlib.redirect_stdout(out), torch.random.fork_rng(devices=[]):
        threads = torch.get_num_threads()
        try:
            result = load_program(program).main(argv)
        except Exception as exc:
            raised = exc
        finally:
            torch.set_num_threads(threads)
    return out.getvalue(), raised, result


def _first_nonfinite_loss(output: str) -> int | None:
    """The first iteration whose printed loss is not finite (the programs print each one)."""
    for line in output.splitlines():
        head, _, value = line.rpartition("loss ")
        if head and not math.isfinite(float(value.split()[0])):
            return int(head.split()[1].rstrip(":"))
    return None


def _line_of(program: Path, text: str) -> int:
    (number,) = [i for i, ln in enumerate(program.read_text().splitlines(), 1) if text in ln]
    return number


@pytest.fixture(scope="module")
def nanogpt_full(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Any]:
    """A plain run of the late divergence, fully recorded: the first step whose loss is not
    finite (from its own output) and the recording's root cause."""
    dump = tmp_path_factory.mktemp("nanogpt-full")
    argv = ["--lr", "1e-3", "--steps", str(DIVERGE_AT + 2), "--diverge-at", str(DIVERGE_AT)]
    with nanscope.enable_dump_debug_info(dump, "FULL_HEALTH", -1, framework="torch"):
        output, raised, _ = _run(NANOGPT, argv)
    assert raised is None
    step = _first_nonfinite_loss(output)
    assert step == DIVERGE_AT + 1  # the spike's update is finite; the next forward overflows
    cause, harmful = analyse_replay(dump)
    assert harmful and cause is not None
    return step, cause


def test_nanogpt_trips_at_the_step_and_the_replay_names_the_full_recordings_cause(
    tmp_path: Path, nanogpt_full: tuple[int, Any]
) -> None:
    bad_step, full_cause = nanogpt_full
    argv = ["--lr", "1e-3", "--steps", str(DIVERGE_AT + 10), "--diverge-at", str(DIVERGE_AT)]
    output, raised, _ = _run(NANOGPT, [*argv, "--sentinel", str(tmp_path)])
    assert isinstance(raised, SentinelTripped), output[-500:]
    trip = raised.trip
    assert trip.step == bad_step and trip.action == "stop" and trip.reproduced is True
    assert "gradients" in trip.where or "loss" in trip.where
    assert trip.cause is not None
    assert (trip.cause.op_type, trip.cause.file, trip.cause.line) == (
        full_cause.op_type,
        full_cause.file,
        full_cause.line,
    )
    assert trip.cause.headline in str(raised) and f"nanscope report {tmp_path}" in str(raised)
    # The history: every step up to the trip, the trip, and the end (the program closed it).
    history = read_history(tmp_path)
    assert history.complete
    assert [s.step for s in history.steps] == list(range(bad_step + 1))
    assert all(not s.bad for s in history.steps[:-1]) and history.steps[-1].bad
    assert history.trips == (trip,)
    assert history.replay_dir(trip) == tmp_path / f"replay-step-{bad_step}"
    # The replay is a normal dump: analysed on its own it names the same cause.
    again, _ = analyse_replay(tmp_path / f"replay-step-{bad_step}")
    assert again == trip.cause


def test_a_nan_born_in_the_optimizer_step_is_replayed_from_the_snapshot(tmp_path: Path) -> None:
    argv = ["--lr", "1e-3", "--steps", "30", "--diverge-at", "20", "--spike-lr", "inf"]
    plain, raised, _ = _run(NANOGPT, argv)
    assert raised is None
    # Oracle: the update of the step before the first non-finite loss wrote the Inf/NaN.
    first = _first_nonfinite_loss(plain)
    assert first is not None
    born = first - 1

    _, raised, _ = _run(NANOGPT, [*argv, "--sentinel", str(tmp_path), "--snapshot-state"])
    assert isinstance(raised, SentinelTripped)
    trip = raised.trip
    assert trip.step == born and "parameters" in trip.where and "gradients" not in trip.where
    assert trip.reproduced is True and trip.replay == f"replay-step-{born}"
    assert trip.cause is not None
    # AdamW's update (torch.optim.adamw's ops), at the program's optimizer.step() line.
    assert trip.cause.op_type in (
        "aten.mul_.Tensor",
        "aten.mul_.Scalar",
        "aten.addcdiv_.default",
        "aten.add_.Tensor",
        "aten.lerp_.Scalar",
    )
    assert trip.cause.file == str(NANOGPT)
    assert trip.cause.line == _line_of(NANOGPT, "        optimizer.step()")


def test_without_snapshot_state_the_trip_says_how_to_replay_it(tmp_path: Path) -> None:
    argv = ["--lr", "1e-3", "--steps", "30", "--diverge-at", "20", "--spike-lr", "inf"]
    _, raised, _ = _run(NANOGPT, [*argv, "--sentinel", str(tmp_path), "--on-nan", "skip"])
    # Skipping is impossible (the parameters hold the Inf/NaN): the run stops.
    assert isinstance(raised, SentinelTripped)
    trip = raised.trip
    assert trip.action == "stop" and trip.replay is None and trip.reproduced is None
    assert trip.reason is not None and "snapshot_state=True" in trip.reason
    assert "optimizer step" in trip.reason and not (tmp_path / "replay-step-20").exists()


def test_skip_drops_the_poisoned_step_and_trains_to_the_end(tmp_path: Path) -> None:
    steps = POISON_AT + 30
    argv = ["--steps", str(steps), "--poison-at", str(POISON_AT)]
    output, raised, model = _run(MLP_LATE, [*argv, "--sentinel", str(tmp_path), "--on-nan", "skip"])
    assert raised is None
    assert _first_nonfinite_loss(output) == POISON_AT  # the poisoned step's own loss
    history = read_history(tmp_path)
    assert history.complete and history.last_step == steps - 1
    (trip,) = history.trips
    assert trip.step == POISON_AT and trip.action == "skip" and trip.reproduced is True
    assert trip.cause is not None and trip.cause.op_type == "aten.log.default"
    assert (trip.cause.file, trip.cause.line) == (str(MLP_LATE), _line_of(MLP_LATE, "torch.log(x)"))
    # Trained on from the step's start: parameters and BatchNorm statistics finite.
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        assert torch.isfinite(t).all(), name
    assert all(s.loss is not None and math.isfinite(s.loss) for s in history.steps[POISON_AT + 1 :])
    # The sentinel's own reductions are not in the replay's dump.
    with nanscope.open_dump(tmp_path / f"replay-step-{POISON_AT}") as reader:
        ops = {e.op_type for e in reader.executions()}
    assert "aten.log.default" in ops
    assert not ops & {
        "aten.aminmax.default",
        "aten._foreach_norm.Scalar",
        "aten.linalg_vector_norm.default",
    }


def test_the_replay_names_the_cause_a_full_recording_names(tmp_path: Path) -> None:
    argv = ["--steps", str(POISON_AT + 1), "--poison-at", str(POISON_AT)]
    with nanscope.enable_dump_debug_info(tmp_path / "full", "FULL_HEALTH", -1, framework="torch"):
        _, raised, _ = _run(MLP_LATE, argv)
    assert raised is None
    full, _ = analyse_replay(tmp_path / "full")
    _, raised, _ = _run(MLP_LATE, [*argv, "--sentinel", str(tmp_path / "s")])
    assert isinstance(raised, SentinelTripped) and raised.trip.cause is not None
    assert full is not None
    got = raised.trip.cause
    assert (got.op_type, got.file, got.line, got.step) == (
        full.op_type,
        full.file,
        full.line,
        full.step,
    )


def _mlp(seed: int = 0) -> tuple[Any, Any, Any, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.rand(40, 32, 8) + 0.5
    y = torch.randint(0, 3, (40, 32))
    return model, optimizer, x, y


def test_a_fault_on_the_first_execution_only_is_not_reproduced(tmp_path: Path) -> None:
    model, optimizer, x, y = _mlp()
    faults = {"left": 1}

    def train_step(xb: Any, yb: Any, step: int) -> Any:
        optimizer.zero_grad()
        h = model[0](torch.log(xb))
        if step == 30 and faults["left"]:  # a bit flip: once, not again in the replay
            faults["left"] -= 1
            h = h * float("nan")
        loss = torch.nn.functional.cross_entropy(model[2](model[1](h)), yb)
        loss.backward()
        optimizer.step()
        return loss

    with sentinel.Sentinel(tmp_path, model=model, optimizer=optimizer, on_nan="skip") as s:
        for step in range(40):
            s.step(train_step, x[step], y[step], step)
    (trip,) = s.trips
    assert trip.step == 30 and trip.reproduced is False and trip.cause is None
    assert trip.reason == NOT_REPRODUCED
    assert trip.reason.startswith("not reproduced: non-determinism or a transient hardware fault")
    assert (tmp_path / "replay-step-30").is_dir()
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_healthy_run_with_an_attention_mask_never_trips(tmp_path: Path) -> None:
    output, raised, _ = _run(
        NANOGPT, ["--lr", "1e-3", "--steps", "60", "--sentinel", str(tmp_path)]
    )
    assert raised is None and _first_nonfinite_loss(output) is None
    history = read_history(tmp_path)
    assert history.complete and history.trips == () and len(history.steps) == 60
    assert not list(tmp_path.glob("replay-step-*"))
    # Detail steps measured the ranges, and the -inf mask did not count as harm.
    detail = [s for s in history.steps if s.module_amax]
    assert detail and all(s.param_amax is not None and math.isfinite(s.param_amax) for s in detail)
    assert len(detail[0].module_amax) == len(history.header.modules)


@pytest.mark.parametrize("fused", [False, True])
def test_gradscalers_skipped_steps_never_trip(tmp_path: Path, fused: bool) -> None:
    amp = load_program(ROOT / "tests" / "programs" / "real" / "amp_gradscaler.py")
    torch.manual_seed(0)
    x_all, y_all = amp.make_data(12 * 64, 32, 10, 0)
    model = amp.MLP(32, 64, 10)
    optimizer = (
        torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
        if fused
        else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    )
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24)

    def train_step(x: Any, y: Any) -> Any:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss

    with sentinel.Sentinel(tmp_path, model=model, optimizer=optimizer) as s:
        for step in range(12):
            s.step(
                train_step, x_all[step * 64 : (step + 1) * 64], y_all[step * 64 : (step + 1) * 64]
            )
    assert scaler.get_scale() < 2.0**24  # the scaler did skip overflowing steps
    assert s.trips == [] and not list(tmp_path.glob("replay-step-*"))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_an_unmarked_loop_is_checked_through_the_optimizers_hooks(tmp_path: Path) -> None:
    model, optimizer, x, y = _mlp()
    x[12, 0, 0] = 0.0  # log(0) in step 12
    assert sentinel.step(lambda a: a + 1, 1) == 2  # no active sentinel: just the call
    s = sentinel.start(tmp_path)
    try:
        assert sentinel.active() is s
        with pytest.raises(RuntimeError, match="active already"):
            sentinel.start(tmp_path / "other")
        with pytest.raises(SentinelTripped) as caught:
            for step in range(20):
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(torch.log(x[step])), y[step])
                loss.backward()
                optimizer.step()
    finally:
        sentinel.stop()
    assert sentinel.active() is None
    trip = caught.value.trip
    assert trip.step == 12 and trip.where == ("gradients",) and trip.replay is None
    assert trip.reason is not None and "nanscope.sentinel.step(fn, batch)" in trip.reason
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the update was dropped
    history = read_history(tmp_path)
    assert history.complete and history.trips == (trip,) and len(history.steps) == 13


def test_bad_arguments_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match='on_nan must be "stop" or "skip"'):
        sentinel.Sentinel(tmp_path, on_nan="ignore")
    with pytest.raises(TypeError, match="optimizer must be"):
        sentinel.Sentinel(tmp_path, optimizer=object())  # type: ignore[arg-type]


def test_buffers_that_training_writes_are_kept_and_constant_ones_are_not() -> None:
    from nanscope.sentinel._snapshot import Buffers

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    model.register_buffer("mask", torch.tril(torch.ones(4, 4)))
    buffers = Buffers(model)
    for _ in range(4):
        buffers.save()
        model(torch.randn(8, 4))  # batch_norm writes its statistics (no version bump)
    kept = {
        n: saved is not None for (_, n), saved in zip(buffers._slots, buffers._saved, strict=True)
    }
    assert kept == {
        "mask": False,
        "running_mean": True,
        "running_var": True,
        "num_batches_tracked": True,
    }
    before = model[1].running_mean.clone()
    buffers.save()
    model(torch.full((8, 4), float("nan")))
    assert not torch.isfinite(model[1].running_mean).all()
    buffers.restore()
    assert torch.equal(model[1].running_mean, before)
    assert torch.equal(model.mask, torch.tril(torch.ones(4, 4)))


def test_the_fused_reductions_match_an_oracle_and_see_every_inf_and_nan() -> None:
    from nanscope.sentinel import _checks

    torch.manual_seed(0)
    mixes = {
        # one dtype: the three-op path
        "float32": [torch.randn(50, 78), torch.randn(5), torch.randn(10, 5)],
        # a transposed (non-contiguous) tensor and other dtypes: per dtype, then gathered
        "mixed": [torch.randn(10, 5).t(), torch.randn(3).bfloat16(), torch.randn(7).double()],
    }
    for tensors in mixes.values():
        every = torch.cat([t.double().reshape(-1) for t in tensors])
        norm = float(_checks.total_norm(tensors))
        assert math.isclose(norm, float(every.norm()), rel_tol=1e-5)
        assert float(_checks.largest_abs(tensors)) == float(every.abs().max().float())
        for k in range(len(tensors)):
            for bad in (math.nan, math.inf, -math.inf):
                poisoned = [t.clone() for t in tensors]
                poisoned[k][(-1,) * poisoned[k].dim()] = bad
                assert not math.isfinite(float(_checks.total_norm(poisoned))), (k, bad)
                amax = float(_checks.largest_abs(poisoned))
                assert math.isnan(amax) if math.isnan(bad) else amax == math.inf, (k, bad)


def test_a_marked_step_under_the_active_sentinel_is_replayed(tmp_path: Path) -> None:
    model, optimizer, x, y = _mlp()
    x[7, 0, 0] = 0.0  # log(0) in step 7

    log_line = inspect.currentframe().f_lineno + 4  # type: ignore[union-attr]

    def train_step(xb: Any, yb: Any) -> Any:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.log(xb)), yb)
        loss.backward()
        optimizer.step()
        return loss

    sentinel.start(tmp_path)  # no optimizer given: found by the global hooks
    try:
        with pytest.raises(SentinelTripped) as caught:
            for step in range(10):
                sentinel.step(train_step, x[step], y[step])
    finally:
        sentinel.stop()
    trip = caught.value.trip
    assert trip.step == 7 and trip.reproduced is True and trip.cause is not None
    assert trip.cause.op_type == "aten.log.default"
    assert (trip.cause.file, trip.cause.line) == (__file__, log_line)
    history = read_history(tmp_path)
    assert history.complete and [s.step for s in history.steps] == list(range(8))
