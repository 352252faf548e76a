"""Recomputation and compiled graphs: two ways the same values show up again.

* Activation checkpointing reruns the forward inside ``backward()``: a rerun op is
  the forward op again, no new birth (``analysis/_recompute.py``). The real
  programs of ``test_real_programs.py`` (cases ``gpt2_checkpointing``,
  ``nanogpt_checkpoint``, ``nanogpt_checkpoint_reentrant``) hold the report
  against the oracle; here: the oracle itself tells the rerun from a new birth, and
  the report names the forward occurrence (its phase, line and module).
* Inside a ``torch.compile`` graph, an op that only moves or selects values
  (``view``, ``permute``, ``embedding``...) makes no Inf/NaN: what it shows came in
  through the graph's inputs (``analysis/_graph_inputs.py``). The graphs decompose
  ops (``masked_fill`` is ``full`` and ``where``, softmax is ``amax``, ``sub``,
  ``exp``...), so the oracle (eager) is compared on the cause only. These programs
  are recorded in this process (``enable_dump_debug_info`` around their ``main``),
  one at a time, with the recorder ``nanscope run`` uses.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import nanscope
from nanscope.analysis import analyze
from nanscope.analysis._graph_inputs import moves_values
from nanscope.report import report_json
from tests.integration.test_real_programs import (
    BUFFERS,
    PROGRAMS,
    Case,
    Run,
    oracle_key,
    report_key,
    run_recorded,
)
from tests.oracle import Result, load_program, run_oracle

pytestmark = [pytest.mark.torch, pytest.mark.slow]

RUNS: dict[str, Case] = {
    # Diverging with each block checkpointed reentrantly (the healthy one is a real case).
    "reentrant": Case(
        "nanogpt.py", ("--steps", "3", "--checkpoint", "reentrant"), False,
        "q @ k^T overflows in the forward of step 1, and again in the rerun",
    ),
    "gpt2": Case(
        "gpt2_transformers.py", ("--steps", "2", "--gradient-checkpointing"), True,
        "the causal masks, made again in every block's rerun",
    ),
    "nanogpt_compiled": Case(
        "nanogpt.py", ("--steps", "3", "--compile"), False,
        "torch.compile(model), lr 1e10: q @ k^T overflows in the forward graph of step 1",
    ),
    "mlp_compiled": Case(
        "compiled_mlp.py", ("--steps", "4"), False,
        "torch.compile(model), SGD lr 1e8: a Linear of step 2's forward graph overflows",
    ),
}  # fmt: skip
COMPILED = ("nanogpt_compiled", "mlp_compiled")


class Runs:
    """The eager recordings of this file, started at once (under ``nanscope run``, two at a
    time), the compiled ones (here, when first asked for), and the oracles."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.pool = ThreadPoolExecutor(max_workers=2)
        self.runs: dict[tuple[str, str], Future[Run]] = {}
        self.compiled: dict[tuple[str, str], dict[str, Any]] = {}
        self.oracles: dict[tuple[str, tuple[str, ...]], Result] = {}
        for name in RUNS:
            if name not in COMPILED:
                self.runs[(name, "full")] = self.pool.submit(
                    run_recorded, RUNS[name], BUFFERS["full"], tmp / f"{name}-full"
                )

    def report(self, name: str, buffer: str = "full") -> dict[str, Any]:
        if name in COMPILED:
            return self._record_here(name, buffer)
        run = self.runs[(name, buffer)].result()
        assert run.returncode == 0, run.stderr[-3000:]
        assert run.report is not None, run.stderr[-3000:]
        return run.report

    def _record_here(self, name: str, buffer: str) -> dict[str, Any]:
        if (name, buffer) not in self.compiled:
            case = RUNS[name]
            logdir = self.tmp / f"{name}-{buffer}"
            options: dict[str, Any] = {"circular_buffer_size": -1} if buffer == "full" else {}
            module = load_program(PROGRAMS / case.program)
            with (
                contextlib.redirect_stdout(io.StringIO()),
                nanscope.enable_dump_debug_info(logdir, "FULL_HEALTH", **options),
            ):
                module.main(list(case.args))
            with nanscope.open_dump(logdir) as dump:
                self.compiled[(name, buffer)] = report_json(analyze(dump))
        return self.compiled[(name, buffer)]

    def oracle(self, program: str, *args: str) -> Result:
        key = (program, args)
        if key not in self.oracles:
            with contextlib.redirect_stdout(io.StringIO()):
                self.oracles[key] = run_oracle(PROGRAMS / program, list(args))
        return self.oracles[key]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    r = Runs(tmp_path_factory.mktemp("recompute_compiled"))
    yield r
    r.pool.shutdown(wait=True, cancel_futures=True)


