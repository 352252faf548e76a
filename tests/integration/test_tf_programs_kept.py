"""TensorFlow programs as Keras users run them: the first Inf/NaN kept, and steps.

Issue 39, "``nanscope run`` on a TensorFlow program loses the first Inf/NaN" and "Steps
on TensorFlow dumps". The programs are ``tests/programs/real/tf_loop_*.py``, written the
way the keras-io guides write them, on generated data: a custom loop with ``tf.function``
train and test steps and Adam ("Writing a training loop from scratch", its learning rate
warmed up to far too high), a ``Model.fit`` regression with SGD too fast for its data
(also with ``steps_per_execution=3``), and a ``Model.train_step`` override with a
hand-written cross-entropy ("Customizing what happens in fit()"). Each is recorded both
by ``nanscope run`` with its default buffer (1000 events) and by TensorFlow's own
``enable_dump_debug_info(dir, "FULL_HEALTH", -1)`` in the program, and the report is held
against oracles that do not use nanscope:

* ``tf.debugging.enable_check_numerics()`` in the program: the type of the first op
  whose output is non-finite, and the step at which it raised, as the program counted it
  (the last ``STEP <n>`` line it printed before the error);
* TensorFlow's ``DebugDataReader`` over the program's own whole-history FULL_HEALTH dump:
  the births (non-finite outputs whose graph inputs were finite), the first NaN, and
  each one's step by the program's training function (the function it called most, the
  n-th call being step n).

The report's origin (and the first -inf/+inf or NaN) must be the oracles' first birth,
at their step; healthy runs exit 0, and run to the end under ``--check-numerics``. A dump
that TensorFlow wrote with its default circular buffer says that its first events are
missing. The programs take ~5-10 s each, run once and shared through ``lab``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import pytest

import nanscope
from nanscope.analysis import analyze
from nanscope.backends import tf_spool
from nanscope.events._streams import EventStream
from nanscope.format import sidecar
from nanscope.format.records import frame, scan
from nanscope.reader import EXECUTIONS, TRACES
from nanscope.report import headline
from nanscope.server.runs import RunSet

from ..helpers import call, extract_tf_dumps

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "tests" / "programs" / "real"
TIMEOUT = 300
STEP_LINE = re.compile(r"^STEP (\d+)$", re.M)
CHECK_NUMERICS = re.compile(
    r'Detected Infinity or NaN in output \d+ of (?:graph op|eagerly-executing op) "(\w+)"'
)


@dataclass(frozen=True)
class Case:
    program: str
    args: tuple[str, ...]
    # The case whose check_numerics run is this one's oracle (the same numerics).
    oracle: str | None = None


DIVERGING = {
    "from_scratch": Case(
        "tf_loop_from_scratch.py", ("--learning-rate", "1e9", "--warmup-steps", "16")
    ),
    "fit": Case("tf_loop_fit.py", ("--learning-rate", "1")),
    "fit_3_per_call": Case(
        "tf_loop_fit.py", ("--learning-rate", "1", "--steps-per-execution", "3"), oracle="fit"
    ),
    "custom_train_step": Case("tf_loop_custom_train_step.py", ("--learning-rate", "4")),
}
HEALTHY = {
    "from_scratch": Case("tf_loop_from_scratch.py", ()),
    "fit": Case("tf_loop_fit.py", ()),
    "custom_train_step": Case("tf_loop_custom_train_step.py", ()),
}


def _env() -> dict[str, str]:
    """This checkout's nanscope first; TensorFlow quiet."""
    env = dict(os.environ)
    src = str(ROOT / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def _run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], cwd=cwd, env=_env(), capture_output=True, text=True,
        timeout=TIMEOUT,
    )  # fmt: skip


@dataclass
class Report:
    returncode: int
    data: dict[str, Any]
    text: str


@functools.cache
def report(logdir: Path) -> Report:
    """``nanscope report`` on ``logdir``, as JSON and as text. Each logdir is written once
    (by the lab, or in a test's own tmp_path), so two tests that read the same dump share
    one report."""
    out = _run("-m", "nanscope", "report", str(logdir), "--json", cwd=logdir.parent)
    text = _run("-m", "nanscope", "report", str(logdir), cwd=logdir.parent).stdout
    return Report(out.returncode, json.loads(out.stdout), text)


# -- the oracles -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Checked:
    """What ``tf.debugging.enable_check_numerics()`` stopped at."""

    op_type: str
    step: int


