"""Real training programs under ``nanscope run``, held against an independent oracle.

Each program in ``tests/programs/real/`` is a plain training script. For each
program and settings (a *case*) the test

* runs it under ``nanscope run`` with the default circular buffer and with
  ``--circular-buffer-size -1``, then ``nanscope report --json``;
* runs it in this process under ``tests/oracle.py``, which derives births,
  lineages, the first NaN and the cause from every op with its own dispatch mode
  (no nanscope code), and holds the report against that;
* runs the healthy cases under ``nanscope run --check-numerics``.

The targets (the issue "real programs: intended and handled Inf/NaN reported as
failures"): a healthy run (every lineage benign or handled) makes the report exit
0 and ``--check-numerics`` run to the end; ``origin`` is the oracle's first birth;
``first_nan`` is the oracle's first NaN; ``cause`` is the oracle's cause;
``found_harmful`` says whether a harmful lineage exists; ``lineages`` classify
births as the oracle does; ``steps`` counts training iterations (GradScaler's
skipped steps included). ``cause`` is an Event (like ``origin``, null when
there is none), ``found_harmful`` a bool, and ``lineages`` a list of objects
with ``kind`` ("harmful", "benign", "handled") and ``birth`` (an Event)
(docs/REPORT_JSON.md).

An event matches the oracle's when op type, source file name, source line and the
-inf/+inf/NaN counts agree. What nanscope gets wrong today is marked
``xfail(strict=True)`` in ``KNOWN_FAILURES``, so that each flips to a failure
(XPASS) when the analysis is fixed and the mark must go.

All runs are shared through the module-scoped ``lab`` fixture: the ``nanscope``
subprocesses of the selected tests start at once (two at a time) while the
oracles run in this process.

The cases are split by theme over two files, so that two test workers share them
evenly: this file runs the language models (``MODELS``: transformers' GPT-2, T5 and
its Trainer, nanoGPT); test_real_programs_loops.py runs the same tests on the
training-loop pieces (loss scaling, clipping, optimizers' in-place writes, held
masks, views, padding). ``pytest_generate_tests`` parametrizes each file's tests
with its own cases.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from tests.oracle import Birth, OpEvent, Result, run_oracle

pytestmark = [pytest.mark.torch, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "tests" / "programs" / "real"
TIMEOUT = 300


@dataclass(frozen=True)
class Case:
    program: str  # file in tests/programs/real
    args: tuple[str, ...]
    healthy: bool  # every lineage benign or handled: the report should exit 0
    story: str  # what really happens (checked against the oracle in test_story)
    # Packages the program imports beyond torch (the dev extra installs them).
    packages: tuple[str, ...] = ()

    @property
    def needs(self) -> tuple[str, ...]:
        """Packages the program imports beyond torch (the dev extra installs them)."""
        return ("transformers",) if self.program.startswith("gpt2") else self.packages

    @property
    def available(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in self.needs)


CASES: dict[str, Case] = {
    "gpt2_fp32": Case(
        "gpt2_transformers.py", ("--steps", "3"), True,
        "SDPA's math path makes scalar_tensor(-inf) for the causal mask in every layer's "
        "forward; _safe_softmax absorbs it",
    ),
    "gpt2_fp16": Case(
        "gpt2_transformers.py", ("--steps", "3", "--dtype", "float16"), False,
        "pure float16 AdamW: eps=1e-8 rounds to 0, the second moment underflows to 0, and "
        "addcdiv_ at optimizer.step() writes +-inf and 0/0 = NaN into the parameters",
    ),
    "amp": Case(
        "amp_gradscaler.py", ("--steps", "8"), True,
        "autocast float16 + GradScaler(init_scale=2**24): the scaled float16 gradients "
        "overflow in backward, GradScaler finds it and skips those steps",
    ),
    "rnn": Case(
        "rnn_lm.py", ("--steps", "5"), False,
        "ReLU RNN with lr 3000: the total grad norm in clip_grad_norm_ overflows (a dead end: "
        "1/inf = 0), then the recurrence's forward addmm overflows and makes the NaN",
    ),
    "nanogpt": Case(
        "nanogpt.py", ("--steps", "4"), False,
        "nanoGPT with lr 1e10: masked_fill(-inf) masks are benign; q @ k^T overflows to inf "
        "and the softmax makes NaN",
    ),
    # In-place writes that return nothing: clip_grad_norm_'s _foreach_mul_, fused and
    # foreach AdamW (the Trainer's default optimizer).
    "clip_fused": Case(
        "clip_fused_adamw.py", ("--steps", "3"), False,
        "sqrt at 0 gives noise_var a -inf gradient; clip_grad_norm_'s 1/inf = 0 scale makes "
        "inf * 0 = NaN in place, _fused_adamw_ writes NaN into the weights, read next step",
    ),
    "clip_foreach": Case(
        "clip_fused_adamw.py", ("--steps", "3", "--foreach"), False,
        "the same with the multi-tensor AdamW: _foreach_lerp_, _foreach_addcdiv_ write NaN",
    ),
    "hf_trainer": Case(
        "gpt2_hf_trainer.py", ("--steps", "3"), False,
        "the Trainer's defaults (max_grad_norm=1.0, adamw_torch_fused) with lr 1e7: a "
        "LayerNorm makes NaN at step 1, the clip and _fused_adamw_ write it into the weights",
        packages=("transformers", "accelerate"),
    ),
    # Held values: an intended -inf kept across steps, saved and loaded.
    "word_lm": Case(
        "word_lm_transformer.py", ("--steps", "4"), True,
        "pytorch/examples' Transformer LM: log(tril(ones)) mask kept in a module attribute; "
        "nn.TransformerEncoder only compares it with its own causal mask (eq) and builds one; "
        "saved and loaded whole (set_ writes the -inf again), compared again",
    ),
    "mask_buffer": Case(
        "masked_attention_buffer.py", ("--steps", "4"), True,
        "an additive -inf causal mask in a buffer, added to the scores every step and absorbed "
        "by softmax; state_dict saved and loaded into a fresh model, evaluated",
    ),
    # Writes through a view carry their values into the base.
    "dataset_log": Case(
        "dataset_log_features.py", ("--steps", "4"), False,
        "Dataset.__getitem__ writes log(x[:4]) into x[:4] (copy_ into a view); a 0 makes "
        "-inf in x, the DataLoader's collate stacks it, Linear makes the loss NaN",
    ),
    "rate_view": Case(
        "ratio_features.py", ("--steps", "4"), False,
        "forward divides a column by another in place through a view (x[:, 0] /= x[:, 1]); "
        "a 0 duration at step 2 makes +inf in x and the loss NaN",
    ),
    # A row of attention masked throughout (an empty sequence in a padded batch).
    "padded_mha": Case(
        "padded_text_encoder.py", ("--steps", "4", "--attention", "mha"), False,
        "nn.MultiheadAttention (need_weights=True) with key_padding_mask: at step 2 one "
        "sequence is all padding, its attention rows are all -inf and the softmax makes NaN",
    ),
    "padded_manual": Case(
        "padded_text_encoder.py", ("--steps", "3", "--attention", "manual"), False,
        "hand-written attention: scores.masked_fill(padding, -inf), softmax; at step 2 one "
        "sequence is all padding and its rows' softmax makes NaN",
    ),
    "padded_encoder": Case(
        "padded_text_encoder.py", ("--steps", "3"), False,
        "nn.TransformerEncoder with src_key_padding_mask: the empty sequence's attention rows "
        "come out as zeros; the masked mean pooling divides 0 by 0 tokens",
    ),
    "padded_healthy": Case(
        "padded_text_encoder.py", ("--steps", "4", "--attention", "mha", "--no-empty"), True,
        "the same with no empty sequence: every padding -inf is absorbed by the softmax",
    ),
    # Casts: -inf cast to an integer and thrown away.
    "t5": Case(
        "t5_transformers.py", ("--arch", "t5", "--steps", "3"), True,
        "T5's relative-position buckets: log(0) = -inf on the diagonal, cast to int64, "
        "thrown away by where",
        packages=("transformers",),
    ),
    "umt5": Case(
        "t5_transformers.py", ("--arch", "umt5", "--steps", "3"), True,
        "UMT5 (every layer computes its own position bias): the same log, cast and where",
        packages=("transformers",),
    ),
    # Activation checkpointing: the backward reruns each block's forward, births and all.
    "gpt2_checkpointing": Case(
        "gpt2_transformers.py", ("--steps", "3", "--gradient-checkpointing"), True,
        "gradient_checkpointing_enable(): every block's forward runs again in backward(), its "
        "causal mask's scalar_tensor(-inf) too; the rerun is no new birth",
    ),
    "nanogpt_checkpoint": Case(
        "nanogpt.py", ("--steps", "4", "--checkpoint", "non-reentrant"), False,
        "nanoGPT with each block under checkpoint(use_reentrant=False), lr 1e10: q @ k^T "
        "overflows in the forward, and again in the backward's rerun, which is no new birth",
    ),
    "nanogpt_checkpoint_reentrant": Case(
        "nanogpt.py", ("--steps", "4", "--checkpoint", "reentrant", "--lr", "1e-3"), True,
        "nanoGPT with each block under checkpoint(use_reentrant=True), lr 1e-3: the masks' "
        "-inf, made again in the backward's rerun, are absorbed both times",
    ),
}  # fmt: skip
BUFFERS: dict[str, tuple[str, ...]] = {"default": (), "full": ("--circular-buffer-size", "-1")}
# The cases this file runs (the others: test_real_programs_loops.py).
MODELS = [
    "gpt2_fp32", "gpt2_fp16", "gpt2_checkpointing", "hf_trainer", "t5", "umt5",
    "nanogpt", "nanogpt_checkpoint", "nanogpt_checkpoint_reentrant",
]  # fmt: skip

# (case, buffer or None for both, test) -> why nanscope fails it today.
KNOWN_FAILURES: dict[tuple[str, str | None, str], str] = {}
CHECK_NUMERICS_FAILURES: dict[str, str] = {}


def cases_for(test: str, only: list[str] | None = None) -> list[Any]:
    """(case, buffer) parameters for ``test``, with the known failures marked xfail."""
    params = []
    for name in only or list(CASES):
        for buffer in BUFFERS:
            reason = KNOWN_FAILURES.get((name, buffer, test)) or KNOWN_FAILURES.get(
                (name, None, test)
            )
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            params.append(pytest.param(name, buffer, id=f"{name}-{buffer}", marks=marks))
    return params


def healthy_cases(only: list[str]) -> list[Any]:
    """The healthy cases among ``only``, those that nanscope's check fails today marked xfail."""
    return [
        pytest.param(name, marks=[pytest.mark.xfail(reason=reason, strict=True)])
        if (reason := CHECK_NUMERICS_FAILURES.get(name))
        else name
        for name in only
        if CASES[name].healthy
    ]


