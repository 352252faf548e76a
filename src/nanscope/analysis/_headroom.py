"""Headroom: overflow and underflow seen coming, from the writer's range history.

The range history (:mod:`nanscope.format.headroom`) holds, per module, phase and
process, each step's largest finite ``|x|`` and the dtype it is measured in (a
process without one: its kept records' ranges). Each step becomes one point: the
step's largest ``|x|`` as a fraction of the format's largest value (its *level*).
From the points:

- **near overflow**: at the last step considered (the step before the first
  harmful Inf, or the run's last step) the level is at least ``NEAR`` (half of
  the format's maximum), or at least ``WATCH`` and growing fast enough, by a
  least-squares fit of ``log2(level)`` over the last ``WINDOW`` steps, to reach
  the maximum within ``HORIZON`` steps. The warning says since which step the
  rule held without a break; the rule uses only points up to each step, so a
  report made at that step would already have warned.
- **underflow**: the module's largest ``|x|`` is below the format's smallest
  normal value for ``UNDERFLOW_STEPS`` steps in a row: all its values are
  subnormal, losing precision, and those below half the smallest subnormal
  are zero.
- with a target format (``float8_e4m3fn``...), every float value is measured
  against it instead, and values beyond its maximum are named.

Values exactly at a format's maximum are sentinels (``torch.finfo(dtype).min``
as a mask), not growth, and are left out. Under a loss scaler (GradScaler's ops
in the dump) the backward pass runs near overflow by design and is not warned
about.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nanscope.format.headroom import FORMATS, FloatFormat, combine, format_of
from nanscope.format.modes import TensorDebugMode
from nanscope.format.tensors import DTYPE_NAMES
from nanscope.reader import EXECUTIONS, PHASES, UNREADABLE, DumpReader

NEAR = 0.5  # a level this high warns without growth
WATCH = 1 / 16  # from this level, growth projected to overflow within HORIZON steps warns
HORIZON = 500
WINDOW = 100  # points in the growth fit
MIN_FIT = 10  # the fewest points a growth rate is fitted on
MIN_R2 = 0.5  # how well log2(level) must follow a line for a projection
UNDERFLOW_STEPS = 3
TABLE_STEPS = 5  # steps of per-module ranges shown before the first Inf
TABLE_MODULES = 8
MAX_WARNINGS = 8
SENTINEL = 1 - 1e-6  # levels at the maximum itself: finfo sentinels, not values
SCALER_OPS = ("aten._amp_foreach_non_finite_check_and_unscale_", "aten._amp_update_scale_")

# DataType number -> the format's (max, smallest normal); 0 where not a float.
_MAX = np.zeros(256)
_TINY = np.zeros(256)
for _dt in range(256):
    _f = format_of(_dt)
    if _f is not None:
        _MAX[_dt], _TINY[_dt] = _f.max, _f.tiny


@dataclass
class HeadroomWarning:
    """One module's values closing in on what their format holds (facts only: the
    reporters word it, ``nanscope.report.warning_text``)."""

    kind: str  # "overflow" or "underflow"
    process: int
    rank: int | None
    module: str
    phase: str
    format: str  # the format measured against
    value: float  # the module's largest |x| at ``step``
    limit: float  # the format's largest value (overflow) or smallest normal (underflow)
    step: int  # the last step considered
    since_step: int  # the first step of the unbroken stretch where the rule held
    growth_per_100: float | None  # the level's fitted factor per 100 steps
    steps_left: int | None  # projected steps until the limit (overflow, growing)
    index: int  # the execution that reached ``value`` at ``step``
    first_inf_step: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The warning's facts; the JSON report adds its ``message``, worded
        (``nanscope.report``)."""
        return {
            "kind": self.kind,
            "process": self.process,
            "rank": self.rank,
            "module": self.module,
            "phase": self.phase,
            "format": self.format,
            "value": self.value,
            "limit": self.limit,
            "step": self.step,
            "since_step": self.since_step,
            "growth_per_100": self.growth_per_100,
            "steps_left": self.steps_left,
            "index": self.index,
            "first_inf_step": self.first_inf_step,
        }


