"""Pairing the ops of two runs: by step, then module, then op type and place.

The two op streams need not be the same length: one run may fuse what the other
runs op by op (``torch.compile``), cast where the other does not (autocast), or
simply run other ops. Alignment goes in three stages (docs/DIFF.md):

1. *Skippable* ops are left out: views (``t``, ``view``, ``expand``, ``detach``,
   ...), which hand on their input's values, and casts (``_to_copy``,
   ``convert_element_type``), which one run may have and the other not. So are
   ops with nothing recorded to compare.
2. Per step (steps present in both runs), the ops are cut into *segments*: runs of
   consecutive ops of one module path and phase. The two lists of segments are
   aligned as sequences of (module, phase); paired segments then have their ops
   aligned as sequences of keys (phase, op type, element count).
3. What lies between paired segments (a module path one run has and the other
   lacks: the backward of a compiled graph runs without module paths) is aligned
   by op keys alone, ignoring modules.

Sequences are aligned with :class:`difflib.SequenceMatcher` (longest matching
blocks, found recursively); identical streams (two ranks, a determinism check)
skip all of that.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

import numpy as np

# Op types (the name between the namespace and the overload: ``aten.<name>.<overload>``)
# that hand on their input's values or only change its format.
VIEW_OPS = frozenset(
    {
        "t", "view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "detach",
        "alias", "unsqueeze", "squeeze", "as_strided", "slice", "select", "split",
        "split_with_sizes", "chunk", "unbind", "narrow", "view_as", "expand_as", "flatten",
        "unflatten", "lift_fresh", "numpy_T", "movedim", "diagonal", "reshape_as",
    }
)  # fmt: skip
CAST_OPS = frozenset({"_to_copy", "to", "convert_element_type", "type_as", "_autocast_to_reduced_precision", "_autocast_to_full_precision"})  # fmt: skip
# Past this many cells (ops of one side times ops of the other), an unpaired stretch is
# aligned with difflib's junk heuristic on (popular keys ignored), which bounds its time.
_EXHAUSTIVE_CELLS = 4_000_000


def base_name(op_type: str) -> str:
    """``aten.addmm.default`` -> ``addmm``; ``prims.convert_element_type`` -> same rule."""
    parts = op_type.split(".")
    if len(parts) >= 3:
        return parts[1]
    if len(parts) == 2:
        return parts[1]
    return op_type


def skippable(op_type: str) -> bool:
    """Whether an op of this type is left out of the alignment (a view or a cast)."""
    name = base_name(op_type)
    return name in VIEW_OPS or name in CAST_OPS


def _pairs_of(a: Sequence[int], b: Sequence[int], cells: int) -> list[tuple[int, int]]:
    """Matched positions of two key sequences, in order."""
    if not a or not b:
        return []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=cells > _EXHAUSTIVE_CELLS)
    out: list[tuple[int, int]] = []
    for i, j, n in matcher.get_matching_blocks():
        out.extend((i + k, j + k) for k in range(n))
    return out


def _segments(module: np.ndarray, phase: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts of the runs of equal (module, phase), and each run's key."""
    n = len(module)
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    change = np.r_[True, (module[1:] != module[:-1]) | (phase[1:] != phase[:-1])]
    starts = np.flatnonzero(change)
    keys = module[starts].astype(np.int64) * 8 + phase[starts].astype(np.int64)
    return starts, keys