# The test that reads the ``nanscope run --check-numerics`` runs (of the healthy cases).
CHECKED_TEST = "test_check_numerics_runs_healthy_programs_to_the_end"


def parametrize_cases(metafunc: pytest.Metafunc, only: list[str]) -> None:
    """Parametrize a test of this file's over the cases ``only``: ``(case, buffer)`` for the
    tests of a recorded run, the healthy cases for the check, every case for the others."""
    names = metafunc.fixturenames
    if "case" not in names:
        return
    test = metafunc.function.__name__
    if "buffer" in names:
        metafunc.parametrize(("case", "buffer"), cases_for(test.removeprefix("test_"), only))
    elif test == CHECKED_TEST:
        metafunc.parametrize("case", healthy_cases(only))
    else:
        metafunc.parametrize("case", only)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_cases(metafunc, MODELS)


# -- running everything once -----------------------------------------------------------------


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    report: dict[str, Any] | None = None
    report_returncode: int | None = None


def _env() -> dict[str, str]:
    """The environment for ``python -m nanscope``: this checkout's nanscope first."""
    env = dict(os.environ)
    src = str(ROOT / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _nanscope(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nanscope", *args],
        cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip


def run_recorded(case: Case, buffer: tuple[str, ...], workdir: Path) -> Run:
    """``nanscope run`` into ``workdir/dump``, then ``nanscope report --json``."""
    workdir.mkdir(parents=True, exist_ok=True)
    program = str(PROGRAMS / case.program)
    out = _nanscope("run", "--logdir", "dump", *buffer, program, *case.args, cwd=workdir)
    run = Run(out.returncode, out.stdout, out.stderr)
    rep = _nanscope("report", "dump", "--json", cwd=workdir)
    run.report_returncode = rep.returncode
    if rep.stdout.strip():
        run.report = json.loads(rep.stdout)
    return run


def run_checked(case: Case, workdir: Path) -> Run:
    """``nanscope run --check-numerics``."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = _nanscope(
        "run", "--check-numerics", str(PROGRAMS / case.program), *case.args, cwd=workdir
    )
    return Run(out.returncode, out.stdout, out.stderr)


class Lab:
    """Every run the selected tests need, started once: subprocesses in a pool, oracles here."""

    def __init__(self, tmp: Path, recorded: set[tuple[str, str]], checked: set[str]) -> None:
        self.pool = ThreadPoolExecutor(max_workers=2)
        self.recorded: dict[tuple[str, str], Future[Run]] = {}
        self.checked: dict[str, Future[Run]] = {}
        self.oracles: dict[str, Result] = {}
        # The slowest first, so that the pool's tail is short.
        recorded = {k for k in recorded if CASES[k[0]].available}
        checked = {k for k in checked if CASES[k].available}
        for name, buffer in sorted(recorded, key=lambda k: not k[0].startswith("gpt2")):
            self.recorded[(name, buffer)] = self.pool.submit(
                run_recorded, CASES[name], BUFFERS[buffer], tmp / f"{name}-{buffer}"
            )
        for name in sorted(checked):
            self.checked[name] = self.pool.submit(run_checked, CASES[name], tmp / f"{name}-check")

    def run(self, name: str, buffer: str) -> Run:
        return self.recorded[(name, buffer)].result()

    def check(self, name: str) -> Run:
        return self.checked[name].result()

    def oracle(self, name: str) -> Result:
        if name not in self.oracles:
            case = CASES[name]
            with contextlib.redirect_stdout(io.StringIO()):
                self.oracles[name] = run_oracle(PROGRAMS / case.program, list(case.args))
        return self.oracles[name]

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    recorded: set[tuple[str, str]] = set()
    checked: set[str] = set()
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if getattr(item, "module", None) is not request.module or "case" not in params:
            continue
        if "buffer" in params:
            recorded.add((params["case"], params["buffer"]))
        elif getattr(item, "originalname", None) == CHECKED_TEST:
            # Only the check's own test reads these runs (test_story reads the oracle alone).
            checked.add(params["case"])
    lab = Lab(tmp_path_factory.mktemp("real"), recorded, checked)
    yield lab
    lab.close()


@pytest.fixture(autouse=True)
def _needs(request: pytest.FixtureRequest) -> None:
    """Skip a case whose program needs a package that is not installed."""
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    for module in CASES[params["case"]].needs if "case" in params else ():
        pytest.importorskip(module)


def line_of(program: str, text: str) -> int:
    """The line of ``program`` (in tests/programs/real) that holds ``text``."""
    lines = (PROGRAMS / program).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line and "``" not in line)


# -- comparing events ------------------------------------------------------------------------


def oracle_key(e: Birth | OpEvent | None, program: str) -> tuple[Any, ...] | None:
    if e is None:
        return None
    return (e.op, program, e.line, (e.neg_inf, e.pos_inf, e.nan))


def report_key(e: dict[str, Any] | None) -> tuple[Any, ...] | None:
    if e is None:
        return None
    source = e.get("source") or {}
    c = e["counts"]
    return (
        e["op_type"], Path(source.get("file") or "").name, source.get("line"),
        (c["neg_inf"], c["pos_inf"], c["nan"]),
    )  # fmt: skip


def recorded(lab: Lab, case: str, buffer: str) -> dict[str, Any]:
    run = lab.run(case, buffer)
    assert run.report is not None, run.stderr[-3000:]
    return run.report


# -- the tests -------------------------------------------------------------------------------


def test_story(lab: Lab, case: str) -> None:
    """The programs really do what their case says (the oracle alone, no nanscope)."""
    r = lab.oracle(case)
    c = CASES[case]
    assert r.iterations == int(c.args[c.args.index("--steps") + 1])
    assert r.lineages, "every case has Inf/NaN somewhere"
    assert not r.untracked, r.untracked
    assert not any(lin.birth.entered for lin in r.lineages)
    kinds = r.kinds()
    if case == "gpt2_fp32":
        assert kinds == {"benign": 2 * 3}  # 2 layers x 3 forwards
        assert {lin.birth.op for lin in r.lineages} == {"aten.scalar_tensor.default"}
        assert r.first_nan is None and r.cause is None
    elif case == "gpt2_fp16":
        assert r.cause is not None and r.cause.op == "aten.addcdiv_.default" and r.cause.nan > 0
        assert r.first_nan is not None and r.first_nan.index == r.cause.index
        assert r.origin is not None and r.origin.op == "aten.scalar_tensor.default"
        assert kinds["benign"] >= 2 and kinds["harmful"] >= 1
    elif case == "amp":
        assert set(kinds) == {"handled"}
        assert r.skipped_iterations and r.optimizer_steps == r.iterations - len(
            r.skipped_iterations
        )
        assert r.first_nan is not None and r.cause is None
    elif case == "rnn":
        first, cause = r.lineages[0], r.cause
        assert first.birth.op == "aten._foreach_norm.Scalar" and first.kind == "benign"
        assert cause is not None and cause.op == "aten.addmm.default" and cause.nan == 0
        assert r.first_nan is not None and r.first_nan.op == "aten.addmm.default"
        assert cause.index > first.birth.index
    elif case == "nanogpt":
        assert r.origin is not None and r.origin.op == "aten.masked_fill.Scalar"
        assert r.lineages[0].kind == "benign"
        assert r.cause is not None and r.cause.op == "aten.bmm.default"
        assert r.first_nan is not None and r.first_nan.op == "aten._softmax.default"
    elif case in ("word_lm", "mask_buffer"):
        ops = {lin.birth.op for lin in r.lineages}
        assert "aten.set_.source_Storage_storage_offset" in ops  # torch.load wrote the -inf
        assert set(r.kinds()) == {"benign"}
    elif case == "dataset_log":
        assert r.cause is not None and r.cause.op == "aten.log.default"
        assert r.cause.line == line_of(c.program, "torch.log(x[: self.logged])")
    elif case == "rate_view":
        assert r.cause is not None and r.cause.op == "aten.div_.Tensor"
        assert r.cause.line == line_of(c.program, "x[:, 0] /= x[:, 1]")
    elif case == "padded_manual":
        assert r.cause is not None and r.cause.op == "aten._softmax.default"
        assert r.cause.line == line_of(c.program, "torch.softmax(scores")
        assert r.origin is not None and r.origin.op == "aten.masked_fill.Scalar"
        assert r.lineages[0].kind == "benign"
    elif case == "padded_mha":
        assert r.cause is not None and r.cause.op == "aten._softmax.default"
        assert r.origin is not None and r.origin.op == "aten.masked_fill_.Scalar"
        assert r.lineages[0].kind == "benign"
    elif case == "padded_encoder":
        assert r.cause is not None and r.cause.op == "aten.div.Tensor"
    elif case in ("t5", "umt5"):
        assert {lin.birth.op for lin in r.lineages} == {"aten.log.default"}
        assert all("aten._to_copy.default" in lin.absorbed_by for lin in r.lineages)
    assert r.found_harmful == (not c.healthy)


def test_exit_status(lab: Lab, case: str, buffer: str) -> None:
    """The program's own exit status is kept; the report exits 1 only for harmful Inf/NaN."""
    run = lab.run(case, buffer)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.report_returncode == (0 if CASES[case].healthy else 1)


def test_origin(lab: Lab, case: str, buffer: str) -> None:
    """``origin`` is the first birth of all, harmful or not."""
    report = recorded(lab, case, buffer)
    expected = oracle_key(lab.oracle(case).origin, CASES[case].program)
    assert report_key(report["origin"]) == expected
    assert report["origin_kind"] == "born"


def test_first_nan(lab: Lab, case: str, buffer: str) -> None:
    report = recorded(lab, case, buffer)
    expected = oracle_key(lab.oracle(case).first_nan, CASES[case].program)
    assert report_key(report["first_nan"]) == expected


def test_cause(lab: Lab, case: str, buffer: str) -> None:
    """``cause``: the birth of the harmful lineage that made the first NaN, else of the first
    harmful Inf; none in a healthy run."""
    report = recorded(lab, case, buffer)
    assert "cause" in report
    expected = oracle_key(lab.oracle(case).cause, CASES[case].program)
    assert report_key(report["cause"]) == expected


def test_found_harmful(lab: Lab, case: str, buffer: str) -> None:
    report = recorded(lab, case, buffer)
    assert report["found_harmful"] is lab.oracle(case).found_harmful
    assert report["found_nonfinite"] is True  # every case has Inf/NaN, harmful or not


def test_headroom(lab: Lab, case: str, buffer: str) -> None:
    """Ranges are recorded; a healthy run gets no overflow or underflow warning (GradScaler's
    overflowing backward is handled by design, finfo.min masks are sentinels)."""
    h = recorded(lab, case, buffer)["headroom"]
    assert h is not None
    if CASES[case].healthy:
        assert h["warnings"] == [], [w["message"] for w in h["warnings"]]
        assert h["before_inf"] == []
    elif lab.oracle(case).cause is not None:
        assert h["before_step"] is not None and h["before_inf"]


def test_lineages(lab: Lab, case: str, buffer: str) -> None:
    """Each birth (op, file, line) is classified as the oracle classifies it. With the
    default circular buffer some births are evicted: those the report lists must agree."""
    report = recorded(lab, case, buffer)
    program = CASES[case].program
    expected: dict[tuple[Any, ...], set[str]] = {}
    for lin in lab.oracle(case).lineages:
        expected.setdefault((lin.birth.op, program, lin.birth.line), set()).add(lin.kind)
    seen: dict[tuple[Any, ...], set[str]] = {}
    for lin in report["lineages"]:
        key = report_key(lin["birth"])
        assert key is not None
        seen.setdefault(key[:3], set()).add(lin["kind"])
    if buffer == "full":
        assert seen == expected
    else:
        assert seen and all(kinds <= expected.get(key, set()) for key, kinds in seen.items())
        assert set().union(*seen.values()) >= {"harmful"} & set().union(*expected.values())


def test_steps(lab: Lab, case: str, buffer: str) -> None:
    """The last step is the number of training iterations (each program reads its loss after
    its last optimizer step), skipped optimizer steps included."""
    report = recorded(lab, case, buffer)
    assert report["steps"] is not None
    assert report["steps"][1] == lab.oracle(case).iterations


def test_check_numerics_runs_healthy_programs_to_the_end(lab: Lab, case: str) -> None:
    run = lab.check(case)
    assert run.returncode == 0, run.stderr[-3000:]
    losses = [ln for ln in run.stdout.splitlines() if " loss " in ln]
    assert len(losses) == lab.oracle(case).iterations
