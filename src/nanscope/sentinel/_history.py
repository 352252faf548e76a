"""The sentinel's history on disk: one JSON line per step, the trips, and the end.

A sentinel's logdir holds ``sentinel.jsonl`` (this module) and, for each step
that went bad and was replayed, a normal dump in ``replay-step-<N>/``. The file
is appended to as training goes (flushed every few steps and at each trip), so
that a run killed hours in leaves its history up to the last flush.

Lines, each a JSON object with a ``kind``:

- ``header`` (first): ``version``, ``run_id``, ``framework``, ``started`` (Unix
  time), ``modules`` (the module paths whose ``module_amax`` the steps give, in
  order), ``settings`` (what the sentinel was asked for).
- ``step``: ``step``, ``time``, ``loss``, ``grad_norm`` (L2 norm over all
  gradients), ``grad_amax``, ``param_amax``, ``state_amax`` (largest ``|x|`` of
  the gradients, the parameters and the optimizer state), ``module_amax`` (one
  per header module: the largest ``|x|`` the module's forward outputs reached in
  the step; empty on steps where they were not measured), ``param_norm`` (L2
  norm over all parameters after the step; absent in older files), ``bad`` (which checks saw Inf/NaN: ``loss``, ``gradients``,
  ``parameters``, ``optimizer_state``).
- ``trip``: the step where the sentinel saw Inf/NaN and what it did: ``step``,
  ``where`` (as ``bad``), ``action`` (``stop`` or ``skip``), ``replay`` (the
  replay dump's directory, relative to the logdir, or null), ``reproduced``
  (whether the replay saw Inf/NaN again: true, false, or null when there was no
  replay), ``reason`` (why there was no replay, or null), ``cause`` (the replay's
  root cause: ``headline``, ``op_type``, ``file``, ``line``, ``step``; or null).
- ``end``: ``step`` (the last step checked), ``time``, ``error`` (null, or the
  exception that ended the program, when it ended by one that was not the
  sentinel's own: the steps after it were never checked). Its absence means the
  program did not stop the sentinel (it was killed): the history is then
  incomplete, never read as a clean run.

Floats that are not finite are written ``"nan"``, ``"inf"`` and ``"-inf"``
(JSON has no such numbers); ``null`` where a figure was not measured.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

HISTORY_FILE = "sentinel.jsonl"
VERSION = 1
CHECKS = ("loss", "gradients", "parameters", "optimizer_state")


class SentinelHistoryError(ValueError):
    """A sentinel history that cannot be read (not one, or damaged before its header)."""


@dataclass(frozen=True)
class Header:
    """What a sentinel run was: its id, framework, the modules it watches, its settings."""

    run_id: str
    framework: str
    started: float
    modules: tuple[str, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)
    version: int = VERSION


@dataclass(frozen=True)
class StepRecord:
    """One step as the sentinel saw it (``None``: not measured; NaN/inf as measured)."""

    step: int
    time: float
    loss: float | None = None
    grad_norm: float | None = None
    grad_amax: float | None = None
    param_amax: float | None = None
    state_amax: float | None = None
    module_amax: tuple[float | None, ...] = ()
    bad: tuple[str, ...] = ()
    param_norm: float | None = None  # L2 norm over all parameters (measured every step)


@dataclass(frozen=True)
class Cause:
    """The replay's root cause, as its report names it."""

    headline: str
    op_type: str | None = None
    file: str | None = None
    line: int | None = None
    step: int | None = None


@dataclass(frozen=True)
class Trip:
    """A step where the sentinel saw Inf/NaN, and what came of it."""

    step: int
    where: tuple[str, ...]
    action: str  # "stop" or "skip"
    replay: str | None = None  # relative to the logdir
    reproduced: bool | None = None
    reason: str | None = None
    cause: Cause | None = None


@dataclass(frozen=True)
class SentinelHistory:
    """A sentinel logdir read back: its header, steps, trips, and whether it ended."""

    logdir: Path
    header: Header
    steps: tuple[StepRecord, ...]
    trips: tuple[Trip, ...]
    ended: bool
    last_step: int | None
    problems: tuple[str, ...] = ()
    error: str | None = None  # the exception that ended the program (the end record's)

    @property
    def complete(self) -> bool:
        """Whether the history was closed by the sentinel, read without damage, and the
        program did not end by an error (after which nothing was checked)."""
        return self.ended and not self.problems and self.error is None

    def replay_dir(self, trip: Trip) -> Path | None:
        """The directory of a trip's replay dump, or ``None`` when it has none."""
        return None if trip.replay is None else self.logdir / trip.replay