def align_step(
    keys_a: np.ndarray,
    keys_b: np.ndarray,
    module_a: np.ndarray,
    module_b: np.ndarray,
    phase_a: np.ndarray,
    phase_b: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Pair the ops of one step of two runs: positions ``(ia, ib)`` into the given arrays,
    increasing in both. ``keys_*`` are op keys (equal keys may pair), ``module_*`` and
    ``phase_*`` cut each side into segments."""
    na, nb = len(keys_a), len(keys_b)
    if na == nb and np.array_equal(keys_a, keys_b):
        r = np.arange(na, dtype=np.int64)
        return r, r.copy()
    sa, ka = _segments(module_a, phase_a)
    sb, kb = _segments(module_b, phase_b)
    ea = np.r_[sa[1:], na].astype(np.int64)
    eb = np.r_[sb[1:], nb].astype(np.int64)
    seg_pairs = _pairs_of(ka.tolist(), kb.tolist(), len(ka) * len(kb))
    out_a: list[np.ndarray] = []
    out_b: list[np.ndarray] = []

    def gap(a0: int, a1: int, b0: int, b1: int) -> None:
        """Align ops ``a0:a1`` and ``b0:b1`` (between paired segments) by keys alone."""
        if a1 <= a0 or b1 <= b0:
            return
        pa = keys_a[a0:a1].tolist()
        pb = keys_b[b0:b1].tolist()
        found = _pairs_of(pa, pb, len(pa) * len(pb))
        if found:
            arr = np.asarray(found, dtype=np.int64)
            out_a.append(arr[:, 0] + a0)
            out_b.append(arr[:, 1] + b0)

    prev_a, prev_b = 0, 0  # ops before these are aligned
    for i, j in seg_pairs:
        gap(prev_a, int(sa[i]), prev_b, int(sb[j]))
        a0, a1, b0, b1 = int(sa[i]), int(ea[i]), int(sb[j]), int(eb[j])
        if a1 - a0 == b1 - b0 and np.array_equal(keys_a[a0:a1], keys_b[b0:b1]):
            out_a.append(np.arange(a0, a1, dtype=np.int64))
            out_b.append(np.arange(b0, b1, dtype=np.int64))
        else:
            gap(a0, a1, b0, b1)
        prev_a, prev_b = a1, b1
    gap(prev_a, na, prev_b, nb)
    if not out_a:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(out_a), np.concatenate(out_b)


def align(
    step_a: np.ndarray,
    step_b: np.ndarray,
    keys_a: np.ndarray,
    keys_b: np.ndarray,
    module_a: np.ndarray,
    module_b: np.ndarray,
    phase_a: np.ndarray,
    phase_b: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, list[int], list[int], list[int]]:
    """Pair two op streams (each in the order it ran), step by step.

    Returns ``(ia, ib, steps, only_a, only_b)``: the paired positions (increasing in
    both), the steps both runs have, and the steps one run has and the other lacks.
    """
    steps_a, first_a = np.unique(step_a, return_index=True)
    steps_b = np.unique(step_b)
    common = np.intersect1d(steps_a, steps_b)
    only_a = np.setdiff1d(steps_a, steps_b).tolist()
    only_b = np.setdiff1d(steps_b, steps_a).tolist()
    # Steps in the order they ran (the order of their first ops).
    common = common[np.argsort(first_a[np.searchsorted(steps_a, common)], kind="stable")]
    # Positions of each step's ops: a stable sort by step keeps each step's own order.
    order_a = np.argsort(step_a, kind="stable")
    order_b = np.argsort(step_b, kind="stable")
    sorted_a, sorted_b = step_a[order_a], step_b[order_b]
    out_a: list[np.ndarray] = []
    out_b: list[np.ndarray] = []
    for s in common.tolist():
        pa = order_a[np.searchsorted(sorted_a, s, "left") : np.searchsorted(sorted_a, s, "right")]
        pb = order_b[np.searchsorted(sorted_b, s, "left") : np.searchsorted(sorted_b, s, "right")]
        ia, ib = align_step(
            keys_a[pa], keys_b[pb], module_a[pa], module_b[pb], phase_a[pa], phase_b[pb]
        )
        out_a.append(pa[ia])
        out_b.append(pb[ib])
    if not out_a:
        empty = np.zeros(0, np.int64)
        return empty, empty.copy(), [], only_a, only_b
    ia_all = np.concatenate(out_a)
    ib_all = np.concatenate(out_b)
    return ia_all, ib_all, [int(s) for s in common.tolist()], only_a, only_b
