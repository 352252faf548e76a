"""``diff``: the first op where two runs part.

Each run's ops are read into columns (:mod:`._diff_table`), paired by step, module
and op (:mod:`._align`), and each pair's outputs compared within a tolerance
(:mod:`._tolerance`) on the strongest evidence both runs recorded: statistics
(mean, standard deviation, L2 norm, a bits hash), else ranges (largest ``|x|``),
else the counts (Inf/NaN, negative, zero, positive). The verdict is the first pair
whose output parts; its inputs are traced back to the ops that made them (tensor
ids), which says whether they agreed, and names an op that only one run has when
one fed it. Then the first step whose loss parts. See docs/DIFF.md.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from nanscope.analysis._align import VIEW_OPS, align, base_name, skippable
from nanscope.analysis._diff_result import (
    EVIDENCE,
    Alignment,
    DiffResult,
    InputCheck,
    LossDiff,
    LossStep,
    OpSide,
    OutputDiff,
    PartedOp,
    RankDiff,
    RunSide,
    SourceLine,
)
from nanscope.analysis._diff_table import _COL, OpTable, Strings, build_table
from nanscope.analysis._tolerance import FORMAT_NAMES, Tolerance, ranks_of
from nanscope.analysis._views import Source, ViewBuilder
from nanscope.reader import EXECUTIONS, TRACES, UNREADABLE, DumpReader
from nanscope.vocabulary import Phase

Run = DumpReader | str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
_EV_STATS, _EV_RANGES, _EV_COUNTS, _EV_NONE = 0, 1, 2, 3
_SEED_OPS = ("ones_like", "full_like", "fill", "new_ones", "ones")
_LOSS_STEPS_KEPT = 10_000


class DiffInputError(ValueError):
    """Runs that cannot be compared as asked (a rank a run lacks, say): the message says why."""


@dataclass
class _Side:
    """One side of a diff: a reader, the process compared, and its ops."""

    name: str  # "a" or "b"
    reader: DumpReader
    process: int
    table: OpTable
    comparable: np.ndarray  # positions in the table of the ops that are aligned
    op_rank: np.ndarray  # each op's coarsest float format (rank), per table position
    floor: np.ndarray  # the running coarsest format up to each op (inclusive)
    strings: Strings  # the op types' and module paths' names (shared by both sides)
    views: ViewBuilder | None = None

    @cached_property
    def op_kinds(self) -> tuple[np.ndarray, np.ndarray]:
        """Per table position: whether the op is a view (its output shares its input's
        storage), and whether it writes its first input in place (``copy_``, ``mul_``,
        ``_foreach_mul_``: aten's in-place names end with ``_``)."""
        bases = [base_name(n) for n in self.strings.strings] or [""]
        views = np.array([b in VIEW_OPS for b in bases], dtype=bool)
        inplace = np.array([b.endswith("_") and b.strip("_") != "" for b in bases], dtype=bool)
        return views[self.table.op_type], inplace[self.table.op_type]

    def rank(self) -> int | None:
        procs = self.reader.processes
        return procs[self.process].rank if self.process < len(procs) else None

    def run_side(self) -> RunSide:
        mode = self.reader.tensor_debug_mode
        return RunSide(
            logdirs=tuple(str(p) for p in self.reader.logdirs),
            process=self.process,
            rank=self.rank(),
            framework=self.reader.framework,
            tensor_debug_mode=mode.name if mode is not None else "",
            ops=len(self.table),
            steps=len(np.unique(self.table.step)),
            unreadable=self.table.unreadable,
        )


def _open(run: Run) -> tuple[DumpReader, bool]:
    if isinstance(run, DumpReader):
        return run, False
    return DumpReader(run), True


def _process_of(reader: DumpReader, rank: int | None, what: str) -> int:
    procs = reader.processes
    if not procs:
        raise DiffInputError(f"{what}: the dump holds no process (no metadata was read)")
    if rank is None:
        return procs[0].index
    for p in procs:
        if p.rank == rank:
            return p.index
    have = sorted(p.rank for p in procs if p.rank is not None)
    raise DiffInputError(
        f"{what} has no rank {rank} (its ranks: {', '.join(map(str, have)) or 'none'})"
    )


def _side(name: str, reader: DumpReader, process: int, strings: Strings) -> _Side:
    table = build_table(reader, process, strings)
    n = len(table)
    skip_type = np.array([skippable(s) for s in strings.strings], dtype=bool)
    outputs = table.outputs
    # Each output row's op, for per-op reductions (an op may have no output row).
    op_of_row = np.repeat(np.arange(n), np.diff(table.out_start))
    known = ~np.isnan(outputs[:, _COL["size"]]) | ~np.isnan(outputs[:, _COL["amax"]])
    per_op = np.zeros(n, dtype=np.int64)
    np.add.at(per_op, op_of_row, known.astype(np.int64))
    comparable = np.flatnonzero((per_op > 0) & ~skip_type[table.op_type])
    out_rank = ranks_of(np.nan_to_num(outputs[:, _COL["dtype"]]).astype(np.int64))
    op_rank = np.zeros(n, dtype=np.int8)
    np.maximum.at(op_rank, op_of_row, out_rank)
    floor = np.maximum.accumulate(op_rank) if n else op_rank
    return _Side(name, reader, process, table, comparable, op_rank, floor, strings)


def _keys(a: _Side, b: _Side) -> tuple[np.ndarray, np.ndarray]:
    """Op keys shared by both sides: (phase, op type, first output's element count), packed
    in one int64 (phase: 3 bits, op type: 20, elements: 40; larger counts share a key)."""
    parts = []
    for s in (a, b):
        t, pos = s.table, s.comparable
        size = np.nan_to_num(t.first_output("size")[pos], nan=-1.0)
        size = np.where((size < 0) | (size >= 2.0**40), 2.0**40 - 1, size).astype(np.int64)
        key = (t.phase[pos].astype(np.int64) & 7) << 60
        key |= (t.op_type[pos].astype(np.int64) & 0xFFFFF) << 40
        parts.append(key | size)
    return parts[0], parts[1]


# -- comparing outputs -----------------------------------------------------------------------


@dataclass
class _Compared:
    """Per aligned pair: parted, error, evidence; and per output pair, the same."""

    parted: np.ndarray  # bool per pair
    error: np.ndarray  # float per pair
    evidence: np.ndarray  # int per pair (_EV_*)
    out_pair: np.ndarray  # pair index of each output pair
    oa: np.ndarray  # output rows of side a
    ob: np.ndarray
    out_parted: np.ndarray
    out_error: np.ndarray
    out_evidence: np.ndarray
    out_stat: np.ndarray  # index into _STATS of the statistic that gave the error
    out_rank: np.ndarray  # the format rank the tolerance was taken at
    out_rtol: np.ndarray


_STATS = ("mean", "std", "l2", "amax", "counts", "nonfinite", "hash")


def _rel(d: np.ndarray, ref: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(ref > 0, d / ref, np.where(d > 0, np.inf, 0.0))
    out: np.ndarray = r
    return out


def _compare_rows(
    xa: np.ndarray, xb: np.ndarray, rank: np.ndarray, tol: Tolerance
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Compare output rows pairwise: (parted, error, evidence, statistic, rtol) per row."""
    n = len(xa)
    rtol = tol.rtols(rank)
    atol = tol.atol

    def col(x: np.ndarray, name: str) -> np.ndarray:
        out: np.ndarray = x[:, _COL[name]]
        return out

    parted = np.zeros(n, dtype=bool)
    error = np.zeros(n)
    stat = np.full(n, _STATS.index("counts"), dtype=np.int8)
    evidence = np.full(n, _EV_NONE, dtype=np.int8)

    # Counts: Inf/NaN exactly; signs and zeros within count_tolerance of the elements.
    size_a, size_b = col(xa, "size"), col(xb, "size")
    have_counts = ~np.isnan(size_a) & ~np.isnan(size_b) & ~np.isnan(col(xa, "nan"))
    have_counts &= ~np.isnan(col(xb, "nan"))
    nonfinite_differ = np.zeros(n, dtype=bool)
    for c in ("neg_inf", "pos_inf", "nan"):
        nonfinite_differ |= have_counts & (col(xa, c) != col(xb, c))
    signs = ~np.isnan(col(xa, "neg")) & ~np.isnan(col(xb, "neg")) & have_counts
    moved = np.zeros(n)
    for c in ("neg", "zero", "pos"):
        moved += np.abs(np.nan_to_num(col(xa, c)) - np.nan_to_num(col(xb, c)))
    moved /= 2
    size = np.nan_to_num(np.maximum(size_a, size_b))
    counts_part = signs & (moved > np.maximum(1.0, tol.count_tolerance * size))
    evidence[have_counts] = _EV_COUNTS
    with np.errstate(divide="ignore", invalid="ignore"):
        error = np.where(signs & (size > 0), moved / np.maximum(size, 1), 0.0)
    parted |= counts_part

    # Ranges: the largest |x|.
    amax_a, amax_b = col(xa, "amax"), col(xb, "amax")
    have_ranges = ~np.isnan(amax_a) & ~np.isnan(amax_b)
    d = np.abs(amax_a - amax_b)
    ref = np.maximum(amax_a, amax_b)
    ranges_part = have_ranges & (d > atol + rtol * ref)
    stats_part = np.zeros(n, dtype=bool)
    ranges_err = _rel(np.nan_to_num(d), np.nan_to_num(ref))
    use_ranges = have_ranges
    evidence[use_ranges] = _EV_RANGES
    error = np.where(use_ranges, ranges_err, error)
    stat[use_ranges] = _STATS.index("amax")
    parted |= ranges_part & ~_stats_known(xa, xb)

    # Statistics: mean (against the spread), std, L2; equal hashes agree exactly.
    have_stats = _stats_known(xa, xb)
    if have_stats.any():
        ma, mb = col(xa, "mean"), col(xb, "mean")
        sa, sb = col(xa, "std"), col(xb, "std")
        la, lb = col(xa, "l2"), col(xb, "l2")
        checks = (
            ("mean", np.abs(ma - mb), np.maximum.reduce([sa, sb, np.abs(ma), np.abs(mb)])),
            ("std", np.abs(sa - sb), np.maximum(sa, sb)),
            ("l2", np.abs(la - lb), np.maximum(la, lb)),
        )
        best = np.zeros(n)
        best_stat = np.full(n, _STATS.index("l2"), dtype=np.int8)
        for name, dd, rr in checks:
            dd, rr = np.nan_to_num(dd), np.nan_to_num(rr)
            stats_part |= dd > atol + rtol * rr
            e = _rel(dd, rr)
            better = e > best
            best = np.where(better, e, best)
            best_stat[better] = _STATS.index(name)
        ha, hb = col(xa, "hash"), col(xb, "hash")
        same_bits = ~np.isnan(ha) & (ha == hb)
        stats_part &= ~same_bits
        best = np.where(same_bits, 0.0, best)
        evidence[have_stats] = _EV_STATS
        error = np.where(have_stats, best, error)
        stat[have_stats] = best_stat[have_stats]
        parted |= have_stats & stats_part

    # Counts that part where the stronger evidence does not: the counts say why.
    primary = np.where(have_stats, stats_part, ranges_part)
    by_counts = counts_part & ~primary
    with np.errstate(divide="ignore", invalid="ignore"):
        error = np.where(by_counts, moved / np.maximum(size, 1), error)
    stat[by_counts] = _STATS.index("counts")
    parted |= nonfinite_differ
    error = np.where(nonfinite_differ, np.inf, error)
    stat[nonfinite_differ] = _STATS.index("nonfinite")
    return parted, error, evidence, stat, rtol


def _stats_known(xa: np.ndarray, xb: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.ones(len(xa), dtype=bool)
    for c in ("mean", "std", "l2"):
        out &= ~np.isnan(xa[:, _COL[c]]) & ~np.isnan(xb[:, _COL[c]])
    return out


def _compare(a: _Side, b: _Side, ia: np.ndarray, ib: np.ndarray, tol: Tolerance) -> _Compared:
    """Compare the outputs of each aligned pair (table positions ``ia``, ``ib``)."""
    ta, tb = a.table, b.table
    na_out = ta.out_start[ia + 1] - ta.out_start[ia]
    nb_out = tb.out_start[ib + 1] - tb.out_start[ib]
    m = np.minimum(na_out, nb_out)
    total = int(m.sum())
    out_pair = np.repeat(np.arange(len(ia)), m)
    within = np.arange(total) - np.repeat(np.concatenate([[0], np.cumsum(m)[:-1]]), m)
    oa = ta.out_start[ia][out_pair] + within
    ob = tb.out_start[ib][out_pair] + within
    xa, xb = ta.outputs[oa], tb.outputs[ob]
    ra = ranks_of(np.nan_to_num(xa[:, _COL["dtype"]]).astype(np.int64))
    rb = ranks_of(np.nan_to_num(xb[:, _COL["dtype"]]).astype(np.int64))
    floor = np.maximum(a.floor[ia], b.floor[ib])[out_pair]
    rank = np.maximum.reduce([ra, rb, floor]).astype(np.int64)
    o_parted, o_error, o_ev, o_stat, o_rtol = _compare_rows(xa, xb, rank, tol)
    n = len(ia)
    parted = np.zeros(n, dtype=bool)
    error = np.zeros(n)
    evidence = np.full(n, _EV_NONE, dtype=np.int8)
    if total:
        np.logical_or.at(parted, out_pair, o_parted)
        np.maximum.at(error, out_pair, np.where(o_ev < _EV_NONE, o_error, 0.0))
        np.minimum.at(evidence, out_pair, o_ev)
    return _Compared(
        parted, error, evidence, out_pair, oa, ob, o_parted, o_error, o_ev, o_stat, rank, o_rtol
    )


# -- naming ops -------------------------------------------------------------------------------


def _source(s: Source | None) -> SourceLine | None:
    return None if s is None else SourceLine(s.file, s.line, s.function, s.code)


def _op_side(side: _Side, pos: int, slot: int = 0) -> OpSide:
    """Table position ``pos`` of ``side`` as an :class:`OpSide` (decoded through the reader)."""
    t = side.table
    kind = EXECUTIONS if t.kind[pos] == 0 else TRACES
    index = int(t.index[pos])
    if side.views is None:
        side.views = ViewBuilder(side.reader)
    try:
        view = side.views.view(kind, index)
    except (IndexError, *UNREADABLE):
        view = None
    row = t.out_start[pos] + slot
    values: dict[str, float | None] = {}
    dtype = ""
    if row < t.out_start[pos + 1]:
        x = t.outputs[row]
        for name in ("amax", "amin", "mean", "std", "l2", "size", "neg", "zero", "pos"):
            v = float(x[_COL[name]])
            values[name] = None if math.isnan(v) else v
        for name in ("neg_inf", "pos_inf", "nan"):
            v = float(x[_COL[name]])
            values[name] = None if math.isnan(v) else v
        dt = x[_COL["dtype"]]
        dtype = (
            ""
            if math.isnan(dt)
            else FORMAT_NAMES[int(ranks_of(np.array([int(dt)]))[0])] or f"DataType {int(dt)}"
        )
    phase = Phase(int(t.phase[pos])).label if int(t.phase[pos]) in (0, 1, 2, 3) else ""
    return OpSide(
        run=side.name,
        kind=kind,
        index=index,
        process=side.process,
        rank=side.rank(),
        step=int(t.step[pos]),
        phase=phase,
        op_type=view.op_type if view else "",
        op_name=view.op_name if view else "",
        module_path=view.module_path if view else "",
        dtype=dtype,
        source=_source(view.source) if view else None,
        forward_source=_source(view.forward_source) if view else None,
        values=values,
    )


# -- inputs -------------------------------------------------------------------------------------


def _last_row(out_ids: np.ndarray, tid: int, limit: int) -> int | None:
    """The last output row before ``limit`` holding tensor ``tid``: looked for in windows
    growing backwards (a tensor is used soon after it is made, as a rule)."""
    hi, width = limit, 4096
    while hi > 0:
        lo = max(0, hi - width)
        hits = np.flatnonzero(out_ids[lo:hi] == tid)
        if hits.size:
            return lo + int(hits[-1])
        hi, width = lo, width * 8
    return None


def _first_inputs(t: OpTable, ops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ops among ``ops`` that have inputs, and the tensor id of each one's first input."""
    ops = ops[t.in_start[ops + 1] > t.in_start[ops]]
    return ops, t.in_ids[t.in_start[ops]]


def _aliases(side: _Side, tid: int, pos: int) -> np.ndarray:
    """Tensor ``tid`` and the views made of it (transitively) by ops before ``pos``: a
    write into any of them is a write into ``tid``'s values."""
    t = side.table
    views, first_in = _first_inputs(t, np.flatnonzero(side.op_kinds[0][:pos]))
    ids = np.array([tid], dtype=t.out_ids.dtype)
    for _ in range(8):  # views of views
        made = views[np.isin(first_in, ids)].tolist()
        out = [t.out_ids[t.out_start[v] : t.out_start[v + 1]] for v in made]
        grown = np.union1d(ids, np.concatenate(out)) if out else ids
        grown = grown[grown != 0]
        if len(grown) == len(ids):
            break
        ids = grown
    return ids


def _last_write(side: _Side, tid: int, pos: int) -> int | None:
    """The last output row of an op before ``pos`` that wrote ``tid``'s values: the op
    that made it, or a later one that wrote into it, or into a view of it, in place
    (``x[0] = ...`` is a ``select`` and a ``copy_``; the write's output is a new version)."""
    t = side.table
    limit = int(t.out_start[pos])
    row = _last_row(t.out_ids, tid, limit)
    writers, first_in = _first_inputs(t, np.flatnonzero(side.op_kinds[1][:pos]))
    if not writers.size:
        return row
    writes = writers[np.isin(first_in, _aliases(side, tid, pos))]
    writes = writes[t.out_start[writes + 1] > t.out_start[writes]]  # it recorded an output
    if writes.size:
        wrow = int(t.out_start[writes[-1]])
        if row is None or wrow > row:
            return wrow
    return row


def _made_by(side: _Side, pos: int, tid: int, skip_ok: np.ndarray) -> tuple[int, int] | None:
    """The op (table position) that made tensor ``tid`` before op ``pos``, and the output
    slot it came out of; through skipped ops (views, casts) to the op that made their
    input."""
    t = side.table
    for _ in range(32):
        row = _last_write(side, tid, pos)
        if row is None:
            return None
        prod = int(np.searchsorted(t.out_start, row, side="right") - 1)
        if skip_ok[prod]:
            return prod, row - int(t.out_start[prod])
        ins = t.in_ids[t.in_start[prod] : t.in_start[prod + 1]]
        ins = ins[ins != 0]
        if not ins.size:
            return prod, row - int(t.out_start[prod])
        pos, tid = prod, int(ins[0])
    return None


def _producer(side: _Side, pos: int, tid: int, skip_ok: np.ndarray) -> int | None:
    """The table position of the op that made tensor ``tid`` (see :func:`_made_by`)."""
    found = _made_by(side, pos, tid, skip_ok)
    return None if found is None else found[0]


def _inputs(
    a: _Side,
    b: _Side,
    pa: int,
    pb: int,
    pair_of_a: np.ndarray,
    pair_of_b: np.ndarray,
    parted: np.ndarray,
) -> tuple[tuple[InputCheck, ...], bool | None, OpSide | None]:
    """The parted op's inputs, traced back in both runs: checks, whether all agree, and an
    op only one run has that fed it."""
    comp_a = np.zeros(len(a.table), dtype=bool)
    comp_a[a.comparable] = True
    comp_b = np.zeros(len(b.table), dtype=bool)
    comp_b[b.comparable] = True
    ins_a = a.table.in_ids[a.table.in_start[pa] : a.table.in_start[pa + 1]].tolist()
    ins_b = b.table.in_ids[b.table.in_start[pb] : b.table.in_start[pb + 1]].tolist()
    checks: list[InputCheck] = []
    only: OpSide | None = None
    for slot in range(max(len(ins_a), len(ins_b))):
        ta = ins_a[slot] if slot < len(ins_a) else None
        tb = ins_b[slot] if slot < len(ins_b) else None
        if (ta in (0, None)) and (tb in (0, None)):
            checks.append(InputCheck(slot, "a_number"))
            continue
        prod_a = _producer(a, pa, ta, comp_a) if ta else None
        prod_b = _producer(b, pb, tb, comp_b) if tb else None
        side_a = _op_side(a, prod_a) if prod_a is not None else None
        side_b = _op_side(b, prod_b) if prod_b is not None else None
        status = "not_recorded"
        if prod_a is not None and comp_a[prod_a] and pair_of_a[prod_a] < 0:
            status = "only_a"
        elif prod_b is not None and comp_b[prod_b] and pair_of_b[prod_b] < 0:
            status = "only_b"
        elif prod_a is not None and pair_of_a[prod_a] >= 0:
            status = "parted" if parted[pair_of_a[prod_a]] else "agree"
        elif prod_b is not None and pair_of_b[prod_b] >= 0:
            status = "parted" if parted[pair_of_b[prod_b]] else "agree"
        if status in ("only_a", "only_b") and only is None:
            only = side_a if status == "only_a" else side_b
        checks.append(InputCheck(slot, status, side_a, side_b))
    statuses = {c.status for c in checks}
    all_agree: bool | None = True
    if statuses & {"parted", "only_a", "only_b"}:
        all_agree = False
    elif "not_recorded" in statuses:
        all_agree = None  # an input no recorded op made: whether it agreed is not known
    return tuple(checks), all_agree, only


# -- the loss -------------------------------------------------------------------------------------


def _loss_positions(side: _Side) -> dict[int, tuple[int, int]]:
    """Each step's loss: the op (table position) and output slot the backward pass began
    from, or without a backward pass the last forward op's first output."""
    t = side.table
    out: dict[int, tuple[int, int]] = {}
    n = len(t)
    if not n:
        return out
    comp = np.zeros(n, dtype=bool)
    comp[side.comparable] = True
    order = np.argsort(t.step, kind="stable")
    steps, starts = np.unique(t.step[order], return_index=True)
    ends = np.r_[starts[1:], n]
    for s, lo, hi in zip(steps.tolist(), starts.tolist(), ends.tolist(), strict=True):
        pos = order[lo:hi]  # the step's ops, in the order they ran
        back = pos[t.phase[pos] == int(Phase.BACKWARD)]
        cand: tuple[int, int] | None = None
        if back.size:
            seed = int(back[0]) - 1
            if seed >= 0 and t.step[seed] == s:
                if _base(side, seed) in _SEED_OPS:
                    ins = t.in_ids[t.in_start[seed] : t.in_start[seed + 1]]
                    ins = ins[ins != 0]
                    if ins.size:
                        cand = _made_by(side, seed, int(ins[0]), comp)
                elif t.out_start[seed + 1] > t.out_start[seed]:
                    cand = (seed, 0)
        else:
            fwd = pos[(t.phase[pos] == int(Phase.FORWARD)) & comp[pos]]
            cand = (int(fwd[-1]), 0) if fwd.size else None
        if cand is not None and t.out_start[cand[0]] + cand[1] < t.out_start[cand[0] + 1]:
            out[int(s)] = cand
    return out


def _base(side: _Side, pos: int) -> str:
    return base_name(side.strings.strings[int(side.table.op_type[pos])])


def _loss(a: _Side, b: _Side, steps: list[int], tol: Tolerance) -> LossDiff | None:
    la, lb = _loss_positions(a), _loss_positions(b)
    common = [s for s in steps if s in la and s in lb]
    if not common:
        return None
    ia = np.array([la[s][0] for s in common], dtype=np.int64)
    ib = np.array([lb[s][0] for s in common], dtype=np.int64)
    ta, tb = a.table, b.table
    rows_a = ta.out_start[ia] + np.array([la[s][1] for s in common], dtype=np.int64)
    rows_b = tb.out_start[ib] + np.array([lb[s][1] for s in common], dtype=np.int64)
    xa, xb = ta.outputs[rows_a], tb.outputs[rows_b]
    rank = np.maximum(a.floor[ia], b.floor[ib]).astype(np.int64)
    parted, error, ev, _, _ = _compare_rows(xa, xb, rank, tol)
    use_stats = bool((ev == _EV_STATS).all())
    column = "mean" if use_stats else "amax"
    first = int(np.argmax(parted)) if parted.any() else None
    kept = []
    for k, s in enumerate(common[:_LOSS_STEPS_KEPT]):
        va, vb = float(xa[k, _COL[column]]), float(xb[k, _COL[column]])
        kept.append(
            LossStep(
                s,
                None if math.isnan(va) else va,
                None if math.isnan(vb) else vb,
                float(error[k]),
                bool(parted[k]),
            )
        )
    return LossDiff(
        first_parted_step=common[first] if first is not None else None,
        statistic=column,
        steps=tuple(kept),
        evidence=EVIDENCE[int(ev.max())] if len(ev) else "none",
        loss_a=_op_side(a, int(ia[first])) if first is not None else None,
        loss_b=_op_side(b, int(ib[first])) if first is not None else None,
    )


# -- the diff -------------------------------------------------------------------------------------


def _diff_sides(a: _Side, b: _Side, tol: Tolerance, problems: list[str]) -> DiffResult:
    ka, kb = _keys(a, b)
    ca, cb = a.comparable, b.comparable
    ia_c, ib_c, steps, only_steps_a, only_steps_b = align(
        a.table.step[ca], b.table.step[cb], ka, kb,
        a.table.module[ca], b.table.module[cb], a.table.phase[ca], b.table.phase[cb],
    )  # fmt: skip
    ia, ib = ca[ia_c], cb[ib_c]
    order = np.argsort(ia, kind="stable")
    ia, ib = ia[order], ib[order]
    cmp = _compare(a, b, ia, ib, tol)
    compared = cmp.evidence < _EV_NONE
    counts = {EVIDENCE[e]: int((cmp.evidence == e).sum()) for e in range(3)}
    in_steps_a = np.isin(a.table.step[ca], steps)
    in_steps_b = np.isin(b.table.step[cb], steps)
    alignment = Alignment(
        pairs=len(ia),
        compared=int(compared.sum()),
        only_a=int(in_steps_a.sum()) - len(ia),
        only_b=int(in_steps_b.sum()) - len(ib),
        skipped_a=len(a.table) - len(ca),
        skipped_b=len(b.table) - len(cb),
        steps=len(steps),
        steps_only_a=tuple(only_steps_a),
        steps_only_b=tuple(only_steps_b),
        evidence=counts,
    )
    loss = _loss(a, b, steps, tol)
    hits = np.flatnonzero(cmp.parted & compared)
    parted: PartedOp | None = None
    if hits.size:
        p = int(hits[0])
        parted = _parted_op(a, b, ia, ib, p, cmp, tol)
    if parted is not None:
        status = "parted"
        evidence = parted.evidence
    elif alignment.compared:
        status = "agree"
        evidence = next((e for e in EVIDENCE[:3] if counts[e]), "none")
    else:
        status = "not_compared"
        evidence = "none"
    if loss is not None and loss.first_parted_step is not None and parted is None:
        status = "parted"
    if status == "agree" and (problems or a.table.unreadable or b.table.unreadable):
        # What is missing may be where the runs part: no all-clear can be given.
        status = "incomplete"
    return DiffResult(
        status=status,
        a=a.run_side(),
        b=b.run_side(),
        tolerance=tol,
        alignment=alignment,
        evidence=evidence,
        parted=parted,
        loss=loss,
        problems=tuple(problems),
    )


def _parted_op(
    a: _Side, b: _Side, ia: np.ndarray, ib: np.ndarray, p: int, cmp: _Compared, tol: Tolerance
) -> PartedOp:
    pa, pb = int(ia[p]), int(ib[p])
    rows = np.flatnonzero(cmp.out_pair == p)
    outputs = []
    for r in rows.tolist():
        stat = _STATS[int(cmp.out_stat[r])]
        col = stat if stat in ("mean", "std", "l2", "amax") else None
        va = float(a.table.outputs[cmp.oa[r], _COL[col]]) if col else None
        vb = float(b.table.outputs[cmp.ob[r], _COL[col]]) if col else None
        outputs.append(
            OutputDiff(
                slot=int(r - rows[0]),
                evidence=EVIDENCE[int(cmp.out_evidence[r])],
                parted=bool(cmp.out_parted[r]),
                relative_error=float(cmp.out_error[r]),
                statistic=stat,
                value_a=None if va is None or math.isnan(va) else va,
                value_b=None if vb is None or math.isnan(vb) else vb,
                rtol=float(cmp.out_rtol[r]),
                compared_as=FORMAT_NAMES[int(cmp.out_rank[r])] or "unknown",
            )
        )
    first = next((o for o in outputs if o.parted), outputs[0])
    pair_of_a = np.full(len(a.table), -1, dtype=np.int64)
    pair_of_a[ia] = np.arange(len(ia))
    pair_of_b = np.full(len(b.table), -1, dtype=np.int64)
    pair_of_b[ib] = np.arange(len(ib))
    inputs, agree, only = _inputs(a, b, pa, pb, pair_of_a, pair_of_b, cmp.parted)
    side_a, side_b = _op_side(a, pa, first.slot), _op_side(b, pb, first.slot)
    return PartedOp(
        step=side_a.step,
        phase=side_a.phase,
        a=side_a,
        b=side_b,
        evidence=first.evidence,
        relative_error=first.relative_error,
        rtol=first.rtol,
        atol=tol.atol,
        compared_as=first.compared_as,
        outputs=tuple(outputs),
        inputs=inputs,
        inputs_agree=agree,
        only_in_one_run=only,
    )


def _tolerance(rtol: float | None, atol: float | None, count_tolerance: float | None) -> Tolerance:
    for name, v in (("rtol", rtol), ("atol", atol), ("count_tolerance", count_tolerance)):
        if v is not None and not (v >= 0 and math.isfinite(v)):
            raise DiffInputError(f"{name} must be a finite number >= 0, not {v}")
    base = Tolerance()
    return Tolerance(
        rtol=rtol,
        atol=base.atol if atol is None else float(atol),
        count_tolerance=base.count_tolerance if count_tolerance is None else count_tolerance,
    )


def _problems(reader: DumpReader, label: str) -> list[str]:
    """What makes a run's dump incomplete: events it lacks, records it cannot read."""
    out = [f"{label}: {p.message}" for p in reader.incomplete]
    for kind, what in ((EXECUTIONS, "executions"), (TRACES, "graph execution traces")):
        lost = reader.evicted(kind)
        if lost:
            out.append(
                f"{label}: {lost:,} {what} are not in the dump (a circular buffer let go of "
                "them, or the writer could not keep up); record with circular_buffer_size=-1"
            )
    return out


def diff(
    run_a: Run,
    run_b: Run,
    *,
    rank_a: int | None = None,
    rank_b: int | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    count_tolerance: float | None = None,
) -> DiffResult:
    """Compare two runs op by op; the first op where they part, and the loss's first step.

    **Arguments:**

    - ``run_a``, ``run_b``: dump roots (a path, or several paths of one run) or
      open :class:`~nanscope.reader.DumpReader` objects. They may be the same run
      (then name two ranks).
    - ``rank_a``, ``rank_b``: which rank of each run to compare (default: each
      run's first process).
    - ``rtol``: one relative tolerance for every float format, instead of each
      format's default (docs/DIFF.md); ``atol``: the absolute floor;
      ``count_tolerance``: for outputs with counts only, the fraction of elements
      whose sign or zeroness may differ.

    **Returns** a :class:`DiffResult`; raises :class:`DiffInputError` when a rank
    is missing or a tolerance is not a number >= 0, and
    :class:`nanscope.DumpNotFoundError` for a missing dump.
    """
    tol = _tolerance(rtol, atol, count_tolerance)
    reader_a, close_a = _open(run_a)
    try:
        reader_b, close_b = (reader_a, False) if run_b is run_a else _open(run_b)
        try:
            strings = Strings()
            pa = _process_of(reader_a, rank_a, "run A")
            pb = _process_of(reader_b, rank_b, "run B")
            a = _side("a", reader_a, pa, strings)
            b = _side("b", reader_b, pb, strings)
            problems = _problems(reader_a, "run A") + _problems(reader_b, "run B")
            return _diff_sides(a, b, tol, problems)
        finally:
            if close_b:
                reader_b.close()
    finally:
        if close_a:
            reader_a.close()


def diff_ranks(
    run: Run,
    *,
    ranks: Sequence[int] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    count_tolerance: float | None = None,
) -> DiffResult:
    """Compare the ranks of one data-parallel run, which should agree op by op.

    Each rank is compared with the first; with three ranks or more, the rank (or
    ranks) that part first from the majority are the odd ones, and the result is
    the diff of a majority rank (run A) against the first odd rank (run B). With
    two ranks there is no majority: run B is the second rank. ``ranks`` picks the
    ranks compared (default: all). Tolerances as in :func:`diff`.
    """
    tol = _tolerance(rtol, atol, count_tolerance)
    reader, close = _open(run)
    try:
        procs = [p for p in reader.processes if p.rank is not None]
        by_rank = {p.rank: p.index for p in procs if p.rank is not None}
        chosen = sorted(by_rank) if ranks is None else list(dict.fromkeys(ranks))
        missing = [r for r in chosen if r not in by_rank]
        if missing:
            have = ", ".join(map(str, sorted(by_rank))) or "none"
            raise DiffInputError(
                f"the run has no rank {missing[0]} (its ranks: {have}); "
                "--ranks compares the ranks of one run"
            )
        if len(chosen) < 2:
            raise DiffInputError(
                f"comparing ranks needs two ranks or more; the run has "
                f"{len(chosen)} ({', '.join(map(str, chosen)) or 'none'})"
            )
        strings = Strings()
        sides = {r: _side("a", reader, by_rank[r], strings) for r in chosen}
        problems = _problems(reader, "run")
        ref = chosen[0]
        results: dict[int, DiffResult] = {}
        for r in chosen[1:]:
            results[r] = _diff_sides(sides[ref], _as_b(sides[r]), tol, problems)
        first = {r: _first_step(results[r]) for r in results}
        parted = {r: k for r, k in first.items() if k is not None}
        majority = len(chosen) >= 3
        odd: list[int] = []
        reference = ref
        result: DiffResult
        if not parted:
            result = results[chosen[1]]
        elif majority and len(parted) == len(results):
            # The first rank parts from every other: it is the odd one, if the others
            # agree among themselves at least as long.
            other = chosen[1]
            between = [
                _diff_sides(sides[other], _as_b(sides[r]), tol, problems) for r in chosen[2:]
            ]
            earliest = min(_order_key(results[r]) for r in results)
            if all(_first_step(x) is None or _order_key(x) > earliest for x in between):
                odd = [ref]
                reference = other
                result = _diff_sides(sides[other], _as_b(sides[ref]), tol, problems)
            else:
                odd = [r for r in results if _order_key(results[r]) == earliest]
                result = results[odd[0]]
        else:
            earliest = min(_order_key(results[r]) for r in parted)
            odd = [r for r in parted if _order_key(results[r]) == earliest]
            result = results[odd[0]]
        rank_diff = RankDiff(
            ranks=tuple(chosen),
            reference=reference,
            odd_ranks=tuple(odd),
            majority=majority,
            first_parted=dict(first),
        )
        return DiffResult(
            status=result.status,
            a=result.a,
            b=result.b,
            tolerance=result.tolerance,
            alignment=result.alignment,
            evidence=result.evidence,
            parted=result.parted,
            loss=result.loss,
            ranks=rank_diff,
            problems=result.problems,
        )
    finally:
        if close:
            reader.close()


def _as_b(side: _Side) -> _Side:
    """The same side, named run B (the views are shared)."""
    return _Side("b", side.reader, side.process, side.table, side.comparable, side.op_rank,
                 side.floor, side.strings, side.views)  # fmt: skip


def _first_step(r: DiffResult) -> int | None:
    if r.parted is not None:
        return r.parted.step
    if r.loss is not None and r.loss.first_parted_step is not None:
        return r.loss.first_parted_step
    return None


def _order_key(r: DiffResult) -> tuple[int, int]:
    """Where a result first parts, comparable across results of one reference rank."""
    if r.parted is not None:
        return (r.parted.step, r.parted.a.index)
    step = _first_step(r)
    return (step if step is not None else 1 << 62, 1 << 62)
