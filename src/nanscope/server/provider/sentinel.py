"""A sentinel's history for the GUI: per step the loss, gradient norm and largest ``|x|``,
folded into buckets for long histories, and each trip's lead-up exact.

A sentinel logdir holds ``sentinel.jsonl`` (:mod:`nanscope.sentinel`) and, per replayed
trip, a dump in ``replay-step-<N>/``: those dumps are runs like any other, and this module
links each trip to its replay's run. A history of a million steps is never sent whole: the
chart gets at most ``points`` buckets (each series' smallest and largest finite value, and
how many of its steps were not finite), plus the last ``lead`` steps before each trip exact.

The file is read once into compact arrays and then only what was appended since (a live
run's history grows every few steps), never through :func:`~nanscope.sentinel.read_history`'s
one object per step, which a million steps would make gigabytes of. Damage is kept as
``problems`` with the same words ``read_history`` uses: a history that did not end, or has
lines that cannot be read, is never shown as a clean run.
"""

from __future__ import annotations

import json
import math
import os
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# The history's module, not the package: the package also holds the sentinel itself.
from nanscope.sentinel._history import CHECKS, HISTORY_FILE, json_float
from nanscope.server.provider.events import NotFound
from nanscope.server.runs import RunSet

# The per-step figures charted, in the order the answer gives them. ``amax``: the largest
# |x| any watched module's forward outputs reached in the step (its module in ``amax_module``).
SERIES = ("loss", "grad_norm", "amax", "grad_amax", "param_amax", "state_amax", "param_norm")
_FIELDS = ("loss", "grad_norm", "grad_amax", "param_amax", "state_amax")
# Modules charted in a trip's lead-up (those whose largest |x| came highest there).
LEAD_MODULES = 8
# Histories kept read (their arrays) at once; the least recently asked for is dropped.
MAX_HISTORIES = 4  # about 80 MB each per million steps
_CHUNK = 8 << 20


class SentinelNotFound(NotFound):
    """No sentinel history where one was asked for."""


class AmbiguousHistory(ValueError):
    """Several histories under the logdir and none named."""


def _number(x: Any) -> float | None:
    """A figure as the history writes it: a number, ``"nan"``/``"inf"``/``"-inf"``, or null."""
    if type(x) is float:  # the common case first: a million steps go through here
        return x
    if x is None:
        return None
    if isinstance(x, str) and x in ("nan", "inf", "-inf"):
        return float(x)
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"not a number: {x!r}")
    return float(x)


_json_number = json_float  # JSON has no NaN or infinity (http_api.md's convention)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# One decoder for every line (json.loads with arguments builds one per call).
_DECODER = json.JSONDecoder(parse_constant=_no_constants)


def _loads(line: bytes) -> dict[str, Any]:
    record = _DECODER.decode(line.decode("utf-8", errors="replace"))
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    return record


def _trip(record: dict[str, Any]) -> dict[str, Any]:
    """A trip record checked as the history's reader checks it, as the answer gives it."""
    action = str(record["action"])
    if action not in ("stop", "skip"):
        raise ValueError(f"unknown action {action!r}")
    where = [str(w) for w in record.get("where") or ()]
    unknown = [w for w in where if w not in CHECKS]
    if unknown:
        raise ValueError(f"unknown check {unknown[0]!r}")
    cause = record.get("cause")
    if cause is not None:
        cause = {
            "headline": str(cause["headline"]),
            "op_type": None if cause.get("op_type") is None else str(cause["op_type"]),
            "file": None if cause.get("file") is None else str(cause["file"]),
            "line": None if cause.get("line") is None else int(cause["line"]),
            "step": None if cause.get("step") is None else int(cause["step"]),
        }
    reproduced = record.get("reproduced")
    return {
        "step": int(record["step"]),
        "where": where,
        "action": action,
        "replay": None if record.get("replay") is None else str(record["replay"]),
        "reproduced": None if reproduced is None else bool(reproduced),
        "reason": None if record.get("reason") is None else str(record["reason"]),
        "cause": cause,
    }