@dataclass(frozen=True)
class Event:
    """An event as TensorFlow's own reader reads it, with its step by the program's calls."""

    kind: str
    op_type: str
    op_name: str
    wall_time: float
    step: int


@dataclass(frozen=True)
class Oracle:
    births: list[Event]  # in order of time
    first_nan: Event | None


def check_numerics_oracle(out: subprocess.CompletedProcess[str]) -> Checked:
    text = out.stdout + out.stderr
    found = CHECK_NUMERICS.search(text)
    steps = STEP_LINE.findall(out.stdout)
    assert out.returncode != 0 and found and steps, text[-3000:]
    return Checked(found.group(1), int(steps[-1]))


def _bad(summary: Any) -> tuple[bool, bool]:
    """(any Inf/NaN, any NaN) of a FULL_HEALTH summary (TensorFlow's eleven slots)."""
    if summary is None or len(summary) < 11:
        return False, False
    return bool(summary[5] + summary[6] + summary[7] > 0), bool(summary[7] > 0)


def reader_oracle(dump: Path) -> Oracle:
    """Births and the first NaN of a whole-history FULL_HEALTH dump, by TensorFlow's reader.

    A trace is a birth when its output holds Inf/NaN and none of its graph inputs (the
    latest trace of each input tensor in the same graph) did; an eager execution (not a
    function call), when none of its input tensors came out of an execution with Inf/NaN.
    Steps: the n-th call of the function the program called most (its training step)
    runs step n: a trace's step is that of the call that ran it (the first to end after
    it), an eager execution's that of the latest call before it.
    """
    from tensorflow.python.debug.lib.debug_events_reader import DebugDataReader

    with DebugDataReader(str(dump)) as r:
        r.update()
        executions = r.executions()
        calls: dict[str, list[float]] = {}
        for e in executions:
            if e.op_type.startswith("__inference_"):
                calls.setdefault(e.op_type, []).append(e.wall_time)
        train = np.array(max(calls.values(), key=len)) if calls else np.zeros(0)

        def step(t: float, kind: str) -> int:
            if kind == TRACES:  # the call that ran it ends after it
                return int(np.searchsorted(train, t, side="left"))
            return max(0, int(np.searchsorted(train, t, side="right")) - 1)  # after a call

        births: list[Event] = []
        nans: list[Event] = []
        last: dict[tuple[str, str, int], bool] = {}
        for t in r.graph_execution_traces():
            bad, nan = _bad(t.debug_tensor_value)
            op = r.graph_by_id(t.graph_id).get_op_creation_digest(t.op_name)
            fed = any(
                last.get((t.graph_id, *_tensor(name)), False) for name in op.input_names or ()
            )
            event = Event(TRACES, t.op_type, t.op_name, t.wall_time, step(t.wall_time, TRACES))
            if bad and not fed:
                births.append(event)
            if nan:
                nans.append(event)
            last[(t.graph_id, t.op_name, t.output_slot)] = bad
        made_bad: set[int] = set()
        for e in executions:
            flags = [_bad(v) for v in e.debug_tensor_values or ()]
            bad, nan = any(f[0] for f in flags), any(f[1] for f in flags)
            fed = any(i in made_bad for i in e.input_tensor_ids or ())
            if bad:
                made_bad.update(e.output_tensor_ids or ())
            event = Event(EXECUTIONS, e.op_type, "", e.wall_time, step(e.wall_time, EXECUTIONS))
            if bad and not fed and not e.op_type.startswith("__"):
                births.append(event)
            if nan:
                nans.append(event)
    births.sort(key=lambda b: b.wall_time)
    return Oracle(births, min(nans, key=lambda n: n.wall_time) if nans else None)


def _tensor(name: str) -> tuple[str, int]:
    op, _, slot = name.rpartition(":")
    return (op, int(slot)) if op and slot.isdigit() else (name, 0)


# -- running everything once -----------------------------------------------------------------


