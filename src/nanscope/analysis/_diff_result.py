"""What a diff of two runs found, as facts (the words are :mod:`nanscope.report`'s).

``DiffResult.to_json()`` is the documented form (schema ``nanscope.diff/1``,
docs/DIFF.md): ``nanscope diff --json`` prints it and the GUI can serve it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from nanscope.analysis._tolerance import Tolerance

DIFF_SCHEMA = "nanscope.diff/1"
# Evidence, from the strongest: statistics (mean, std, L2, hash), ranges (largest |x|),
# counts (Inf/NaN, negative, zero, positive elements), none (nothing to compare).
EVIDENCE = ("statistics", "ranges", "counts", "none")


def json_float(x: float | None) -> float | str | None:
    """A float as JSON carries it: NaN as null, the infinities as strings."""
    if x is None or math.isnan(x):
        return None
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


@dataclass(frozen=True)
class SourceLine:
    """A line of the program: where an op was called (or its forward op, for a backward op)."""

    file: str
    line: int
    function: str
    code: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function, "code": self.code}


@dataclass(frozen=True)
class OpSide:
    """One run's op at a place the diff names."""

    run: str  # "a" or "b"
    kind: str  # "execution" or "graph_execution_trace"
    index: int
    process: int
    rank: int | None
    step: int
    phase: str
    op_type: str
    op_name: str
    module_path: str
    dtype: str
    source: SourceLine | None
    forward_source: SourceLine | None
    # The compared columns of the output (``amax``, ``mean``, ``neg``, ...; None: not recorded).
    values: dict[str, float | None] = field(default_factory=dict)

    @property
    def line(self) -> SourceLine | None:
        """The line that names the op best: its own, or for a backward op its forward's."""
        return self.source or self.forward_source

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "kind": self.kind,
            "index": self.index,
            "process": self.process,
            "rank": self.rank,
            "step": self.step,
            "phase": self.phase,
            "op_type": self.op_type,
            "op_name": self.op_name,
            "module_path": self.module_path,
            "dtype": self.dtype,
            "source": self.source.to_json() if self.source else None,
            "forward_source": self.forward_source.to_json() if self.forward_source else None,
            "values": {k: json_float(v) for k, v in self.values.items()},
        }


@dataclass(frozen=True)
class OutputDiff:
    """One output slot of a pair of aligned ops, compared."""

    slot: int
    evidence: str  # one of EVIDENCE
    parted: bool
    relative_error: float  # the largest over the compared statistics (inf: Inf/NaN differ)
    statistic: str  # the statistic that gave it ("amax", "mean", "l2", "counts", ...)
    value_a: float | None
    value_b: float | None
    rtol: float
    compared_as: str  # the format the tolerance is that of ("bfloat16", ...)

    def to_json(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "evidence": self.evidence,
            "parted": self.parted,
            "relative_error": json_float(self.relative_error),
            "statistic": self.statistic,
            "value_a": json_float(self.value_a),
            "value_b": json_float(self.value_b),
            "rtol": self.rtol,
            "compared_as": self.compared_as,
        }


@dataclass(frozen=True)
class InputCheck:
    """Where one input of the parted op came from, in each run, and whether it agreed.

    ``status``: ``agree`` (made by aligned ops whose outputs agree), ``parted`` (by
    aligned ops whose outputs part: not the first place), ``only_a`` / ``only_b`` (made
    by an op that one run has and the other lacks), ``not_recorded`` (no recorded op
    made it: a parameter, the data, a constant), ``a_number`` (a Python number).
    """

    slot: int
    status: str
    producer_a: OpSide | None = None
    producer_b: OpSide | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "status": self.status,
            "producer_a": self.producer_a.to_json() if self.producer_a else None,
            "producer_b": self.producer_b.to_json() if self.producer_b else None,
        }


@dataclass(frozen=True)
class PartedOp:
    """The first aligned op whose output parts: the runs' two ops, and why."""

    step: int
    phase: str
    a: OpSide
    b: OpSide
    evidence: str
    relative_error: float
    rtol: float
    atol: float
    compared_as: str
    outputs: tuple[OutputDiff, ...]
    inputs: tuple[InputCheck, ...]
    # Whether every input agreed (None: some input's origin is not known, e.g. not recorded).
    inputs_agree: bool | None
    # An op that one run has and the other lacks, feeding the parted op: the likely cause.
    only_in_one_run: OpSide | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "phase": self.phase,
            "module_path": self.a.module_path or self.b.module_path,
            "op_type": self.a.op_type,
            "evidence": self.evidence,
            "relative_error": json_float(self.relative_error),
            "rtol": self.rtol,
            "atol": self.atol,
            "compared_as": self.compared_as,
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "outputs": [o.to_json() for o in self.outputs],
            "inputs_agree": self.inputs_agree,
            "inputs": [i.to_json() for i in self.inputs],
            "only_in_one_run": self.only_in_one_run.to_json() if self.only_in_one_run else None,
        }


@dataclass(frozen=True)
class LossStep:
    """One step's loss in both runs."""

    step: int
    value_a: float | None
    value_b: float | None
    relative_error: float
    parted: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "value_a": json_float(self.value_a),
            "value_b": json_float(self.value_b),
            "relative_error": json_float(self.relative_error),
            "parted": self.parted,
        }


