"""``DumpReader``: the one way every nanscope tool reads a dump.

Pure Python and numpy: no TensorFlow needed. It reads dumps written by
nanscope and by TensorFlow, with one or many file sets (hosts, processes,
ranks), while they are still being written (call :meth:`DumpReader.update`
again to catch up), and keeps only a columnar index in memory: records are
decoded on demand.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np

from nanscope.format import files, headroom, health, statistics
from nanscope.format.modes import TensorDebugMode
from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.format.records import scan
from nanscope.format.strings import StringTable
from nanscope.format.tensors import ValueView, view_of
from nanscope.reader._data import (
    PHASES,
    Collective,
    Execution,
    GraphExecutionTrace,
    GraphInfo,
    GraphOpInfo,
    Problem,
    ProcessInfo,
    SourceFileInfo,
    StackFrame,
)
from nanscope.reader._decode import (
    DecodeError,
    execution_row,
    mode_of,
    output_views,
    parse_event,
    tensor_values,
    trace_row,
    wall_time,
)
from nanscope.reader._drops import WriterDrops, read_drops
from nanscope.reader._eventfile import INDEX_DTYPE, EventFile, FileReplaced
from nanscope.reader._logs import RecordLog, describe
from nanscope.reader._tfsteps import TfHistory
from nanscope.vocabulary import EventKind

SUPPORTED_FILE_VERSION = 1
# One dump root, or several roots read as one dump (one per host, say).
DumpRoots: TypeAlias = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
EXECUTIONS: str = EventKind.EXECUTION
TRACES: str = EventKind.GRAPH_EXECUTION_TRACE
# The event file of each kind.
_SUFFIX_OF = {EXECUTIONS: files.EXECUTION, TRACES: files.GRAPH_EXECUTION_TRACES}


# The largest range history read: a writer's holds at most 1024 points per module and phase
# (22 bytes each); a file larger than this is not one (docs/FORMAT.md, "Headroom").
MAX_HISTORY_BYTES = 64 << 20
# A range history row as the reader hands it out: a point of one process.
HISTORY_DTYPE = np.dtype([("process", "<i4"), *headroom.POINT_DTYPE.descr])


class DumpError(Exception):
    """A dump that cannot be read at all (the message says why and what to do)."""


@dataclass(frozen=True)
class _Record:
    """One event's record as :meth:`DumpReader._event_at` read it."""

    proc: _Process
    event: pb.DebugEvent | None  # None: it cannot be read now (why: ``where``)
    where: str  # "<file>: record at byte offset N", or why it cannot be read
    file: str
    offset: int


@dataclass(frozen=True)
class EventRef:
    """A pointer to one event: ``kind`` is ``"execution"`` or ``"graph_execution_trace"``."""

    kind: str
    index: int
    process: int
    wall_time: float


class _Process:
    """Everything read from one file set."""

    def __init__(self, index: int, file_set: files.FileSet, strings: StringTable) -> None:
        self.index = index
        self.file_set = file_set
        self.info: ProcessInfo | None = None
        self.source_log = RecordLog(file_set.path(files.SOURCE_FILES))
        self.frames_log = RecordLog(file_set.path(files.STACK_FRAMES))
        self.graphs_log = RecordLog(file_set.path(files.GRAPHS))
        self.executions = EventFile(
            file_set.path(files.EXECUTION), execution_row, EXECUTIONS, strings
        )
        self.traces = EventFile(
            file_set.path(files.GRAPH_EXECUTION_TRACES), trace_row, TRACES, strings
        )
        # (host, path, offset, num_lines) in file-index order.
        self.source_files: list[tuple[str, str, int, int]] = []
        self.frames: dict[str, tuple[int, int, str]] = {}
        self.graphs: dict[str, GraphInfo] = {}
        self.devices: dict[int, str] = {}
        self.drops: WriterDrops | None = None  # the writer's report, when it lost anything
        self.report: WriterDrops | None = None  # the writer's report, whatever it says

    def close(self) -> None:
        self.executions.close()
        self.traces.close()