class Lab:
    """Each program run at most once per setting, in a directory of its own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._done: dict[tuple[str, ...], Any] = {}

    def _dir(self, *key: str) -> Path:
        path = self.root.joinpath(*key)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _once(self, key: tuple[str, ...], make: Callable[[], T]) -> T:
        if key not in self._done:
            self._done[key] = make()
        return cast(T, self._done[key])

    def checked(self, name: str) -> Checked:
        case = DIVERGING[name]
        if case.oracle:
            return self.checked(case.oracle)

        def make() -> Checked:
            out = _run(str(PROGRAMS / case.program), *case.args, "--check-numerics",
                       cwd=self._dir("checked", name))  # fmt: skip
            return check_numerics_oracle(out)

        return self._once(("checked", name), make)

    def tf_dump(self, name: str, buffer: int = -1, healthy: bool = False) -> Path:
        """The program's own dump with TensorFlow's writer (``buffer`` events; -1: all)."""
        case = (HEALTHY if healthy else DIVERGING)[name]
        key = ("tf", name, str(buffer), str(healthy))

        def make() -> Path:
            work = self._dir(*key)
            out = _run(str(PROGRAMS / case.program), *case.args, "--dump-dir", "dump",
                       "--dump-buffer", str(buffer), cwd=work)  # fmt: skip
            assert out.returncode == 0, out.stderr[-3000:]
            return work / "dump"

        return self._once(key, make)

    def oracle(self, name: str) -> Oracle:
        return self._once(("oracle", name), lambda: reader_oracle(self.tf_dump(name)))

    def recorded(
        self, name: str, *options: str, healthy: bool = False
    ) -> tuple[subprocess.CompletedProcess[str], Path]:
        """``nanscope run [options]`` on the program, and its logdir."""
        case = (HEALTHY if healthy else DIVERGING)[name]
        key = ("run", name, str(healthy), *options)

        def make() -> tuple[subprocess.CompletedProcess[str], Path]:
            work = self._dir(*key)
            logdir = "dump" if "--check-numerics" not in options else None
            argv = ["-m", "nanscope", "run", *(["--logdir", logdir] if logdir else []), *options,
                    str(PROGRAMS / case.program), *case.args]  # fmt: skip
            return _run(*argv, cwd=work), work / "dump"

        return self._once(key, make)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    yield Lab(tmp_path_factory.mktemp("tf_programs"))


def _same_event(got: dict[str, Any] | None, want: Event, what: str) -> None:
    assert got is not None, f"no {what}"
    assert (got["op_type"], got["step"]) == (want.op_type, want.step), (what, got, want)
    if want.kind == TRACES:
        assert got["op_name"] == want.op_name, (what, got["op_name"], want)


# -- the first Inf/NaN, kept and told at its step ------------------------------------------


@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.parametrize("name", list(DIVERGING))
@pytest.mark.parametrize("recorder", ["nanscope_run", "tensorflow_whole"])
def test_origin_is_the_first_birth_at_its_step(lab: Lab, name: str, recorder: str) -> None:
    """The report names the first op whose output went non-finite (check_numerics' op, and
    TensorFlow's reader's first birth) at the step the program was at when it raised."""
    pytest.importorskip("tensorflow")
    checked = lab.checked(name)
    oracle = lab.oracle(DIVERGING[name].oracle or name)
    birth = oracle.births[0]
    assert (birth.op_type, birth.step) == (checked.op_type, checked.step)  # oracles agree
    if recorder == "nanscope_run":
        out, logdir = lab.recorded(name)
        assert out.returncode == 0, out.stderr[-3000:]
    else:
        logdir = lab.tf_dump(name)
    rep = report(logdir)
    assert rep.returncode == 1 and rep.data["verdict"] == "harmful", rep.text
    _same_event(rep.data["origin"], birth, "origin")
    assert rep.data["steps"] is not None, "no steps counted"
    first = "first_nan" if rep.data["first_inf"] is None else "first_inf"
    _same_event(rep.data[first], birth, first)
    # The first NaN and the cause say their steps too (the headline, the cause's).
    assert oracle.first_nan is not None
    _same_event(rep.data["first_nan"], oracle.first_nan, "first NaN")
    cause = rep.data["cause"]
    assert cause is not None and cause["step"] >= checked.step
    assert f"at step {cause['step']}" in rep.data["headline"], rep.data["headline"]


@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.parametrize("name", list(DIVERGING))
def test_the_default_buffer_keeps_the_birth_in_a_dump_tensorflow_reads(lab: Lab, name: str) -> None:
    """Under ``nanscope run``'s 1000-event buffer, events were let go of (so the test
    means something), the birth was kept, and TensorFlow's reader reads the dump: the
    same events, the first non-finite trace the birth."""
    pytest.importorskip("tensorflow")
    from tensorflow.python.debug.lib.debug_events_reader import DebugDataReader

    _, logdir = lab.recorded(name)
    birth = lab.oracle(DIVERGING[name].oracle or name).births[0]
    rep = report(logdir).data
    assert rep["evicted"][TRACES] > 0, rep["evicted"]
    assert rep["num_graph_execution_traces"] <= 1000 + 33 * 201
    with DebugDataReader(str(logdir)) as r:
        r.update()
        traces = r.graph_execution_traces()
        assert len(traces) == rep["num_graph_execution_traces"]
        assert len(r.executions(digest=True)) == rep["num_executions"]
        first = next(t for t in traces if _bad(t.debug_tensor_value)[0])
        assert (first.op_type, first.op_name) == (birth.op_type, birth.op_name)
    with nanscope.open_dump(logdir) as r:
        (proc,) = r.processes
        assert proc.circular_buffer_size == 1000 and r.steps_known
        assert r.problems == []  # the sidecars written with the kept records agree


@pytest.mark.tf
@pytest.mark.slow
def test_steps_show_in_the_gui(lab: Lab) -> None:
    """The GUI's run list says steps are known, and its events carry them."""
    pytest.importorskip("tensorflow")
    _, logdir = lab.recorded("fit")
    runs = RunSet(logdir, refresh_interval=0)
    (entry,) = call(runs, "/api/runs")["runs"]
    assert entry["steps_known"] is True
    analysis = call(runs, "/api/analysis", run=entry["run"])
    origin = analysis["origin"]
    assert origin["step"] == lab.checked("fit").step
    trace = call(runs, f"/api/traces/{origin['index']}", run=entry["run"])
    assert trace["step"] == origin["step"]


