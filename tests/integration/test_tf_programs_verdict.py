"""Real TensorFlow programs as Keras users run them, recorded by TensorFlow's own writer with
the whole history, held against oracles that do not use nanscope.

Programs (``tests/programs/real/tf_*.py``), by class:

* loss scaling under ``mixed_float16`` (Keras's ``LossScaleOptimizer``): the TensorFlow
  mixed-precision guide's ``Model.fit`` and its custom training loop, each healthy (float16
  gradients overflow, the update is skipped, the scale halves, training goes on: every
  lineage ``handled``, exit 0, ``--check-numerics`` runs to the end) and diverging (a
  learning rate far too high: the float16 forward pass overflows, the loss is Inf/NaN:
  ``harmful``, and ``--check-numerics`` stops it);
* explanations that fit the op: keras-io's ``Model.train_step`` override with a
  hand-written cross-entropy (``Log`` of a softmax that underflowed to 0) and keras-io's
  training loop from scratch with Adam far too fast (``Square`` of a gradient above 1.8e19
  for Adam's second moment), plus a probe that makes each listed op make Inf/NaN from
  finite inputs.

The oracles, computed here:

* ``tf.debugging.enable_check_numerics()``: the first op whose output holds Inf/NaN, which
  the report's ``origin`` must be;
* TensorFlow's ``DebugDataReader`` over the FULL_HEALTH dump: the births (a non-finite
  graph trace whose traced graph inputs were all finite), which the report's lineages must
  be born at, and nowhere else;
* the program's own counters: train steps run against the optimizer's ``iterations`` (the
  updates it applied): the loss scaler's skipped steps.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tensorflow")

import nanscope
from nanscope.analysis import ViewBuilder, analyze
from nanscope.analysis._lineages import find_lineages
from nanscope.backends import tf_spool
from nanscope.format import files
from nanscope.reader import TRACES
from nanscope.report import report_json

pytestmark = [pytest.mark.tf, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "tests" / "programs" / "real"
TIMEOUT = 300
DEFAULT_BUFFER = 1000  # `nanscope run`'s --circular-buffer-size

# Runs a program as `python program.py args` would, with TensorFlow's own dumping (FULL_HEALTH,
# the whole history) or TensorFlow's own check_numerics turned on first.
RUNNER = """
import os, runpy, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
how, where = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[3:]
if how == "dump":
    tf.debugging.experimental.enable_dump_debug_info(where, "FULL_HEALTH", -1)
else:
    tf.debugging.enable_check_numerics()
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    if how == "dump":
        tf.debugging.experimental.disable_dump_debug_info()
