"""``nanscope diff``'s alignment, tolerances and verdict, on sequences and crafted dumps.

The crafted dumps are written with nanscope's ``DumpWriter`` from a plan that says which
op was changed and how: the plan is the oracle the verdict is checked against.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from nanscope.analysis import DiffInputError, Tolerance, diff, diff_ranks
from nanscope.analysis._align import align, align_step, skippable
from nanscope.analysis._diff import _compare_rows
from nanscope.analysis._diff_table import OUTPUT_COLUMNS
from nanscope.analysis._tolerance import DEFAULT_RTOL, rank_of
from nanscope.cli import main
from nanscope.events import DumpWriter, ExecutionEvent
from nanscope.events._model import Phase
from nanscope.format.proto.types_pb2 import DataType

# -- alignment of key sequences ----------------------------------------------------------------


def pairs(
    a: list[int], b: list[int], ma: list[int] | None = None, mb: list[int] | None = None
) -> list[tuple[int, int]]:
    """Aligned positions of two key sequences (one module each unless given)."""
    ma = ma or [0] * len(a)
    mb = mb or [0] * len(b)
    ia, ib = align_step(
        np.array(a, np.int64), np.array(b, np.int64), np.array(ma, np.int32),
        np.array(mb, np.int32), np.zeros(len(a), np.int8), np.zeros(len(b), np.int8),
    )  # fmt: skip
    return list(zip(ia.tolist(), ib.tolist(), strict=True))


def test_identical_streams_pair_one_to_one() -> None:
    assert pairs([1, 2, 3, 2], [1, 2, 3, 2]) == [(0, 0), (1, 1), (2, 2), (3, 3)]


def test_an_op_one_run_lacks_is_left_unpaired() -> None:
    # B runs one op more in the middle (say, a fused kernel's extra step).
    assert pairs([1, 2, 3, 4], [1, 2, 9, 3, 4]) == [(0, 0), (1, 1), (2, 3), (3, 4)]


def test_fused_against_unfused_pairs_only_the_common_ops() -> None:
    mm, gelu, mul, erf, add = 1, 2, 3, 4, 5
    got = pairs([mm, gelu, mm], [mm, mul, erf, add, mul, mm])
    assert got == [(0, 0), (2, 5)]


def test_modules_anchor_ops_of_the_same_type() -> None:
    # The same op type in two modules: B ran only the second module's. Keys alone would
    # pair B's op with A's first; the module segments pair it with A's second.
    got = pairs([7, 7], [7], ma=[1, 2], mb=[2])
    assert got == [(1, 0)]


def test_a_module_one_run_lacks_is_aligned_by_keys_alone() -> None:
    # A compiled backward runs without module paths (module 0); eager's has them.
    got = pairs([1, 2, 3], [1, 2, 3], ma=[5, 6, 7], mb=[0, 0, 0])
    assert got == [(0, 0), (1, 1), (2, 2)]


def test_steps_align_separately_and_steps_in_one_run_are_named() -> None:
    step_a = np.array([0, 0, 1, 1, 2], np.int64)
    step_b = np.array([0, 0, 1, 1, 3], np.int64)
    keys = np.array([1, 2, 1, 2, 1], np.int64)
    zeros = np.zeros(5, np.int32)
    ia, ib, steps, only_a, only_b = align(
        step_a, step_b, keys, keys, zeros, zeros, zeros.astype(np.int8), zeros.astype(np.int8)
    )
    assert steps == [0, 1]
    assert (only_a, only_b) == ([2], [3])
    assert ia.tolist() == ib.tolist() == [0, 1, 2, 3]


def test_views_and_casts_are_skippable() -> None:
    for op in ("aten.t.default", "aten.view.default", "aten._to_copy.default",
               "aten.detach.default", "prims.convert_element_type.default"):  # fmt: skip
        assert skippable(op), op
    for op in ("aten.mm.default", "aten.add.Tensor", "aten.gelu.default", "aten.copy_.default"):
        assert not skippable(op), op


# -- tolerances ----------------------------------------------------------------------------------


def test_the_default_rtol_is_that_of_the_coarser_format() -> None:
    tol = Tolerance()
    f32, bf16 = rank_of(DataType.DT_FLOAT), rank_of(DataType.DT_BFLOAT16)
    assert tol.rtol_of_rank(max(f32, bf16)) == DEFAULT_RTOL[bf16] > DEFAULT_RTOL[f32]
    assert Tolerance(rtol=0.5).rtol_of_rank(f32) == 0.5


def row(**values: float) -> np.ndarray:
    r = np.full(len(OUTPUT_COLUMNS), np.nan)
    for k, v in values.items():
        r[OUTPUT_COLUMNS.index(k)] = v
    return r


COUNTS = {"size": 100.0, "neg_inf": 0.0, "pos_inf": 0.0, "nan": 0.0, "neg": 50.0, "zero": 0.0,
          "pos": 50.0, "dtype": float(DataType.DT_FLOAT)}  # fmt: skip


def compare(a: np.ndarray, b: np.ndarray, rtol: float | None = None) -> tuple[bool, float, str]:
    f32 = np.array([rank_of(DataType.DT_FLOAT)])
    parted, err, _, stat, _ = _compare_rows(a[None], b[None], f32, Tolerance(rtol=rtol))
    from nanscope.analysis._diff import _STATS

    return bool(parted[0]), float(err[0]), _STATS[int(stat[0])]


def test_largest_abs_within_and_beyond_tolerance() -> None:
    a = row(**COUNTS, amax=1.0)
    assert compare(a, row(**COUNTS, amax=1.00001))[0] is False
    parted, err, stat = compare(a, row(**COUNTS, amax=1.01))
    assert parted and stat == "amax" and err == pytest.approx(0.01 / 1.01)


def test_inf_nan_counts_that_differ_part_whatever_the_values() -> None:
    b = {**COUNTS, "nan": 1.0, "pos": 49.0}
    parted, err, stat = compare(row(**COUNTS, amax=1.0), row(**b, amax=1.0))
    assert parted and math.isinf(err) and stat == "nonfinite"


def test_counts_alone_part_on_a_sign_flip() -> None:
    flipped = {**COUNTS, "neg": 10.0, "pos": 90.0}
    assert compare(row(**COUNTS), row(**flipped))[0] is True
    one_moved = {**COUNTS, "neg": 49.0, "pos": 51.0}
    assert compare(row(**COUNTS), row(**one_moved))[0] is False


def test_statistics_are_preferred_and_equal_hashes_agree() -> None:
    stats = {"mean": 0.1, "std": 1.0, "l2": 10.0}
    a = row(**COUNTS, amax=1.0, **stats, hash=1234.0)
    # Same largest |x|, another standard deviation: the statistics see it.
    parted, err, stat = compare(a, row(**COUNTS, amax=1.0, **{**stats, "std": 1.1}, hash=99.0))
    assert parted and stat == "std" and err == pytest.approx(0.1 / 1.1)
    same = row(**COUNTS, amax=1.0, **stats, hash=1234.0)
    assert compare(a, same) == (False, 0.0, "l2")


# -- crafted dumps: the verdict against the plan ---------------------------------------------------


@dataclass
class Op:
    op_type: str
    module: str
    amax: float
    phase: Phase = Phase.FORWARD
    dtype: int = DataType.DT_FLOAT
    nan: int = 0
    stats: tuple[float, float, float, float] | None = None
    inputs: list[int] = field(default_factory=list)  # positions in the step's op list (-1: none)


def model_ops(scale_at: int | None = None, scale: float = 1.0, cast: bool = False) -> list[Op]:
    """A 3-layer forward and a backward; ``scale_at``: the op whose output is scaled."""
    ops: list[Op] = []
    for layer in range(3):
        m = f"model.layers.{layer} (Block)"
        if cast:
            ops.append(Op("aten._to_copy.default", m, 1.0, inputs=[len(ops) - 1]))
        ops.append(Op("aten.mm.default", m, 2.0 + layer, inputs=[len(ops) - 1]))
        ops.append(Op("aten.gelu.default", m, 1.5 + layer, inputs=[len(ops) - 1]))
    ops.append(Op("aten.mean.default", "", 0.7, inputs=[len(ops) - 1]))
    ops.append(Op("aten.ones_like.default", "", 1.0, inputs=[len(ops) - 1]))
    for layer in reversed(range(3)):
        m = f"model.layers.{layer} (Block)"
        ops.append(Op("aten.gelu_backward.default", m, 0.3, Phase.BACKWARD, inputs=[len(ops) - 1]))
        ops.append(Op("aten.mm.default", m, 0.2, Phase.BACKWARD, inputs=[len(ops) - 1]))
    if scale_at is not None:
        ops[scale_at].amax *= scale
    return ops


def write_run(logdir: Path, steps: list[list[Op]], rank: int | None = None, keep: int = -1) -> None:
    w = DumpWriter(logdir, "FULL_HEALTH", circular_buffer_size=keep, framework="test", rank=rank)
    stack = w.capture_stack()
    tid = 1
    for step, ops in enumerate(steps):
        ids: list[int] = []
        for op in ops:
            width = 17 if op.stats else 13
            s = np.zeros(width)
            s[:11] = [tid, -1, op.dtype, 2, 16, 0, 0, op.nan, 8, 0, 8 - op.nan]
            s[11:13] = [op.amax, 1e-3]
            if op.stats:
                s[13:17] = op.stats
            ins = [ids[i] for i in op.inputs if 0 <= i < len(ids)]
            w.write_execution(
                ExecutionEvent(
                    op_type=op.op_type, output_tensor_ids=[tid], input_tensor_ids=ins,
                    summaries=[s], stack=stack, module_path=op.module, phase=op.phase,
                    step=step,
                )
            )  # fmt: skip
            ids.append(tid)
            tid += 1
    w.close()


def test_the_verdict_names_the_changed_op_with_agreeing_inputs(tmp_path: Path) -> None:
    clean, bad = model_ops(), model_ops(scale_at=2, scale=1.01)  # layer 1's mm
    write_run(tmp_path / "a", [clean, clean])
    write_run(tmp_path / "b", [clean, bad])
    r = diff(tmp_path / "a", tmp_path / "b")
    assert r.status == "parted" and r.exit_status == 1
    p = r.parted
    assert p is not None
    assert (p.step, p.a.op_type, p.a.module_path) == (
        1,
        "aten.mm.default",
        "model.layers.1 (Block)",
    )
    assert p.evidence == "ranges" and p.compared_as == "float32"
    assert p.outputs[0].value_a == 3.0 and p.outputs[0].value_b == pytest.approx(3.03)
    assert p.relative_error == pytest.approx(0.03 / 3.03)
    assert p.inputs_agree is True  # made by layer 0's gelu, which agrees
    assert r.alignment.only_a == r.alignment.only_b == 0
    # The loss (what the backward began from: mean's output) is the same in both runs.
    assert r.loss is not None and r.loss.first_parted_step is None
    assert [s.value_a for s in r.loss.steps] == [0.7, 0.7]


def test_an_extra_cast_in_one_run_does_not_move_the_verdict(tmp_path: Path) -> None:
    write_run(tmp_path / "a", [model_ops()])
    write_run(tmp_path / "b", [model_ops(scale_at=5, scale=0.9, cast=True)])  # layer 1's gelu
    r = diff(tmp_path / "a", tmp_path / "b")
    assert r.parted is not None
    assert (r.parted.a.op_type, r.parted.a.module_path) == (
        "aten.gelu.default", "model.layers.1 (Block)",
    )  # fmt: skip
    assert r.alignment.skipped_b - r.alignment.skipped_a == 3  # the casts, left out
    assert r.parted.inputs_agree is True  # traced through the cast to the mm


def test_a_different_loss_is_found_at_its_step(tmp_path: Path) -> None:
    clean = model_ops()
    loss_off = model_ops(scale_at=6, scale=2.0)  # the mean (the loss)
    write_run(tmp_path / "a", [clean, clean, clean])
    write_run(tmp_path / "b", [clean, clean, loss_off])
    r = diff(tmp_path / "a", tmp_path / "b")
    assert r.loss is not None and r.loss.first_parted_step == 2
    assert r.loss.loss_b is not None and r.loss.loss_b.op_type == "aten.mean.default"


def test_bfloat16_is_compared_at_its_own_tolerance(tmp_path: Path) -> None:
    clean = model_ops()
    bf16 = model_ops(scale_at=1, scale=1.005)  # 0.5% off: beyond float32's, within bfloat16's
    bf16[1].dtype = DataType.DT_BFLOAT16
    write_run(tmp_path / "a", [clean])
    write_run(tmp_path / "b", [bf16])
    r = diff(tmp_path / "a", tmp_path / "b")
    assert r.status == "agree" and r.exit_status == 0
    strict = diff(tmp_path / "a", tmp_path / "b", rtol=1e-3)
    assert strict.parted is not None and strict.parted.a.module_path == "model.layers.0 (Block)"


def test_statistics_are_the_evidence_where_both_runs_have_them(tmp_path: Path) -> None:
    def with_stats(ops: list[Op], std_at: int | None = None) -> list[Op]:
        for i, op in enumerate(ops):
            changed = i == std_at
            # Equal hashes mean equal bits: the changed output's hash differs.
            op.stats = (0.0, 1.2 if changed else 1.0, 4.0, float(1000 + i + 500 * changed))
        return ops

    write_run(tmp_path / "a", [with_stats(model_ops())])
    write_run(tmp_path / "b", [with_stats(model_ops(), std_at=3)])  # layer 1's gelu, same |x|max
    r = diff(tmp_path / "a", tmp_path / "b")
    assert r.evidence == "statistics" and r.parted is not None
    assert (r.parted.a.op_type, r.parted.outputs[0].statistic) == ("aten.gelu.default", "std")
    assert r.parted.a.module_path == "model.layers.1 (Block)"


def test_ranks_of_one_run_name_the_odd_rank(tmp_path: Path) -> None:
    clean = model_ops()
    for rank in range(3):
        ops = model_ops(scale_at=1, scale=1.5) if rank == 1 else clean  # layer 0's gelu
        write_run(tmp_path / "run", [clean, ops], rank=rank)
    r = diff_ranks(tmp_path / "run")
    assert r.ranks is not None and r.ranks.odd_ranks == (1,) and r.ranks.majority
    assert r.parted is not None and r.parted.b.rank == 1 and r.parted.step == 1
    assert r.parted.a.op_type == "aten.gelu.default"
    assert r.ranks.first_parted == {1: 1, 2: None}


def test_cli_exit_status_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path / "a", [model_ops()])
    write_run(tmp_path / "b", [model_ops()])
    write_run(tmp_path / "c", [model_ops(scale_at=0, scale=2.0)])  # layer 0's mm
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert "agree within tolerance" in capsys.readouterr().out
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "c"), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "nanscope.diff/1" and doc["status"] == "parted"
    assert doc["parted"]["op_type"] == "aten.mm.default"
    assert (
        doc["parted"]["a"]["values"]["amax"] == 2.0 and doc["parted"]["b"]["values"]["amax"] == 4.0
    )
    # Bad input: one line on stderr, exit 2.
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "missing")]) == 2
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--rank-a", "3"]) == 2
    assert main(["diff", str(tmp_path / "a"), "--ranks"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("nanscope diff: error: ") for line in err)


def test_no_all_clear_when_a_dump_lacks_events(tmp_path: Path) -> None:
    ops = model_ops()
    write_run(tmp_path / "a", [ops, ops])
    write_run(tmp_path / "b", [ops, ops], keep=len(ops))  # a circular buffer: the last step
    r = diff(tmp_path / "a", tmp_path / "b")
    assert r.parted is None and r.alignment.compared > 0
    assert r.status == "incomplete" and r.exit_status == 2
    assert any("not in the dump" in p for p in r.problems)


def test_bad_tolerance_is_refused(tmp_path: Path) -> None:
    write_run(tmp_path / "a", [model_ops()])
    with pytest.raises(DiffInputError, match="rtol"):
        diff(tmp_path / "a", tmp_path / "a", rtol=-1.0)
