"""A corpus of buggy programs (``tests/cases/``), each run through ``nanscope run`` + ``report --json``.

Every ``tests/cases/*.py`` is a small program that ends normally (exit 0) after
making Inf or NaN somewhere (or, for a clean case, nowhere). It states what the
report must say in comments:

``# EXPECT path=value path~=value ...``
    One or more header lines. ``path`` is a dotted path into the report JSON
    (``docs/REPORT_JSON.md``): ``origin_kind``, ``found_nonfinite``,
    ``origin.op_type``, ``first_nan.explanation``, ``origin.counts.neg_inf``,
    ``origin.inputs.0.name``; a number indexes a list. ``=`` compares exactly,
    with ``value`` read as JSON when it parses (``1``, ``true``, ``null``) and
    as a string otherwise (``aten.log.default``). ``~=`` asks for a substring
    of the value's text. Quote values with spaces: ``origin.explanation~="log of zero"``.

``# <- target target ...`` (at the end of a code line)
    The line that a report event's source must point at: ``origin``,
    ``cause``, ``first_inf`` and ``first_nan`` are the event's ``source`` (the
    innermost frame of the case file's own code); ``origin.forward`` (or just
    ``forward``), ``cause.forward`` and ``first_nan.forward`` are a backward
    event's ``forward_source``, where the forward op whose gradient it computes
    was called.

``# XFAIL: reason``
    The expectation is right but nanscope gets it wrong today: the case is
    ``xfail(strict=True)`` with that reason, so fixing the bug turns it into a
    failure that asks for the line to be removed.

The report must exit 1 (a harmful Inf/NaN found), or 0 when a case expects
``found_nonfinite=false`` or ``found_harmful=false`` (only benign Inf, e.g. a
mask that softmax absorbs). Cases named ``tf_*`` need TensorFlow (marked
``tf``), ``jax_*`` JAX (marked ``jax``), the others PyTorch. All selected
programs are started at once on a small thread pool (each is a separate
``nanscope run`` process) and each test waits for its own; the example programs
of ``nanscope.examples`` are checked the same way, from the dumps they write
with ``--dump_dir``.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CASES_DIR = Path(__file__).parents[1] / "cases"
CASE_FILES = sorted(CASES_DIR.glob("*.py"))
TIMEOUT_S = 180
WORKERS = max(2, min(4, (os.cpu_count() or 1) + 1))  # the programs also wait on I/O
EVENTS = ("origin", "cause", "first_inf", "first_nan")
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_TF = importlib.util.find_spec("tensorflow") is not None
HAS_JAX = importlib.util.find_spec("jax") is not None


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


# --- the expectations in a case file ---------------------------------------------------------


@dataclass(frozen=True)
class Check:
    path: str
    op: str  # "=" or "~="
    value: Any


@dataclass
class Case:
    path: Path
    checks: list[Check] = field(default_factory=list)
    lines: dict[str, int] = field(default_factory=dict)  # "origin", "cause.forward", ... -> line
    xfail: str | None = None

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def framework(self) -> str:
        if self.name.startswith("tf_"):
            return "tensorflow"
        return "jax" if self.name.startswith("jax_") else "torch"

    @property
    def expects_nonfinite(self) -> bool:
        return not any(c.path == "found_nonfinite" and c.value is False for c in self.checks)

    @property
    def expects_harmful(self) -> bool:
        """Whether the report must exit 1: a harmful Inf/NaN, not only benign ones."""
        return self.expects_nonfinite and not any(
            c.path == "found_harmful" and c.value is False for c in self.checks
        )


_CHECK = re.compile(r"^(?P<path>[A-Za-z_][\w.]*)(?P<op>~=|=)(?P<value>.*)$", re.S)
_MARKER = re.compile(r"#\s*<-\s*(?P<targets>[\w. ]+?)\s*$")
_TARGET = re.compile(r"^(origin|cause|first_inf|first_nan)(\.forward)?$")


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_case(path: Path) -> Case:
    case = Case(path)
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("# EXPECT "):
            for token in shlex.split(stripped[len("# EXPECT ") :]):
                m = _CHECK.match(token)
                if m is None:
                    raise ValueError(f"{path.name}:{lineno}: bad EXPECT item {token!r}")
                value = m["value"] if m["op"] == "~=" else _value(m["value"])
                case.checks.append(Check(m["path"], m["op"], value))
        elif stripped.startswith("# XFAIL:"):
            case.xfail = stripped[len("# XFAIL:") :].strip()
        elif not stripped.startswith("#") and (m := _MARKER.search(line)):
            for target in m["targets"].split():
                target = "origin.forward" if target == "forward" else target
                if not _TARGET.match(target):
                    raise ValueError(f"{path.name}:{lineno}: unknown line marker {target!r}")
                if target in case.lines:
                    raise ValueError(f"{path.name}:{lineno}: a second line marked {target!r}")
                case.lines[target] = lineno
    if case.expects_nonfinite and "origin" not in case.lines:
        raise ValueError(f"{path.name}: no line is marked '# <- origin'")
    return case


CASES = [parse_case(p) for p in CASE_FILES]


# --- running programs (concurrently) ---------------------------------------------------------


@dataclass
class Outcome:
    command: list[str]
    run: subprocess.CompletedProcess[str]
    report: subprocess.CompletedProcess[str] | None
    data: dict[str, Any] | None

    def context(self) -> str:
        """What a failing assertion shows: the command, its output's tail and the key events."""
        lines = [
            "$ " + shlex.join(self.command),
            f"exit {self.run.returncode}; stderr tail:",
            *self.run.stderr.strip().splitlines()[-15:],
        ]
        if self.report is not None:
            lines.append(f"report exit {self.report.returncode}; {self.report.stderr.strip()}")
        if self.data is not None:
            lines.append(f"origin_kind={self.data.get('origin_kind')!r}")
            for name in EVENTS:
                lines.append(f"{name}: {_describe(self.data.get(name))}")
        return "\n".join(lines)