"""


@dataclass(frozen=True)
class Case:
    program: str
    args: tuple[str, ...]
    healthy: bool
    story: str


CASES: dict[str, Case] = {
    "fit_mixed_healthy": Case(
        "tf_fit_mixed_precision.py", (), True,
        "the guide's Model.fit with pixels left in 0..255: float16 gradients overflow at the "
        "first steps, the LossScaleOptimizer skips them and halves its scale",
    ),
    "fit_mixed_diverges": Case(
        "tf_fit_mixed_precision.py", ("--learning-rate", "3"), False,
        "RMSprop far too fast: the weights grow until the float16 forward pass overflows",
    ),
    "step_loss_scale_healthy": Case(
        "tf_step_loss_scale.py", (), True,
        "the guide's custom loop (scale_loss, apply) on a ConvNet: gradients overflow, skipped",
    ),
    "step_loss_scale_diverges": Case(
        "tf_step_loss_scale.py", ("--learning-rate", "10"), False,
        "Adam far too fast: a float16 Conv2D of the forward pass overflows",
    ),
    "fit_custom_train_step": Case(
        "tf_fit_custom_train_step.py", ("--learning-rate", "50"), False,
        "train_step override, hand-written cross-entropy: softmax underflows, log(0) = -inf",
    ),
    "step_adam_from_scratch": Case(
        "tf_step_adam_from_scratch.py", ("--learning-rate", "1e10"), False,
        "Adam far too fast: its Square of a gradient above 1.8e19 overflows float32",
    ),
}  # fmt: skip


@dataclass
class Run:
    """What one case gave: its dump, the report's JSON, and the oracles' findings."""

    dump: Path
    report: dict[str, Any]
    report_status: int
    program_output: str
    tf_check: str  # the output of the run under tf.debugging.enable_check_numerics()
    checked: subprocess.CompletedProcess[str]  # `nanscope run --check-numerics`
    # `nanscope run`'s own dump of the whole history (TensorFlow's writer into its spool).
    spooled: Path
    # That history kept as `nanscope run` keeps it by default: the report and exit status.
    launched: dict[str, Any]
    launched_status: int


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=TIMEOUT, env=_env(), cwd=ROOT, check=False
    )


def _nanscope(*args: str) -> list[str]:
    return [sys.executable, "-m", "nanscope", *args]


def _case_run(case: Case, workdir: Path) -> Run:
    program = [str(PROGRAMS / case.program), *case.args]
    dump = workdir / "dump"
    recorded = _run([sys.executable, "-c", RUNNER, "dump", str(dump), *program])
    assert recorded.returncode == 0, recorded.stderr[-3000:]
    tf_check = _run([sys.executable, "-c", RUNNER, "check", "-", *program])
    checked = _run(_nanscope("run", "--check-numerics", *program))
    report = _run(_nanscope("report", str(dump), "--json"))
    spooled = workdir / "spooled"
    launched = _run(_nanscope("run", "--circular-buffer-size", "-1", "--logdir", str(spooled),
                              *program))  # fmt: skip
    assert launched.returncode == 0, launched.stderr[-3000:]
    # What `nanscope run` keeps with its default buffer, by the function it keeps it with
    # at exit, from the same history (so that the windows below cut this very run).
    launched_report = window(spooled, workdir / "launched", DEFAULT_BUFFER, tf_spool.ORIGIN_WINDOW)
    return Run(dump, json.loads(report.stdout), report.returncode,
               recorded.stdout, tf_check.stdout + tf_check.stderr, checked, spooled,
               launched_report.data, launched_report.status)  # fmt: skip


@dataclass
class Windowed:
    data: dict[str, Any]  # the report's JSON
    status: int


def window(spooled: Path, where: Path, capacity: int, origin_window: int) -> Windowed:
    """A copy of a spooled whole history kept as a buffer of ``capacity`` with windows of
    ``origin_window`` keeps it, and its report: the JSON and exit status of ``nanscope
    report --json`` (made here, by the functions that command calls)."""
    shutil.copytree(spooled, where)
    (file_set,) = files.discover(where)
    tf_spool.finish(file_set, capacity, origin_window)
    with nanscope.open_dump(where) as reader:
        found = analyze(reader)
    # Serialised as the command prints it (no NaN allowed in the JSON).
    as_json = json.dumps(report_json(found), allow_nan=False, default=str)
    return Windowed(json.loads(as_json), found.exit_status)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[Run]]]:
    """Every case's runs, two at a time, started when the first test asks."""
    root = tmp_path_factory.mktemp("tf_programs")
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {name: pool.submit(_case_run, case, root / name) for name, case in CASES.items()}


def run_of(lab: dict[str, Future[Run]], name: str) -> Run:
    return lab[name].result(timeout=TIMEOUT * 4)


# -- the oracles -------------------------------------------------------------------------------


def tf_first_nonfinite(output: str) -> tuple[str, str] | None:
    """``(op type, op name)`` of the op at which ``tf.debugging.enable_check_numerics()``
    raised, from its error message."""
    kind = re.search(
        r'Detected Infinity or NaN in output \d+ of (?:graph|eagerly-executing) op "(\w+)"', output
    )
    node = re.search(r"\{\{node (.+?)/CheckNumericsV2\}\}", output)
    if kind is None:
        return None
    return kind.group(1), node.group(1) if node else kind.group(1)