EXAMPLE = "nanscope.examples.debug_mnist_tf"
ACCURACY_LINE = re.compile(r"^Accuracy at step (\d+):", re.M)


@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.parametrize("recorder", ["nanscope_run", "tensorflow_whole"])
def test_the_tutorials_example_counts_the_models_calls(lab: Lab, recorder: str) -> None:
    """The Debugger V2 tutorial's example calls its ``tf.function`` model and loss under a
    GradientTape and applies Adam eagerly: no function trains on its own, so each call of
    the model (the first function of an iteration) begins a step. The Log's -inf is at the
    step the program was at when check_numerics raised (it prints each step's accuracy
    after the step), in 10 steps."""
    pytest.importorskip("tensorflow")

    def checked() -> Checked:
        # TensorFlow's own check_numerics (the example's flag would turn on nanscope's).
        runner = (
            "import runpy, sys, tensorflow as tf; tf.debugging.enable_check_numerics(); "
            f"sys.argv = [{EXAMPLE!r}]; runpy.run_module({EXAMPLE!r}, run_name='__main__')"
        )
        out = _run("-c", runner, cwd=lab._dir("example", "checked"))
        text = out.stdout + out.stderr
        found = CHECK_NUMERICS.search(text)
        assert out.returncode != 0 and found, text[-3000:]
        return Checked(found.group(1), len(ACCURACY_LINE.findall(out.stdout)))

    want = lab._once(("example", "checked"), checked)
    work = lab._dir("example", recorder)
    if recorder == "nanscope_run":
        out = _run("-m", "nanscope", "run", "--logdir", "dump", "-m", EXAMPLE, cwd=work)
    else:
        out = _run("-m", EXAMPLE, "--dump_dir", "dump", cwd=work)
    assert out.returncode == 0, out.stderr[-3000:]
    rep = report(work / "dump")
    origin = rep.data["origin"]
    assert (origin["op_type"], origin["step"]) == (want.op_type, want.step), rep.text
    assert rep.data["steps"] == [0, 9]
    assert f"at step {want.step}" in rep.data["headline"], rep.data["headline"]


# -- healthy programs --------------------------------------------------------------------------


@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.parametrize("name", list(HEALTHY))
def test_healthy_programs_exit_0_with_their_steps(lab: Lab, name: str) -> None:
    pytest.importorskip("tensorflow")
    out, logdir = lab.recorded(name, healthy=True)
    assert out.returncode == 0, out.stderr[-3000:]
    steps = [int(s) for s in STEP_LINE.findall(out.stdout)]
    rep = report(logdir)
    assert rep.returncode == 0 and rep.data["verdict"] in ("clean", "absorbed"), rep.text
    assert rep.data["steps"] == [0, steps[-1]], (rep.data["steps"], steps[-1])