def _forward_amax(values: list[float | None]) -> tuple[float | None, int]:
    """The largest of the modules' |x| (NaN before Inf before the largest finite) and its module."""
    best: float | None = None
    at = -1
    for i, v in enumerate(values):
        if v is None:
            continue
        if math.isnan(v):
            return v, i
        if best is None or v > best:
            best, at = v, i
    return best, at


@dataclass
class _Scan:
    """A history file read so far: the header, trips and end as records, the steps as arrays.

    :meth:`update` reads what was appended since the last call (from the last whole line on),
    or everything again when the file was replaced or cut.
    """

    path: Path
    inode: int = -1
    offset: int = 0  # bytes read: whole lines only
    lines: int = 0  # lines read
    header: dict[str, Any] | None = None
    header_error: str | None = None
    trips: list[dict[str, Any]] = field(default_factory=list)
    ended: bool = False
    end_step: int | None = None
    damaged: list[str] = field(default_factory=list)
    tail: bool = False  # the file ends inside a line
    step: array = field(default_factory=lambda: array("q"))  # type: ignore[type-arg]
    where: array = field(default_factory=lambda: array("q"))  # type: ignore[type-arg]
    values: dict[str, array] = field(  # type: ignore[type-arg]
        default_factory=lambda: {name: array("d") for name in SERIES}
    )
    measured: array = field(default_factory=lambda: array("B"))  # type: ignore[type-arg]
    amax_module: array = field(default_factory=lambda: array("i"))  # type: ignore[type-arg]
    bad: array = field(default_factory=lambda: array("B"))  # type: ignore[type-arg]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def update(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise SentinelNotFound(f"{self.path}: {exc.strerror or exc}") from None
        if st.st_ino != self.inode or st.st_size < self.offset:
            self._reset()  # replaced or cut: read it from the start
            self.inode = st.st_ino
        if st.st_size == self.offset and not self.tail:
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            # A chunk at a time: a history of a million steps is hundreds of megabytes.
            size = _CHUNK
            while True:
                data = f.read(size)
                cut = data.rfind(b"\n") + 1
                if not cut and len(data) == size:  # a line longer than a chunk
                    size *= 2
                    f.seek(self.offset)
                    continue
                if not cut:  # no whole line left: what remains is a cut line, or nothing
                    self.tail = bool(data.strip())
                    return
                size = _CHUNK
                f.seek(self.offset + cut)
                start = self.offset
                for line in data[:cut].split(b"\n")[:-1]:
                    at = start
                    start += len(line) + 1
                    self.lines += 1
                    if line.strip():
                        self._line(line, at)
                self.offset += cut

    def _reset(self) -> None:
        lock = self.lock
        self.__init__(self.path)  # type: ignore[misc]
        self.lock = lock

    def _line(self, line: bytes, at: int) -> None:
        if self.header is None and self.header_error is None:
            try:
                record = _loads(line)
                if record.get("kind") != "header":
                    raise ValueError("the first line is not a header")
                self.header = {
                    "run_id": str(record["run_id"]),
                    "framework": str(record["framework"]),
                    "started": float(record["started"]),
                    "modules": [str(m) for m in record.get("modules", ())],
                    "settings": dict(record.get("settings") or {}),
                    "version": int(record.get("version", 1)),
                }
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                self.header_error = f"{self.path}: line 1 is not a sentinel header ({exc})"
            return
        if self.header_error is not None:
            return
        try:
            record = _loads(line)
            kind = record.get("kind")
            if kind == "step":
                self._step(record, at)
            elif kind == "trip":
                self.trips.append(_trip(record))
            elif kind == "end":
                self.ended = True
                if record.get("step") is not None:
                    self.end_step = int(record["step"])
            else:
                raise ValueError(f"unknown kind {kind!r}")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self.damaged.append(f"{self.path}: line {self.lines} cannot be read ({exc})")

    def _step(self, record: dict[str, Any], at: int) -> None:
        # Checked in the order read_history checks them, so that both say the same of a line.
        step = int(record["step"])
        float(record["time"])
        figures = [_number(record.get(name)) for name in _FIELDS]
        modules = [_number(x) for x in record.get("module_amax") or ()]
        bad = [str(b) for b in record.get("bad") or ()]
        mask = 0
        for b in bad:
            if b not in CHECKS:
                raise ValueError(f"unknown check {b!r}")
            mask |= 1 << CHECKS.index(b)
        param_norm = _number(record.get("param_norm"))  # absent in older histories
        amax, module = _forward_amax(modules)
        figure = dict(zip(_FIELDS, figures, strict=True), amax=amax, param_norm=param_norm)
        # Checked above; appended only now, so that a bad line adds nothing.
        self.step.append(step)
        self.where.append(at)
        got = 0
        for i, name in enumerate(SERIES):
            v = figure[name]
            self.values[name].append(math.nan if v is None else v)
            if v is not None:
                got |= 1 << i
        self.measured.append(got)
        self.amax_module.append(module)
        self.bad.append(mask)

    def problems(self) -> list[str]:
        out = list(self.damaged)
        if self.tail:
            out.append(f"{self.path}: the last line was cut short (the process died writing it)")
        if not self.ended:
            out.append(
                f"{self.path}: the history has no end: the program stopped without closing the "
                "sentinel (a crash or a kill); steps after the last one written are unknown"
            )
        return out

    def array(self, name: str) -> np.ndarray:
        return np.frombuffer(self.values[name], dtype=np.float64)