def tf_births(dump: Path) -> list[int]:
    """The births TensorFlow's own reader shows: the graph traces (by index) whose FULL_HEALTH
    summary holds -inf, +inf or NaN while every traced graph input was finite (looking
    through ``Identity`` ops, which TensorFlow does not trace)."""
    from tensorflow.python.debug.lib.debug_events_reader import DebugDataReader

    births: list[int] = []
    with DebugDataReader(str(dump)) as reader:
        reader.update()
        last: dict[tuple[str, str, int], int] = {}  # (graph, op, slot) -> latest trace
        bad: list[bool] = []
        for i, trace in enumerate(reader.graph_execution_traces()):
            value = trace.debug_tensor_value
            bad.append(value is not None and value[5] + value[6] + value[7] > 0)
            if bad[i]:
                graph = reader.graph_by_id(trace.graph_id)
                inputs = []
                for name in graph.get_op_creation_digest(trace.op_name).input_names:
                    src, _, slot = name.rpartition(":")
                    key = (trace.graph_id, src, int(slot))
                    while key not in last:  # through untraced Identity ops
                        op = graph.get_op_creation_digest(key[1])
                        if op.op_type != "Identity":
                            break
                        src, _, slot = op.input_names[0].rpartition(":")
                        key = (trace.graph_id, src, int(slot))
                    if key in last:
                        inputs.append(last[key])
                if inputs and not any(bad[j] for j in inputs):
                    births.append(i)
            last[(trace.graph_id, trace.op_name, trace.output_slot)] = i
    return births


def skipped_by_program(output: str) -> int:
    """Train steps run less the updates the optimizer applied, as the program printed them."""
    found = re.search(r"train steps (\d+), updates applied (\d+)", output)
    assert found, output
    return int(found.group(1)) - int(found.group(2))


# -- the tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_verdict_and_exit_status(lab: dict[str, Future[Run]], name: str) -> None:
    """Healthy runs (every overflow handled by the loss scaler) exit 0, harmful ones 1."""
    run, case = run_of(lab, name), CASES[name]
    kinds = {g["kind"] for g in run.report["lineages"]}
    if case.healthy:
        assert run.report_status == 0, (case.story, run.report["headline"], run.report["lineages"])
        assert run.report["verdict"] == "absorbed"
        assert kinds == {"handled"}, case.story
    else:
        assert run.report_status == 1, (case.story, run.report["headline"])
        assert run.report["verdict"] == "harmful"


@pytest.mark.parametrize("name", list(CASES))
def test_nanscope_run_with_its_default_buffer_tells_the_same(
    lab: dict[str, Future[Run]], name: str
) -> None:
    """Under `nanscope run` (a buffer of 1000, windowed when the program ends) the verdict,
    the exit status, the cause and the skipped steps are the whole history's."""
    run = run_of(lab, name)
    whole, launched = run.report, run.launched
    assert (launched["verdict"], run.launched_status) == (whole["verdict"], run.report_status)
    if whole["cause"] is not None:
        assert launched["cause"]["op_name"] == whole["cause"]["op_name"]
        assert launched["cause"]["step"] == whole["cause"]["step"]

    def skipped(report: dict[str, Any]) -> set[int]:
        return {s for g in report["lineages"] if g["kind"] == "handled" for s in g["skipped_steps"]}

    # The buffer keeps the windows of each first Inf/NaN, so some skipped steps, never others.
    assert bool(skipped(launched)) == bool(skipped(whole))
    assert skipped(launched) <= skipped(whole)