@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.parametrize("name", list(HEALTHY))
def test_healthy_programs_run_to_the_end_under_check_numerics(lab: Lab, name: str) -> None:
    pytest.importorskip("tensorflow")
    out, _ = lab.recorded(name, "--check-numerics", healthy=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "validation" in out.stdout or "loss" in out.stdout


# -- dumps that TensorFlow wrote with its circular buffer ------------------------------------


@pytest.mark.tf
@pytest.mark.slow
def test_a_healthy_tensorflow_circular_dump_is_no_all_clear(lab: Lab) -> None:
    """TensorFlow's default buffer (1000) let go of the first traces of a healthy run: the
    report says so and gives no verdict (exit 2), instead of "no Inf/NaN recorded"."""
    pytest.importorskip("tensorflow")
    rep = report(lab.tf_dump("fit", buffer=1000, healthy=True))
    assert rep.returncode == 2 and rep.data["verdict"] == "incomplete", rep.text
    (lost,) = rep.data["incomplete"]
    assert "were not kept" in lost["message"] and lost["file"].endswith(".graph_execution_traces")
    assert "✓" not in rep.text


@pytest.mark.tf
@pytest.mark.slow
def test_a_diverging_tensorflow_circular_dump_says_what_is_missing(lab: Lab) -> None:
    """Harm found is told, and the missing first events with it; no steps are counted
    from a history whose start is gone."""
    pytest.importorskip("tensorflow")
    rep = report(lab.tf_dump("fit", buffer=1000))
    assert rep.returncode == 1 and rep.data["verdict"] == "harmful", rep.text
    assert any("were not kept" in p["message"] for p in rep.data["incomplete"])
    assert rep.data["steps"] is None


@pytest.mark.tf
@pytest.mark.slow
def test_a_whole_tensorflow_dump_without_inf_nan_says_it_may_be_circular(lab: Lab) -> None:
    """TensorFlow's files never say whether a circular buffer was used: a clean dump that
    TensorFlow wrote says that the first events may not have been kept."""
    pytest.importorskip("tensorflow")
    rep = report(lab.tf_dump("fit", healthy=True))
    assert rep.returncode == 0 and rep.data["verdict"] == "clean", rep.text
    assert any("may not have been kept" in n for n in rep.data["notes"]), rep.data["notes"]
    assert rep.data["steps"] is not None


# -- crash paths --------------------------------------------------------------------------------

CRASHING = """
import os, signal, time
import numpy as np
import tensorflow as tf

w = tf.Variable(np.ones((4, 1), np.float32))
opt = tf.keras.optimizers.SGD(0.01)

@tf.function
def train_step(x):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.matmul(x, w) ** 2)
    opt.apply([tape.gradient(loss, w)], [w])
    return loss

x = tf.constant(np.ones((8, 4), np.float32))
for step in range(40):
    train_step(x)
time.sleep(1.5)  # past the flush interval
os.kill(os.getpid(), signal.{signal})
time.sleep(5)
"""


@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_a_killed_tensorflow_program_leaves_what_it_recorded(tmp_path: Path, sig: str) -> None:
    """SIGKILL: the whole history up to the last flush stays, read as incomplete (the
    recording never ended), never as clean. SIGTERM: recording ends as at exit."""
    pytest.importorskip("tensorflow")
    (tmp_path / "prog.py").write_text(textwrap.dedent(CRASHING.replace("{signal}", sig)))
    out = _run("-m", "nanscope", "run", "--logdir", "dump", "--circular-buffer-size", "50",
               "prog.py", cwd=tmp_path)  # fmt: skip
    assert out.returncode == -getattr(signal, sig), out.stderr[-3000:]
    rep = report(tmp_path / "dump")
    with nanscope.open_dump(tmp_path / "dump") as r:
        assert r.num_graph_execution_traces() > 0 and r.steps_known
    if sig == "SIGKILL":
        assert rep.returncode == 2 and rep.data["verdict"] == "incomplete", rep.text
        assert any("never closed" in p["message"] for p in rep.data["incomplete"])
    else:
        assert rep.returncode == 0 and rep.data["verdict"] == "clean", rep.text
        assert rep.data["evicted"][TRACES] > 0  # windowed as at exit
        assert rep.data["steps"] == [0, 39]


# -- the rules, on their own (no TensorFlow needed) --------------------------------------------


def _stream_kept(
    nonfinite: np.ndarray,
    nan: np.ndarray,
    kinds: np.ndarray,
    capacity: int,
    window: int,
    chunks: list[int],
    tmp: Path,
) -> np.ndarray:
    """Which events nanscope's own writer keeps (its EventStream, fed in ``chunks``)."""
    n = len(nonfinite)
    payloads = [b"x" * (1 + i % 7) for i in range(n)]
    framed = [frame(p) for p in payloads]
    rows = np.zeros(n, dtype=sidecar.ROW_DTYPE)
    rows["name"] = kinds
    rows["nonfinite"] = nonfinite
    rows["nan"] = nan
    rows["sequence"] = np.arange(1, n + 1)
    stream = EventStream(tmp / "x.execution", capacity, window, lambda spec: spec)
    start = 0
    for size in chunks:
        part = slice(start, start + size)
        data = b"".join(framed[part])
        block = rows[part].copy()
        lengths = np.array([len(f) for f in framed[part]], dtype=np.int64)
        block["length"] = lengths
        block["offset"] = np.cumsum(lengths) - lengths
        stream.add_framed(data, block)
        start += size
    for op in stream.flush():
        op.run()
    kept_rows = []
    for record in scan((tmp / "x.execution.nsidx").read_bytes(), "idx").records:
        chunk, _ = sidecar.decode_chunk(record.payload)
        if chunk is not None:
            kept_rows.append(chunk)
    seq = np.concatenate(kept_rows)["sequence"] if kept_rows else np.zeros(0, np.int64)
    mask = np.zeros(n, dtype=bool)
    mask[seq - 1] = True
    return mask


@pytest.mark.parametrize("seed", range(6))
def test_the_spool_keeps_what_nanscopes_writer_keeps(tmp_path: Path, seed: int) -> None:
    """:func:`tf_spool.kept` over a whole history keeps exactly the events that nanscope's
    writer keeps as they arrive: anchors per (op type, has NaN), the first NaN past the
    bound, windows merging, the last N."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(200, 3000))
    kinds = rng.integers(1, 40, size=n)
    nonfinite = (rng.random(n) < rng.choice([0.002, 0.02, 0.2])).astype(np.int8)
    nan = np.where(nonfinite == 1, rng.integers(0, 2, size=n), 0)
    capacity = int(rng.choice([5, 50, 300]))
    window = int(rng.choice([3, 20, 100]))
    chunks = []
    left = n
    while left:
        size = min(left, int(rng.integers(1, 400)))
        chunks.append(size)
        left -= size
    want = _stream_kept(nonfinite, nan, kinds, capacity, window, chunks, tmp_path)
    got = tf_spool.kept(nonfinite == 1, nan, kinds, capacity, window)
    assert np.array_equal(got, want), (np.flatnonzero(got ^ want)[:20], capacity, window)


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return extract_tf_dumps(tmp_path_factory.mktemp("tf_dumps"))


def test_steps_of_a_tensorflow_dump(golden: Path) -> None:
    """tests/data/tf_program.py differentiates a tf.function under a GradientTape three
    times: three steps, the Log's -inf at step 1 (its docstring), the eager ops before
    training at step 0; the eager-only version trains with no function: no steps."""
    with nanscope.open_dump(golden / "FULL_HEALTH") as r:
        assert r.steps_known
        first = r.first_where("neg_inf", TRACES)[1]
        assert first is not None
        trace = r.trace(first.index)
        assert (trace.op_type, trace.step) == ("Log", 1)
        assert r.execution(0).step == 0
        assert int(r.index(TRACES)["step"].max()) == 2
    a = analyze(nanscope.open_dump(golden / "FULL_HEALTH"))
    assert a.steps == [0, 2] and a.cause is not None and a.cause.step == 1
    assert "at step 1" in (headline(a) or "")
    with nanscope.open_dump(golden / "FULL_HEALTH_eager_only") as r:
        assert not r.steps_known
        assert analyze(r).steps is None


def test_a_tensorflow_circular_dump_that_lost_traces_is_incomplete(golden: Path) -> None:
    """TensorFlow's buffer of 20 kept 20 of 42 traces: the first call it holds left 6 of the
    14 traces every call leaves. Incomplete (its harm still told), and no steps."""
    with nanscope.open_dump(golden / "FULL_HEALTH_circular") as r:
        (lost,) = r.incomplete
        assert "left fewer of the traces" in lost.message and "(14)" in lost.message
        assert lost.file is not None and lost.file.endswith(".graph_execution_traces")
        assert not r.steps_known
        a = analyze(r)
    assert a.verdict == "harmful" and a.incomplete and a.steps is None