_scans: OrderedDict[Path, _Scan] = OrderedDict()
_scans_lock = threading.Lock()


def _scan_of(path: Path) -> _Scan:
    with _scans_lock:
        scan = _scans.get(path)
        if scan is None:
            scan = _scans[path] = _Scan(path)
        _scans.move_to_end(path)
        while len(_scans) > MAX_HISTORIES:
            _scans.popitem(last=False)
    return scan


# -- which history ---------------------------------------------------------------------------


def histories(runs: RunSet) -> dict[str, Any]:
    """``/api/sentinels``: every sentinel history under the logdir and the runs below it (its
    replays)."""
    found = runs.sentinels()
    names = runs.names()
    paths = {n: runs.get(n).paths for n in names}
    out = []
    for name, path in found.items():
        below = [n for n in names if any(_within(p, path) for p in paths[n])]
        out.append({"history": name, "path": str(path), "runs": below})
    return {"logdir": str(runs.logdir), "sentinels": out}


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def locate(runs: RunSet, history: str | None, run: str | None) -> tuple[str, Path]:
    """The history named ``history``, else the one ``run``'s directory is in (its own or the
    nearest above it, within the logdir), else the only one under the logdir."""
    found = runs.sentinels()
    if history is not None:
        if history not in found:
            raise SentinelNotFound(
                f"no sentinel history {history!r} under the logdir; /api/sentinels lists them"
            )
        return history, found[history]
    if run is not None:
        the_run = runs.get(run)  # RunNotFound: the route's 404
        for path in the_run.paths:
            for root in runs.logdirs:
                if not _within(path, root):
                    continue
                d = path
                while True:
                    if (d / HISTORY_FILE).is_file():
                        name = next((n for n, p in found.items() if p == d), None)
                        if name is None:  # deeper than the walk looks: named by its path
                            name = "." if d == root else d.relative_to(root).as_posix()
                        return name, d
                    if d == root:
                        break
                    d = d.parent
        raise SentinelNotFound(
            f"run {run!r} is not in a sentinel's logdir (no {HISTORY_FILE} in its directory "
            "or above it)"
        )
    if not found:
        raise SentinelNotFound(
            f"no sentinel history ({HISTORY_FILE}) under {runs.logdir}; run the program with "
            "the sentinel on (nanscope run --sentinel) with this logdir"
        )
    if len(found) > 1:
        raise AmbiguousHistory(
            f"{len(found)} sentinel histories under the logdir; name one with history= "
            f"({', '.join(list(found)[:5])})"
        )
    name = next(iter(found))
    return name, found[name]


# -- the answer ------------------------------------------------------------------------------