# (buffer, window) cuts of a history: windows that end inside a graph call, cutting a
# gradient's lineage off from the loss scaler's check that reads it, or a birth off from
# its consumers (the spool keeps `window` traces after the first Inf/NaN of each kind).
CUTS = [(1000, 90), (1000, 95), (1000, 105), (300, 20), (300, 50), (300, 95)]


@pytest.mark.parametrize("name", list(CASES))
def test_no_window_of_the_history_turns_its_verdict(
    lab: dict[str, Future[Run]], name: str, tmp_path: Path
) -> None:
    """Wherever a circular buffer's windows cut a lineage, the verdict is the whole
    history's: a gradient overflow cut off from the loss scaler's check is still handled
    (the graph shows that only the check reads it), never harmful for want of its
    consumer's trace, nor absorbed by a later call's; a harmful run stays harmful, with its
    cause. A lineage whose fate no rule can tell would make a dump with no harm incomplete
    (exit 2), never clean; the healthy programs have none (in the harmful ones, some of
    Adam's updates cut off from their variables are rightly unknown)."""
    run = run_of(lab, name)
    whole = run.report
    for capacity, origin_window in CUTS:
        cut = window(run.spooled, tmp_path / f"{capacity}-{origin_window}", capacity, origin_window)
        got = (cut.data["verdict"], cut.status)
        assert got == (whole["verdict"], run.report_status), (capacity, origin_window, cut.data)
        if CASES[name].healthy:
            assert {g["kind"] for g in cut.data["lineages"]} <= {"handled"}, (
                capacity,
                origin_window,
            )
        if whole["cause"] is not None:
            assert cut.data["cause"]["op_name"] == whole["cause"]["op_name"]


@pytest.mark.parametrize("name", list(CASES))
def test_origin_is_the_first_op_tf_check_numerics_stops_at(
    lab: dict[str, Future[Run]], name: str
) -> None:
    run = run_of(lab, name)
    first = tf_first_nonfinite(run.tf_check)
    assert first is not None, run.tf_check[-2000:]
    origin = run.report["origin"]
    assert (origin["op_type"], origin["op_name"]) == first


@pytest.mark.parametrize("name", list(CASES))
def test_lineages_are_born_where_tensorflows_reader_sees_births(
    lab: dict[str, Future[Run]], name: str
) -> None:
    """Every lineage of the graph traces starts at a birth the oracle sees, and every birth the
    oracle sees starts one (the report groups them; the lineages themselves are compared)."""
    run = run_of(lab, name)
    with nanscope.open_dump(run.dump) as reader:
        lineages, complete = find_lineages(reader)
    assert complete
    ours = sorted(lin.birth for lin in lineages if lin.kind == TRACES)
    assert ours == tf_births(run.dump)


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.healthy])
def test_loss_scaler_skipped_steps(lab: dict[str, Future[Run]], name: str) -> None:
    """Each step the loss scaler skipped is told as handled, once: as many as the program's
    train steps less its optimizer's applied updates."""
    run = run_of(lab, name)
    skipped = skipped_by_program(run.program_output)
    assert skipped >= 2  # the program overflows, as the case says
    with nanscope.open_dump(run.dump) as reader:
        lineages, _ = find_lineages(reader)
        handled = {
            lin.handled_at
            for lin in lineages
            if lin.verdict == "handled" and lin.handled_at is not None
        }
        assert len(handled) == skipped
        # Each is a trace of the branch that skips the update (halves the scale).
        for index in handled:
            assert re.search(r"cond_false_\d+$", reader.trace(index).graph_name)
    if run.report["steps"] is not None:  # when the dump's steps are counted
        steps = {s for g in run.report["lineages"] for s in g["skipped_steps"]}
        assert len(steps) == skipped


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if not c.healthy])
def test_harm_is_born_outside_the_loss_scalers_reach(
    lab: dict[str, Future[Run]], name: str
) -> None:
    """The cause is what made the loss or the weights non-finite, never a gradient overflow
    that the scaler skipped: a forward op (a float16 overflow, log of zero) or Adam's own
    update."""
    run = run_of(lab, name)
    cause = run.report["cause"]
    assert cause is not None
    assert not cause["op_name"].startswith("gradient_tape/"), cause["op_name"]
    for group in run.report["lineages"]:
        if group["kind"] == "handled":
            assert group["birth"]["op_name"].startswith("gradient_tape/")


