"""Eager and jitted parts of a JAX program are one data flow: real programs, held against the oracle.

Each program in ``tests/programs/real/jax_*.py`` below mixes eager JAX and jitted calls the
way people write it:

* a causal mask built eagerly at init (``jnp.where(allowed, 0, -inf)`` outside ``jit``), kept,
  and passed into every jitted training step, where the softmax absorbs its -inf: a flax.linen
  LM (the mask an argument of the step) and a flax.nnx classifier (the mask a variable of the
  module, in the state ``nnx.jit`` passes in and returns). Healthy: the report must exit 0 and
  ``--check-numerics`` run to the end (issue 30: "a mask built eagerly at init");
* the where-gradient trap in a kernel (``jnp.where(d2 > 0, jnp.sqrt(d2), 0)``) differentiated
  under ``jax.jit(jax.grad(...))``, its NaN gradient then used eagerly (``squeeze``, the
  update): a Gaussian process and an RBF network. The cause is the derivative's ``div`` inside
  the jitted function at the kernel's line, not an eager op that received the NaN (issue 30:
  "a NaN that a jitted function returns, used eagerly");
* a ``custom_vjp`` whose backward rule makes the NaN (a gradient clipper that divides by a zero
  norm, a safe log whose gradient divides by the unclamped input), under ``jit(grad)``: the
  cause is at the rule's own line, where the bug is (issue 30: "custom_vjp backward").

Each runs under ``nanscope run`` with the default circular buffer and with
``--circular-buffer-size -1`` (then ``nanscope report --json``), and under ``nanscope run
--check-numerics``. The oracle (``tests/jax_oracle.py``'s ``evaluate_program``, no nanscope
code) traces the same program whole (eager ops and jitted calls in one jaxpr), evaluates it
with NumPy and follows every lineage through eager ops and jitted calls alike; the report's
verdict, exit status, cause (op and line) and first NaN are held against it. The lines are
also marked in the programs (``# <- label``), so that the oracle's story is checked too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("optax")

from tests.jax_oracle import ProgramResult, evaluate_program

pytestmark = [pytest.mark.jax, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "tests" / "programs" / "real"
TIMEOUT = 600
STEPS = 2


@dataclass(frozen=True)
class Case:
    program: str  # file in tests/programs/real
    healthy: bool
    # Buggy programs: the op and the marked line of the cause, and of the first NaN.
    cause: tuple[str, str] | None = None
    first_nan: tuple[str, str] | None = None
    backward_cause: bool = False  # born in a backward equation (a custom rule's)


CASES: dict[str, Case] = {
    "lm_eager_mask": Case("jax_lm_eager_mask.py", True),
    "nnx_eager_mask": Case("jax_nnx_eager_mask.py", True),
    "gp_where_sqrt": Case("jax_gp_where_sqrt.py", False, ("div", "gp.sqrt"), ("mul", "gp.sqrt")),
    "rbf_where_sqrt": Case(
        "jax_rbf_where_sqrt.py", False, ("div", "rbf.sqrt"), ("mul", "rbf.sqrt")
    ),
    "clip_grad_vjp": Case(
        "jax_clip_grad_vjp.py", False, ("div", "clip.bwd"), ("mul", "clip.bwd"), True
    ),
    "masked_policy_safe_log": Case(
        "jax_masked_policy_safe_log.py", False, ("div", "safe_log.bwd"), ("div", "safe_log.bwd"),
        True,
    ),
}  # fmt: skip
BUFFERS: dict[str, tuple[str, ...]] = {"default": (), "full": ("--circular-buffer-size", "-1")}


def line_of(case: Case, label: str) -> int:
    """The line of the case's program that ends with ``# <- label``."""
    lines = (PROGRAMS / case.program).read_text().splitlines()
    found = [
        n for n, text in enumerate(lines, 1) if re.search(rf"#\s*<-\s*{re.escape(label)}$", text)
    ]
    assert len(found) == 1, (case.program, label)
    return found[0]


# -- running everything once -----------------------------------------------------------------


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    report: dict[str, Any] | None = None
    report_returncode: int | None = None