class DumpReader:
    """Reads a tfdbg2 dump root, or several roots of one run as one dump.

    **Arguments:**

    - ``logdir``: the directory holding ``tfdbg_events.*`` file sets, or a sequence of
      such directories (one per host, say, when each host wrote its ranks to its own
      directory): their file sets are read together, as if they shared one directory.

    :attr:`logdirs` holds every root (as given, duplicates dropped); :attr:`logdir` is the
    first of them.
    Raises :class:`nanscope.DumpNotFoundError` when a root is missing or holds no dump.
    Damage that can be worked around (a torn last record, a corrupt record, a
    missing file) is reported in :attr:`problems` instead of raising.
    Call :meth:`update` to read what was added since (the constructor calls
    it once).
    """

    def __init__(self, logdir: DumpRoots) -> None:
        self.logdirs: list[Path] = _roots(logdir)
        self.logdir = self.logdirs[0]
        self._strings = StringTable()
        self._histories: dict[int, tuple[tuple[int, int], np.ndarray | None]] = {}
        self._problems: dict[str, Problem] = {}
        self._processes: list[_Process] = []
        # By prefix (root and name): two roots may hold sets of the same name (two hosts of
        # the same name that started in the same second).
        self._known_sets: set[Path] = set()
        # The size each rank-less nanscope process's .metadata had when read: a worker of
        # torch.multiprocessing.spawn appends its rank later (live dumps read it then).
        self._metadata_sizes: dict[Path, int] = {}
        self._exec_rows = np.zeros(0, dtype=INDEX_DTYPE)
        self._exec_process = np.zeros(0, dtype=np.int16)
        self._trace_rows = np.zeros(0, dtype=INDEX_DTYPE)
        self._trace_process = np.zeros(0, dtype=np.int16)
        self._trace_types: np.ndarray | None = None
        # gaps() per kind, kept while the index is the same array of the same length.
        self._gaps: dict[
            str, tuple[np.ndarray, int, tuple[np.ndarray, np.ndarray, np.ndarray]]
        ] = {}
        self._reindexed = False
        # TensorFlow's processes whose steps this reader counted (docs/TENSORFLOW.md), and
        # whether any process's events say at which step they ran.
        self._counted_steps: set[int] = set()
        self._steps_known = False
        self.generation = 0
        for root in self.logdirs:
            files.discover(root)  # a clear error for a missing or empty dump root
        self.update()

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        for p in self._processes:
            p.close()

    def __enter__(self) -> DumpReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def problems(self) -> list[Problem]:
        """What is wrong with the dump (each problem once), oldest first."""
        return list(self._problems.values())

    @property
    def incomplete(self) -> list[Problem]:
        """The problems that leave some event file's history incomplete (events missing
        from the index, or indexed but unreadable): :attr:`Problem.incomplete`, in
        :attr:`problems` order. Empty: every event each file holds was read."""
        return [p for p in self._problems.values() if p.incomplete]

    def event_file(self, process: int, kind: str) -> Path:
        """The path of one process's event file of ``kind`` (:data:`EXECUTIONS` or
        :data:`TRACES`), whether or not it exists."""
        return self._processes[process].file_set.path(_SUFFIX_OF[kind])

    def incomplete_events(self, process: int, kind: str | None = None) -> list[Problem]:
        """The :attr:`incomplete` problems of one process's event files: its ``.execution``
        file (``kind`` :data:`EXECUTIONS`), its ``.graph_execution_traces`` file
        (:data:`TRACES`), or either (None). Empty: that history is whole."""
        kinds = (EXECUTIONS, TRACES) if kind is None else (kind,)
        names = {str(self.event_file(process, k)) for k in kinds}
        names.add(str(self._processes[process].file_set.prefix))
        return [p for p in self.incomplete if p.file in names]

    def _problem(self, severity: str, message: str, **where: Any) -> None:
        self._problems.setdefault(message, Problem(severity, message, **where))

    def update(self) -> bool:
        """Read what was written since the last call; True when anything changed."""
        problems: list[Problem] = []
        changed = self._discover(problems)
        for proc in self._processes:
            if proc.info is None or self._rank_may_follow(proc):
                self._read_metadata(proc, problems)
            changed |= self._read_sources(proc, problems)
            changed |= self._read_frames(proc, problems)
            changed |= self._read_graphs(proc, problems)
        exec_changed = trace_changed = False
        exec_resets = sum(p.executions.reset_count for p in self._processes)
        trace_resets = sum(p.traces.reset_count for p in self._processes)
        room = {which: self._merged_room(which) for which in ("executions", "traces")}
        for proc in self._processes:
            exec_changed |= room["executions"].update(proc.executions, problems)
            trace_changed |= room["traces"].update(proc.traces, problems)
            for log, name in ((proc.executions, "execution"), (proc.traces, "trace")):
                # A record that could not be read because its file had been replaced since
                # the last update: the index now says what the file holds.
                self._problems.pop(f"stale {log.path}", None)
                # Keyed by file: the tail a live writer was writing is read by a later
                # update, and then the file is whole again.
                key = f"torn {log.path}"
                if log.torn_at is None:
                    self._problems.pop(key, None)
                    continue
                message = (
                    f"{log.path}: ends in an incomplete record at byte offset {log.torn_at} "
                    f"(the writer was interrupted or is still writing); the {name} records "
                    "before it were read"
                )
                if getattr(self._problems.get(key), "message", None) != message:
                    self._problems.pop(key, None)
                    self._problems[key] = Problem(
                        "warning", message, incomplete=True, file=str(log.path), offset=log.torn_at
                    )
        reindexed, self._reindexed = self._reindexed, False
        if exec_changed or reindexed:
            self._exec_rows, self._exec_process = self._concat("executions", room["executions"])
        if trace_changed or reindexed:
            self._trace_rows, self._trace_process = self._concat("traces", room["traces"])
            self._trace_types = None
        if exec_changed or trace_changed or reindexed or changed:
            self._tensorflow_history()
        if (
            sum(p.executions.reset_count for p in self._processes) != exec_resets
            or sum(p.traces.reset_count for p in self._processes) != trace_resets
            or (len(self._processes) > 1 and (exec_changed or trace_changed))
            or reindexed
        ):
            # Indices of earlier events may have moved: tell live viewers to reload.
            self.generation += 1
        for proc in self._processes:
            self._writer_report(proc)
        self._unrecorded_notes()
        for p in problems:
            self._problems.setdefault(p.message, p)
        return changed or exec_changed or trace_changed

    def _tensorflow_history(self) -> None:
        """What TensorFlow's own dumps do not record, read from what they do
        (:mod:`nanscope.reader._tfsteps`): the first events its circular buffer let go of,
        as incomplete problems, and the steps, counted from the calls of the training
        function into the index's ``step`` column (a copy: the files' rows stay as read)."""
        copied = False
        for index in self._counted_steps:
            # Counted by an earlier update into copies of the rows: counted again below.
            if not copied:
                self._exec_rows, self._trace_rows = self._exec_rows.copy(), self._trace_rows.copy()
                copied = True
            self._exec_rows["step"][self._exec_process == index] = 0
            self._trace_rows["step"][self._trace_process == index] = 0
        self._counted_steps = set()
        self._steps_known = False
        for proc in self._processes:
            info = proc.info
            if info is None or not info.tensorflow_version:
                self._steps_known |= bool(info is not None and info.nanscope_version)
                continue
            executions, traces = proc.executions.rows, proc.traces.rows
            recorded = bool(executions["step"].any() or traces["step"].any())
            self._steps_known |= recorded
            history = TfHistory(executions, traces, self.string, proc.graphs)
            lost = False
            if not info.nanscope_version:
                # Written by TensorFlow alone: its circular buffer (if one was used) says
                # nothing of what it let go of; the calls and their traces may.
                for efile, why in zip((proc.traces, proc.executions), history.lost(), strict=True):
                    key = f"tf-lost {efile.path}"
                    if why is None:
                        self._problems.pop(key, None)
                        continue
                    lost = True
                    kind = "graph execution traces" if efile is proc.traces else "executions"
                    self._problems[key] = Problem(
                        "warning",
                        f"{efile.path}: its first {kind} are missing: {why}. TensorFlow's "
                        "circular buffer (enable_dump_debug_info's circular_buffer_size, 1000 by "
                        "default) let go of them, and of any Inf/NaN among them; record with "
                        "circular_buffer_size=-1, or with nanscope run, to keep them",
                        incomplete=True,
                        file=str(efile.path),
                        offset=0,
                    )
            if recorded or lost or not (_whole(executions) and _whole(traces)):
                continue  # steps from an incomplete history would be counted from a wrong start
            steps = history.steps()
            if steps is None:
                continue
            if not copied:
                self._exec_rows, self._trace_rows = self._exec_rows.copy(), self._trace_rows.copy()
                copied = True
            self._exec_rows["step"][self._exec_process == proc.index] = steps[0]
            self._trace_rows["step"][self._trace_process == proc.index] = steps[1]
            self._counted_steps.add(proc.index)
            self._steps_known = True

    @property
    def steps_known(self) -> bool:
        """Whether the events say at which training step they ran: nanscope counts steps
        as it records; in TensorFlow's dumps the reader counts them from the calls of the
        training function (docs/TENSORFLOW.md); otherwise every event reads step 0."""
        return self._steps_known

    def _writer_report(self, proc: _Process) -> None:
        """What the process's writer says of its dump (``.nsdrops``), as problems: events it
        lost (incomplete when one may have held Inf/NaN), and whether it ever closed."""
        # The writer rewrites its report in place: read it again each time (4 KiB).
        report = read_drops(proc.file_set)
        proc.report = report if isinstance(report, WriterDrops) else None
        proc.drops = proc.report if proc.report is not None and proc.report.lost else None
        prefix = proc.file_set.prefix
        # Keyed by file set: a live writer's counts grow, one problem stays.
        if isinstance(report, str):
            self._problems[f"drops {prefix}"] = Problem("warning", report, file=str(prefix))
        elif proc.drops is not None:
            self._problems[f"drops {prefix}"] = Problem(
                "error" if proc.drops.nonfinite_lost else "warning",
                f"{prefix}: {proc.drops.summary()}",
                incomplete=proc.drops.nonfinite_lost,
                file=str(prefix),
            )
        unclosed = f"unclosed {prefix}"
        if proc.report is not None and proc.report.closed is False:
            self._problems[unclosed] = Problem(
                "warning",
                f"{prefix}: {self._not_closed(proc)}",
                incomplete=True,
                file=str(prefix),
            )
        else:
            self._problems.pop(unclosed, None)  # the live writer has closed since

    def _unrecorded_notes(self) -> None:
        """Processes of the run that ran unrecorded: the ``.nsunrecorded`` notes ``nanscope
        run`` leaves for a child it could not record. What they computed is missing, so the
        dump is incomplete (never an all-clear)."""
        for root in self.logdirs:
            for path in sorted(Path(root).glob(f"{files.PREFIX}.*.{files.UNRECORDED}")):
                key = f"unrecorded {path}"
                if key not in self._problems:
                    self._problems[key] = Problem(
                        "error", files.unrecorded_note(path), incomplete=True, file=str(path)
                    )

    @staticmethod
    def _not_closed(proc: _Process) -> str:
        """Why a writer that never closed left an incomplete dump."""
        info = proc.info
        alive = False
        if info is not None and info.pid and info.host == socket.gethostname():
            try:
                os.kill(info.pid, 0)  # no signal sent: only asks whether the pid exists
                alive = True
            except PermissionError:
                alive = True
            except OSError:
                pass
        if alive:
            return (
                "the writer has not closed: the program is still running (or its pid was "
                "reused); events after its last flush are not in the dump yet"
            )
        return (
            "the writer never closed: the program was killed (SIGKILL, the OOM killer, "
            "os._exit) or died in a hard crash; events after its last flush are lost"
        )

    def writer_drops(self) -> dict[int, WriterDrops]:
        """What each process's writer could not write (a full disk, ...), by process index;
        processes that dropped nothing are left out."""
        return {p.index: p.drops for p in self._processes if p.drops is not None}

    def _merged_room(self, which: str) -> _MergedRoom:
        """Where a first read of many processes' sidecars puts their rows (see _MergedRoom)."""
        files_ = [getattr(p, which) for p in self._processes]
        if len(files_) < 2 or any(len(f.rows) for f in files_):
            return _MergedRoom(None)
        caps = [f.sidecar_capacity() for f in files_]
        if any(c is None for c in caps):
            return _MergedRoom(None)
        return _MergedRoom(np.empty(sum(caps), dtype=INDEX_DTYPE))

    def _concat(self, which: str, room: _MergedRoom | None = None) -> tuple[np.ndarray, np.ndarray]:
        files_ = [getattr(p, which) for p in self._processes]
        if not files_:
            return np.zeros(0, dtype=INDEX_DTYPE), np.zeros(0, dtype=np.int16)
        sizes = [len(f.rows) for f in files_]
        procs = np.repeat(
            np.array([p.index for p in self._processes], dtype=np.int16), np.array(sizes)
        )
        if len(files_) == 1:  # one process: its rows as they are, no copy
            return files_[0].rows, procs
        merged_in_place = room.merged(files_) if room is not None else None
        if merged_in_place is not None:
            return merged_in_place, procs
        # One merged index; each process then keeps a view of its part instead of its own
        # copy, so the index is held once (and the peak is the index plus one part).
        merged = np.empty(sum(sizes), dtype=INDEX_DTYPE)
        start = 0
        for f, n in zip(files_, sizes, strict=True):
            merged[start : start + n] = f.rows
            f.adopt(merged[start : start + n])
            start += n
        return merged, procs

    def add_logdir(self, logdir: str | os.PathLike[str]) -> None:
        """Also read the file sets under ``logdir`` (another root of the same run), from the
        next :meth:`update` on; a root already read is ignored."""
        for root in _roots([*self.logdirs, logdir])[len(self.logdirs) :]:
            files.discover(root)  # the same clear error as the constructor's
            self.logdirs.append(root)

    def _discover(self, problems: list[Problem]) -> bool:
        sets: list[files.FileSet] = []
        for root in self.logdirs:
            try:
                sets += files.discover(root)
            except files.DumpNotFoundError:
                if self._processes:
                    continue  # deleted under us: keep what we have
                raise
        new = [s for s in sets if s.prefix not in self._known_sets]
        if not new:
            return False
        for s in new:
            missing = s.missing()
            if missing:
                # Without an event file, its events are missing: the problem names that
                # file (the set's prefix when both are missing, which both names start with).
                lost = [m for m in missing if m in files.CIRCULAR_SUFFIXES]
                problems.append(
                    Problem(
                        "warning",
                        f"{s.prefix}: file set is incomplete, missing "
                        + ", ".join("." + m for m in missing)
                        + " (copied partially? events of those files are not shown)",
                        incomplete=bool(lost),
                        file=(str(s.path(lost[0])) if len(lost) == 1 else str(s.prefix))
                        if lost
                        else None,
                    )
                )
            self._known_sets.add(s.prefix)
            proc = _Process(len(self._processes), s, self._strings)
            self._read_metadata(proc, problems)
            self._processes.append(proc)
        # Earliest first, as TensorFlow's reader orders hosts; indices follow, in
        # everything that holds one (metadata read and graphs made before sorting).
        # The prefix only breaks ties between sets of the same name in different roots.
        self._processes.sort(
            key=lambda p: (
                p.info.start_time if p.info else 0.0,
                p.file_set.name,
                str(p.file_set.prefix),
            )
        )
        for i, p in enumerate(self._processes):
            if p.index != i and (len(p.executions.rows) or len(p.traces.rows)):
                self._reindexed = True  # rows already concatenated under the old index
            p.index = i
            if p.info is not None and p.info.index != i:
                p.info = dataclasses.replace(p.info, index=i)
            for g in p.graphs.values():
                g.process = i
        run_ids = {p.info.run_id for p in self._processes if p.info and p.info.run_id}
        if len(run_ids) > 1:
            problems.append(Problem("warning", self._mixed_runs(sorted(run_ids))))
        return True

    def _mixed_runs(self, run_ids: list[str]) -> str:
        ids = ", ".join(run_ids)
        if len(self.logdirs) == 1:
            return (
                f"{self.logdir}: file sets from different runs ({ids}) "
                "share this directory; write each run to its own logdir"
            )
        roots = ", ".join(str(r) for r in self.logdirs)
        return f"file sets from different runs ({ids}) in {roots}: give the directories of one run"

    # -- the append-only files ---------------------------------------------------------------

    def _rank_may_follow(self, proc: _Process) -> bool:
        """Whether a nanscope process without a rank has appended to its ``.metadata``."""
        info = proc.info
        if info is None or info.rank is not None or not info.nanscope_version:
            return False
        path = proc.file_set.path(files.METADATA)
        try:
            size = path.stat().st_size
        except OSError:
            return False
        return size != self._metadata_sizes.get(path, size)

    def _read_metadata(self, proc: _Process, problems: list[Problem]) -> None:
        log = RecordLog(proc.file_set.path(files.METADATA))
        with contextlib.suppress(OSError):
            self._metadata_sizes[log.path] = log.path.stat().st_size
        for _, event in log.new_events(problems):
            if event.WhichOneof("what") != "debug_metadata":
                continue
            m = event.debug_metadata
            if proc.info is not None:
                # A later record: the rank became known after the process started (a
                # worker of torch.multiprocessing.spawn): the last one's rank counts.
                if m.nanscope_version and m.process_rank >= 0:
                    proc.info = dataclasses.replace(
                        proc.info, rank=m.process_rank, world_size=m.world_size
                    )
                continue
            version = m.file_version
            number = version.rpartition(":")[2]
            # isascii: int() refuses other digits ("²"); len: and numbers of 4,300+ digits.
            if (
                number.isascii()
                and number.isdigit()
                and (len(number) > 9 or int(number) > SUPPORTED_FILE_VERSION)
            ):
                problems.append(
                    Problem(
                        "warning",
                        f"{log.path}: written in format {version!r}, newer than this nanscope reads "
                        f"(debug.Event:{SUPPORTED_FILE_VERSION}); upgrade nanscope "
                        "(pip install -U nanscope); reading it as best it can",
                    )
                )
            framework = m.framework or (
                f"tensorflow {m.tensorflow_version}" if m.tensorflow_version else ""
            )
            has_ext = bool(m.nanscope_version)
            try:
                mode: TensorDebugMode | None = (
                    TensorDebugMode(m.tensor_debug_mode) if has_ext else None
                )
            except ValueError:
                mode = None
            proc.info = ProcessInfo(
                index=proc.index,
                name=proc.file_set.name,
                host=proc.file_set.host,
                run_id=m.tfdbg_run_id,
                file_version=version,
                tensorflow_version=m.tensorflow_version,
                framework=framework,
                nanscope_version=m.nanscope_version,
                rank=m.process_rank if has_ext and m.process_rank >= 0 else None,
                world_size=m.world_size,
                pid=m.pid if has_ext and m.pid else None,
                tensor_debug_mode=mode,
                circular_buffer_size=m.circular_buffer_size if has_ext else None,
                start_time=wall_time(event),
                clock_wall=m.clock_wall or None,
                clock_monotonic=m.clock_monotonic or None,
            )
        if proc.info is None:
            problems.append(
                Problem("warning", f"{log.path}: holds no metadata record (empty or damaged file)")
            )
            proc.info = ProcessInfo(
                proc.index,
                proc.file_set.name,
                proc.file_set.host,
                "",
                "",
                "",
                "",
                "",
                None,
                0,
                None,
                None,
                None,
                0.0,
            )

    def _read_sources(self, proc: _Process, problems: list[Problem]) -> bool:
        changed = False
        for offset, event in proc.source_log.new_events(problems):
            if event.WhichOneof("what") == "source_file":
                sf = event.source_file
                proc.source_files.append((sf.host_name, sf.file_path, offset, len(sf.lines)))
                changed = True
        return changed

    def _read_frames(self, proc: _Process, problems: list[Problem]) -> bool:
        changed = False
        for _, event in proc.frames_log.new_events(problems):
            if event.WhichOneof("what") == "stack_frame_with_id":
                f = event.stack_frame_with_id
                flc = f.file_line_col
                proc.frames[f.id] = (flc.file_index, flc.line, flc.func)
                changed = True
        return changed

    def _read_graphs(self, proc: _Process, problems: list[Problem]) -> bool:
        changed = False
        for _, event in proc.graphs_log.new_events(problems):
            what = event.WhichOneof("what")
            changed = True
            if what == "debugged_graph":
                g = event.debugged_graph
                info = proc.graphs.get(g.graph_id)
                if info is None:
                    info = proc.graphs[g.graph_id] = GraphInfo(
                        g.graph_id, g.graph_name, g.outer_context_id, proc.index
                    )
                else:  # ops arrived before their graph: fill in the graph's own facts
                    info.name, info.outer_graph_id = g.graph_name, g.outer_context_id
                if g.outer_context_id:
                    outer = proc.graphs.setdefault(
                        g.outer_context_id, GraphInfo(g.outer_context_id, "", "", proc.index)
                    )
                    if g.graph_id not in outer.inner_graph_ids:
                        outer.inner_graph_ids.append(g.graph_id)
            elif what == "graph_op_creation":
                op = event.graph_op_creation
                info = proc.graphs.setdefault(
                    op.graph_id, GraphInfo(op.graph_id, op.graph_name, "", proc.index)
                )
                info.ops[op.op_name] = GraphOpInfo(
                    graph_id=op.graph_id,
                    op_type=op.op_type,
                    op_name=op.op_name,
                    graph_name=op.graph_name,
                    input_names=tuple(op.input_names),
                    num_outputs=op.num_outputs,
                    output_tensor_ids=tuple(op.output_tensor_ids),
                    device_name=op.device_name,
                    host_name=op.code_location.host_name,
                    stack_frame_ids=tuple(op.code_location.stack_frame_ids),
                    module_path=op.module_path,
                    forward_stack_frame_ids=tuple(op.forward_code_location.stack_frame_ids),
                )
                info._consumers = None
            elif what == "debugged_device":
                d = event.debugged_device
                proc.devices[d.device_id] = d.device_name
        return changed

    # -- run facts ---------------------------------------------------------------------------

    @property
    def processes(self) -> list[ProcessInfo]:
        """One entry per file set, earliest first."""
        return [p.info for p in self._processes if p.info is not None]

    @property
    def run_id(self) -> str:
        ids = [p.run_id for p in self.processes if p.run_id]
        return ids[0] if ids else ""

    @property
    def tensor_debug_mode(self) -> TensorDebugMode | None:
        """The mode the dump was written in (from metadata, else from the first event)."""
        for p in self.processes:
            if p.tensor_debug_mode is not None:
                return p.tensor_debug_mode
        for kind in (TRACES, EXECUTIONS):
            for i in range(min(self.num(kind), 16)):  # the first that decodes
                event = self._event_at(kind, i).event
                if event is None:
                    continue
                what = event.graph_execution_trace if kind == TRACES else event.execution
                return mode_of(what.tensor_debug_mode)
        return None

    @property
    def framework(self) -> str:
        names = sorted({p.framework for p in self.processes if p.framework})
        return ", ".join(names)

    # -- the columnar index ------------------------------------------------------------------

    def num_executions(self) -> int:
        return len(self._exec_rows)

    def num_graph_execution_traces(self) -> int:
        return len(self._trace_rows)

    def num(self, kind: str) -> int:
        return self.num_executions() if kind == EXECUTIONS else self.num_graph_execution_traces()

    def index(self, kind: str) -> np.ndarray:
        """The index rows (:data:`nanscope.reader.INDEX_DTYPE`) of one kind of event.

        Columns ``name``/``graph`` are ids into :meth:`string`; ``process`` is
        given by :meth:`processes_of`. Do not modify the array.
        """
        return self._exec_rows if kind == EXECUTIONS else self._trace_rows

    def decoded_for_index(self) -> int:
        """How many records were decoded to build the index (0 when sidecars served)."""
        return sum(p.executions.decoded + p.traces.decoded for p in self._processes)

    def processes_of(self, kind: str) -> np.ndarray:
        return self._exec_process if kind == EXECUTIONS else self._trace_process

    def string(self, sid: int) -> str:
        return self._strings.strings[sid]

    def range_history(self) -> np.ndarray:
        """Every process's range history (``.nsranges``, :mod:`nanscope.format.headroom`):
        rows of :data:`HISTORY_DTYPE`, ``module`` a string id (:meth:`string`).

        Read again when a file changed; a file that cannot be read is a problem and
        counts as absent (the analysis then uses the index's rows).
        """
        parts = []
        for proc in self._processes:
            path = proc.file_set.path(files.RANGES)
            try:
                st = path.stat()
            except OSError:
                continue
            key = (st.st_mtime_ns, st.st_size)
            cached = self._histories.get(proc.index)
            if cached is None or cached[0] != key:
                cached = (key, self._read_history(proc, path))
                self._histories[proc.index] = cached
            if cached[1] is not None:
                parts.append(cached[1])
        return np.concatenate(parts) if parts else np.zeros(0, dtype=HISTORY_DTYPE)

    def _read_history(self, proc: _Process, path: Path) -> np.ndarray | None:
        try:
            if path.stat().st_size > MAX_HISTORY_BYTES:
                raise ValueError(
                    f"{path.stat().st_size:,} bytes, more than a writer makes "
                    f"({MAX_HISTORY_BYTES:,} at most)"
                )
            data = path.read_bytes()
            result = scan(data, str(path))
            if result.errors or result.torn:
                raise ValueError("damaged records")
            modules, points = headroom.parse_history([r.payload for r in result.records])
        except (OSError, ValueError) as exc:
            self._problem(
                "warning",
                f"{path}: the range history cannot be read ({exc}); "
                "headroom uses the recorded events only",
            )
            return None
        out = np.zeros(len(points), dtype=HISTORY_DTYPE)
        for name in headroom.POINT_DTYPE.names or ():
            out[name] = points[name]
        remap = np.array([self._strings.intern(m) for m in modules], dtype=np.uint32)
        out["module"] = remap[points["module"]] if len(points) else out["module"]
        out["process"] = proc.index
        return out

    def intern(self, value: str) -> int:
        """The string id of ``value``, numbered now if no index string names it yet."""
        return self._strings.intern(value)

    def string_id(self, value: str) -> int | None:
        return self._strings.get(value)

    def string_ids(self, prefixes: tuple[str, ...]) -> np.ndarray:
        """The ids of every string that starts with one of ``prefixes`` (op types, say)."""
        strings = self._strings.strings
        return np.array(
            [i for i, s in enumerate(strings) if s.startswith(prefixes)], dtype=np.int64
        )

    def trace_op_types(self, indices: np.ndarray | None = None) -> np.ndarray:
        """The op type (string id) of every trace, or of the traces at ``indices``.

        Op types come from the graphs; all of them are resolved once and kept,
        but a few ``indices`` (the Inf/NaN traces, say) are resolved on their own.
        """
        if self._trace_types is not None and len(self._trace_types) == len(self._trace_rows):
            return self._trace_types if indices is None else self._trace_types[indices]
        if indices is not None and len(indices) < len(self._trace_rows) // 4:
            return self._resolve_op_types(indices)
        self._trace_types = self._resolve_op_types(None)
        return self._trace_types if indices is None else self._trace_types[indices]

    def _resolve_op_types(self, indices: np.ndarray | None) -> np.ndarray:
        rows = self._trace_rows if indices is None else self._trace_rows[indices]
        procs = self._trace_process if indices is None else self._trace_process[indices]
        key = (
            procs.astype(np.uint64) << np.uint64(48)
            | rows["graph"].astype(np.uint64) << np.uint64(24)
            | rows["name"].astype(np.uint64)
        )
        uniq, inverse = np.unique(key, return_inverse=True)
        types = np.zeros(len(uniq), dtype=np.uint32)
        for i, k in enumerate(uniq.tolist()):
            proc = self._processes[k >> 48]
            graph = proc.graphs.get(self.string((k >> 24) & 0xFFFFFF))
            op = graph.ops.get(self.string(k & 0xFFFFFF)) if graph else None
            types[i] = self._strings.intern(op.op_type if op else "")
        result: np.ndarray = types[inverse]
        return result

    def nonfinite(self, kind: str) -> np.ndarray:
        """Indices of the events whose recorded outputs hold Inf or NaN, in order."""
        return np.flatnonzero(self.index(kind)["nonfinite"] == 1)

    def first_where(
        self, column: str = "nonfinite", kind: str | None = None, process: int | None = None
    ) -> tuple[int, EventRef | None]:
        """How many events have ``column`` > 0, and the first of them.

        ``column`` is ``nonfinite``, ``neg_inf``, ``pos_inf``, ``nan`` or ``inf`` (either
        infinity); ``kind`` and ``process`` narrow the search. Within a process, "first"
        is the order of execution (file order); across processes and kinds, the earliest
        wall time.
        """
        count, firsts = self._firsts(column, kind, process)
        best = min(firsts.values(), key=lambda ref: ref.wall_time, default=None)
        return count, best

    def first_by_process(self, column: str = "nonfinite") -> dict[int, EventRef]:
        """Each process's first event with ``column`` > 0 (see :meth:`first_where`), by
        process index; processes with none are left out."""
        return self._firsts(column, None, None)[1]

    def _firsts(
        self, column: str, kind: str | None, process: int | None
    ) -> tuple[int, dict[int, EventRef]]:
        firsts: dict[int, EventRef] = {}
        count = 0
        for k in (kind,) if kind else (EXECUTIONS, TRACES):
            rows, procs = self.index(k), self.processes_of(k)
            if column == "inf":
                mask = (rows["neg_inf"] > 0) | (rows["pos_inf"] > 0)
            else:
                mask = rows[column] > 0
            if process is not None:
                mask &= procs == process
            hits = np.flatnonzero(mask)
            count += int(hits.size)
            if not hits.size:
                continue
            # The first hit of each process; across kinds, the earlier by the process's clock.
            _, first_of_proc = np.unique(procs[hits], return_index=True)
            for i in hits[first_of_proc].tolist():
                ref = EventRef(k, i, int(procs[i]), float(rows["wall_time"][i]))
                seen = firsts.get(ref.process)
                if seen is None or ref.wall_time < seen.wall_time:
                    firsts[ref.process] = ref
        return count, firsts

    def first_nonfinite(self, kind: str | None = None) -> EventRef | None:
        """The first event with Inf or NaN (see :meth:`first_where`)."""
        return self.first_where("nonfinite", kind)[1]

    def gaps(self, kind: str) -> list[tuple[int, int, int]]:
        """Where events of ``kind`` are missing: ``(process, after, missing)``, in index order.

        nanscope's writer numbers each process's executions, and its traces, 1, 2, 3, ...
        as they happen (the ``sequence`` column), before a circular buffer evicts any;
        so ``missing`` events happened between index ``after`` and the next event of
        the same ``process`` (index ``after + 1``), or before the process's first event
        when ``after`` is -1, and are not in the dump. A circular buffer evicted them
        (or, rarely, the writer could not write them, and warned). Events after the
        last one in the dump are not counted: a circular buffer keeps the most recent
        ones. Events without a number (TensorFlow's dumps: 0) count as no gap.
        """
        procs, after, missing = self._gap_arrays(kind)
        return list(zip(procs.tolist(), after.tolist(), missing.tolist(), strict=True))

    def evicted(self, kind: str) -> int:
        """How many events of ``kind`` are missing from the dump: all :meth:`gaps`, summed,
        and those a closed writer numbered after the last event of its process that the
        dump holds (lost at its end, which no gap between two held events shows)."""
        return int(self._gap_arrays(kind)[2].sum()) + self._lost_at_end(kind)

    def _lost_at_end(self, kind: str) -> int:
        """Events of ``kind`` each closed writer numbered past its process's last held one."""
        lost = 0
        seq, procs = None, None
        for process, drops in self.writer_drops().items():
            issued = drops.issued_executions if kind == EXECUTIONS else drops.issued_traces
            if issued is None:
                continue
            if seq is None:
                seq, procs = self.index(kind)["sequence"], self.processes_of(kind)
            mine = seq[procs == process]
            lost += max(0, issued - (int(mine.max()) if mine.size else 0))
        return lost

    def _gap_arrays(self, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`gaps` as three arrays: process, index before the gap (-1: none), missing."""
        rows = self.index(kind)
        cached = self._gaps.get(kind)
        if cached is not None and cached[0] is rows and cached[1] == len(rows):
            return cached[2]
        seq = rows["sequence"]
        procs = self.processes_of(kind)
        numbered: np.ndarray | None = None
        if seq.size and int(seq.min()) <= 0:  # some events without a number (TensorFlow's)
            numbered = np.flatnonzero(seq > 0)
            seq, procs = seq[numbered], procs[numbered]
        n = len(seq)
        # In slices: temporaries over a 25M-row index would cost hundreds of MB.
        found_between: list[np.ndarray] = []
        found_starts: list[np.ndarray] = []
        for lo in range(0, max(0, n - 1), _GAP_SLICE):
            hi = min(n - 1, lo + _GAP_SLICE)
            new_proc = procs[lo + 1 : hi + 1] != procs[lo:hi]
            # Between two numbered events of one process: numbers skipped (out of order,
            # which nanscope's writer never does: no gap).
            skipped = seq[lo + 1 : hi + 1] - seq[lo:hi] > 1
            found_between.append(np.flatnonzero(skipped & ~new_proc) + lo)
            found_starts.append(np.flatnonzero(new_proc) + lo + 1)
        between = np.concatenate([np.zeros(0, np.int64), *found_between]).astype(np.int64)
        step = seq[between + 1] - seq[between] - 1
        # Before each process's first numbered event: the numbers below it.
        firsts = np.concatenate([np.zeros(1 if n else 0, np.int64), *found_starts]).astype(np.int64)
        before = firsts[seq[firsts] > 1]
        where = np.concatenate([before, between + 1])  # position of the event after each gap
        order = np.argsort(where, kind="stable")
        where = where[order]
        missing = np.concatenate([seq[before] - 1, step])[order]
        after = np.concatenate([np.full(len(before), -1, np.int64), between])[order]
        if numbered is not None:
            after = np.where(after >= 0, numbered[np.maximum(after, 0)], -1)
        result = (procs[where].astype(np.int64), after.astype(np.int64), missing.astype(np.int64))
        self._gaps[kind] = (rows, len(rows), result)
        return result

    def index_json(self, kind: str, index: int) -> dict[str, Any]:
        """What the index alone says of an event, as its list row (``counts`` unknown)."""
        row = self.index(kind)[index]
        process = int(self.processes_of(kind)[index])
        flag = int(row["nonfinite"])
        graph_id = self.string(int(row["graph"]))
        common = {
            "index": index,
            "process": process,
            "step": int(row["step"]),
            "wall_time": float(row["wall_time"]),
            "graph_id": graph_id,
            "nonfinite": None if flag < 0 else bool(flag),
            "counts": None,
            "shape": None,
        }
        if kind == EXECUTIONS:
            return {
                **common,
                "op_type": self.string(int(row["name"])),
                "phase": PHASES.get(int(row["phase"]), ""),
                "num_outputs": int(row["slot"]),
            }
        graph = self.graph(graph_id, process)
        op_name = self.string(int(row["name"]))
        op = graph.ops.get(op_name) if graph else None
        return {
            **common,
            "op_name": op_name,
            "op_type": op.op_type if op else "",
            "output_slot": int(row["slot"]),
            "graph_name": graph.name if graph else "",
            "device": "",
        }

    # -- decoding single events --------------------------------------------------------------

    def _event_at(self, kind: str, index: int) -> _Record:
        """The record of event ``index``, decoded (``event`` None where it cannot be read
        now: why is reported among the problems, and in ``where``)."""
        n = self.num(kind)
        if not 0 <= index < n:
            raise IndexError(f"{kind} index {index} out of range (0..{n - 1})")
        row = self.index(kind)[index]
        proc = self._processes[int(self.processes_of(kind)[index])]
        efile = proc.executions if kind == EXECUTIONS else proc.traces
        path = str(efile.path)
        offset, length = int(row["offset"]), int(row["length"])
        where = f"{path}: record at byte offset {offset}"
        try:
            blob = efile.read(offset, length)
        except FileReplaced as err:
            # The index is older than the file: not damage, and the next update() reads
            # the new file (which clears this warning).
            return self._stale(proc, path, offset, f"{where}: not read, the file was {err.reason}")
        except OSError as exc:  # an I/O error: the record is unreadable, whatever it holds
            return self._unreadable(proc, path, offset, f"{where}: {exc.strerror or exc}")
        result = scan(blob, path, base=offset, limit=1, resync_limit=0)
        if not result.records:
            if not result.errors:  # cut short: the file was truncated since it was indexed
                return self._stale(proc, path, offset, f"{where}: record missing (file changed)")
            # Sound when it was indexed, damaged since (or damage in several records that
            # the bulk check of a sidecar's rows missed, 2^-32 odds).
            return self._unreadable(proc, path, offset, describe(result.errors[0]))
        try:
            event = parse_event(result.records[0].payload)
        except DecodeError as exc:
            return self._unreadable(proc, path, offset, f"{where}: {exc}")
        return _Record(proc, event, where, path, offset)

    def _stale(self, proc: _Process, path: str, offset: int, why: str) -> _Record:
        """An indexed record that its file no longer holds, which the next :meth:`update`
        sets right: one warning per file (not a loss: that update reads the file as it is
        now, and drops the warning), its event shown as not read."""
        message = f"{why}; call update() to read the file as it is now"
        self._problems[f"stale {path}"] = Problem("warning", message, file=path, offset=offset)
        return _Record(proc, None, message, path, offset)

    def _unreadable(self, proc: _Process, path: str, offset: int, why: str) -> _Record:
        """An indexed record that cannot be decoded: reported, its event shown as lost."""
        message = f"{why}; the event is not shown"
        self._problem("error", message, incomplete=True, file=path, offset=offset)
        return _Record(proc, None, message, path, offset)

    def _damage(self, record: _Record, found: list[str]) -> tuple[str, ...]:
        """Report what decoding one record found wrong (once each); the messages, as they read."""
        messages = tuple(f"{record.where}: {what}" for what in found)
        for m in messages:
            self._problem("error", m, file=record.file, offset=record.offset)
        return messages

    def _lost_execution(self, index: int, record: _Record) -> Execution:
        """Execution ``index`` whose record cannot be read: what the index says of it, no
        output recorded, and why in its ``problems``."""
        row = self._exec_rows[index]
        proc = record.proc
        mode = proc.info.tensor_debug_mode if proc.info else None
        return Execution(
            index=index,
            process=proc.index,
            wall_time=float(row["wall_time"]),
            step=int(row["step"]),
            sequence=int(row["sequence"]),
            op_type=self.string(int(row["name"])),
            num_outputs=int(row["slot"]),
            graph_id=self.string(int(row["graph"])),
            input_tensor_ids=(),
            output_tensor_ids=(),
            output_tensor_device_ids=(),
            tensor_debug_mode=mode or TensorDebugMode.UNSPECIFIED,
            debug_tensor_values=None,
            host_name="",
            stack_frame_ids=(),
            health=health.UNKNOWN,
            phase=int(row["phase"]),
            problems=(record.where,),
        )

    def _lost_trace(self, index: int, record: _Record) -> GraphExecutionTrace:
        """Trace ``index`` whose record cannot be read (see :meth:`_lost_execution`)."""
        row = self._trace_rows[index]
        proc = record.proc
        mode = proc.info.tensor_debug_mode if proc.info else None
        graph_id, op_name = self.string(int(row["graph"])), self.string(int(row["name"]))
        graph = proc.graphs.get(graph_id)
        op = graph.ops.get(op_name) if graph else None
        return GraphExecutionTrace(
            index=index,
            process=proc.index,
            wall_time=float(row["wall_time"]),
            step=int(row["step"]),
            sequence=int(row["sequence"]),
            op_name=op_name,
            op_type=op.op_type if op else "",
            output_slot=int(row["slot"]),
            graph_id=graph_id,
            graph_ids=tuple(self._graph_chain(proc, graph_id)),
            tensor_debug_mode=mode or TensorDebugMode.UNSPECIFIED,
            debug_tensor_value=None,
            device_name="",
            health=health.UNKNOWN,
            graph_name=graph.name if graph else "",
            problems=(record.where,),
        )

    def execution(self, index: int) -> Execution:
        """Execution ``index`` (0-based over all processes), decoded.

        A record that cannot be read (damaged since it was indexed, or its file replaced
        since the last :meth:`update`) raises nothing: the execution holds what the index
        says of it, no output, and why in its ``problems`` (also among the reader's).
        """
        record = self._event_at(EXECUTIONS, index)
        if record.event is None:
            return self._lost_execution(index, record)
        proc, event = record.proc, record.event
        ex = event.execution
        mode = mode_of(ex.tensor_debug_mode)
        found: list[str] = []
        values: list[Any] = tensor_values(list(ex.tensor_protos), mode, found)
        views = (
            output_views(ex, values, found)
            if ex.output_views and mode == TensorDebugMode.FULL_TENSOR
            else {}
        )
        inputs = tensor_values(list(ex.input_tensor_protos), mode, found, "input")
        # Health is decoded here, once per event; everything downstream uses it as it is.
        outputs = () if mode == TensorDebugMode.NO_TENSOR else health.per_output(mode, values)
        summaries: tuple[np.ndarray | None, ...] | None
        full: tuple[np.ndarray | None, ...] | None = None
        if mode in (TensorDebugMode.NO_TENSOR, TensorDebugMode.FULL_TENSOR):
            summaries = None
            if mode == TensorDebugMode.FULL_TENSOR:
                full = tuple(values)
                if views:
                    full = self._view_values(proc, index, full, views, found)
        else:
            summaries = tuple(values)
        return Execution(
            index=index,
            process=proc.index,
            wall_time=wall_time(event),
            # Counted by the reader for TensorFlow's dumps, which record none.
            step=event.step or int(self._exec_rows["step"][index]),
            sequence=ex.sequence,
            op_type=ex.op_type,
            num_outputs=ex.num_outputs,
            graph_id=ex.graph_id,
            input_tensor_ids=tuple(ex.input_tensor_ids),
            output_tensor_ids=tuple(ex.output_tensor_ids),
            output_tensor_device_ids=tuple(ex.output_tensor_device_ids),
            tensor_debug_mode=mode,
            debug_tensor_values=summaries,
            host_name=ex.code_location.host_name,
            stack_frame_ids=tuple(ex.code_location.stack_frame_ids),
            health=health.combined(outputs),
            output_health=outputs,
            module_path=ex.module_path,
            phase=ex.phase,
            forward_sequence=ex.forward_sequence,
            forward_stack_frame_ids=tuple(ex.forward_code_location.stack_frame_ids),
            input_debug_tensor_values=tuple(inputs),
            input_health=health.per_output(mode, inputs),
            collective=_collective(ex),
            tensor_values=full,
            output_ranges=_output_ranges(ex, mode, values),
            output_statistics=_output_statistics(ex.output_statistics, mode, len(values)),
            problems=self._damage(record, found),
        )

    def _view_values(
        self,
        proc: _Process,
        index: int,
        values: tuple[Any, ...],
        views: dict[int, ValueView],
        found: list[str],
    ) -> tuple[np.ndarray | None, ...]:
        """FULL_TENSOR values with each view's read from the record that holds them
        (``None`` where that record was not kept, e.g. by a circular buffer)."""
        out = list(values)
        for slot, view in views.items():
            out[slot] = None
            if view.sequence == 0:
                continue  # values too large to record (docs/FORMAT.md): no record holds them
            at = self._execution_of(proc.index, view.sequence, index)
            if at is None:
                continue
            event = self._event_at(EXECUTIONS, at).event
            if event is None:
                continue  # that record's own problem, reported as it was read
            protos = event.execution.tensor_protos
            if view.slot >= len(protos):
                continue
            (source,) = tensor_values([protos[view.slot]], TensorDebugMode.FULL_TENSOR)
            if source is None:
                continue
            try:
                out[slot] = view_of(source, view)
            except ValueError as exc:
                found.append(f"output {slot}: {exc}; not shown")
        return tuple(out)

    def _execution_of(self, process: int, sequence: int, before: int) -> int | None:
        """The index of ``process``'s execution ``sequence``, looked for backwards from
        ``before`` (a view's values were recorded shortly before it, as a rule)."""
        rows, procs = self._exec_rows, self._exec_process
        lo = max(0, before - 4096)
        for begin, end in ((lo, before), (0, lo), (before, len(rows))):
            hits = np.flatnonzero(
                (rows["sequence"][begin:end] == sequence) & (procs[begin:end] == process)
            )
            if hits.size:
                return begin + int(hits[-1])
        return None

    def executions(self, begin: int = 0, end: int | None = None) -> list[Execution]:
        end = self.num_executions() if end is None else min(end, self.num_executions())
        return [self.execution(i) for i in range(max(0, begin), end)]

    def trace(self, index: int) -> GraphExecutionTrace:
        """Graph execution trace ``index`` (0-based over all processes), decoded (a record
        that cannot be read raises nothing: see :meth:`execution`)."""
        record = self._event_at(TRACES, index)
        if record.event is None:
            return self._lost_trace(index, record)
        proc, event = record.proc, record.event
        tr = event.graph_execution_trace
        mode = mode_of(tr.tensor_debug_mode)
        found: list[str] = []
        values = (
            tensor_values([tr.tensor_proto], mode, found) if tr.HasField("tensor_proto") else [None]
        )
        value = values[0]
        summary = (
            None if mode in (TensorDebugMode.NO_TENSOR, TensorDebugMode.FULL_TENSOR) else value
        )
        graph = proc.graphs.get(tr.tfdbg_context_id)
        op = graph.ops.get(tr.op_name) if graph else None
        return GraphExecutionTrace(
            index=index,
            process=proc.index,
            wall_time=wall_time(event),
            step=event.step or int(self._trace_rows["step"][index]),
            sequence=tr.sequence,
            op_name=tr.op_name,
            op_type=op.op_type if op else "",
            output_slot=tr.output_slot,
            graph_id=tr.tfdbg_context_id,
            graph_ids=tuple(self._graph_chain(proc, tr.tfdbg_context_id)),
            tensor_debug_mode=mode,
            debug_tensor_value=summary,
            device_name=tr.device_name,
            health=health.of_summary(mode, value),
            tensor_value=value if mode == TensorDebugMode.FULL_TENSOR else None,
            graph_name=graph.name if graph else "",
            problems=self._damage(record, found),
            iteration=tr.iteration - 1,
            output_statistics=_output_statistics(tr.output_statistics, mode, 1),
        )

    def traces(self, begin: int = 0, end: int | None = None) -> list[GraphExecutionTrace]:
        n = self.num_graph_execution_traces()
        end = n if end is None else min(end, n)
        return [self.trace(i) for i in range(max(0, begin), end)]

    # -- graphs, stacks, sources -------------------------------------------------------------

    def _graph_chain(self, proc: _Process, graph_id: str) -> list[str]:
        chain: list[str] = []
        g = proc.graphs.get(graph_id)
        seen: set[str] = set()
        while g is not None and g.graph_id not in seen:
            seen.add(g.graph_id)
            chain.append(g.graph_id)
            g = proc.graphs.get(g.outer_graph_id) if g.outer_graph_id else None
        if not chain and graph_id:
            chain.append(graph_id)
        chain.reverse()
        return chain

    def graph_chain(self, graph_id: str, process: int = 0) -> list[str]:
        """``graph_id`` and the graphs enclosing it, outermost first."""
        return self._graph_chain(self._processes[process], graph_id) if self._processes else []

    def graphs(self, process: int = 0) -> dict[str, GraphInfo]:
        return self._processes[process].graphs if self._processes else {}

    def graph(self, graph_id: str, process: int = 0) -> GraphInfo | None:
        return self.graphs(process).get(graph_id)

    def graph_op(self, graph_id: str, op_name: str, process: int = 0) -> GraphOpInfo | None:
        g = self.graph(graph_id, process)
        return g.ops.get(op_name) if g else None

    def devices(self, process: int = 0) -> dict[int, str]:
        return dict(self._processes[process].devices) if self._processes else {}

    def stack_frames(self, frame_ids: Sequence[str], process: int = 0) -> list[StackFrame]:
        """Resolve frame ids (outermost first); unknown ids are skipped."""
        proc = self._processes[process]
        out = []
        for fid in frame_ids:
            f = proc.frames.get(fid)
            if f is None:
                continue
            file_index, line, func = f
            if 0 <= file_index < len(proc.source_files):
                host, path = proc.source_files[file_index][:2]
            else:
                host, path = "", f"<file #{file_index}>"
            out.append(StackFrame(host, path, line, func, file_index))
        return out

    def stack(self, event: Execution | GraphOpInfo, process: int = 0) -> list[StackFrame]:
        proc = event.process if isinstance(event, Execution) else process
        return self.stack_frames(event.stack_frame_ids, proc)

    def source_files(self, process: int = 0) -> list[SourceFileInfo]:
        if not self._processes:
            return []
        proc = self._processes[process]
        return [
            SourceFileInfo(i, process, host, path, n)
            for i, (host, path, _, n) in enumerate(proc.source_files)
        ]

    def source_lines(self, file_index: int, process: int = 0) -> list[str]:
        """The recorded lines of a source file (empty when the writer did not snapshot it)."""
        proc = self._processes[process]
        if not 0 <= file_index < len(proc.source_files):
            raise IndexError(f"source file index {file_index} out of range")
        offset = proc.source_files[file_index][2]
        event = proc.source_log.read_event(offset)
        return list(event.source_file.lines)


_GAP_SLICE = 1 << 22


def _whole(rows: np.ndarray) -> bool:
    """Whether a file's events are its whole history as far as their sequence numbers
    tell: unnumbered (TensorFlow's), or numbered 1, 2, 3, ... without a gap."""
    seq = rows["sequence"]
    if not len(seq) or not seq.any():
        return True
    return bool(seq[0] == 1 and np.all(np.diff(seq) == 1))


class _MergedRoom:
    """One array for the merged index, filled as each process's sidecar is read.

    Read one by one and then merged, a many-process index is held twice at the
    peak (256 ranks x 100,000 events: 3.2 GB instead of 1.6). Each file's sidecar
    rows are read straight into the next free part of one array sized from the
    sidecars' lengths (pages no row reaches are never touched); the processes'
    files then hold views of it. A file that the sidecar does not serve alone
    (a scanned tail, damage) leaves the room, and the index is merged by copying.
    """

    def __init__(self, buffer: np.ndarray | None) -> None:
        self.buffer = buffer
        self.filled = 0
        self.parts: list[EventFile] = []

    def update(self, f: EventFile, problems: list[Problem]) -> bool:
        if self.buffer is None:
            return f.update(problems)
        changed = f.update(problems, into=self.buffer[self.filled :])
        n = len(f.rows)
        # In place: its rows start where the room's free part does (and are n rows of it).
        start = self.buffer[self.filled :].__array_interface__["data"][0]
        if n and f.rows.__array_interface__["data"][0] != start:
            self.buffer = None  # not read in place: merge by copying
            return changed
        self.filled += n
        self.parts.append(f)
        return changed

    def merged(self, files_: list[EventFile]) -> np.ndarray | None:
        """The merged index, when every file's rows were read into the room in order."""
        if self.buffer is None or self.parts != files_:
            return None
        merged = self.buffer[: self.filled]
        start = 0
        for f in files_:
            n = len(f.rows)
            f.adopt(merged[start : start + n])
            start += n
        return merged


def _output_ranges(
    ex: pb.Execution, mode: TensorDebugMode, values: list[np.ndarray | None]
) -> tuple[tuple[float, float] | None, ...]:
    """Each output's ranges pair (see :mod:`nanscope.format.headroom`), where recorded."""
    if mode == TensorDebugMode.FULL_TENSOR:
        # A view's values are counted where they were made (see the FULL_HEALTH ranges).
        found = [headroom.of_value(v) if isinstance(v, np.ndarray) else None for v in values]
        return tuple(None if f is None else f[1] for f in found)
    if mode == TensorDebugMode.FULL_HEALTH and ex.output_ranges:
        return tuple(headroom.pairs_of(ex.output_ranges))
    return ()


def _output_statistics(
    field: Sequence[float], mode: TensorDebugMode, outputs: int
) -> tuple[statistics.Statistics | None, ...]:
    """Each output's statistics (``output_statistics``, :mod:`nanscope.format.statistics`),
    one entry per output; empty where the record holds none (or is not FULL_HEALTH)."""
    if mode != TensorDebugMode.FULL_HEALTH or not field:
        return ()
    found = statistics.per_output(field)
    # Aligned with the outputs whatever the field's length (a damaged record's too).
    return (found + (None,) * outputs)[: max(outputs, 0)]


def _collective(ex: pb.Execution) -> Collective | None:
    if not ex.HasField("collective"):
        return None
    c = ex.collective
    return Collective(
        group=c.group,
        kind=c.kind,
        sequence=c.sequence,
        group_desc=c.group_desc,
        group_size=c.group_size,
        peer=c.peer if c.kind in ("send", "recv") else None,
    )


def _roots(logdir: DumpRoots) -> list[Path]:
    """The dump roots given (one path or several), in order, each once."""
    given = [logdir] if isinstance(logdir, (str, os.PathLike)) else list(logdir)
    if not given:
        raise files.DumpNotFoundError("no dump root given; pass the logdir the program wrote to")
    roots: dict[str, Path] = {}
    for g in given:
        # Compared resolved, so that one directory named twice is not read twice.
        roots.setdefault(os.path.realpath(g), Path(g))
    return list(roots.values())


def open_dump(logdir: DumpRoots) -> DumpReader:
    """Open a dump root, or several roots of one run, for reading (see :class:`DumpReader`)."""
    return DumpReader(logdir)
