"""TensorFlow's whole history, kept the way nanscope's own writer keeps events.

TensorFlow's writer has a plain circular buffer: with ``enable_dump_debug_info``'s
default (the last 1000 events of each kind) a diverging run's first Inf/NaN is gone by
the time it ends, and nothing in the files says so. So when nanscope records a
TensorFlow program it asks TensorFlow for the whole history (``circular_buffer_size=-1``),
written into the logdir as the program runs (a *spool*: the six tfdbg2 files, readable
at any moment, and left whole by a process that is killed), and when recording ends
keeps of each event file what nanscope's writer would have kept with the buffer asked
for: the last N events, and ``origin_window`` events on each side of the first
Inf/NaN of each (op type, has NaN) pair and of the first NaN (docs/FORMAT.md,
"Circular buffers and what survives a crash"; :func:`kept` is that rule). The kept
records get what nanscope's own records carry: their position in the whole history
(``sequence``, so that readers count what was let go of) and their training step
(counted over the whole history, docs/TENSORFLOW.md). The metadata says who wrote the
set and how (nanscope's fields), and a ``.nsdrops`` report says whether recording
ended: a process killed before it leaves ``"closed": false``, and its dump reads as
incomplete. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nanscope._version import __version__
from nanscope.events._streams import floor_below
from nanscope.format import files, sidecar
from nanscope.format.modes import TensorDebugMode
from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.format.records import FOOTER_SIZE, HEADER_SIZE, frame, scan
from nanscope.format.strings import StringTable
from nanscope.reader import EXECUTIONS, TRACES, DumpReader

# As nanscope's writer (nanscope.events._streams.MAX_ANCHORS and DumpWriter's default
# origin_window): the same rule keeps the same events.
MAX_ANCHORS = 32
ORIGIN_WINDOW = 100
# The drop report's size, as nanscope's writer pads it (docs/FORMAT.md, "The drop report").
DROPS_SIZE = 4096
_EVENT_FILES = ((EXECUTIONS, files.EXECUTION), (TRACES, files.GRAPH_EXECUTION_TRACES))


@dataclass
class Kept:
    """What :func:`finish` kept of one event file: ``kept`` of ``total`` events, in
    ``bytes`` (the whole history took ``spool_bytes``)."""

    kind: str
    total: int
    kept: int
    bytes: int
    spool_bytes: int


def kept(
    nonfinite: np.ndarray,
    nan: np.ndarray,
    kinds: np.ndarray,
    capacity: int,
    window: int = ORIGIN_WINDOW,
    max_anchors: int = MAX_ANCHORS,
) -> np.ndarray:
    """Which events of a file a circular buffer of ``capacity`` keeps (a bool mask).

    nanscope's writer decides as events arrive (:class:`nanscope.events._streams.EventStream`);
    this is the same rule over a whole history: the first non-finite event of each new
    (``kinds``, has NaN) pair is an *anchor*, for at most ``max_anchors`` pairs, and the
    first event with NaN in any case; each keeps the ``window`` events after it and up to
    ``window`` before it that the buffer still held when it came (none from before the
    previous window; an anchor inside an open window extends it); besides the windows,
    the ``capacity`` most recent events are kept. ``capacity <= 0`` keeps everything.
    """
    n = len(nonfinite)
    if capacity <= 0 or n == 0:
        return np.ones(n, dtype=bool)
    hits = np.flatnonzero(nonfinite)
    has_nan = nan[hits] > 0
    keys = kinds[hits].astype(np.int64) * 2 + has_nan
    _, firsts = np.unique(keys, return_index=True)
    anchors: list[int] = []
    seen: set[int] = set()
    nan_seen = False
    for j in np.sort(firsts).tolist():
        key, with_nan = int(keys[j]), bool(has_nan[j])
        if len(seen) >= max_anchors and (nan_seen or not with_nan):
            continue  # past the bound: only the first NaN still gets a window
        seen.add(key)
        nan_seen |= with_nan
        anchors.append(int(hits[j]))
    windows: list[list[int]] = []

    def floor_at(end: int) -> int:
        return floor_below(windows, end, capacity)

    floor = 0
    for a in anchors:
        end = a + window + 1
        if windows and a < windows[-1][1]:
            windows[-1][1] = end  # inside the previous window: they merge
            continue
        floor = max(floor, floor_at(a))  # what was let go of before it stays let go of
        start = max(a - window, floor, windows[-1][1] if windows else 0)
        if windows and windows[-1][1] == start:
            windows[-1][1] = end
        else:
            windows.append([start, end])
    floor = max(floor, floor_at(n))
    keep = np.arange(n) >= floor
    for s, e in windows:
        keep[s : min(e, n)] = True
    return keep


def find_file_set(logdir: str | os.PathLike[str], run_id: str) -> files.FileSet | None:
    """The file set in ``logdir`` whose metadata names ``run_id`` (the newest of them)."""
    found = None
    for fs in files.discover(logdir):
        event = _metadata_event(fs)
        if event is not None and event.debug_metadata.tfdbg_run_id == run_id:
            found = fs
    return found


def _metadata_event(fs: files.FileSet) -> pb.DebugEvent | None:
    try:
        data = fs.path(files.METADATA).read_bytes()
    except OSError:
        return None
    for record in scan(data, str(fs.path(files.METADATA))).records:
        event = pb.DebugEvent()
        try:
            event.ParseFromString(record.payload)
        except Exception:  # not a DebugEvent: not TensorFlow's metadata
            continue
        if event.WhichOneof("what") == "debug_metadata":
            return event
    return None


def start(fs: files.FileSet, mode: TensorDebugMode, capacity: int) -> None:
    """Mark a file set that TensorFlow just created as recorded by nanscope: its metadata
    gets nanscope's fields (who, the mode and the buffer asked for), and a drop report
    says that recording has not ended (until :func:`finish`)."""
    event = _metadata_event(fs)
    if event is None:
        raise ValueError(f"{fs.path(files.METADATA)}: no metadata record to add to")
    md = event.debug_metadata
    md.framework = f"tensorflow {md.tensorflow_version}".strip()
    md.nanscope_version = __version__
    md.process_rank = -1
    md.pid = os.getpid()
    md.tensor_debug_mode = mode.value  # type: ignore[assignment]
    md.circular_buffer_size = capacity
    # TensorFlow wrote its record and will not write this file again: replaced whole.
    _replace(fs.path(files.METADATA), [frame(event.SerializeToString())])
    _write_drops(fs, closed=False)


def _write_drops(fs: files.FileSet, *, closed: bool) -> None:
    report = {
        "dropped": 0,
        "executions": 0,
        "traces": 0,
        "records": 0,
        "io_errors": 0,
        "last_write": time.time(),
        "nonfinite_dropped": 0,
        "closed": closed,
        "faults": [],
    }
    data = json.dumps(report).encode()
    _replace(fs.path(files.DROPS), [data + b" " * (DROPS_SIZE - 1 - len(data)) + b"\n"])


def finish(fs: files.FileSet, capacity: int, window: int = ORIGIN_WINDOW) -> list[Kept]:
    """Keep of the whole history in ``fs`` what a circular buffer of ``capacity`` keeps
    (:func:`kept`), with steps and sequence numbers, and mark recording as ended.

    Each event file that loses events is rewritten (a temporary file, then renamed over
    it) with a sidecar index; one that loses none is left as TensorFlow wrote it (the
    reader counts its steps). Whatever goes wrong leaves the whole history in place.
    """
    report: list[Kept] = []
    try:
        with DumpReader(fs.path(files.METADATA).parent) as reader:
            proc = next((p.index for p in reader.processes if p.name == fs.name), None)
            if proc is None:
                raise ValueError(f"{fs.prefix}: not found by the reader")
            plans = []
            for kind, suffix in _EVENT_FILES:
                where = np.flatnonzero(reader.processes_of(kind) == proc)
                rows = reader.index(kind)[where]
                kinds = rows["name"] if kind == EXECUTIONS else reader.trace_op_types(where)
                keep = kept(rows["nonfinite"] == 1, rows["nan"], kinds, capacity, window)
                path = fs.path(suffix)
                spool = path.stat().st_size if path.exists() else 0
                plans.append((kind, path, rows, keep, spool))
            if all(keep.all() for _, _, _, keep, _ in plans):
                # Nothing to let go of: TensorFlow's files stay as written (the reader
                # counts the steps of a whole history itself).
                return [Kept(k, len(r), len(r), n, n) for k, _, r, _, n in plans]
            # Both files are rewritten, so that every event carries its step (the reader
            # counts none in a history with gaps), while the reader's strings are open.
            for kind, path, rows, keep, spool in plans:
                data, index = _rewrite(path, rows, keep, reader)
                _replace(path, [data])
                _replace(Path(str(path) + files.INDEX_SUFFIX), [index])
                report.append(Kept(kind, len(rows), int(keep.sum()), len(data), spool))
    finally:
        _write_drops(fs, closed=True)
    return report


def _rewrite(
    path: Path, rows: np.ndarray, keep: np.ndarray, reader: DumpReader
) -> tuple[bytes, bytes]:
    """The kept records of ``path``, each with its step and its position in the whole
    history, and their sidecar index."""
    positions = np.flatnonzero(keep)
    picked = rows[positions]
    pieces: list[bytes] = []
    columns = (picked["offset"].tolist(), picked["length"].tolist(), picked["step"].tolist())
    with open(path, "rb") as fh:
        for offset, length, step, position in zip(*columns, positions.tolist(), strict=True):
            record = os.pread(fh.fileno(), length, offset)
            event = pb.DebugEvent()
            event.ParseFromString(record[HEADER_SIZE : length - FOOTER_SIZE])
            event.step = step
            what = event.WhichOneof("what")
            if what == "execution":
                event.execution.sequence = position + 1
            elif what == "graph_execution_trace":
                event.graph_execution_trace.sequence = position + 1
            pieces.append(frame(event.SerializeToString()))
    out = np.zeros(len(picked), dtype=sidecar.ROW_DTYPE)
    for name in sidecar.ROW_DTYPE.names or ():
        if name in (picked.dtype.names or ()):
            out[name] = picked[name]
    out["size"] = -1  # the index does not keep it: unknown, as in a sidecar the reader leaves
    lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
    out["length"] = lengths
    out["offset"] = np.cumsum(lengths) - lengths
    out["sequence"] = positions + 1
    # The reader's string ids, renumbered into the sidecar's own table.
    table = StringTable()
    for column in ("name", "graph"):
        ids = out[column].astype(np.int64)
        uniq, inverse = np.unique(ids, return_inverse=True)
        mapped = np.array([table.intern(reader.string(int(u))) for u in uniq], dtype=np.int64)
        out[column] = mapped[inverse] if len(uniq) else out[column]
    index = frame(sidecar.strings_chunk(table.strings[1:])) + b"".join(
        frame(chunk) for chunk in sidecar.rows_chunks(out)
    )
    return b"".join(pieces), index


def _replace(path: Path, pieces: list[bytes]) -> None:
    """Write ``path`` whole under a temporary name, then rename it into place."""
    tmp = path.with_name(path.name + ".nanscope-tmp")
    try:
        with open(tmp, "wb") as fh:
            for piece in pieces:
                fh.write(piece)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