@dataclass
class Headroom:
    """Headroom of a dump: warnings, and each module's ranges in the steps before the first Inf."""

    target: str | None  # the format asked about; None: each value's own
    warnings: list[HeadroomWarning] = field(default_factory=list)
    # Before the first harmful Inf: one row per (module, phase, step), largest levels first.
    before_step: int | None = None
    before_inf: list[dict[str, Any]] = field(default_factory=list)
    scaler: bool = False  # a loss scaler ran: backward overflow is handled

    def to_json(self) -> dict[str, Any]:
        """The headroom's facts; the JSON report adds each warning's ``message``."""
        return {
            "target": self.target,
            "warnings": [w.to_json() for w in self.warnings],
            "before_step": self.before_step,
            "before_inf": self.before_inf,
            "scaler": self.scaler,
        }


@dataclass
class _Points:
    """Per (process, module, phase) group and step: the step's largest level."""

    group: np.ndarray  # int64 group number, sorted by group then step
    step: np.ndarray
    level: np.ndarray  # amax / the format's max (overflow)
    low: np.ndarray  # amax / the format's smallest normal (underflow)
    amax: np.ndarray
    index: np.ndarray  # the execution that gave the step's largest level
    keys: np.ndarray  # per group: (process, module string id, phase)
    formats: list[FloatFormat]  # per group: the format measured against


@dataclass
class _Rows:
    """Range rows from the range history or the records, as plain columns."""

    process: np.ndarray
    module: np.ndarray
    phase: np.ndarray
    step: np.ndarray
    amax: np.ndarray
    amin: np.ndarray
    dtype: np.ndarray
    index: np.ndarray  # the execution (-1: a history point)


# The first Inf's own step: at most this many of its records before the Inf are decoded.
TABLE_DECODED = 5000
# Without a range history (a process killed before its first rewrite), at most this many
# records, over all processes, are decoded for their ranges (the last ones of each), after
# a probe of the last PROBE records says that the process recorded ranges at all.
MAX_DECODED = 50_000
PROBE = 8


def _rows(reader: DumpReader, until_step: int | None) -> _Rows | None:
    """Every recorded range: each process's range history (every step, the circular
    buffer's evicted ones too), or, for a process without one, its kept records' ranges."""
    hist = reader.range_history()
    covered = set(np.unique(hist["process"]).tolist())
    parts: list[tuple[np.ndarray, ...]] = [
        (
            hist["process"],
            hist["module"],
            hist["phase"],
            hist["step_hi"],
            hist["amax"],
            hist["amin"],
            hist["range_dtype"],
            np.full(len(hist), -1, dtype=np.int64),
        ),
    ]
    steps = reader.index(EXECUTIONS)["step"]
    budget = MAX_DECODED
    missing = [p.index for p in reader.processes if p.index not in covered]
    if reader.tensor_debug_mode not in (TensorDebugMode.FULL_HEALTH, TensorDebugMode.FULL_TENSOR):
        missing = []  # no mode but these records ranges
    spans = _spans(reader) if missing else {}
    for p in missing:
        if budget <= 0:
            break
        lo, hi = spans.get(p, (0, 0))
        mine = _of_process(reader, p, lo, hi)
        if until_step is not None:
            mine = mine[steps[mine] <= until_step]
        # Records without ranges (an older nanscope, NANSCOPE_HEADROOM=0) are not read on:
        # a probe of the last few tells, and one process's answer stands for the others
        # (they were written alike; a 1,024-rank dump is not probed 1,024 times).
        if not len(mine):
            continue
        if not len(_decoded(reader, mine[-PROBE:])[0]):
            break
        take = mine[-budget:]
        budget -= len(take)
        parts.append(_decoded(reader, take))
    cols = [np.concatenate([np.asarray(part[k]) for part in parts]) for k in range(8)]
    r = _Rows(
        process=cols[0].astype(np.int64),
        module=cols[1].astype(np.int64),
        phase=cols[2].astype(np.int64),
        step=cols[3].astype(np.int64),
        amax=cols[4].astype(np.float64),
        amin=cols[5].astype(np.float64),
        dtype=cols[6].astype(np.int64),
        index=cols[7].astype(np.int64),
    )
    ok = (r.amax >= 0) & (_MAX[r.dtype] > 0)
    ok &= r.amax < _MAX[r.dtype] * SENTINEL  # sentinels: a value at its format's maximum
    if until_step is not None:
        ok &= r.step <= until_step
    if not ok.any():
        return None
    return _Rows(*(getattr(r, f)[ok] for f in _Rows.__dataclass_fields__))