# An intended mask in a tf.function: log(0) = -inf where a position is masked out, carried
# through three ops, then absorbed by a softmax. Healthy.
MASK_IN_A_FUNCTION = """
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf

scores = tf.Variable([[1.0, 2.0, 3.0, 4.0]])
keep = tf.Variable([[1.0, 1.0, 0.0, 1.0]])

@tf.function
def attend():
    masked = scores.read_value() + tf.math.log(keep.read_value())
    masked = (masked * 0.5) - 1.0
    return tf.nn.softmax(masked)

for _ in range(4):
    weights = attend()
print("weights finite:", bool(tf.reduce_all(tf.math.is_finite(weights))))
"""


def test_a_lineage_cut_off_from_its_fate_leaves_no_all_clear_and_no_alarm(tmp_path: Path) -> None:
    """A window that ends right after a mask's birth keeps neither the softmax that absorbed
    it nor anything after it in that call: what became of the -inf is not in the dump. The
    report gives no verdict (exit 2), names the birth and what was dropped, and calls
    nothing harmful; the whole history's report says every mask was absorbed (exit 0)."""
    program = tmp_path / "masked.py"
    program.write_text(MASK_IN_A_FUNCTION)
    spooled = tmp_path / "spooled"
    ran = _run(_nanscope("run", "--circular-buffer-size", "-1", "--logdir", str(spooled),
                         str(program)))  # fmt: skip
    assert ran.returncode == 0 and "weights finite: True" in ran.stdout, ran.stderr[-3000:]
    whole = _run(_nanscope("report", str(spooled), "--json"))
    assert (json.loads(whole.stdout)["verdict"], whole.returncode) == ("absorbed", 0)
    assert {g["kind"] for g in json.loads(whole.stdout)["lineages"]} == {"benign"}
    # The first call's ops each make a new kind of Inf/NaN (Log, AddV2, Mul, Sub), so all
    # of it is kept; then 4 traces more: the second call's two reads and its Log. Of the
    # rest, the buffer's last two: the last call's Sub and Softmax.
    cut = window(spooled, tmp_path / "cut", 2, 4)
    with nanscope.open_dump(tmp_path / "cut") as reader:
        kept = [reader.trace(i) for i in range(reader.num(TRACES))]
    logs = [k for k, t in enumerate(kept) if t.op_type == "Log"]
    assert len(logs) == 2
    second = kept[logs[1]]
    assert kept[logs[1] + 1].sequence > second.sequence + 1  # the rest of its call: dropped
    assert (cut.data["verdict"], cut.status) == ("incomplete", 2), cut.data["headline"]
    unknown = [g for g in cut.data["lineages"] if g["kind"] == "unknown"]
    assert [g["birth"]["index"] for g in unknown] == [logs[1]]
    assert "harmful" not in {g["kind"] for g in cut.data["lineages"]}
    (problem,) = [p for p in cut.data["incomplete"] if "what became of" in p["message"]]
    assert f"born at Log #{unknown[0]['birth']['index']}" in problem["message"]
    assert "circular_buffer_size=-1" in problem["message"]


def test_cause_explanations_fit_the_op(lab: dict[str, Future[Run]]) -> None:
    log = run_of(lab, "fit_custom_train_step").report["cause"]
    assert (log["op_type"], log["explanation"]) == (
        "Log",
        f"log of zero: the input had {log['inputs'][0]['counts']['zero']} zeros",
    )
    square = run_of(lab, "step_adam_from_scratch").report["cause"]
    assert square["op_type"] == "Square"
    assert square["explanation"].startswith(
        "overflow in Square: the input was finite, but x² exceeds"
    )
    assert "0 to a negative power" not in square["explanation"]


