"""The dump writer: one file set per process, fed by any thread, written by one.

The training thread's cost per event is building a small object and one
``deque.append``; a background thread turns events into records, keeps the
circular buffers and the sidecar index, and hands the bytes to a third thread
that writes them (events/_io.py). Files reach the disk every
``flush_interval`` seconds, on :meth:`DumpWriter.flush`, and on close (which
runs at exit, on uncaught exceptions and on SIGTERM/SIGINT).

Nothing the disk does reaches the training program: an I/O error or a write
that hangs is reported once on stderr and in the dump's ``.nsdrops`` file,
the events wait in bounded memory (the circular buffers, or the newest
``hold_limit`` events and the first Inf/NaN's windows) and the write is
retried with backoff; a producer faster than the writer waits at most
``backpressure_timeout`` seconds, then events are shed and counted, never those
that hold the first Inf/NaN or their windows (events/_shed.py). Both bounds
count bytes as well as events (FULL_TENSOR events hold whole tensors), and a
FULL_TENSOR record keeps its values only up to ``max_value_bytes``.

What each queued item counts for (events, bytes, Inf/NaN) is in events/_backlog.py; the
writer's counters and the ``.nsdrops`` report made of them, in events/_drops.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import secrets
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

from nanscope._version import __version__
from nanscope.events import _lifecycle as lifecycle
from nanscope.events._backlog import (
    EVENT_BYTES,
    EVENTS_IN,
    call_health,
    execution_health,
    item_bytes,
    nonfinite_in,
    subset_batch,
    values_bytes,
)
from nanscope.events._drops import WriterStats, clock, drops_line, drops_report, reported
from nanscope.events._encode import MAX_VALUE_BYTES, Encoder, resolve
from nanscope.events._history import RangeHistory
from nanscope.events._io import DiskWorker, Op, Overwrite, Replace, StalledError, reason
from nanscope.events._model import ExecutionEvent, Graph, GraphOp, TraceEvent
from nanscope.events._queue import (
    CloseRequest,
    EncodedExecution,
    EncodedExecutions,
    ExecutionBatch,
    FlushRequest,
    GraphCallTraces,
    NewDevice,
    NewSourceFile,
    NewStackFrame,
    QueuedExecution,
    QueuedGraph,
    QueuedGraphOp,
    QueuedTrace,
    QueueItem,
)
from nanscope.events._shed import Piece, Shedder
from nanscope.events._stacks import SnapshotPolicy, StackInterner, read_source_lines
from nanscope.events._streams import AppendFile, EventStream
from nanscope.format import files, sidecar
from nanscope.format.health import UNKNOWN_ROW, IndexRow, index_row
from nanscope.format.modes import TensorDebugMode, parse_mode
from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.format.records import frame

FILE_VERSION = "debug.Event:1"


def default_run_id() -> str:
    """The run id shared by all processes of one run.

    ``NANSCOPE_RUN_ID`` wins; then torchrun's ``TORCHELASTIC_RUN_ID``; then,
    where that is ``none`` (torchrun's static rendezvous: ``--master-addr`` and
    ``--master-port``, as in multi-node jobs) or unset, one derived from
    ``MASTER_ADDR:MASTER_PORT``, which every rank of a ``torch.distributed`` run
    shares; else a fresh id (like TensorFlow: 8 characters of a uuid4).
    """
    for var in ("NANSCOPE_RUN_ID", "TORCHELASTIC_RUN_ID"):
        value = os.environ.get(var, "")
        if value and value != "none":
            return value
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    if addr and port:
        return hashlib.sha1(f"{addr}:{port}".encode()).hexdigest()[:8]
    return uuid.uuid4().hex[:8]


def default_rank() -> int | None:
    for var in ("NANSCOPE_RANK", "RANK"):
        value = os.environ.get(var)
        if value is not None and value.lstrip("-").isdigit():
            return int(value)
    return None


def default_world_size() -> int:
    """``WORLD_SIZE`` (set by torchrun), else 0 (unknown)."""
    value = os.environ.get("WORLD_SIZE", "")
    return int(value) if value.isdigit() else 0


MAX_BACKOFF = 30.0  # seconds between retries of a failing disk, at most
HISTORY_INTERVAL = 5.0  # seconds between rewrites of the range history (and at close)


class DumpWriter:
    """Writes one tfdbg2 file set.

    **Arguments:**

    - ``logdir``: the directory (created if needed).
    - ``tensor_debug_mode``: a :class:`~nanscope.format.modes.TensorDebugMode`,
      or its name or number; summaries handed to the writer must use its layout.
    - ``circular_buffer_size``: as in TensorFlow, the number of most recent
      ``.execution`` and ``.graph_execution_traces`` events kept; ``<= 0`` keeps
      all. In addition, ``origin_window`` events on each side of a few
      *anchors* are always kept: the first non-finite event of each (op type,
      has NaN) pair, up to :data:`~nanscope.events._streams.MAX_ANCHORS` per
      file, and the first event with NaN (docs/FORMAT.md).
    - ``framework``: e.g. ``"torch 2.13.0"``, recorded in the metadata.
    - ``run_id``, ``rank``, ``world_size``: identity in a multi-process run
      (defaults: :func:`default_run_id`, ``NANSCOPE_RANK``/``RANK``,
      ``WORLD_SIZE``); the rank (or else the pid) goes into the file names.
    - ``flush_interval``: seconds between flushes; this bounds what a process
      killed by SIGKILL loses.
    - ``source_snapshots``: ``"user"`` records the lines of the user's own files
      (not of the standard library or installed packages), ``"all"`` or ``"none"``.
    - ``max_queue``, ``max_queue_bytes``: events, and their bytes, waiting for the
      background thread beyond which the producing thread waits (bounds memory
      when events come faster than the writer takes them).
    - ``backpressure_timeout``: seconds a producer waits for the writer at most;
      then events are shed (counted) until the writer has caught up with half
      of both bounds, keeping the first Inf/NaN of each (op type, has NaN) pair
      with its window on each side, and the other non-finite events while the
      backlog stays below twice the bounds (events/_shed.py).
    - ``io_timeout``: seconds after which a write that has not returned counts
      as a hung disk, or a slow one when it still makes progress (the writer
      then holds events in bounded memory; at close it waits for a slow disk,
      until ``close``'s timeout, but not for a hung one).
    - ``hold_limit``, ``hold_limit_bytes``: while the disk takes nothing, an
      unbounded dump (``circular_buffer_size <= 0``) keeps the newest this many
      events of each kind, and at most this many bytes of them (and the
      anchors' windows); older ones are dropped, and counted.
    - ``max_value_bytes``: FULL_TENSOR: the values one record holds at most
      (:data:`MAX_VALUE_BYTES`); past it an output is written with its shape and
      health counts only (docs/FORMAT.md).
    - ``thread_init``: called first on the writer's thread (a backend marks the
      thread as its own, so that nothing it runs there is recorded).

    Raises ``OSError`` (with a one-line message) only here, when the dump's
    files cannot be created; afterwards no method raises for the disk's sake.
    """

    def __init__(
        self,
        logdir: str | os.PathLike[str],
        tensor_debug_mode: TensorDebugMode | str | int = "FULL_HEALTH",
        circular_buffer_size: int = 1000,
        *,
        framework: str = "",
        run_id: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        host_name: str | None = None,
        origin_window: int = 100,
        flush_interval: float = 1.0,
        source_snapshots: SnapshotPolicy = "user",
        max_queue: int = 200_000,
        backpressure_timeout: float = 5.0,
        io_timeout: float = 10.0,
        hold_limit: int = 20_000,
        max_queue_bytes: int = 256 << 20,
        hold_limit_bytes: int = 256 << 20,
        max_value_bytes: int = MAX_VALUE_BYTES,
        thread_init: Callable[[], None] | None = None,
    ) -> None:
        # A mode given as a TensorDebugMode was parsed by the caller: this only checks
        # that it can be written.
        self.mode = parse_mode(tensor_debug_mode)
        self.circular_buffer_size = int(circular_buffer_size)
        self.logdir = Path(logdir)
        try:
            self.logdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OSError(f"cannot create dump directory {self.logdir}: {exc.strerror}") from exc
        self.run_id = run_id or default_run_id()
        self.rank = default_rank() if rank is None else rank
        self.host_name = host_name or socket.gethostname()
        self.pid = os.getpid()
        # Clock anchors, taken together (DebugMetadata.clock_wall/clock_monotonic).
        self.start_time, self.start_monotonic = time.time(), time.monotonic()
        self.flush_interval = flush_interval
        self.origin_window = max(0, origin_window)
        self.max_queue = max_queue
        self.backpressure_timeout = backpressure_timeout
        self.io_timeout = io_timeout
        self.hold_limit = max(1, hold_limit)
        self.max_queue_bytes = max(1, max_queue_bytes)
        self.hold_limit_bytes = max(1, hold_limit_bytes)
        self.max_value_bytes = max(0, max_value_bytes)
        self.stats = WriterStats()
        self._thread_init = thread_init

        self._queue: deque[QueueItem] = deque()
        self._seq_lock = threading.Lock()
        self._exec_next = 1  # the next execution's sequence number
        self._trace_seq = 1
        self._devices: dict[str, int] = {}
        # (graph id, op name) -> op type, from the graph ops written: the traces'
        # anchor rule groups non-finite traces by op type, like executions.
        self._graph_op_types: dict[tuple[str, str], str] = {}
        self._symbolic_next = 1  # the next symbolic tensor id for a graph op written without any
        self.stacks = StackInterner(self._queue.append, source_snapshots)
        # FULL_TENSOR: an output (or input) whose values would take its record past
        # max_value_bytes is written with its shape and health counts only: a record stays
        # well below the 2 GiB the reader accepts (nanscope.format.records.MAX_RECORD_SIZE),
        # and decoding one costs a few times its size in memory.
        self._encoder = Encoder(self.mode, self.host_name, self.stacks.stacks, self.max_value_bytes)
        self._closed = False
        self._wake = threading.Event()
        self._warned = False
        self._backlog = 0  # events enqueued and not yet processed (written under _seq_lock)
        self._backlog_bytes = 0  # and their bytes (see _backlog.item_bytes)
        self._full_tensor = self.mode == TensorDebugMode.FULL_TENSOR

        # The disk's state, all kept by the writer's thread.
        self._shedding = False  # producers drop events (the writer thread fell behind)
        # What producers shed, by kind (under _seq_lock), and events a recorder let go of
        # before they reached the writer (count_dropped).
        self._shed_exec = Shedder(origin_window)
        self._shed_trace = Shedder(origin_window)
        self._recorder_dropped = 0
        self._recorder_nonfinite = 0
        # Events that were queued when closing on a failed disk, only counted (not written).
        self._abandoned_executions = 0
        self._abandoned_traces = 0
        self._abandoned_nonfinite = 0
        self._told_shedding = False
        self._fault: BaseException | None = None  # what the disk does wrong now
        self._faults: list[dict[str, Any]] = []  # each outage: reason, error, since, until
        self._retry: list[Op] = []  # what a failed job left to do, in order
        self._next_try = 0.0
        self._backoff = 0.0
        self._last_write = self.start_time  # when a disk job last succeeded
        self._report_due = False  # the .nsdrops report is out of date
        self._reported: tuple[int, ...] = ()  # the counters the last report was made from
        self._close_deadline = 0.0
        self._abandon = False  # closing on a failed disk: queued events are only counted
        self._closing = False  # close() was called: the writer thread decides _abandon

        try:
            self._create_files(origin_window, framework, world_size)
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot write the dump in {self.logdir}: {exc.strerror or exc}"
            ) from exc
        self._disk = DiskWorker()
        self._thread = threading.Thread(target=self._run, name="nanscope-writer", daemon=True)
        self._thread.start()
        lifecycle.register(self)  # which also forgets it in a forked child (forget_in_child)

    def _create_files(self, origin_window: int, framework: str, world_size: int | None) -> None:
        # The metadata file is created exclusively: should a tag ever repeat, the
        # next one is tried, so that two processes can never share a file set.
        for _ in range(100):
            host = files.process_host(self.host_name, self.rank, self.pid, secrets.token_hex(3))
            self.prefix = files.file_set_prefix(self.logdir, self.start_time, host)
            self.file_set = files.FileSet(self.prefix)
            try:
                metadata = AppendFile(self.file_set.path(files.METADATA), exclusive=True)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"no free file-set name in {self.logdir}")
        # Then the others, in TensorFlow's creation order.
        self._source_files = AppendFile(self.file_set.path(files.SOURCE_FILES))
        self._stack_frames = AppendFile(self.file_set.path(files.STACK_FRAMES))
        self._graphs = AppendFile(self.file_set.path(files.GRAPHS))
        self._executions = EventStream(
            self.file_set.path(files.EXECUTION),
            self.circular_buffer_size,
            origin_window,
            self._encode_execution,
        )
        self._traces = EventStream(
            self.file_set.path(files.GRAPH_EXECUTION_TRACES),
            self.circular_buffer_size,
            origin_window,
            self._encode_trace,
            self._trace_op_type,
        )
        meta = pb.DebugEvent(wall_time=self.start_time)
        md = meta.debug_metadata
        md.tensorflow_version = ""
        md.file_version = FILE_VERSION
        md.tfdbg_run_id = self.run_id
        md.framework = framework
        md.nanscope_version = __version__
        md.process_rank = self.rank if self.rank is not None else -1
        md.world_size = default_world_size() if world_size is None else world_size
        md.pid = self.pid
        md.tensor_debug_mode = self.mode.value  # type: ignore[assignment]
        md.circular_buffer_size = self.circular_buffer_size
        md.clock_wall, md.clock_monotonic = self.start_time, self.start_monotonic
        metadata.write(meta.SerializeToString())
        for op in metadata.take():
            op.run()
        metadata.close()
        self._metadata = meta
        # Reserved now, while the disk has room (see _drops.DROPS_SIZE).
        # Per module and step, the |x| extremes, beyond the circular buffer's reach.
        self._history = RangeHistory()
        self._history_due = 0.0
        self._drops_fd = os.open(
            self.file_set.path(files.DROPS), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644
        )
        Overwrite(self._drops_fd, self._drops_report()).run()

    def set_rank(self, rank: int, world_size: int) -> None:
        """Record the process's rank, known only now (``init_process_group`` of a worker that
        ``torch.multiprocessing.spawn`` started): one more metadata record, appended; readers
        take the rank and world size of the last (docs/FORMAT.md). Never raises."""
        if self._closed or (rank, world_size) == (
            self.rank,
            self._metadata.debug_metadata.world_size,
        ):
            return
        self.rank = rank
        meta = pb.DebugEvent()
        meta.CopyFrom(self._metadata)
        meta.debug_metadata.process_rank = rank
        meta.debug_metadata.world_size = world_size
        try:
            metadata = AppendFile(self.file_set.path(files.METADATA))
            metadata.write(meta.SerializeToString())
            for op in metadata.take():
                op.run()
            metadata.close()
        except OSError as exc:
            print(f"nanscope: could not record this process's rank: {exc}", file=sys.stderr)
            return
        self._metadata = meta

    # -- the producer side (any thread) ------------------------------------------------------

    def capture_stack(self, frame: FrameType | None = None, limit: int = 64) -> int:
        """The stack id of the caller's Python stack (nanscope's frames left out)."""
        return self.stacks.capture(frame if frame is not None else sys._getframe(1), limit)

    def stack_from_frames(self, frames: Sequence[tuple[str, int, str]]) -> int:
        """The stack id of explicit ``(file, line, function)`` frames, outermost first.

        For stacks known only as text (a compiled graph node's recorded stack
        trace): frames and files are interned and snapshotted as for
        :meth:`capture_stack`.
        """
        return self.stacks.intern_frames(
            [
                (f if f.startswith("<") else os.path.abspath(f), int(line), fn)
                for f, line, fn in frames
            ]
        )

    @property
    def encoder(self) -> Encoder:
        """The record encoder (for backends that encode records themselves)."""
        return self._encoder

    def register_device(self, device_name: str) -> int:
        """The id of a device (from 1, in first-seen order), written once to ``.graphs``."""
        did = self._devices.get(device_name)
        if did is None:
            with self._seq_lock:
                did = self._devices.get(device_name)
                if did is None:
                    did = self._devices[device_name] = len(self._devices) + 1
                    self._put(NewDevice(name=device_name, device_id=did))
        return did

    def write_graph(self, graph: Graph) -> None:
        """Enqueue a graph (a ``.graphs`` record)."""
        self._put(QueuedGraph(graph=graph, wall_time=time.time()))

    def write_graph_op(self, op: GraphOp) -> None:
        """Enqueue a graph op (a ``.graphs`` record)."""
        self._put(QueuedGraphOp(op=op, wall_time=time.time()))

    # The five methods that hand over events each only build their queued item; the
    # rest (numbering, shedding, the backlog, backpressure) is _produce's.

    def write_execution(self, event: ExecutionEvent, *, encode_now: bool = False) -> int:
        """Enqueue an execution; returns its sequence number (1-based, never reused).

        ``encode_now``: turn it into its record on the calling thread (a
        backend's own background thread), so that what waits for the disk is
        bytes, not the event's Python objects. Thousands of those alive at
        once, long enough to reach the garbage collector's oldest generation,
        make it scan the whole program's heap every few hundred steps. Ignored
        for summaries still on a device.
        """
        if encode_now and isinstance(event.summaries, (list, tuple)):
            return self._write_encoded(event)
        return self._produce(
            False, lambda seq: QueuedExecution(event, seq, event.wall_time or time.time())
        )[0]

    def _write_encoded(self, ev: ExecutionEvent) -> int:
        summaries: Sequence[np.ndarray | None] = (
            () if self.mode == TensorDebugMode.NO_TENSOR else ev.summaries  # type: ignore[assignment]
        )
        wall = ev.wall_time or time.time()
        num_outputs = ev.num_outputs if ev.num_outputs >= 0 else len(ev.output_tensor_ids)
        device = ev.output_device_ids[0] if ev.output_device_ids else 0
        numbered: list[int] = []

        def produce(seq: int) -> list[EncodedExecution]:
            numbered.append(seq)
            payload, h, resolved = self._encoder.execution(ev, seq, wall, summaries)
            r = self._encoder.ranges(resolved)
            return [
                EncodedExecution(
                    payload=payload,
                    op_type=ev.op_type,
                    graph_id=ev.graph_id,
                    num_outputs=num_outputs,
                    wall_time=wall,
                    step=ev.step,
                    sequence=seq,
                    size=h.size,
                    neg_inf=h.neg_inf,
                    pos_inf=h.pos_inf,
                    nan=h.nan,
                    nonfinite=h.nonfinite,
                    phase=int(ev.phase),
                    device=device,
                    module_path=ev.module_path,
                    amax=r.amax,
                    amin=r.amin,
                    range_dtype=r.dtype,
                )
            ]

        self.write_encoded_executions(produce)
        return numbered[0] if numbered else 0

    def write_encoded_executions(self, produce: Callable[[int], Sequence[EncodedExecution]]) -> int:
        """Enqueue executions a backend encoded itself; returns how many.

        ``produce(first)`` returns :class:`~nanscope.events._queue.EncodedExecution`
        records numbered from sequence ``first`` (or tuples in its field order).
        It runs under the writer's sequence lock.
        """

        def build(first: int) -> EncodedExecutions | None:
            records = produce(first)
            return EncodedExecutions(records) if len(records) else None

        return self._produce(False, build)[1]

    def write_execution_batch(self, produce: Callable[[int], ExecutionBatch | None]) -> int:
        """Enqueue a batch of executions a backend encoded and framed; returns how many.

        ``produce(first)`` returns an :class:`~nanscope.events._queue.ExecutionBatch`
        numbered from sequence ``first`` (or ``None``: nothing to hand over). It
        runs under the writer's sequence lock.
        """

        def build(first: int) -> ExecutionBatch | None:
            batch = produce(first)
            return batch if batch is not None and batch.events else None

        return self._produce(False, build)[1]

    def write_trace(self, event: TraceEvent) -> int:
        """Enqueue one graph op's trace; returns its sequence number (1-based)."""
        return self._produce(
            True, lambda seq: QueuedTrace(event, seq, event.wall_time or time.time())
        )[0]

    def write_traces(
        self,
        graph_id: str,
        op_names: Sequence[str],
        output_slots: Sequence[int],
        summaries: np.ndarray,
        *,
        device_name: str = "",
        step: int = 0,
    ) -> int:
        """Enqueue one graph call's traces: row ``i`` of ``summaries`` belongs to ``op_names[i]``.

        ``summaries`` may be a host array or any object with ``resolve()``
        returning one (e.g. an asynchronous device-to-host copy). In NO_TENSOR
        mode it may be ``None``; in FULL_TENSOR mode it is a sequence of arrays.
        Returns the first trace's sequence number.
        """

        def build(first: int) -> GraphCallTraces:
            return GraphCallTraces(
                graph_id=graph_id,
                op_names=op_names,
                output_slots=output_slots,
                summaries=summaries,
                device_name=device_name,
                step=step,
                first_sequence=first,
                wall_time=time.time(),
            )

        return self._produce(True, build)[0]

    def _produce(self, traces: bool, build: Callable[[int], QueueItem | None]) -> tuple[int, int]:
        """The one path of the producer methods: ``build(first)`` makes the queued item
        whose events are numbered from sequence ``first`` (``None``: nothing to hand
        over); the numbers are taken, and the item queued, or shed while the writer is
        behind (events/_shed.py); then the producer waits if the backlog is past a bound.

        ``traces``: the item's events are traces (numbered apart from executions).
        Returns the first sequence number and the count of events; ``(0, 0)`` once closed.
        """
        if self._closed:
            return 0, 0
        n = 0
        with self._seq_lock:
            # Numbered and queued under one lock: sequence numbers are in queue order.
            first = self._trace_seq if traces else self._exec_next
            item = build(first)
            if item is not None:
                kind = type(item)
                # Inline for one event without values (as EVENTS_IN and item_bytes
                # count it): the hot path of recorders that hand over one at a time.
                single = kind is QueuedExecution or kind is QueuedTrace
                n = 1 if single else EVENTS_IN[kind](item)
                if traces:
                    self._trace_seq += n
                else:
                    self._exec_next += n
                if self._shedding and self._still_shedding():
                    # A shed event's sequence number stays unused: readers show a gap.
                    self._shed(item)
                else:
                    self._queue.append(item)
                    self._backlog += n
                    self._backlog_bytes += (
                        EVENT_BYTES
                        if single and not self._full_tensor
                        else item_bytes(item, self._full_tensor)
                    )
        if self._backlog > self.max_queue or self._backlog_bytes > self.max_queue_bytes:
            self._backpressure()  # as _over() tells, inline
        return first, n

    def _put(self, item: QueueItem) -> None:
        self._queue.append(item)

    # -- the backlog and shedding (producers, under _seq_lock) -----------------------------

    def _enqueue(self, item: QueueItem, events: int, nbytes: int) -> None:
        self._queue.append(item)
        self._backlog += events
        self._backlog_bytes += nbytes

    def _enqueue_pieces(self, pieces: Sequence[Piece]) -> None:
        for piece in pieces:
            self._enqueue(piece.item, piece.events, piece.nbytes)

    def _over(self) -> bool:
        """Whether the backlog is past a bound (the producer then waits, or sheds)."""
        return self._backlog > self.max_queue or self._backlog_bytes > self.max_queue_bytes

    def _caught_up(self) -> bool:
        """Whether the writer has caught up with half of both bounds."""
        return (
            self._backlog <= self.max_queue // 2
            and self._backlog_bytes <= self.max_queue_bytes // 2
        )

    def _room(self) -> bool:
        """Whether non-finite events that no window asks for may still be kept while
        shedding: the backlog is below twice both bounds."""
        return self._backlog < 2 * self.max_queue and self._backlog_bytes < 2 * self.max_queue_bytes

    def _shed(self, item: QueueItem) -> None:
        """While shedding: queue what the windows rule wants of an item's events, hold the
        newest of the others in the ring, and let go of the rest (events/_shed.py)."""
        match item:
            case QueuedExecution():
                event = item.event
                health = execution_health(event, self.mode)
                self._shed_single(self._shed_exec, item, event.op_type, health)
            case QueuedTrace():
                trace = item.event
                health = (
                    index_row(self.mode, (trace.summary,))
                    if trace.summary is not None and self.mode != TensorDebugMode.NO_TENSOR
                    else None
                )
                self._shed_single(self._shed_trace, item, (trace.graph_id, trace.op_name), health)
            case EncodedExecutions():
                records = item.records
                # By position: the field at 11 is EncodedExecution.nonfinite, 10 the NaN
                # count, 1 the op type.
                bad = np.array([i for i, r in enumerate(records) if r[11] == 1], dtype=np.int64)
                picked = [records[i] for i in bad.tolist()]
                keep, need = self._shed_exec.plan(
                    len(records),
                    bad,
                    [r[10] > 0 for r in picked],
                    [r[1] for r in picked],
                    self._room(),
                )

                def subset(mask: np.ndarray) -> EncodedExecutions:
                    return EncodedExecutions([records[i] for i in np.flatnonzero(mask).tolist()])

                self._apply_plan(self._shed_exec, keep, need, bad, subset)
            case ExecutionBatch():
                batch = item
                rows = np.frombuffer(batch.rows, dtype=sidecar.ROW_DTYPE)
                bad = np.flatnonzero(rows["nonfinite"] == 1)
                names = batch.names
                keep, need = self._shed_exec.plan(
                    batch.events,
                    bad,
                    (rows["nan"][bad] > 0).tolist(),
                    [names[k] for k in rows["name"][bad].tolist()],
                    self._room(),
                )
                self._apply_plan(
                    self._shed_exec, keep, need, bad, lambda mask: subset_batch(batch, mask)
                )
            case GraphCallTraces():
                self._shed_call(item)

    def _shed_single(
        self, shedder: Shedder, item: QueueItem, key: Any, health: IndexRow | None
    ) -> None:
        """Keep one event after all, or put it in the ring (see events/_shed.py).

        ``health`` ``None``: not known yet (device summaries); such an event is kept
        while the backlog leaves room, and counted as one that may have held Inf/NaN
        when it is let go of.
        """
        nonfinite = health is not None and health.nonfinite == 1
        bad = _ONE if nonfinite else _NONE
        nan = [health.nan > 0] if health is not None and nonfinite else []
        room = self._room()
        keep, need = shedder.plan(1, bad, nan, [key] if nonfinite else [], room)
        nbytes = item_bytes(item, self._full_tensor)
        if keep[0] or (health is None and room):
            self._enqueue_pieces(shedder.release(need))
            self._enqueue(item, 1, nbytes)
        else:
            doubt = int(nonfinite or health is None)
            shedder.hold(Piece(item, 1, doubt, nbytes), self.max_queue_bytes)

    def _apply_plan(
        self,
        shedder: Shedder,
        keep: np.ndarray,
        need: int,
        bad: np.ndarray,
        subset: Callable[[np.ndarray], Any],
    ) -> None:
        """Enqueue the events of a batch that ``keep`` marks (after the ring's events that
        an anchor's window wants back); of the others, the newest ``window`` after the last
        one kept wait in the ring, and the rest are let go of."""
        n = len(keep)
        bad_mask = np.zeros(n, dtype=bool)
        bad_mask[bad] = True
        start = 0
        if keep.any():
            self._enqueue_pieces(shedder.release(need))
            item = subset(keep)
            self._enqueue(item, int(keep.sum()), item_bytes(item, self._full_tensor))
            start = int(np.flatnonzero(keep)[-1]) + 1
        ring_from = max(start, n - shedder.window)
        let_go = ~keep
        let_go[ring_from:] = False
        shedder.drop(int(let_go.sum()), int((let_go & bad_mask).sum()))
        if ring_from < n:
            mask = np.zeros(n, dtype=bool)
            mask[ring_from:] = True
            piece = subset(mask)
            shedder.hold(
                Piece(
                    piece,
                    n - ring_from,
                    int(bad_mask[ring_from:].sum()),
                    item_bytes(piece, self._full_tensor),
                ),
                self.max_queue_bytes,
            )

    def _shed_call(self, call: GraphCallTraces) -> None:
        """A graph call's traces while shedding: kept whole when the windows rule wants any
        of them, else in the ring whole."""
        n = len(call.op_names)
        bad = _NONE
        nan: list[bool] = []
        # Summaries still on a device are not fetched here (see _backlog.execution_health).
        undecided = hasattr(call.summaries, "resolve")
        if self.mode != TensorDebugMode.NO_TENSOR and call.summaries is not None and not undecided:
            # A failure here: the writer's thread meets it too, and counts it.
            with contextlib.suppress(Exception):
                bad, nan = call_health(call, self.mode)
        keys = [(call.graph_id, call.op_names[i]) for i in bad.tolist()]
        room = self._room()
        keep, need = self._shed_trace.plan(n, bad, nan, keys, room)
        nbytes = item_bytes(call, self._full_tensor)
        if keep.any() or (undecided and room):
            self._enqueue_pieces(self._shed_trace.release(need))
            self._enqueue(call, n, nbytes)
        else:
            doubt = n if undecided else len(bad)
            self._shed_trace.hold(Piece(call, n, doubt, nbytes), self.max_queue_bytes)

    def _still_shedding(self) -> bool:
        """Whether producers still shed events (under ``_seq_lock``): until the writer
        has caught up with half of both bounds. Then what waits in the rings goes too."""
        if self._caught_up():
            self._shedding = False
            self._enqueue_pieces(self._shed_exec.take_all() + self._shed_trace.take_all())
        return self._shedding

    def _backpressure(self) -> None:
        """Wait until the writer has caught up with half of both bounds (bounds memory),
        at most ``backpressure_timeout`` seconds; then shed events until it has."""
        if self._shedding:
            return
        self._wake.set()
        self.stats.waits += 1
        self.stats.max_backlog = max(self.stats.max_backlog, self._backlog)
        self.stats.max_backlog_bytes = max(self.stats.max_backlog_bytes, self._backlog_bytes)
        deadline = time.monotonic() + self.backpressure_timeout
        while not self._caught_up() and self._thread.is_alive():
            if time.monotonic() >= deadline:
                self._shedding = True
                self._report_due = True
                if not self._told_shedding:
                    self._told_shedding = True
                    _warn(
                        f"the dump writer fell {self._backlog} events "
                        f"({self._backlog_bytes >> 20} MiB) behind for "
                        f"{self.backpressure_timeout:g} s; dropping events (keeping the first "
                        "Inf/NaN and its windows) until it catches up"
                    )
                return
            time.sleep(0.001)

    @property
    def failing(self) -> bool:
        """Whether the disk fails now (full, gone, read-only or not responding); the
        writer keeps recording in memory and retries by itself."""
        return self._fault is not None

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Write everything enqueued so far to disk; True when done within ``timeout``.

        Returns False at once while the disk fails or hangs (the writer retries by itself).
        """
        if self._closed or not self._thread.is_alive():
            return self._closed
        if self._fault is not None:
            return False
        done = threading.Event()
        self._put(FlushRequest(done))
        self._wake.set()
        return done.wait(timeout)

    def close(self, timeout: float | None = 60.0) -> None:
        """Flush and close the files; the writer cannot be used afterwards.

        Never raises, and returns within about ``timeout`` seconds even on a hung
        disk (what could not be written is counted in :attr:`stats` and reported).
        """
        if self._closed:
            return
        self._closed = True
        try:
            lifecycle.unregister(self)
            self._close_deadline = time.monotonic() + (60.0 if timeout is None else timeout)
            with self._seq_lock:
                # The events waiting in the shedding rings are the program's last: the
                # writer takes them now that nothing comes after them.
                self._shedding = False
                self._enqueue_pieces(self._shed_exec.take_all() + self._shed_trace.take_all())
            self._closing = True
            if self._thread.is_alive() and threading.current_thread() is not self._thread:
                self._put(CloseRequest())
                self._wake.set()
                self._thread.join(timeout)
            else:
                self._drain()
                self._finish()
        except Exception as exc:  # a debugger's bug must not end the program
            _warn(f"could not close the dump in {self.logdir} ({exc!r})")

    def __enter__(self) -> DumpWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def forget_in_child(self) -> None:
        """In a forked child (a DataLoader worker): write nothing more. The files are the
        parent's, the writer thread did not come along, and a lock it held at the fork
        stays held; a closed writer's producer methods take no lock."""
        self._closed = True
        self._queue.clear()

    # -- the writer thread ----------------------------------------------------------------

    def _run(self) -> None:
        if self._thread_init is not None:
            with contextlib.suppress(Exception):
                self._thread_init()
        last_flush = time.monotonic()
        interval = self.flush_interval
        while True:
            # Nothing may end this thread but a close: events would pile up unread.
            try:
                if not self._queue:
                    self._wake.wait(min(0.05, interval))
                    self._wake.clear()
                # Stop draining when a flush is due, even under a steady stream of
                # events: the flush interval bounds what a killed process loses.
                stop = self._drain(last_flush + interval)
                now = time.monotonic()
                if stop:
                    self._finish()
                    return
                if now - last_flush >= interval:
                    started = time.monotonic()
                    self._flush()
                    last_flush = time.monotonic()
                    # A huge circular buffer (FULL_TENSOR) makes each rewrite
                    # expensive: never spend more than ~10% of the time rewriting.
                    # Appends cost only what is new, so unbounded files keep the
                    # interval (backing off there would hold more events in memory
                    # and lose more to a SIGKILL).
                    if self.circular_buffer_size > 0:
                        interval = max(self.flush_interval, 10 * (last_flush - started))
            except Exception as exc:
                self._failed(exc)
                time.sleep(0.05)  # not a busy loop, should the failure repeat

    def _drain(self, deadline: float = float("inf")) -> bool:
        """Process queued items until none is left or ``deadline`` passes; True on close."""
        queue = self._queue
        done = 0
        full_tensor = self._full_tensor
        if self._closing and not self._abandon and self._fault is not None:
            self._abandon = not self._disk_came_back()
        while queue:
            done += 1
            if not done % 512 and time.monotonic() >= deadline:
                return False
            item = queue.popleft()
            if self._abandon and type(item) in EVENTS_IN:
                # Closing on a failed disk: what still waits could not be written
                # anyway; counting it is cheap, encoding it is not (the exit waits).
                n = EVENTS_IN[type(item)](item)
                self._processed(n, item_bytes(item, self._full_tensor))
                if type(item) in (QueuedTrace, GraphCallTraces):
                    self._abandoned_traces += n
                else:
                    self._abandoned_executions += n
                with contextlib.suppress(Exception):
                    self._abandoned_nonfinite += nonfinite_in(item, self.mode)
                continue
            try:
                # The most frequent kinds first: each case is one type check. Events
                # leave the backlog first, so that a failing one does not stay in it.
                match item:
                    case QueuedExecution():
                        self._processed(
                            1, item_bytes(item, self._full_tensor) if full_tensor else EVENT_BYTES
                        )
                        self._on_execution(item.event, item.sequence, item.wall_time)
                    case EncodedExecutions():
                        self._processed(len(item.records), item_bytes(item, self._full_tensor))
                        self._on_encoded_executions(item.records)
                    case ExecutionBatch():
                        self._processed(item.events, len(item.data))
                        self._on_execution_batch(item)
                    case GraphCallTraces():
                        self._processed(len(item.op_names), item_bytes(item, self._full_tensor))
                        self._on_traces(item)
                    case QueuedTrace():
                        self._processed(
                            1, item_bytes(item, self._full_tensor) if full_tensor else EVENT_BYTES
                        )
                        self._on_trace(item.event, item.sequence, item.wall_time)
                    case NewStackFrame():
                        self._on_stack_frame(item)
                    case NewSourceFile():
                        self._on_source_file(item)
                    case QueuedGraph():
                        self._on_graph(item.graph, item.wall_time)
                    case QueuedGraphOp():
                        self._on_graph_op(item.op, item.wall_time)
                    case NewDevice():
                        self._on_device(item.name, item.device_id)
                    case FlushRequest():
                        self._flush(done=item.done, wait=True)
                    case CloseRequest():
                        return True
            except Exception as exc:
                self._failed(exc)
        return False

    def _failed(self, exc: Exception) -> None:
        self.stats.errors += 1
        if not self._warned:
            self._warned = True
            _warn(
                f"dropped an event that could not be written ({exc!r}); the dump goes on without it"
            )

    def _processed(self, n: int, nbytes: int) -> None:
        with self._seq_lock:
            self._backlog -= n
            self._backlog_bytes -= nbytes

    # -- the disk (on the writer thread; the disk thread only runs what it is handed) ----------

    def _flush(
        self, *, sync: bool = False, done: threading.Event | None = None, wait: bool = False
    ) -> bool:
        """Hand the disk thread what is new; True when a job was submitted.

        Nothing is handed over while a job runs (one that runs longer than
        ``io_timeout`` makes the disk count as hung) or, after a failure, before
        the backoff has passed: then only the failed operations are retried.
        ``wait``: wait up to ``io_timeout`` for a running job first (an explicit flush).
        """
        disk = self._disk
        if wait and not disk.idle() and not isinstance(self._fault, StalledError):
            disk.wait_idle(self.io_timeout)
        self._collect()
        if not disk.idle():
            busy = disk.busy_for()
            if busy > self.io_timeout and not isinstance(self._fault, StalledError):
                # Slow or hung, events pile up meanwhile: they are held in bounded memory.
                # A job that still writes is a slow disk (at close it is waited for).
                slow = disk.stalled_for() <= self.io_timeout
                what = "is still going on" if slow else "has not returned"
                self._on_fault(
                    StalledError(f"a write {what} after {busy:.1f} s", slow=slow),
                    time.time() - busy,
                )
            return False
        now = time.monotonic()
        if self._retry:
            if now < self._next_try and not sync:
                return False
            ops, self._retry = self._retry, []
            self._next_try = now + self._backoff
            self._backoff = min(MAX_BACKOFF, self._backoff * 2)
            disk.submit(ops)
            return True
        ops = self._new_ops(sync)
        if self._report_due or self._drops_changed():
            self._report_due = False
            ops.append(Overwrite(self._drops_fd, self._drops_report()))
        if not ops:
            if done is not None:
                done.set()
            return False
        disk.submit(ops, done)
        return True

    def _new_ops(self, sync: bool) -> list[Op]:
        ops: list[Op] = []
        for f in (self._source_files, self._stack_frames, self._graphs):
            ops += f.take(sync)
        ops += self._executions.flush(sync)
        ops += self._traces.flush(sync)
        now = time.monotonic()
        if self._history.dirty and (sync or now >= self._history_due):
            # A few hundred kB at most, rewritten whole: not at every flush.
            self._history_due = now + HISTORY_INTERVAL
            ops.append(Replace(self.file_set.path(files.RANGES), self._history.to_bytes(), sync))
        self.stats.executions_kept = self._executions.kept()
        self.stats.traces_kept = self._traces.kept()
        self.stats.executions_evicted = self._executions.evicted
        self.stats.traces_evicted = self._traces.evicted
        return ops

    def _disk_came_back(self) -> bool:
        """Closing while the disk failed: one more try now, whatever the backoff (a disk
        that freed up since the last try takes the queued events after all). A slow disk
        is waited for while it writes, until the close deadline; a hung one is not: the
        program's exit must not wait on it."""
        if isinstance(self._fault, StalledError):
            if self._wait_disk():
                self._collect()
            return self._fault is None
        if not self._retry:
            return self._fault is None
        self._flush(sync=True)
        if self._disk.wait_idle(
            min(self.io_timeout, max(0.0, self._close_deadline - time.monotonic()))
        ):
            self._collect()
        return self._fault is None

    def _wait_disk(self) -> bool:
        """Closing: wait for the running job while it makes progress (a slow disk, a huge
        FULL_TENSOR record), until the close deadline; not at all on a disk that stopped
        responding. True when the disk is idle."""
        disk = self._disk
        if disk.idle():
            return True
        if disk.stalled_for() > self.io_timeout:
            return False  # a hung disk: waiting would only hang the program's exit
        return disk.wait_progressing(self._close_deadline, self.io_timeout)

    def _collect(self) -> None:
        """Take the result of the disk thread's last job, if it finished."""
        finished, failed, error = self._disk.result()
        if not finished:
            return
        if error is not None:
            self.stats.io_errors += 1
            self._retry = failed
            self._on_fault(error, time.time())
        else:
            self._last_write = time.time()
            self._executions.confirm()
            self._traces.confirm()
            if self._fault is not None:
                self._on_recovered()

    def _on_fault(self, error: BaseException, since: float) -> None:
        """The disk failed or hangs: hold events in bounded memory, report, back off."""
        if self._fault is not None:
            return
        self._fault = error
        self._backoff = 0.5
        self._next_try = time.monotonic() + self._backoff
        self._faults.append(
            {"reason": reason(error), "error": str(error), "since": since, "until": None}
        )
        self._hold(True)
        self._report_due = True
        if len(self._faults) == 1:  # once per writer, not once per outage
            _warn(
                f"cannot write the dump in {self.logdir}: {reason(error)} at "
                f"{clock(since)} ({error}); recording goes on in memory (the newest events "
                "and the first Inf/NaN), dropping the rest, and the write is retried"
            )

    def _on_recovered(self) -> None:
        self._fault = None
        self._faults[-1]["until"] = time.time()
        self._hold(False)
        self._report_due = True

    def _hold(self, on: bool) -> None:
        limit, limit_bytes = (self.hold_limit, self.hold_limit_bytes) if on else (0, 0)
        self._executions.hold(limit, limit_bytes)
        self._traces.hold(limit, limit_bytes)
        for f in (self._source_files, self._stack_frames, self._graphs):
            # Frames, files and graphs are few; this only bounds a pathological program.
            f.limit = 64 << 20 if on else 0

    def _drops_changed(self) -> bool:
        """Whether the drop counters moved since the report on disk was made (then it is
        rewritten with the next flush: a process killed later leaves them on disk)."""
        self._update_drops()
        return reported(self.stats) != self._reported

    def _update_drops(self, lost: Sequence[Op] = ()) -> None:
        """Bring the drop counters up to date (``lost``: operations that will never run)."""
        st = self.stats
        lost_exec = sum(op.events for op in lost if op.of == files.EXECUTION)
        lost_traces = sum(op.events for op in lost if op.of == files.GRAPH_EXECUTION_TRACES)
        st.executions_shed = self._shed_exec.shed + self._recorder_dropped
        st.traces_shed = self._shed_trace.shed
        st.executions_dropped = (
            st.executions_shed + self._abandoned_executions + self._executions.dropped + lost_exec
        )
        st.traces_dropped = (
            st.traces_shed + self._abandoned_traces + self._traces.dropped + lost_traces
        )
        st.nonfinite_dropped = (
            self._recorder_nonfinite
            + self._shed_exec.nonfinite_shed
            + self._shed_trace.nonfinite_shed
            + self._abandoned_nonfinite
            + self._executions.nonfinite_dropped
            + self._traces.nonfinite_dropped
            + sum(op.nonfinite for op in lost)
        )
        st.records_dropped = sum(
            f.dropped for f in (self._source_files, self._stack_frames, self._graphs)
        )
        st.values_omitted = self._encoder.values_omitted

    def _drops_report(self) -> bytes:
        """The ``.nsdrops`` JSON (docs/FORMAT.md), padded to :data:`DROPS_SIZE` bytes."""
        self._update_drops()
        return self._drops_report_now()

    def _drops_report_now(self, closed: bool = False) -> bytes:
        """The report from the counters as they are (``closed``: the final one, written
        by :meth:`close` once everything it could write was written)."""
        self._reported = reported(self.stats)
        issued = (self._exec_next - 1, self._trace_seq - 1)
        return drops_report(self.stats, self._faults, self._last_write, closed, issued)

    def _finish(self) -> None:
        """The last writes, each waited for until the close deadline; then the report."""
        disk = self._disk

        def wait() -> bool:
            if not disk.idle() and disk.stalled_for() > self.io_timeout:
                return False  # a hung disk: waiting would only hang the program's exit
            return disk.wait_progressing(self._close_deadline, self.io_timeout)

        if wait():
            self._collect()
            if self._retry:  # one more try, whatever the backoff
                self._flush(sync=True)
                if wait():
                    self._collect()
            if not self._retry and self._fault is None:
                self._flush(sync=True)
                if wait():
                    self._collect()
        hung = not disk.idle()
        # What stayed in memory, or in operations that never ran, did not reach the dump:
        # the held events, and the writes still to do (a hung one's too, unknown which).
        self._executions.drop_held()
        self._traces.drop_held()
        self._update_drops(self._retry + (self._disk.running() if hung else []))
        # The final report, always: `closed` tells a reader that its counts are complete
        # (a process killed before this leaves the last periodic one, closed false).
        report = Overwrite(self._drops_fd, self._drops_report_now(closed=True))
        if not hung:
            disk.submit([report])
            wait()
        else:
            _last_try(report, min(1.0, max(0.0, self._close_deadline - time.monotonic())))
        if self._faults or self.stats.dropped:
            _warn(self.drops_summary())
        if disk.idle():
            for f in (self._source_files, self._stack_frames, self._graphs):
                f.close()
            self._executions.close()
            self._traces.close()
            with contextlib.suppress(OSError):
                os.close(self._drops_fd)
        disk.stop()

    def count_dropped(self, executions: int, nonfinite: int = 0) -> None:
        """Count events a producer let go of before they reached the writer (a
        recorder's own full buffer; ``nonfinite`` of them held Inf/NaN); they are
        reported with what producers shed."""
        with self._seq_lock:
            self._recorder_dropped += executions
            self._recorder_nonfinite += nonfinite
        self._report_due = True

    def drops_summary(self) -> str:
        """One line on what did not reach the dump: ``N events dropped: disk full at 12:03:14``."""
        return drops_line(self.stats, self._faults, self.logdir, self._last_write)

    # Events are turned into records only when a flush writes them (see
    # EventStream); here they get their index row and their health.

    def _encode_execution(self, spec: tuple[ExecutionEvent, int, float, Any]) -> bytes:
        ev, seq, wall, summaries = spec
        return self._encoder.execution(ev, seq, wall, summaries)[0]

    def _trace_op_type(self, name: int, graph: int) -> str | None:
        """The op type of a trace's op, from its row's string numbers (``None`` when its
        graph op was not written).

        Asked only for non-finite traces while anchors are still being chosen.
        """
        strings = self._traces.strings.strings
        return self._graph_op_types.get((strings[graph], strings[name]))

    def _encode_trace(self, spec: Any) -> bytes:
        if len(spec) == 1:  # encoded already, by a batch
            return spec[0]  # type: ignore[no-any-return]
        ev, seq, wall = spec
        return self._encoder.trace(ev, seq, wall)

    def _on_execution(self, ev: ExecutionEvent, seq: int, wall: float) -> None:
        if self.mode == TensorDebugMode.NO_TENSOR:
            summaries: Sequence[np.ndarray | None] = ()
        else:
            summaries = resolve(ev.summaries)
        # The ranges before the values past the record's bound are let go of (now, not
        # at the flush: memory), which leaves their counts (taken once) for the health.
        r = self._encoder.ranges(summaries)
        if self._full_tensor:
            summaries = self._encoder.cap_outputs(summaries)[0]
        h = index_row(self.mode, summaries)
        device = ev.output_device_ids[0] if ev.output_device_ids else 0
        num_outputs = ev.num_outputs if ev.num_outputs >= 0 else len(ev.output_tensor_ids)
        st = self._executions.strings
        row = (
            st.intern(ev.op_type),
            st.intern(ev.graph_id),
            num_outputs,
            wall,
            ev.step,
            seq,
            h.size,
            h.neg_inf,
            h.pos_inf,
            h.nan,
            h.nonfinite,
            int(ev.phase),
            device,
        )
        if r.dtype:
            self._history.add(ev.module_path, int(ev.phase), ev.step, r.amax, r.amin, r.dtype)
        # The spec is what _encode_execution turns into the record, at flush time; its
        # bytes (FULL_TENSOR values) count toward a hold's bound.
        nbytes = EVENT_BYTES + (values_bytes(summaries) if self._full_tensor else 0)
        self._executions.add((ev, seq, wall, summaries), row, h.nonfinite == 1, nbytes)
        self.stats.executions += 1

    def _on_encoded_executions(self, records: Sequence[EncodedExecution]) -> None:
        st = self._executions.strings
        add = self._executions.add
        history = self._history.add
        # By position: the native recorder hands over plain tuples in EncodedExecution's order.
        for (
            payload,
            op_type,
            graph_id,
            num_outputs,
            wall,
            step,
            seq,
            size,
            neg_inf,
            pos_inf,
            nan,
            nonfinite,
            phase,
            device,
            module,
            amax,
            amin,
            range_dtype,
        ) in records:
            row = (
                st.intern(op_type),
                st.intern(graph_id),
                num_outputs,
                wall,
                step,
                seq,
                size,
                neg_inf,
                pos_inf,
                nan,
                nonfinite,
                phase,
                device,
            )
            if range_dtype:
                history(module, phase, step, amax, amin, range_dtype)
            add(frame(payload), row, nonfinite == 1)
        self.stats.executions += len(records)

    def _on_execution_batch(self, batch: ExecutionBatch) -> None:
        stream = self._executions
        st = stream.strings
        rows = np.frombuffer(batch.rows, dtype=sidecar.ROW_DTYPE).copy()
        numbers = np.fromiter(map(st.intern, batch.names), dtype=np.uint32, count=len(batch.names))
        rows["name"] = numbers[rows["name"]]
        history = self._history.add
        for module, phase, step, amax, amin, range_dtype in batch.ranges:
            history(module, phase, step, amax, amin, range_dtype)
        stream.add_framed(batch.data, rows)
        self.stats.executions += batch.events

    def _on_trace(self, ev: TraceEvent, seq: int, wall: float) -> None:
        h = index_row(self.mode, (ev.summary,)) if ev.summary is not None else UNKNOWN_ROW
        if self._full_tensor and ev.summary is not None:
            value = self._encoder.cap_trace(ev.summary)
            if value is None:  # past the record's bound: let go of now (see cap_trace)
                ev = dataclasses.replace(ev, summary=None)
        st = self._traces.strings
        row = (
            st.intern(ev.op_name),
            st.intern(ev.graph_id),
            ev.output_slot,
            wall,
            ev.step,
            seq,
            h.size,
            h.neg_inf,
            h.pos_inf,
            h.nan,
            h.nonfinite,
            0,
            0,
        )
        nbytes = EVENT_BYTES + (values_bytes((ev.summary,)) if self._full_tensor else 0)
        self._traces.add((ev, seq, wall), row, h.nonfinite == 1, nbytes)
        self.stats.traces += 1

    def _on_traces(self, call: GraphCallTraces) -> None:
        graph_id, op_names, slots = call.graph_id, call.op_names, call.output_slots
        device_name, step, first, wall = (
            call.device_name,
            call.step,
            call.first_sequence,
            call.wall_time,
        )
        summaries = call.summaries
        matrix = summaries.resolve() if hasattr(summaries, "resolve") else summaries
        iterations = getattr(summaries, "iterations", None)
        chosen = getattr(summaries, "chosen", None)
        if chosen is not None:
            # Only these rows were summarised at this call (a JAX program's guards): the
            # others are not written. Sequence numbers stay those reserved for the call.
            op_names = [op_names[i] for i in chosen]
            slots = [slots[i] for i in chosen]
            matrix = matrix[chosen]
            iterations = iterations[chosen] if iterations is not None else None
        if self.mode == TensorDebugMode.NO_TENSOR:
            matrix = np.zeros((len(op_names), 0))  # only that each op ran: encoded as a batch
        elif self.mode == TensorDebugMode.FULL_TENSOR:
            # No summary matrix: FULL_TENSOR values keep their own dtype and shape.
            for i, name in enumerate(op_names):
                value = None if matrix is None else matrix[i]
                trace = TraceEvent(
                    graph_id=graph_id,
                    op_name=name,
                    output_slot=slots[i],
                    summary=value,
                    device_name=device_name,
                    step=step,
                )
                self._on_trace(trace, first + i, wall)
            return
        payloads, health = self._encoder.trace_batch(
            graph_id,
            op_names,
            slots,
            np.asarray(matrix),
            device_name,
            step,
            first,
            wall,
            iterations,
        )
        stream = self._traces
        st = stream.strings
        # The whole call goes to the stream together, rows built at once.
        n = len(payloads)
        rows = np.zeros(n, dtype=sidecar.ROW_DTYPE)
        rows["name"] = [st.intern(name) for name in op_names]
        rows["graph"] = st.intern(graph_id)
        rows["slot"] = slots
        rows["wall_time"] = wall
        rows["step"] = step
        rows["sequence"] = np.arange(first, first + n)
        for k, col in enumerate(("size", "neg_inf", "pos_inf", "nan", "nonfinite")):
            rows[col] = health[:, k]
        stream.add_batch(payloads, rows)
        self.stats.traces += n

    def _on_stack_frame(self, new: NewStackFrame) -> None:
        ev = pb.DebugEvent(wall_time=time.time())
        sf = ev.stack_frame_with_id
        sf.id = new.frame_id
        sf.file_line_col.file_index = new.file_index
        sf.file_line_col.line = new.line
        sf.file_line_col.func = new.func
        self._stack_frames.write(ev.SerializeToString())

    def _on_source_file(self, new: NewSourceFile) -> None:
        ev = pb.DebugEvent(wall_time=time.time())
        ev.source_file.file_path = new.path
        ev.source_file.host_name = self.host_name
        if new.snapshot:
            ev.source_file.lines.extend(read_source_lines(new.path))
        self._source_files.write(ev.SerializeToString())

    def _on_graph(self, g: Graph, wall: float) -> None:
        ev = pb.DebugEvent(wall_time=wall)
        dg = ev.debugged_graph
        dg.graph_id = g.graph_id
        dg.graph_name = g.graph_name
        dg.outer_context_id = g.outer_graph_id
        dg.instrumented_ops.extend(g.instrumented_ops)
        self._graphs.write(ev.SerializeToString())

    def _on_graph_op(self, op: GraphOp, wall: float) -> None:
        if self._traces.circular:  # only the anchor rule asks
            self._graph_op_types[(op.graph_id, op.op_name)] = op.op_type
        ev = pb.DebugEvent(wall_time=wall)
        goc = ev.graph_op_creation
        goc.op_type = op.op_type
        goc.op_name = op.op_name
        goc.graph_name = op.graph_name
        goc.graph_id = op.graph_id
        goc.device_name = op.device_name
        goc.input_names.extend(op.input_names)
        goc.num_outputs = op.num_outputs
        ids = op.output_tensor_ids
        if not ids and op.num_outputs > 0:
            # TensorFlow's reader counts an op's outputs by their symbolic tensor ids (and
            # TensorBoard lists each output's consumers by them): without ids, an op has
            # no outputs there. The JAX and torch.compile backends name none: fresh ones.
            ids = range(self._symbolic_next, self._symbolic_next + op.num_outputs)
            self._symbolic_next += op.num_outputs
        goc.output_tensor_ids.extend(ids)
        if op.stack >= 0:
            goc.code_location.ParseFromString(self._encoder.code_location(op.stack))
        goc.module_path = op.module_path
        if op.forward_stack >= 0:
            goc.forward_code_location.ParseFromString(self._encoder.code_location(op.forward_stack))
        self._graphs.write(ev.SerializeToString())

    def _on_device(self, name: str, device_id: int) -> None:
        ev = pb.DebugEvent(wall_time=time.time())
        ev.debugged_device.device_name = name
        ev.debugged_device.device_id = device_id
        self._graphs.write(ev.SerializeToString())


def _warn(message: str) -> None:
    """One line on stderr (which may itself be closed or broken: then nothing)."""
    with contextlib.suppress(Exception):
        print(f"nanscope: {message}", file=sys.stderr, flush=True)


_ONE = np.zeros(1, dtype=np.int64)  # the one event of a single write, holding Inf/NaN
_NONE = np.zeros(0, dtype=np.int64)


def _last_try(op: Overwrite, timeout: float) -> None:
    """Run ``op`` on a thread of its own and wait for it at most ``timeout`` seconds
    (closing while the disk thread is stuck: a slow disk may still take a small write;
    on a hung one the thread stays blocked, a daemon that cannot hold up the exit)."""

    def run() -> None:
        with contextlib.suppress(Exception):
            op.run()

    thread = threading.Thread(target=run, name="nanscope-last-report", daemon=True)
    thread.start()
    thread.join(timeout)