def _spans(reader: DumpReader) -> dict[int, tuple[int, int]]:
    """Per process, the span of the merged execution index that holds its rows (one pass)."""
    procs = reader.processes_of(EXECUTIONS)
    if not len(procs):
        return {}
    cuts = np.flatnonzero(procs[1:] != procs[:-1]) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [len(procs)]))
    spans: dict[int, tuple[int, int]] = {}
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        p = int(procs[a])
        lo, hi = spans.get(p, (a, b))
        spans[p] = (min(lo, a), max(hi, b))  # interleaved processes: one span over them all
    return spans


def _of_process(reader: DumpReader, process: int, lo: int, hi: int) -> np.ndarray:
    """The indices of ``process``'s executions within ``lo:hi``."""
    return lo + np.flatnonzero(reader.processes_of(EXECUTIONS)[lo:hi] == process)


def _decoded(reader: DumpReader, indices: np.ndarray) -> tuple[np.ndarray, ...]:
    """The range columns of the executions at ``indices``, decoded from their records."""
    out: list[tuple[int, int, int, int, float, float, int, int]] = []
    mode = reader.tensor_debug_mode
    if mode not in (TensorDebugMode.FULL_HEALTH, TensorDebugMode.FULL_TENSOR):
        indices = indices[:0]
    for i in indices.tolist():
        try:
            ex = reader.execution(i)
        except UNREADABLE:
            continue
        dtypes = [h.dtype if h is not None else "" for h in ex.output_health]
        pairs = list(ex.output_ranges)
        row = combine([int(DTYPE_NAMES.get(d, 0)) for d in dtypes], pairs)
        if row.dtype:
            out.append(
                (
                    ex.process,
                    reader.intern(ex.module_path),
                    ex.phase,
                    ex.step,
                    row.amax,
                    row.amin,
                    row.dtype,
                    i,
                )
            )
    if not out:
        return tuple(np.zeros(0) for _ in range(8))
    cols = [np.array(c) for c in zip(*out, strict=True)]
    for k in (4, 5):  # as the history holds them
        cols[k] = cols[k].astype(np.float32)
    return tuple(cols)