@pytest.mark.parametrize("name", list(CASES))
def test_check_numerics_raises_only_for_harm(lab: dict[str, Future[Run]], name: str) -> None:
    """``nanscope run --check-numerics`` runs healthy programs to the end through the loss
    scaler's skipped steps, and stops harmful ones."""
    run, case = run_of(lab, name), CASES[name]
    out = run.checked.stdout + run.checked.stderr
    if case.healthy:
        assert run.checked.returncode == 0, out[-3000:]
        assert "train steps" in run.checked.stdout
    else:
        assert run.checked.returncode != 0, out[-3000:]
        assert "nanscope check_numerics" in out


# -- explanations, op by op ----------------------------------------------------------------------

# One tf.function in which each op makes Inf/NaN from finite inputs (values read from
# variables, so that grappler folds nothing and each input is traced).
PROBE = """
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf

def f32(*values):
    return tf.Variable(values, dtype=tf.float32)

V = dict(big=f32(1e20, 2.0), zero_one=f32(0.0, 1.0), neg=f32(-2.0, 4.0), half=f32(0.5, 0.5),
         ones=f32(1.0, 1.0), exponent=f32(-1.0, 1.0), x16=f32(1e5, 1.0),
         image=tf.Variable(tf.fill([1, 3, 3, 1], 1e20)),
         kernel=tf.Variable(tf.fill([3, 3, 1, 1], 1e20)))

@tf.function
def probe():
    v = {k: var.read_value() for k, var in V.items()}
    big, zero_one, neg, ones = v["big"], v["zero_one"], v["neg"], v["ones"]
    out = {}
    out["Square"] = tf.math.square(big)
    out["Pow"] = tf.math.pow(zero_one, v["exponent"])
    out["Pow_1"] = tf.math.pow(neg, v["half"])
    out["Exp"] = tf.math.exp(big / 1e18)
    out["Log"] = tf.math.log(zero_one)
    out["Log_1"] = tf.math.log(neg)
    out["Reciprocal"] = tf.math.reciprocal(zero_one)
    out["RealDiv"] = tf.math.truediv(ones, zero_one, name="RealDiv")
    out["RealDiv_1"] = tf.math.truediv(zero_one, zero_one, name="RealDiv_1")
    out["MatMul"] = tf.linalg.matmul(tf.reshape(big, [1, -1]), tf.reshape(big, [-1, 1]))
    out["Mul"] = tf.math.multiply(big, big, name="Mul")
    out["Sub"] = tf.math.subtract(big * 3e18, -big * 3e18, name="Sub")
    out["AddV2"] = tf.math.add(big * 3e18, big * 3e18, name="AddV2")
    out["Sqrt"] = tf.math.sqrt(neg)
    out["Rsqrt"] = tf.math.rsqrt(zero_one)
    out["Sum"] = tf.reduce_sum(tf.concat([big * 3e18, big * 3e18], 0), name="Sum")
    out["Mean"] = tf.reduce_mean(tf.concat([big * 3e18, big * 3e18], 0), name="Mean")
    out["Cast"] = tf.cast(v["x16"], tf.float16, name="Cast")
    half_big = tf.cast(ones * 6e4, tf.float16)
    out["BiasAdd"] = tf.nn.bias_add(tf.reshape(half_big, [1, -1]), half_big, name="BiasAdd")
    out["Conv2D"] = tf.nn.conv2d(v["image"], v["kernel"], strides=1, padding="VALID", name="Conv2D")
    plus_inf = tf.math.negative(tf.math.log(zero_one), name="PlusInf")
    out["Softmax"] = tf.nn.softmax(plus_inf, name="Softmax")
    out["InfMinusInf"] = tf.math.subtract(plus_inf, plus_inf, name="InfMinusInf")
    out["ZeroTimesInf"] = tf.math.multiply(plus_inf, zero_one * 0.0, name="ZeroTimesInf")
    out["Log1p"] = tf.math.log1p(neg)
    out["Xlogy"] = tf.math.xlogy(ones, zero_one)
    out["DivNoNan"] = tf.math.divide_no_nan(big * 3e18, ones * 1e-20, name="DivNoNan")
    out["SquaredDifference"] = tf.math.squared_difference(big, -big)
    with tf.GradientTape() as tape:
        tape.watch(zero_one)
        root = tf.math.sqrt(zero_one, name="SqrtOfZero")
    out["SqrtGrad"] = tape.gradient(root, zero_one)
    return out

tf.debugging.experimental.enable_dump_debug_info(os.environ["DUMP"], "FULL_HEALTH", -1)
probe()
tf.debugging.experimental.disable_dump_debug_info()
"""