def _describe(event: dict[str, Any] | None) -> str:
    if event is None:
        return "null"
    src, fwd = event.get("source"), event.get("forward_source")
    where = f"{Path(src['file']).name}:{src['line']}" if src else "?"
    fwhere = f" forward {fwd['line']}" if fwd else ""
    return (
        f"{event['kind']} #{event['index']} {event['op_type']} at {where}{fwhere} "
        f"phase={event['phase']!r} module={event['module_path']!r} "
        f"explanation={event['explanation']!r}"
    )


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("OMP_NUM_THREADS", "1")  # several small programs share the CPUs
    return env


def record_and_report(command: list[str], logdir: Path) -> Outcome:
    """Run ``command`` (which writes a dump into ``logdir``), then ``nanscope report --json``."""
    run = subprocess.run(
        command, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=logdir.parent, env=_env()
    )
    if run.returncode != 0:
        return Outcome(command, run, None, None)
    report = subprocess.run(
        [sys.executable, "-m", "nanscope", "report", str(logdir), "--json"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=_env(),
    )
    try:
        data = json.loads(report.stdout)
    except ValueError:
        data = None
    return Outcome(command, run, report, data)


def _case_command(case: Case, logdir: Path) -> list[str]:
    return [sys.executable, "-m", "nanscope", "run", "--logdir", str(logdir),
            "--circular-buffer-size", "-1", str(case.path)]  # fmt: skip


def _example_command(module: str, logdir: Path) -> list[str]:
    return [sys.executable, "-m", module, "--dump_dir", str(logdir), "--max_steps", "6"]


EXAMPLES = {
    "debug_mnist": ("nanscope.examples.debug_mnist", "torch"),
    "debug_mnist_tf": ("nanscope.examples.debug_mnist_tf", "tensorflow"),
    "debug_mnist_jax": ("nanscope.examples.debug_mnist_jax", "jax"),
}


def _runnable(framework: str) -> bool:
    return {"tensorflow": HAS_TF, "jax": HAS_JAX}.get(framework, HAS_TORCH)


class Runner:
    """Starts every selected program at once on a thread pool; tests wait for their own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="nanscope-case")
        self.jobs: dict[str, Future[Outcome]] = {}
        self.commands: dict[str, Callable[[Path], list[str]]] = {}
        for case in CASES:
            if _runnable(case.framework):
                self.commands[f"case:{case.name}"] = functools.partial(_case_command, case)
        for key, (module, framework) in EXAMPLES.items():
            if _runnable(framework) and _has_module(module):
                self.commands[f"example:{key}"] = functools.partial(_example_command, module)

    def start(self, key: str) -> None:
        if key in self.jobs or key not in self.commands:
            return
        logdir = self.root / key.replace(":", "-") / "dump"
        logdir.parent.mkdir(parents=True)
        self.jobs[key] = self.pool.submit(record_and_report, self.commands[key](logdir), logdir)

    def result(self, key: str) -> Outcome:
        self.start(key)
        return self.jobs[key].result()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def _key_of(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "case" in callspec.params:
        return f"case:{callspec.params['case'].name}"
    return getattr(getattr(item, "function", None), "job_key", None)


@pytest.fixture(scope="module")
def runner(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Runner]:
    r = Runner(tmp_path_factory.mktemp("cases"))
    here = Path(__file__)
    for item in request.session.items:  # only what this session selected (-k, node ids)
        if Path(str(item.path)) == here and (key := _key_of(item)) is not None:
            r.start(key)
    yield r
    r.close()


# --- checking a report -----------------------------------------------------------------------


def lookup(data: Any, path: str) -> Any:
    value = data
    for part in path.split("."):
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise KeyError(f"{path}: no {part!r} in the report here")
    return value


def check_report(case: Case, data: dict[str, Any]) -> list[str]:
    """Every way the report differs from the case's expectations (empty when it matches)."""
    problems = []
    for c in case.checks:
        try:
            actual = lookup(data, c.path)
        except KeyError as exc:
            problems.append(str(exc))
            continue
        if c.op == "~=":
            if c.value not in str(actual):
                problems.append(f"{c.path}: {actual!r} does not contain {c.value!r}")
        elif actual != c.value:
            problems.append(f"{c.path}: {actual!r}, expected {c.value!r}")
    for target, line in case.lines.items():
        event_name, _, forward = target.partition(".")
        event = data.get(event_name)
        if event is None:
            problems.append(f"{target}: expected line {line}, but the report has no {event_name}")
            continue
        src = event.get("forward_source" if forward else "source")
        if src is None:
            what = "forward_source" if forward else "source"
            problems.append(f"{target}: expected line {line}, but {event_name}.{what} is null")
        elif not _same_file(src["file"], case.path) or src["line"] != line:
            problems.append(
                f"{target}: at {src['file']}:{src['line']}, expected {case.path.name}:{line}"
            )
    return problems


def _same_file(recorded: str, expected: Path) -> bool:
    try:
        return os.path.samefile(recorded, expected)
    except OSError:
        return False


def _case_param(case: Case) -> Any:
    marks = []
    if case.framework == "tensorflow":
        marks += [pytest.mark.tf, pytest.mark.skipif(not HAS_TF, reason="needs TensorFlow")]
    elif case.framework == "jax":
        marks += [pytest.mark.jax, pytest.mark.skipif(not HAS_JAX, reason="needs JAX")]
    else:
        marks.append(pytest.mark.skipif(not HAS_TORCH, reason="needs PyTorch"))
    if case.xfail:
        marks.append(pytest.mark.xfail(strict=True, reason=case.xfail))
    return pytest.param(case, id=case.name, marks=marks)


# --- the tests -------------------------------------------------------------------------------


def test_corpus_is_broad_enough() -> None:
    """At least a dozen buggy programs, in every framework, a clean one and a benign one."""
    buggy = [c for c in CASES if c.expects_harmful]
    assert len(buggy) >= 12
    assert {c.framework for c in buggy} == {"torch", "tensorflow", "jax"}
    assert any(not c.expects_nonfinite for c in CASES)
    assert any(c.expects_nonfinite and not c.expects_harmful for c in CASES)
    assert any("origin.forward" in c.lines for c in CASES)  # born in backward
    assert any(c.value == "entered" for case in CASES for c in case.checks)  # NaN in the data


def test_expectation_syntax(tmp_path: Path) -> None:
    path = tmp_path / "probe.py"
    path.write_text(
        '# EXPECT origin.op_type=Log origin.explanation~="log of zero" first_nan=null\n'
        "# XFAIL: a reason\n"
        "y = f(x)  # <- origin first_inf\n"
        "z = g(y)  # <- forward\n"
        "w = h(z)  # <- cause cause.forward\n"
    )
    case = parse_case(path)
    assert case.checks == [
        Check("origin.op_type", "=", "Log"),
        Check("origin.explanation", "~=", "log of zero"),
        Check("first_nan", "=", None),
    ]
    assert case.lines == {
        "origin": 3, "first_inf": 3, "origin.forward": 4, "cause": 5, "cause.forward": 5
    }  # fmt: skip
    assert case.xfail == "a reason"
    assert case.framework == "torch" and case.expects_harmful
    data = {"origin": {"op_type": "Log", "explanation": "log of zero: 2 zeros"}, "first_nan": 1}
    assert check_report(case, data)[0] == "first_nan: 1, expected None"
    assert "cause: expected line 5, but the report has no cause" in check_report(case, data)


def test_benign_expectation(tmp_path: Path) -> None:
    """found_harmful=false: Inf/NaN found (exit 0 all the same); jax_ names need JAX."""
    path = tmp_path / "jax_probe.py"
    path.write_text("# EXPECT found_harmful=false\nx = mask()  # <- origin\n")
    case = parse_case(path)
    assert case.framework == "jax"
    assert case.expects_nonfinite and not case.expects_harmful


@pytest.mark.parametrize("case", [_case_param(c) for c in CASES])
def test_case(case: Case, runner: Runner) -> None:
    out = runner.result(f"case:{case.name}")
    assert out.run.returncode == 0, out.context()
    assert out.report is not None and out.data is not None, out.context()
    assert out.report.returncode == (1 if case.expects_harmful else 0), out.context()
    assert out.data["schema"] == "nanscope.report/2"
    assert out.data["found_nonfinite"] is case.expects_nonfinite, out.context()
    assert out.data["framework"].startswith(case.framework), out.context()
    problems = check_report(case, out.data)
    assert not problems, "\n".join(problems) + "\n" + out.context()


def _source_line(module: str, needle: str) -> tuple[Path, int]:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    path = Path(spec.origin)
    hits = [n for n, text in enumerate(path.read_text().splitlines(), 1) if needle in text]
    assert len(hits) == 1, f"{needle!r} is on lines {hits} of {path}"
    return path, hits[0]


def _job(key: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def mark(fn: Callable[..., None]) -> Callable[..., None]:
        fn.job_key = key  # type: ignore[attr-defined]
        return fn

    return mark


@pytest.mark.skipif(not HAS_TORCH, reason="needs PyTorch")
@_job("example:debug_mnist")
def test_pytorch_example_log_of_zero(runner: Runner) -> None:
    """The seed example: origin aten.log at the ``torch.log(probs)`` line, "log of zero"."""
    out = runner.result("example:debug_mnist")
    assert out.run.returncode == 0, out.context()
    assert out.report is not None and out.report.returncode == 1, out.context()
    assert out.data is not None
    path, line = _source_line("nanscope.examples.debug_mnist", "torch.log(probs)")
    origin = out.data["origin"]
    assert out.data["origin_kind"] == "born", out.context()
    assert origin["op_type"] == "aten.log.default", out.context()
    assert _same_file(origin["source"]["file"], path), out.context()
    assert origin["source"]["line"] == line, out.context()
    assert "log of zero" in origin["explanation"], out.context()
    assert origin["inputs"][0]["producer"]["op_type"] == "aten._softmax.default", out.context()


@pytest.mark.tf
@pytest.mark.skipif(not HAS_TF, reason="needs TensorFlow")
@_job("example:debug_mnist_tf")
def test_tensorflow_example_dump_log_fed_by_probs(runner: Runner) -> None:
    """TensorFlow's own dump of the example: first -inf is the graph's Log of probs, at its line."""
    if not _has_module("nanscope.examples.debug_mnist_tf"):
        pytest.skip("nanscope.examples.debug_mnist_tf is not there yet")
    out = runner.result("example:debug_mnist_tf")
    assert out.run.returncode == 0, out.context()
    assert out.report is not None and out.report.returncode == 1, out.context()
    assert out.data is not None
    assert out.data["framework"].startswith("tensorflow"), out.context()
    path, line = _source_line("nanscope.examples.debug_mnist_tf", "tf.math.log(probs)")
    for name in ("first_inf", "origin"):
        event = out.data[name]
        assert event is not None, out.context()
        assert event["kind"] == "graph_execution_trace", out.context()
        assert event["op_type"] == "Log", out.context()
        assert event["inputs"][0]["name"].startswith(("probs", "Softmax")), event["inputs"]
        assert _same_file(event["source"]["file"], path), out.context()
        assert event["source"]["line"] == line, out.context()
        assert "log of zero" in event["explanation"], out.context()


@pytest.mark.jax
@pytest.mark.skipif(not HAS_JAX, reason="needs JAX")
@_job("example:debug_mnist_jax")
def test_jax_example_log_of_zero(runner: Runner) -> None:
    """The example in JAX: the jitted step's log at the ``jnp.log(probs)`` line, "log of zero".

    It is both where the first Inf was born and the cause: its -inf times a label of 0
    makes the loss NaN (the first NaN, at the same line), then the gradients and weights.
    """
    out = runner.result("example:debug_mnist_jax")
    assert out.run.returncode == 0, out.context()
    assert "(loss nan)" in out.run.stdout, out.context()  # the training really collapsed
    assert out.report is not None and out.report.returncode == 1, out.context()
    assert out.data is not None
    assert out.data["framework"].startswith("jax"), out.context()
    path, line = _source_line("nanscope.examples.debug_mnist_jax", "jnp.log(probs)")
    assert out.data["origin_kind"] == "born", out.context()
    for name in ("origin", "cause"):
        event = out.data[name]
        assert event is not None, out.context()
        assert event["kind"] == "graph_execution_trace", out.context()
        assert event["graph_name"] == "train_step", out.context()
        assert event["op_type"] == "log", out.context()
        assert _same_file(event["source"]["file"], path), out.context()
        assert event["source"]["line"] == line, out.context()
        assert "log of zero" in event["explanation"], out.context()
        assert event["inputs"][0]["producer"]["op_type"] == "div", out.context()  # softmax's
    first_nan = out.data["first_nan"]
    assert first_nan["op_type"] == "mul" and first_nan["source"]["line"] == line, out.context()
    assert "0 * inf" in first_nan["explanation"], out.context()