def history(
    runs: RunSet,
    name: str,
    root: Path,
    points: int,
    lead: int,
    from_step: int | None,
    to_step: int | None,
) -> dict[str, Any]:
    """``/api/sentinel``: the history in ``root``, its steps from ``from_step`` to ``to_step``
    (inclusive; ``None``: from the first, to the last) in at most ``points`` buckets, and the
    last ``lead`` steps up to each trip exact."""
    scan = _scan_of(root / HISTORY_FILE)
    with scan.lock:
        scan.update()
        out: dict[str, Any] = {"history": name, "path": str(root), "error": scan.header_error}
        header = scan.header or {
            "run_id": "",
            "framework": "",
            "started": None,
            "modules": [],
            "settings": {},
            "version": None,
        }
        out.update(header)
        out["settings"] = _strict(out["settings"])
        if scan.header is None:
            problems = [scan.header_error or f"{scan.path} is empty: the sentinel wrote no header"]
            out.update(
                error=problems[0], complete=False, ended=False, last_step=None,
                problems=problems, num_steps=0, first_step=None, window=None,
                bucket_size=1.0, buckets=_buckets(scan, 0, 0, points), trips=[],
            )  # fmt: skip
            return out
        steps = np.frombuffer(scan.step, dtype=np.int64)
        n = len(steps)
        last = scan.end_step if scan.end_step is not None else (int(steps[-1]) if n else None)
        problems = scan.problems()
        begin, end = _window(steps, from_step, to_step)
        buckets = _buckets(scan, begin, end, points)
        out.update(
            complete=scan.ended and not problems,
            ended=scan.ended,
            last_step=last,
            problems=problems,
            num_steps=n,
            first_step=int(steps[0]) if n else None,
            window={
                "from_step": int(steps[begin]) if end > begin else None,
                "to_step": int(steps[end - 1]) if end > begin else None,
                "begin": begin,
                "end": end,
            },
            bucket_size=(end - begin) / max(1, len(buckets["first_step"])),
            buckets=buckets,
            trips=[_trip_answer(runs, root, scan, t, lead) for t in scan.trips],
        )
        return out