# op name in the probe -> (op type, what its explanation must say)
EXPLAINED: dict[str, tuple[str, str]] = {
    "Square": ("Square", "overflow in Square: the input was finite, but x² exceeds the largest "
                         "float32 (3.4e38), as it does for |x| above 1.8e19"),
    "Pow": ("Pow", "0 to a negative power in Pow: the base (input 0) had 1 zero, the exponent "
                   "(input 1) had 1 negative value"),
    "Pow_1": ("Pow", "a negative number to a fractional power in Pow gives NaN: the base "
                     "(input 0) had 1 negative value"),
    "Exp": ("Exp", "overflow in Exp: the input was finite, but exp(x) exceeds the largest "
                   "float32 (3.4e38) for x above 88.7"),
    "Log": ("Log", "log of zero: the input had 1 zero"),
    "Log_1": ("Log", "log of a negative number: the input had 1 negative value"),
    "Reciprocal": ("Reciprocal", "x/0 in Reciprocal: the divisor (input 0) had 1 zero"),
    "RealDiv": ("RealDiv", "x/0 in RealDiv: the divisor (input 1) had 1 zero"),
    "RealDiv_1": ("RealDiv", "0/0 in RealDiv: zeros divided by zeros; the divisor (input 1) had "
                             "1 zero, the numerator (input 0) 1 zero"),
    "MatMul": ("MatMul", "overflow in MatMul: the inputs were finite, but the result exceeds "
                         "the largest float32 (3.4e38)"),
    "Mul": ("Mul", "overflow in Mul: the inputs were finite, but the result exceeds the largest "
                   "float32 (3.4e38)"),
    "Sub": ("Sub", "overflow in Sub: the inputs were finite, but the result exceeds the largest "
                   "float32 (3.4e38)"),
    "AddV2": ("AddV2", "overflow in AddV2: the inputs were finite, but the result exceeds the "
                       "largest float32 (3.4e38)"),
    "Sqrt": ("Sqrt", "sqrt of a negative number: the input had 1 negative value"),
    "Rsqrt": ("Rsqrt", "rsqrt of zero: the input had 1 zero"),
    "Sum": ("Sum", "overflow in Sum: the recorded inputs were finite, but the result exceeds "
                   "the largest float32 (3.4e38)"),
    "Mean": ("Mean", "overflow in Mean: the recorded inputs were finite, but the result exceeds "
                     "the largest float32 (3.4e38)"),
    "Cast": ("Cast", "a cast to float16 overflowed: values above 65504 became inf (input 0 was "
                     "float32, finite)"),
    "BiasAdd": ("BiasAdd", "overflow in BiasAdd: the inputs were finite, but the result exceeds "
                           "the largest float16 (65504)"),
    "Conv2D": ("Conv2D", "overflow in Conv2D: the inputs were finite, but the result exceeds "
                         "the largest float32 (3.4e38)"),
    "Softmax": ("Softmax", "softmax of a row holding +inf gives NaN: subtracting the row's max "
                           "makes inf - inf"),
    "InfMinusInf": ("Sub", "inf - inf: infinities cancelled, giving NaN"),
    "ZeroTimesInf": ("Mul", "0 * inf: an infinite input was multiplied by a zero, giving NaN"),
    "Log1p": ("Log1p", "log1p of a value <= -1 (the input had negative values)"),
    "Xlogy": ("Xlogy", "log of zero: y (input 1) of Xlogy(x, y) = x * log(y) had 1 zero"),
    "DivNoNan": ("DivNoNan", "overflow in DivNoNan: the inputs were finite (DivNoNan gives 0 "
                             "where the divisor is 0), but a quotient exceeds the largest "
                             "float32 (3.4e38): a divisor near 0?"),
    "SquaredDifference": ("SquaredDifference", "overflow in SquaredDifference: the inputs were "
                          "finite, but (x - y)² exceeds the largest float32 (3.4e38), as it "
                          "does for |x - y| above 1.8e19"),
    "SqrtGrad": ("SqrtGrad", "x/0 in SqrtGrad: the gradient of sqrt is dy * 0.5 / sqrt(x), "
                             "infinite at x = 0: sqrt's output (input 0) had 1 zero"),
}  # fmt: skip
# Made from Inf/NaN that came in: not births, but their explanation must still fit.
CARRIED = {"Softmax", "InfMinusInf", "ZeroTimesInf"}