def json_float(x: float | None) -> float | str | None:
    """A figure as JSON holds it: non-finite values as ``"nan"``, ``"inf"``, ``"-inf"``."""
    if x is None:
        return None
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _json_number(x: float | None) -> str:
    """:func:`json_float` as JSON text (``json.dumps`` writes a float by its ``repr``)."""
    v = json_float(x)
    if v is None:
        return "null"
    return f'"{v}"' if isinstance(v, str) else repr(v)


def _decode_float(x: Any) -> float | None:
    if x is None:
        return None
    if isinstance(x, str):
        if x in ("nan", "inf", "-inf"):
            return float(x)
        raise ValueError(f"not a number: {x!r}")
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"not a number: {x!r}")
    return float(x)


class HistoryWriter:
    """Appends a sentinel's history to ``<logdir>/sentinel.jsonl``.

    Lines are buffered and written every ``flush_every`` steps, at each trip and at
    :meth:`close`; each write ends with whole lines, so a reader never sees half a
    record unless the process died inside a write (the reader then reports it).
    """

    def __init__(self, logdir: str | os.PathLike[str], header: Header, flush_every: int = 50):
        self.path = Path(logdir) / HISTORY_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = self.path.open("w", encoding="utf-8")
        self._pending: list[str] = []
        self._flush_every = max(1, int(flush_every))
        self._last_step: int | None = None
        self._write(
            {
                "kind": "header",
                "version": header.version,
                "run_id": header.run_id,
                "framework": header.framework,
                "started": header.started,
                "modules": list(header.modules),
                "settings": dict(header.settings),
            }
        )
        self.flush()

    def _write(self, record: Mapping[str, Any]) -> None:
        self._pending.append(json.dumps(record, allow_nan=False) + "\n")

    def step(self, record: StepRecord) -> None:
        """Add one step's figures (written at the next flush)."""
        self._last_step = record.step
        # Every step writes one: formatted directly (~5x cheaper than json.dumps of a dict),
        # the same text json.dumps gives (floats by repr, non-finite ones as strings).
        num = _json_number
        modules = ", ".join([num(x) for x in record.module_amax])
        bad = json.dumps(list(record.bad)) if record.bad else "[]"
        self._pending.append(
            f'{{"kind": "step", "step": {int(record.step)}, "time": {float(record.time)!r}, '
            f'"loss": {num(record.loss)}, "grad_norm": {num(record.grad_norm)}, '
            f'"grad_amax": {num(record.grad_amax)}, "param_amax": {num(record.param_amax)}, '
            f'"state_amax": {num(record.state_amax)}, "module_amax": [{modules}], '
            f'"bad": {bad}, "param_norm": {num(record.param_norm)}}}\n'
        )
        if len(self._pending) >= self._flush_every:
            self.flush()

    def trip(self, trip: Trip) -> None:
        """Record a trip, and write it out at once."""
        cause = None
        if trip.cause is not None:
            c = trip.cause
            cause = {
                "headline": c.headline,
                "op_type": c.op_type,
                "file": c.file,
                "line": c.line,
                "step": c.step,
            }
        self._write(
            {
                "kind": "trip",
                "step": int(trip.step),
                "where": list(trip.where),
                "action": trip.action,
                "replay": trip.replay,
                "reproduced": trip.reproduced,
                "reason": trip.reason,
                "cause": cause,
            }
        )
        self.flush()

    def flush(self) -> None:
        if self._file is None or not self._pending:
            return
        self._file.write("".join(self._pending))
        self._file.flush()
        self._pending.clear()

    def close(self, error: str | None = None) -> None:
        """Write the ``end`` record and close the file; a second call does nothing.

        ``error``: the exception that is ending the program, when one is (in words).
        """
        if self._file is None:
            return
        self._write({"kind": "end", "step": self._last_step, "time": time.time(), "error": error})
        self.flush()
        self._file.close()
        self._file = None


def is_sentinel_logdir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory holding a sentinel's history."""
    return (Path(path) / HISTORY_FILE).is_file()