def _points(
    reader: DumpReader, target: FloatFormat | None, until_step: int | None
) -> _Points | None:
    r = _rows(reader, until_step)
    if r is None:
        return None
    top = _MAX[r.dtype] if target is None else np.full(len(r.dtype), target.max)
    tiny = _TINY[r.dtype] if target is None else np.full(len(r.dtype), target.tiny)
    gkey = (r.process << 40) | (r.module << 8) | (r.phase & 0xFF)
    keys_u, first_row, group = np.unique(gkey, return_index=True, return_inverse=True)
    level = r.amax / top
    # Sort by group, step, then level descending: each (group, step)'s first row is its max.
    order = np.lexsort((-level, r.step, group))
    g, s = group[order], r.step[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = (g[1:] != g[:-1]) | (s[1:] != s[:-1])
    pick = order[first]
    # A group's format: the target, or its rows' own (its first row's).
    formats = [
        target or format_of(int(r.dtype[i])) or FORMATS["float32"] for i in first_row.tolist()
    ]
    keys = np.stack([keys_u >> 40, (keys_u >> 8) & 0xFFFFFFFF, keys_u & 0xFF], axis=1)
    return _Points(
        group=group[pick],
        step=r.step[pick],
        level=level[pick],
        low=r.amax[pick] / tiny[pick],
        amax=r.amax[pick],
        index=r.index[pick],
        keys=keys,
        formats=formats,
    )


def _rolling_fit(x: np.ndarray, y: np.ndarray, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Slope and r² of y over x in the trailing window of ``w`` points ending at each point."""
    n = len(x)
    x = x - x[0] if n else x  # steps from the group's first: keeps the sums exact enough

    def trailing(v: np.ndarray) -> np.ndarray:
        c = np.concatenate(([0.0], np.cumsum(v)))
        lo = np.maximum(np.arange(1, n + 1) - w, 0)
        return c[1:] - c[lo]

    k = np.minimum(np.arange(1, n + 1), w).astype(np.float64)
    sx, sy = trailing(x), trailing(y)
    sxx, syy, sxy = trailing(x * x), trailing(y * y), trailing(x * y)
    vx = k * sxx - sx * sx
    vy = k * syy - sy * sy
    cov = k * sxy - sx * sy
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(vx > 0, cov / vx, 0.0)
        r2 = np.where((vx > 0) & (vy > 0), cov * cov / (vx * vy), 0.0)
    slope[k < MIN_FIT] = 0.0
    r2[k < MIN_FIT] = 0.0
    return slope, r2


def _run_start(held: np.ndarray, steps: np.ndarray) -> int:
    """The step where the unbroken run of ``held`` ending at the last point began."""
    broken = np.flatnonzero(~held)
    start = int(broken[-1]) + 1 if len(broken) else 0
    return int(steps[start])


def analyze_headroom(
    reader: DumpReader,
    target: str | None = None,
    first_inf: tuple[int, int, int] | None = None,
    until_step: int | None = None,
) -> Headroom | None:
    """Headroom of ``reader``'s executions; ``None`` when the dump records no ranges.

    ``target``: a format of :data:`nanscope.format.headroom.TARGET_FORMATS` to measure
    every float value against. ``first_inf``: ``(process, step, index)`` of the first
    harmful Inf, before which the trend is judged and the ranges are tabled.
    ``until_step``: use only steps up to this one (what a report made then would say).
    """
    fmt = FORMATS[target] if target is not None else None
    if target is not None and fmt is None:
        raise ValueError(f"unknown format {target!r}; use one of: {', '.join(FORMATS)}")
    pts = _points(reader, fmt, until_step)
    if pts is None:
        return None
    result = Headroom(target=target)
    result.scaler = len(reader.string_ids(SCALER_OPS)) > 0
    inf_step = first_inf[1] if first_inf is not None else None
    ranks = {p.index: p.rank for p in reader.processes}
    bounds = np.flatnonzero(np.diff(pts.group)) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [len(pts.group)]))
    # (overflow first, then the highest level; underflow: the lowest first), warning
    found: list[tuple[tuple[int, float], HeadroomWarning]] = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        proc, module, phase = (int(v) for v in pts.keys[int(pts.group[a])])
        steps = pts.step[a:b]
        if inf_step is not None:
            b = a + int(np.searchsorted(steps, inf_step))  # the steps before the first Inf
            steps = pts.step[a:b]
        if b - a < 1:
            continue
        level, low = pts.level[a:b], pts.low[a:b]
        f = pts.formats[int(pts.group[a])]
        # The fields both kinds of warning share (Any: they go in through **).
        base: dict[str, Any] = dict(
            process=proc,
            rank=ranks.get(proc),
            module=reader.string(module),
            phase=PHASES.get(phase, ""),
            format=f.name,
            step=int(steps[-1]),
            index=int(pts.index[b - 1]),
            first_inf_step=inf_step,
        )
        logs = np.log2(np.maximum(level, 1e-300))
        slope, r2 = _rolling_fit(steps.astype(np.float64), logs, WINDOW)
        growth = float(2.0 ** (slope[-1] * 100)) if r2[-1] >= MIN_R2 else None
        scaled = result.scaler and phase == 2
        if not scaled:
            with np.errstate(divide="ignore"):
                left = np.where(slope > 0, -logs / slope, np.inf)
            growing = (level >= WATCH) & (r2 >= MIN_R2) & (left <= HORIZON)
            held = (level >= NEAR) | growing
            if held[-1]:
                steps_left = int(max(0.0, left[-1])) if growing[-1] and level[-1] < 1 else None
                w = HeadroomWarning(
                    kind="overflow",
                    value=float(pts.amax[b - 1]),
                    limit=f.max,
                    since_step=_run_start(held, steps),
                    growth_per_100=growth,
                    steps_left=steps_left,
                    **base,
                )
                found.append(((1, float(level[-1])), w))
        under = (low < 1) & (low > 0)
        if len(under) >= UNDERFLOW_STEPS and under[-UNDERFLOW_STEPS:].all():
            w = HeadroomWarning(
                kind="underflow",
                value=float(pts.amax[b - 1]),
                limit=f.tiny,
                since_step=_run_start(under, steps),
                growth_per_100=growth,
                steps_left=None,
                **base,
            )
            found.append(((0, -float(low[-1])), w))
    found.sort(key=lambda t: t[0], reverse=True)
    result.warnings = [w for _, w in found[:MAX_WARNINGS]]
    nearest = _Nearest(reader)
    for w in result.warnings:
        if w.index < 0:  # a history point: an execution of that step, for the GUI's link
            w.index = int(nearest(w.process, np.array([w.step]), np.array([-1]))[0])
    if first_inf is not None:
        result.before_step = inf_step
        result.before_inf = headroom_table(reader, first_inf, target)
    return result


def headroom_table(
    reader: DumpReader, first_inf: tuple[int, int, int], target: str | None = None
) -> list[dict[str, Any]]:
    """The ranges before the first harmful Inf, measured against ``target``, ordered.

    The last :data:`TABLE_STEPS` steps of per-module ranges before the first Inf at
    ``first_inf`` = ``(process, step, index)`` (in its process; of its own step, the events
    that ran before it). One row per module, phase and step: ``module``, ``phase``,
    ``step``, ``dtype`` (the tensor's own), ``format`` (the format measured against:
    ``target``, else the tensor's own), ``max_abs``, ``min_nonzero_abs`` (``None``: no
    non-zero value), ``level`` (``max_abs`` over the format's largest value: 1 is
    overflow) and ``of_normal`` (``max_abs`` over the format's smallest normal value:
    below 1, every value is subnormal). The :data:`TABLE_MODULES` modules whose level came
    highest are kept, nearest to overflow first: by their level at their last step in the
    table, then by their highest; each module's steps in order.
    """
    fmt = FORMATS.get(target) if target is not None else None
    if target is not None and fmt is None:
        raise ValueError(f"unknown format {target!r}; use one of: {', '.join(FORMATS)}")
    process, step, index = first_inf
    table: dict[tuple[int, int, int], dict[str, Any]] = {}
    # The steps before from the history (or the records), the first Inf's own step from its
    # records before the first Inf (the history's point holds the whole step).
    before = _rows(reader, step - 1)
    if before is not None:
        recent = (before.process == process) & (before.step > step - TABLE_STEPS)
        _tabulate(reader, before, recent, table, fmt)
    rows = reader.index(EXECUTIONS)
    lo = index - 1
    procs = reader.processes_of(EXECUTIONS)
    while lo >= 0 and index - lo <= TABLE_DECODED and int(rows["step"][lo]) == step:
        lo -= 1
    mine = np.arange(lo + 1, index)
    own = _Rows(*_decoded(reader, mine[procs[mine] == process]))
    if len(own.step):
        _tabulate(reader, own, own.amax >= 0, table, fmt)
    # The modules whose level came highest over the window, listed nearest to overflow
    # first: by their level at their last step (where the first Inf came; the level a
    # report shows for the module), then by their highest. Each module's steps in order.
    peak: dict[tuple[int, int], float] = {}
    last: dict[tuple[int, int], float] = {}
    for (m, ph, _), e in sorted(table.items()):  # keys sort by step: the last one stays
        peak[(m, ph)] = max(peak.get((m, ph), 0.0), e["level"])
        last[(m, ph)] = e["level"]
    kept = sorted(peak, key=lambda k: -peak[k])[:TABLE_MODULES]
    keep = sorted(kept, key=lambda k: (-last[k], -peak[k]))
    out: list[dict[str, Any]] = []
    for k in keep:
        out.extend(table[key] for key in sorted(table) if key[:2] == k)
    for e in out:
        if math.isinf(e["min_nonzero_abs"]):
            e["min_nonzero_abs"] = None  # no non-zero value (JSON has no inf)
    return out


def _tabulate(
    reader: DumpReader,
    r: _Rows,
    sel: np.ndarray,
    table: dict[tuple[int, int, int], dict[str, Any]],
    target: FloatFormat | None = None,
) -> None:
    """Fold the selected rows into ``table``: per (module, phase, step), the extremes, each
    measured against ``target`` (else its own format)."""
    for i in np.flatnonzero(sel).tolist():
        own = format_of(int(r.dtype[i]))
        if own is None:
            continue
        fmt = target or own
        key = (int(r.module[i]), int(r.phase[i]), int(r.step[i]))
        amax, amin = float(r.amax[i]), float(r.amin[i])
        level = amax / fmt.max
        e = table.get(key)
        if e is None:
            table[key] = {
                "module": reader.string(key[0]),
                "phase": PHASES.get(key[1], ""),
                "step": key[2],
                "dtype": own.name,
                "format": fmt.name,
                "max_abs": amax,
                "min_nonzero_abs": amin,
                "level": level,
                "of_normal": amax / fmt.tiny,
            }
            continue
        if level > e["level"]:
            e.update(
                max_abs=amax,
                level=level,
                dtype=own.name,
                format=fmt.name,
                of_normal=amax / fmt.tiny,
            )
        e["min_nonzero_abs"] = min(e["min_nonzero_abs"], amin)


class _Nearest:
    """For points from the history (index -1): the process's first kept execution at or
    after the point's step (-1: none), so that a chart's point leads to the timeline. Each
    process's executions are found once (one pass over the merged index per process)."""

    def __init__(self, reader: DumpReader) -> None:
        self._reader = reader
        self._steps = reader.index(EXECUTIONS)["step"]
        self._of: dict[int, np.ndarray] = {}

    def __call__(self, process: int, steps: np.ndarray, index: np.ndarray) -> np.ndarray:
        missing = index < 0
        if not missing.any():
            return index
        mine = self._of.get(process)
        if mine is None:
            mine = self._of[process] = np.flatnonzero(
                self._reader.processes_of(EXECUTIONS) == process
            )
        out: np.ndarray = index.copy()
        if len(mine):
            at = np.searchsorted(self._steps[mine], steps[missing])
            found = at < len(mine)
            out[np.flatnonzero(missing)[found]] = mine[at[found]]
        return out


def headroom_series(
    reader: DumpReader,
    target: str | None = None,
    process: int | None = None,
    top: int = 8,
    points: int = 600,
) -> dict[str, Any]:
    """Per module: its level (largest ``|x|`` over the format's max) at each step, for a chart.

    The ``top`` modules whose levels came highest, each downsampled to at most ``points``
    points (the largest level of each bucket of steps, so no peak is lost).
    """
    fmt = FORMATS.get(target) if target is not None else None
    pts = _points(reader, fmt, None)
    if pts is None:
        return {"target": target, "series": []}
    sel = np.ones(len(pts.group), dtype=bool)
    if process is not None:
        sel = pts.keys[pts.group, 0] == process
    peaks: dict[int, float] = {}
    for g, lv in zip(pts.group[sel].tolist(), pts.level[sel].tolist(), strict=True):
        if lv > peaks.get(g, -1.0):
            peaks[g] = lv
    series = []
    nearest = _Nearest(reader)
    for g in sorted(peaks, key=lambda k: -peaks[k])[:top]:
        m = sel & (pts.group == g)
        steps, level, index = pts.step[m], pts.level[m], pts.index[m]
        if len(steps) > points:
            edges = np.linspace(0, len(steps), points + 1).astype(np.int64)
            pick = [
                int(lo + np.argmax(level[lo:hi]))
                for lo, hi in itertools.pairwise(edges.tolist())
                if hi > lo
            ]
            steps, level, index = steps[pick], level[pick], index[pick]
        proc, module, phase = (int(v) for v in pts.keys[g])
        index = nearest(proc, steps, index)
        f = pts.formats[g]
        series.append(
            {
                "process": proc,
                "module": reader.string(module),
                "phase": PHASES.get(phase, ""),
                "format": f.name,
                "max": f.max,
                "peak": peaks[g],
                "steps": steps.tolist(),
                "level": [float(v) for v in level],
                "index": index.tolist(),
            }
        )
    return {"target": target, "series": series}