@pytest.fixture(scope="module")
def probe_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dump = tmp_path_factory.mktemp("tf_probe") / "dump"
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=TIMEOUT,
        env={**_env(), "DUMP": str(dump)}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return dump


def test_each_op_explained_from_its_type_and_inputs(probe_dump: Path) -> None:
    """Each op's Inf/NaN, in a dump TensorFlow wrote, explained by what that op does with the
    inputs it had; the births among them are those TensorFlow's reader shows."""
    births = set(tf_births(probe_dump))
    seen: dict[str, str] = {}
    with nanscope.open_dump(probe_dump) as reader:
        views = ViewBuilder(reader)
        rows = reader.index(TRACES)
        for index in range(len(rows)):
            if rows["nonfinite"][index] != 1:
                continue
            view = views.view(TRACES, index)
            name = "SqrtGrad" if view.op_type == "SqrtGrad" else view.op_name
            if name not in EXPLAINED:
                continue
            op_type, text = EXPLAINED[name]
            assert view.op_type == op_type, name
            assert view.explanation == text, name
            assert (index in births) == (name not in CARRIED), name
            seen[name] = view.explanation
    assert set(seen) == set(EXPLAINED)


MASKED = """
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
import nanscope

nanscope.enable_check_numerics(framework="tensorflow")
w = tf.Variable(tf.random.normal([8, 8], seed=0))
mask = tf.constant(np.triu(np.full((8, 8), -np.inf, np.float32), 1))  # causal: -inf above
optimizer = tf.keras.optimizers.SGD(0.1)

@tf.function
def step(x):
    with tf.GradientTape() as tape:
        probs = tf.nn.softmax(tf.matmul(x, w) + mask)  # the mask: absorbed by softmax
        loss = tf.reduce_mean(probs * tf.range(8, dtype=tf.float32))
    optimizer.apply(tape.gradient(loss, [w]), [w])
    return loss

for _ in range(3):
    step(tf.random.normal([8, 8], seed=1))
nanscope.disable_check_numerics()
print("ran to the end")
"""


def test_check_numerics_lets_an_absorbed_mask_run() -> None:
    """A -inf mask that softmax absorbs is neither written nor read by the backward pass
    (the add's gradient reads only shapes): nanscope's TensorFlow check lets it run."""
    done = subprocess.run(
        [sys.executable, "-c", MASKED], capture_output=True, text=True, timeout=TIMEOUT,
        env=_env(), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ran to the end" in done.stdout