def _nanscope(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    src = str(ROOT / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.run(
        [sys.executable, "-m", "nanscope", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip


def run_recorded(case: Case, buffer: tuple[str, ...], workdir: Path) -> Run:
    workdir.mkdir(parents=True, exist_ok=True)
    program = str(PROGRAMS / case.program)
    out = _nanscope("run", "--logdir", "dump", *buffer, program, "--steps", str(STEPS), cwd=workdir)
    run = Run(out.returncode, out.stdout, out.stderr)
    rep = _nanscope("report", "dump", "--json", cwd=workdir)
    run.report_returncode = rep.returncode
    if rep.stdout.strip():
        run.report = json.loads(rep.stdout)
    return run


def run_checked(case: Case, workdir: Path) -> Run:
    workdir.mkdir(parents=True, exist_ok=True)
    program = str(PROGRAMS / case.program)
    out = _nanscope("run", "--check-numerics", program, "--steps", str(STEPS), cwd=workdir)
    return Run(out.returncode, out.stdout, out.stderr)


def _module(case: Case) -> ModuleType:
    name = "nanscope_test_" + case.program.removesuffix(".py")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, PROGRAMS / case.program)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # flax's dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run_oracle(case: Case) -> ProgramResult:
    """The whole program (its ``train``: eager init, jitted steps, eager updates) evaluated by
    the oracle; what it returns is what the program keeps at the end."""
    module = _module(case)

    def program() -> Any:
        state, history = module.train(STEPS)
        with contextlib.suppress(ImportError):
            from flax import nnx

            if isinstance(state, nnx.Module):
                state = nnx.state(state)
        return state, history

    with contextlib.redirect_stdout(io.StringIO()):
        return evaluate_program(program)


class Lab:
    """Every run the selected tests need, started once: subprocesses in a pool, oracles here."""

    def __init__(self, tmp: Path, recorded: set[tuple[str, str]], checked: set[str]) -> None:
        self.pool = ThreadPoolExecutor(max_workers=2)
        self.recorded: dict[tuple[str, str], Future[Run]] = {}
        self.checked: dict[str, Future[Run]] = {}
        self.oracles: dict[str, ProgramResult] = {}
        for name, buffer in sorted(recorded):
            self.recorded[(name, buffer)] = self.pool.submit(
                run_recorded, CASES[name], BUFFERS[buffer], tmp / f"{name}-{buffer}"
            )
        for name in sorted(checked):
            self.checked[name] = self.pool.submit(run_checked, CASES[name], tmp / f"{name}-check")

    def run(self, name: str, buffer: str) -> Run:
        return self.recorded[(name, buffer)].result()

    def check(self, name: str) -> Run:
        return self.checked[name].result()

    def oracle(self, name: str) -> ProgramResult:
        if name not in self.oracles:
            self.oracles[name] = run_oracle(CASES[name])
        return self.oracles[name]

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    recorded: set[tuple[str, str]] = set()
    checked: set[str] = set()
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if getattr(item, "module", None) is not sys.modules[__name__] or "case" not in params:
            continue
        if "buffer" in params:
            recorded.add((params["case"], params["buffer"]))
        elif item.originalname == "test_check_numerics":  # type: ignore[attr-defined]
            checked.add(params["case"])
    lab = Lab(tmp_path_factory.mktemp("jax-boundaries"), recorded, checked)
    yield lab
    lab.close()


def report_of(lab: Lab, case: str, buffer: str) -> dict[str, Any]:
    run = lab.run(case, buffer)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.report is not None, run.stderr[-3000:]
    return run.report


def _where(event: dict[str, Any] | None) -> tuple[str, str, Any] | None:
    if event is None:
        return None
    source = event.get("source") or {}
    return event["op_type"], Path(source.get("file") or "").name, source.get("line")


RECORDED = [(c, b) for c in CASES for b in BUFFERS]


# -- the tests -------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_story(lab: Lab, case: str) -> None:
    """The programs do what their docstrings say (the oracle alone, no nanscope)."""
    c, truth = CASES[case], lab.oracle(case)
    assert truth.lineages, "every program has Inf/NaN somewhere"
    if c.healthy:
        assert not truth.harmful and truth.result.first_nan is None
        # The eagerly built mask: born outside any jitted step, absorbed in each of them.
        (mask,) = {(lin.birth.file, lin.birth.line) for lin in truth.lineages}
        assert mask[1] == line_of(c, "lm.mask" if case.startswith("lm") else "nnx.mask")
        return
    assert c.cause is not None and c.first_nan is not None
    cause = truth.cause
    assert cause is not None
    assert (cause.birth.primitive, cause.birth.line) == (c.cause[0], line_of(c, c.cause[1]))
    assert cause.birth.backward == c.backward_cause
    first_nan = truth.result.first_nan
    assert first_nan is not None
    assert (first_nan.primitive, first_nan.line) == (c.first_nan[0], line_of(c, c.first_nan[1]))


@pytest.mark.parametrize(("case", "buffer"), RECORDED)
def test_exit_status(lab: Lab, case: str, buffer: str) -> None:
    """The program's own exit status is kept; the report exits 1 exactly when the oracle found
    a harmful lineage."""
    run = lab.run(case, buffer)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.report_returncode == (1 if lab.oracle(case).harmful else 0), run.report


@pytest.mark.parametrize(("case", "buffer"), RECORDED)
def test_verdict(lab: Lab, case: str, buffer: str) -> None:
    """An eagerly built mask that each jitted step absorbs is benign, wherever it was kept."""
    report, truth = report_of(lab, case, buffer), lab.oracle(case)
    assert report["found_nonfinite"]
    assert report["found_harmful"] == bool(truth.harmful), report["lineages"]
    if not truth.harmful:
        assert report["lineages"] and {g["kind"] for g in report["lineages"]} == {"benign"}
        assert report["cause"] is None
        # The mask's own birth, at the line of the program that built it eagerly.
        births = {(Path(g["birth"]["source"]["file"]).name, g["birth"]["source"]["line"])
                  for g in report["lineages"]}  # fmt: skip
        (mask,) = {(Path(lin.birth.file or "").name, lin.birth.line) for lin in truth.lineages}
        assert mask in births


@pytest.mark.parametrize(("case", "buffer"), [(c, b) for c, b in RECORDED if not CASES[c].healthy])
def test_cause(lab: Lab, case: str, buffer: str) -> None:
    """The cause is the oracle's: the equation inside the jitted function that made the
    harmful Inf/NaN (at a custom rule's own line), born there, not an eager op that received
    the NaN the call returned."""
    report, truth = report_of(lab, case, buffer), lab.oracle(case)
    cause = truth.cause
    assert cause is not None
    program = CASES[case].program
    assert _where(report["cause"]) == (cause.birth.primitive, program, cause.birth.line)
    assert report["cause"]["kind"] == "graph_execution_trace"  # inside the jitted call
    assert (report["cause"]["phase"] == "backward") == cause.birth.backward
    assert report["origin_kind"] == "born"
    first_nan = truth.result.first_nan
    assert first_nan is not None
    assert _where(report["first_nan"]) == (first_nan.primitive, program, first_nan.line)
    # No lineage is born at an eager op that only received what a jitted call returned.
    harmful = [g for g in report["lineages"] if g["kind"] == "harmful"]
    assert [_where(g["birth"]) for g in harmful] == [_where(report["cause"])]


@pytest.mark.parametrize("case", list(CASES))
def test_check_numerics(lab: Lab, case: str) -> None:
    """``--check-numerics`` runs a healthy program to the end; a buggy one raises at its first
    NaN, naming the line of the oracle's first NaN (a custom rule's own line), and the birth."""
    run, truth, c = lab.check(case), lab.oracle(case), CASES[case]
    if c.healthy:
        assert run.returncode == 0, run.stderr[-3000:]
        assert "losses:" in run.stdout
        return
    assert run.returncode != 0
    assert "NonFiniteError" in run.stderr, run.stderr[-3000:]
    message = run.stderr[run.stderr.rindex("NonFiniteError") :]
    first_nan = truth.result.first_nan
    assert first_nan is not None
    assert message.startswith(f"NonFiniteError: {first_nan.primitive} produced NaN"), message
    assert f"{c.program}:{first_nan.line} in {first_nan.function}" in message, message
    cause = truth.cause
    assert cause is not None
    if (cause.birth.primitive, cause.birth.line) != (first_nan.primitive, first_nan.line):
        assert f"born at {cause.birth.primitive} " in message, message
        assert f"{c.program}:{cause.birth.line}" in message.split("born at", 1)[1], message