def births(r: Result) -> list[tuple[str, int | None, int, str]]:
    return [(lin.birth.op, lin.birth.line, lin.birth.iteration, lin.kind) for lin in r.lineages]


# -- the oracle: a rerun is no birth ------------------------------------------------------------


@pytest.mark.parametrize("checkpoint", ["non-reentrant", "reentrant"])
def test_oracle_rerun_is_the_forward_birth(runs: Runs, checkpoint: str) -> None:
    """With checkpointing, the oracle finds the births (and iterations) of the plain run."""
    plain = runs.oracle("nanogpt.py", "--steps", "3")
    checked = runs.oracle("nanogpt.py", "--steps", "3", "--checkpoint", checkpoint)
    assert checked.iterations == plain.iterations == 3
    assert births(checked) == births(plain)
    assert [lin.birth.op for lin in plain.lineages][-1] == "aten.bmm.default"
    assert checked.cause is not None and plain.cause is not None
    assert (checked.cause.op, checked.cause.line) == (plain.cause.op, plain.cause.line)


def test_oracle_transformers_rerun(runs: Runs) -> None:
    """gradient_checkpointing_enable(): one mask per layer and forward, at the forward's line
    (``model(...)``), not at ``loss.backward()``."""
    r = runs.oracle("gpt2_transformers.py", "--steps", "2", "--gradient-checkpointing")
    assert r.kinds() == {"benign": 2 * 2}
    source = (PROGRAMS / "gpt2_transformers.py").read_text().splitlines()
    assert {source[lin.birth.line - 1].strip() for lin in r.lineages if lin.birth.line} == {
        "outputs = model(input_ids=input_ids, labels=input_ids)"
    }


# -- the report: the forward occurrence, once ---------------------------------------------------


def test_rerun_is_reported_once_at_the_forward(runs: Runs) -> None:
    report = runs.report("gpt2")
    assert report["found_harmful"] is False
    lineages = report["lineages"]
    assert sum(lin["count"] for lin in lineages) == 2 * 2
    assert sum(lin["recomputed"] for lin in lineages) == 2 * 2  # each birth rerun once
    for lin in lineages:
        b = lin["birth"]
        assert b["phase"] == "forward", b
        assert b["source"]["code"] == "outputs = model(input_ids=input_ids, labels=input_ids)"
        assert b["module_path"] in ("transformer.h.0.attn (GPT2Attention)",
                                    "transformer.h.1.attn (GPT2Attention)"), b  # fmt: skip


def test_diverging_rerun_names_the_forward_op(runs: Runs) -> None:
    """The overflow repeats in the rerun: the cause is the forward's bmm, listed once."""
    report = runs.report("reentrant")
    oracle = runs.oracle(*[RUNS["reentrant"].program, *RUNS["reentrant"].args])
    program = RUNS["reentrant"].program
    assert report_key(report["cause"]) == oracle_key(oracle.cause, program)
    assert report["cause"]["phase"] == "forward"
    assert report["cause"]["module_path"] == "transformer.h.0.attn (CausalSelfAttention)"
    keys = sorted(report_key(lin["birth"])[:3] for lin in report["lineages"])  # type: ignore[index]
    expected = sorted((lin.birth.op, program, lin.birth.line) for lin in oracle.lineages)
    assert keys == expected
    assert all(lin["birth"]["phase"] == "forward" for lin in report["lineages"])


# -- compiled graphs: moving values is no birth -------------------------------------------------


@pytest.mark.parametrize(
    ("name", "buffer"),
    [("nanogpt_compiled", "full"), ("nanogpt_compiled", "default"), ("mlp_compiled", "full")],
)
def test_compiled_moves_are_no_births(runs: Runs, name: str, buffer: str) -> None:
    report = runs.report(name, buffer)
    case = RUNS[name]
    assert report["found_harmful"] is True
    assert report["num_graph_execution_traces"] > 0
    # Each values-moving op that showed the Inf/NaN first in a graph continues the lineage
    # that made them (before: "view produced NaN; the inputs' values were not recorded").
    for lin in report["lineages"]:
        assert not moves_values(lin["birth"]["op_type"]), lin["birth"]
    oracle = runs.oracle(case.program, *case.args)
    assert oracle.cause is not None
    cause = report["cause"]
    assert cause is not None
    # The same op at the same line as the eager oracle's (counts differ: inductor fuses).
    assert report_key(cause)[:3] == oracle_key(oracle.cause, case.program)[:3]  # type: ignore[index]
    # Few lineages: the cause, and the masks (nanoGPT: one full(-inf) per step seen).
    assert len(report["lineages"]) <= 3