@dataclass(frozen=True)
class LossDiff:
    """The loss of each step both runs have, and the first step where it parts.

    The loss of a step is the tensor its backward pass began from (the input of the op
    that seeded the backward, ``ones_like``), or, in a step without a backward pass,
    the output of its last forward op.
    """

    first_parted_step: int | None
    statistic: str  # what was compared ("mean" with statistics, else "amax": |loss|)
    steps: tuple[LossStep, ...]
    evidence: str = "ranges"  # the weakest evidence any step's loss was compared on
    loss_a: OpSide | None = None  # the op that made the loss at the first parted step
    loss_b: OpSide | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "first_parted_step": self.first_parted_step,
            "statistic": self.statistic,
            "evidence": self.evidence,
            "loss_a": self.loss_a.to_json() if self.loss_a else None,
            "loss_b": self.loss_b.to_json() if self.loss_b else None,
            "steps": [s.to_json() for s in self.steps],
        }


@dataclass(frozen=True)
class RunSide:
    """Which run, and which of its processes, one side of the diff is."""

    logdirs: tuple[str, ...]
    process: int
    rank: int | None
    framework: str
    tensor_debug_mode: str
    ops: int  # ops read (executions and graph execution traces)
    steps: int
    unreadable: int  # events whose record could not be read

    @property
    def label(self) -> str:
        where = ", ".join(self.logdirs)
        return f"{where} (rank {self.rank})" if self.rank is not None else where

    def to_json(self) -> dict[str, Any]:
        return {
            "logdirs": list(self.logdirs),
            "process": self.process,
            "rank": self.rank,
            "label": self.label,
            "framework": self.framework,
            "tensor_debug_mode": self.tensor_debug_mode,
            "ops": self.ops,
            "steps": self.steps,
            "unreadable": self.unreadable,
        }


@dataclass(frozen=True)
class Alignment:
    """How the two op streams were paired (docs/DIFF.md, "Alignment")."""

    pairs: int  # aligned pairs of ops
    compared: int  # pairs compared (something recorded on both sides)
    only_a: int  # comparable ops of run A left without a partner
    only_b: int
    skipped_a: int  # views, casts and ops with nothing recorded (never aligned)
    skipped_b: int
    steps: int  # steps both runs have
    steps_only_a: tuple[int, ...]
    steps_only_b: tuple[int, ...]
    evidence: dict[str, int]  # compared pairs by the strongest evidence both had

    def to_json(self) -> dict[str, Any]:
        return {
            "pairs": self.pairs,
            "compared": self.compared,
            "only_a": self.only_a,
            "only_b": self.only_b,
            "skipped_a": self.skipped_a,
            "skipped_b": self.skipped_b,
            "steps": self.steps,
            "steps_only_a": list(self.steps_only_a[:100]),
            "steps_only_b": list(self.steps_only_b[:100]),
            "evidence": dict(self.evidence),
        }


@dataclass(frozen=True)
class RankDiff:
    """Ranks of one run compared: which rank first parts from the others, and where.

    ``odd_ranks`` are the ranks that part first from the majority (empty when all
    agree); with two ranks no majority exists, and ``odd_ranks`` names the second.
    ``first_parted`` maps each rank compared with ``reference`` to the step of its
    first parted op (None: it agrees).
    """

    ranks: tuple[int, ...]
    reference: int
    odd_ranks: tuple[int, ...]
    majority: bool  # whether the odd ranks were told by a majority (3 ranks or more)
    first_parted: dict[int, int | None]

    def to_json(self) -> dict[str, Any]:
        return {
            "ranks": list(self.ranks),
            "reference": self.reference,
            "odd_ranks": list(self.odd_ranks),
            "majority": self.majority,
            "first_parted_step": {str(k): v for k, v in self.first_parted.items()},
        }


@dataclass(frozen=True)
class DiffResult:
    """Two runs (or two ranks of one run) compared op by op.

    ``status``: ``agree`` (every compared pair within tolerance: exit 0), ``parted``
    (exit 1; :attr:`parted` says where), ``incomplete`` (every compared pair agrees, but
    a dump lacks events or has unreadable ones, where the runs may part: no all-clear;
    exit 2), ``not_compared`` (nothing could be compared: no common step, or nothing
    recorded; exit 2).
    """

    status: str
    a: RunSide
    b: RunSide
    tolerance: Tolerance
    alignment: Alignment
    evidence: str  # the evidence the verdict rests on (the parted op's, else the strongest used)
    parted: PartedOp | None
    loss: LossDiff | None
    ranks: RankDiff | None = None
    problems: tuple[str, ...] = ()

    @property
    def exit_status(self) -> int:
        return {"agree": 0, "parted": 1}.get(self.status, 2)

    def to_json(self) -> dict[str, Any]:
        """The documented JSON form (schema ``nanscope.diff/1``, docs/DIFF.md)."""
        return {
            "schema": DIFF_SCHEMA,
            "status": self.status,
            "exit_status": self.exit_status,
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "tolerance": self.tolerance.to_json(),
            "evidence": self.evidence,
            "alignment": self.alignment.to_json(),
            "parted": self.parted.to_json() if self.parted else None,
            "loss": self.loss.to_json() if self.loss else None,
            "ranks": self.ranks.to_json() if self.ranks else None,
            "problems": list(self.problems),
        }