def _strict(value: Any) -> Any:
    """``value`` with floats JSON cannot hold as strings (settings are the program's)."""
    if isinstance(value, float):
        return _json_number(value)
    if isinstance(value, dict):
        return {str(k): _strict(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strict(v) for v in value]
    return value


def _window(steps: np.ndarray, lo: int | None, hi: int | None) -> tuple[int, int]:
    """Positions ``[begin, end)`` of the steps from ``lo`` to ``hi`` (inclusive)."""
    n = len(steps)
    if n and bool(np.all(steps[1:] >= steps[:-1])):
        begin = 0 if lo is None else int(np.searchsorted(steps, lo, "left"))
        end = n if hi is None else int(np.searchsorted(steps, hi, "right"))
        return begin, max(begin, end)
    # Steps out of order (a program that numbered them so): the positions they span.
    inside = np.ones(n, dtype=bool)
    if lo is not None:
        inside &= steps >= lo
    if hi is not None:
        inside &= steps <= hi
    hit = np.flatnonzero(inside)
    return (int(hit[0]), int(hit[-1]) + 1) if len(hit) else (0, 0)


def _floats(a: np.ndarray) -> list[float | None]:
    return [None if not math.isfinite(v) else v for v in a.tolist()]


def _buckets(scan: _Scan, begin: int, end: int, points: int) -> dict[str, Any]:
    """Steps ``[begin, end)`` folded into at most ``points`` buckets of equal width."""
    n = end - begin
    if n <= 0:
        empty: dict[str, Any] = {"first_step": [], "last_step": [], "bad": []}
        empty.update({s: {"min": [], "max": [], "nonfinite": []} for s in SERIES})
        return empty
    count = min(n, points)
    edges = begin + (np.arange(count + 1, dtype=np.int64) * n) // count
    starts = edges[:-1]
    rel = starts - begin
    steps = np.frombuffer(scan.step, dtype=np.int64)[begin:end]
    measured = np.frombuffer(scan.measured, dtype=np.uint8)[begin:end]
    bad = np.frombuffer(scan.bad, dtype=np.uint8)[begin:end]
    out: dict[str, Any] = {
        "first_step": steps[rel].tolist(),
        "last_step": steps[edges[1:] - 1 - begin].tolist(),
        "bad": np.add.reduceat((bad != 0).astype(np.int64), rel).tolist(),
    }
    for i, name in enumerate(SERIES):
        x = scan.array(name)[begin:end]
        finite = np.isfinite(x)
        was = (measured & (1 << i)) != 0
        out[name] = {
            "min": _floats(np.minimum.reduceat(np.where(finite, x, np.inf), rel)),
            "max": _floats(np.maximum.reduceat(np.where(finite, x, -np.inf), rel)),
            "nonfinite": np.add.reduceat((~finite & was).astype(np.int64), rel).tolist(),
        }
    return out


def _trip_answer(
    runs: RunSet, root: Path, scan: _Scan, trip: dict[str, Any], lead: int
) -> dict[str, Any]:
    """A trip with its replay's run (``null`` when the replay's dump is not among the runs)
    and the ``lead`` steps up to it, exact."""
    run = None
    if trip["replay"] is not None:
        replay = (root / trip["replay"]).resolve()
        for name in runs.names():
            if replay in runs.get(name).paths:
                run = name
                break
    return {**trip, "run": run, "lead_up": _lead_up(scan, trip["step"], lead)}


def _lead_up(scan: _Scan, step: int, lead: int) -> dict[str, Any]:
    """The last ``lead`` steps at or before ``step``: every figure exact, and the modules whose
    largest |x| came highest there, each with its values (read again from the file)."""
    steps = np.frombuffer(scan.step, dtype=np.int64)
    upto = np.flatnonzero(steps <= step)
    picked = upto[-lead:] if lead > 0 else upto[:0]
    modules = scan.header["modules"] if scan.header else []
    out: dict[str, Any] = {"steps": steps[picked].tolist()}
    for name in SERIES:
        out[name] = [_json_number(v) for v in scan.array(name)[picked].tolist()]
    measured = np.frombuffer(scan.measured, dtype=np.uint8)[picked]
    for i, name in enumerate(SERIES):  # not measured: null, not NaN
        for j in np.flatnonzero((measured & (1 << i)) == 0).tolist():
            out[name][j] = None
    which = np.frombuffer(scan.amax_module, dtype=np.int32)[picked].tolist()
    out["amax_module"] = [modules[m] if 0 <= m < len(modules) else None for m in which]
    bad = np.frombuffer(scan.bad, dtype=np.uint8)[picked].tolist()
    out["bad"] = [[c for k, c in enumerate(CHECKS) if b & (1 << k)] for b in bad]
    out["modules"] = _lead_modules(scan, picked, modules)
    return out


def _lead_modules(scan: _Scan, picked: np.ndarray, modules: list[str]) -> list[dict[str, Any]]:
    """Per module, its largest |x| at each picked step; the :data:`LEAD_MODULES` that came
    highest (a module with Inf/NaN first)."""
    if not len(picked) or not modules:
        return []
    where = np.frombuffer(scan.where, dtype=np.int64)
    lo = int(where[picked[0]])
    hi = int(where[picked[-1] + 1]) if picked[-1] + 1 < len(where) else scan.offset
    with open(scan.path, "rb") as f:
        f.seek(lo)
        data = f.read(hi - lo)
    by_step: list[list[float | None]] = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            record = _loads(line)
            if record.get("kind") != "step":
                continue
            by_step.append([_number(x) for x in record.get("module_amax") or ()])
        except (ValueError, TypeError):
            continue  # counted among the problems when the file was read
    by_step = by_step[-len(picked) :]
    series = []
    for m, module in enumerate(modules):
        values = [row[m] if m < len(row) else None for row in by_step]
        finite = [v for v in values if v is not None and math.isfinite(v)]
        broken = any(v is not None and not math.isfinite(v) for v in values)
        peak = max(finite) if finite else None
        series.append((broken, peak or 0.0, module, values, peak))
    series.sort(key=lambda s: (not s[0], -s[1]))
    return [
        {"module": module, "peak": peak, "nonfinite": broken,
         "values": [_json_number(v) for v in values]}
        for broken, _, module, values, peak in series[:LEAD_MODULES]
    ]  # fmt: skip