def read_history(logdir: str | os.PathLike[str]) -> SentinelHistory:
    """Read ``<logdir>/sentinel.jsonl``.

    Raises ``FileNotFoundError`` when there is none, and :class:`SentinelHistoryError`
    when its header cannot be read. Damage after the header (a line cut short by a
    kill, a record that does not parse) is kept in ``problems``; the records before
    it are returned.
    """
    root = Path(logdir)
    path = root / HISTORY_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no sentinel history in {root} (no {HISTORY_FILE})")
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    cut = lines[-1] != ""  # the last line was not finished
    lines = [ln for ln in lines if ln.strip()]
    if not lines:
        raise SentinelHistoryError(f"{path} is empty: the sentinel wrote no header")
    try:
        first = json.loads(lines[0])
        if first.get("kind") != "header":
            raise ValueError("the first line is not a header")
        header = Header(
            run_id=str(first["run_id"]),
            framework=str(first["framework"]),
            started=float(first["started"]),
            modules=tuple(str(m) for m in first.get("modules", ())),
            settings=dict(first.get("settings") or {}),
            version=int(first.get("version", VERSION)),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SentinelHistoryError(f"{path}: line 1 is not a sentinel header ({exc})") from None
    steps: list[StepRecord] = []
    trips: list[Trip] = []
    problems: list[str] = []
    ended = False
    error: str | None = None
    last_step: int | None = None
    for number, line in enumerate(lines[1:], start=2):
        try:
            record = json.loads(line)
            kind = record.get("kind")
            if kind == "step":
                steps.append(_step(record))
                last_step = steps[-1].step
            elif kind == "trip":
                trips.append(_trip(record))
            elif kind == "end":
                ended = True
                if record.get("error") is not None:
                    error = str(record["error"])
                if record.get("step") is not None:
                    last_step = int(record["step"])
            else:
                raise ValueError(f"unknown kind {kind!r}")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            if cut and number == len(lines):
                problems.append(
                    f"{path}: the last line was cut short (the process died writing it)"
                )
            else:
                problems.append(f"{path}: line {number} cannot be read ({exc})")
    if not ended:
        problems.append(
            f"{path}: the history has no end: the program stopped without closing the "
            "sentinel (a crash or a kill); steps after the last one written are unknown"
        )
    return SentinelHistory(
        logdir=root,
        header=header,
        steps=tuple(steps),
        trips=tuple(trips),
        ended=ended,
        last_step=last_step,
        problems=tuple(problems),
        error=error,
    )


def _step(record: Mapping[str, Any]) -> StepRecord:
    return StepRecord(
        step=int(record["step"]),
        time=float(record["time"]),
        loss=_decode_float(record.get("loss")),
        grad_norm=_decode_float(record.get("grad_norm")),
        grad_amax=_decode_float(record.get("grad_amax")),
        param_amax=_decode_float(record.get("param_amax")),
        state_amax=_decode_float(record.get("state_amax")),
        module_amax=tuple(_decode_float(x) for x in record.get("module_amax") or ()),
        bad=_checks(record.get("bad") or ()),
        param_norm=_decode_float(record.get("param_norm")),
    )


def _checks(names: Iterable[Any]) -> tuple[str, ...]:
    out = tuple(str(n) for n in names)
    unknown = [n for n in out if n not in CHECKS]
    if unknown:
        raise ValueError(f"unknown check {unknown[0]!r}")
    return out


def _trip(record: Mapping[str, Any]) -> Trip:
    cause = record.get("cause")
    action = str(record["action"])
    if action not in ("stop", "skip"):
        raise ValueError(f"unknown action {action!r}")
    reproduced = record.get("reproduced")
    return Trip(
        step=int(record["step"]),
        where=_checks(record.get("where") or ()),
        action=action,
        replay=None if record.get("replay") is None else str(record["replay"]),
        reproduced=None if reproduced is None else bool(reproduced),
        reason=None if record.get("reason") is None else str(record["reason"]),
        cause=None
        if cause is None
        else Cause(
            headline=str(cause["headline"]),
            op_type=cause.get("op_type"),
            file=cause.get("file"),
            line=None if cause.get("line") is None else int(cause["line"]),
            step=None if cause.get("step") is None else int(cause["step"]),
        ),
    )


def steps_before(history: SentinelHistory, step: int, count: int) -> Sequence[StepRecord]:
    """Up to ``count`` step records up to and including ``step`` (the lead-up to a trip)."""
    upto = [s for s in history.steps if s.step <= step]
    return upto[-count:]
