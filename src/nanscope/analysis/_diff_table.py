"""One process's ops as columns: what a diff aligns and compares, read in bulk.

A diff reads every event of a process once. :meth:`DumpReader.execution` builds a
full record (health, views, problems) at about 60 µs an event; here the records'
bytes are read in blocks of the very files the reader indexed, and only what a
comparison needs is taken from each: the module path, the tensor ids, each output's
counts, its ranges (largest and smallest non-zero ``|x|``) and its statistics where
recorded (about 6 µs an event). Executions and graph execution traces (the ops of a
compiled graph) are merged into one stream in the order they ran; a trace takes the
phase of the graph call that ran it.

The blocks are read through the reader's own event files (``DumpReader._processes``, its
private part: the reader has no public bulk read of records yet), so the records are the
very ones its index vouched for; one that fails to decode is read again the reader's way
(:meth:`DumpReader._event_at`), which reports why.
"""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from nanscope.format import statistics as stats_format
from nanscope.format.headroom import of_value
from nanscope.format.health import of_summary
from nanscope.format.modes import TensorDebugMode
from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.format.records import FOOTER_SIZE, HEADER_SIZE
from nanscope.reader import EXECUTIONS, TRACES, UNREADABLE, DumpReader
from nanscope.reader._decode import DecodeError, parse_event, tensor_values

# The columns of each output (one row per output of each op).
OUTPUT_COLUMNS = (
    "dtype",  # the DataType number (0: unknown)
    "size",
    "neg_inf",
    "pos_inf",
    "nan",
    "neg",
    "zero",
    "pos",
    "amax",  # largest finite |x|
    "amin",  # smallest non-zero finite |x|
    "mean",
    "std",
    "l2",
    "hash",  # the order-free bits hash (float64 holds its 52 bits), NaN: none
)
_COL = {name: i for i, name in enumerate(OUTPUT_COLUMNS)}
_BLOCK = 16 << 20  # bytes read at a time from an event file
_FULL_HEALTH = int(TensorDebugMode.FULL_HEALTH)
_FULL_TENSOR = int(TensorDebugMode.FULL_TENSOR)
_UNPACK_11 = struct.Struct("<11d").unpack_from  # a FULL_HEALTH summary's 11 doubles
_HAS_STATISTICS = "output_statistics" in pb.Execution.DESCRIPTOR.fields_by_name


class Strings:
    """Strings numbered in the order first seen, shared by the two runs of a diff."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {"": 0}
        self.strings: list[str] = [""]

    def id(self, s: str) -> int:
        i = self.ids.get(s)
        if i is None:
            i = self.ids[s] = len(self.strings)
            self.strings.append(s)
        return i


@dataclass
class OpTable:
    """The ops of one process of one run, in the order they ran.

    Per op: ``kind`` (0 execution, 1 graph execution trace), ``index`` (the reader's
    index of that kind), ``step``, ``phase``, ``op_type`` and ``module`` (ids into the
    diff's :class:`Strings`); its outputs are rows ``out_start[i]:out_start[i + 1]`` of
    ``outputs`` (columns :data:`OUTPUT_COLUMNS`, NaN where not recorded) and
    ``out_ids`` (their tensor ids; 0 for traces), its input tensor ids
    ``in_ids[in_start[i]:in_start[i + 1]]``.
    """

    process: int
    kind: np.ndarray
    index: np.ndarray
    step: np.ndarray
    phase: np.ndarray
    op_type: np.ndarray
    module: np.ndarray
    out_start: np.ndarray
    outputs: np.ndarray
    out_ids: np.ndarray
    in_start: np.ndarray
    in_ids: np.ndarray
    unreadable: int = 0  # events whose record could not be read (compared as unrecorded)

    def __len__(self) -> int:
        return len(self.kind)

    def column(self, name: str) -> np.ndarray:
        out: np.ndarray = self.outputs[:, _COL[name]]
        return out

    def first_output(self, name: str) -> np.ndarray:
        """Column ``name`` of each op's first output (NaN for an op without outputs)."""
        col = self.column(name)
        has = self.out_start[1:] > self.out_start[:-1]
        out = np.full(len(self), np.nan)
        out[has] = col[self.out_start[:-1][has]]
        return out


class _Builder:
    """The columns as they are read, in compact arrays (a Python list of floats costs
    about five times the memory: a million events would take gigabytes)."""

    def __init__(self) -> None:
        self.kind = array("b")
        self.index = array("q")
        self.step = array("q")
        self.phase = array("b")
        self.op_type = array("i")
        self.module = array("i")
        self.n_out = array("i")
        self.n_in = array("i")
        self.rows = array("d")  # len(OUTPUT_COLUMNS) per output
        self.out_ids = array("q")
        self.in_ids = array("q")

    def add(
        self,
        kind: int,
        index: int,
        step: int,
        phase: int,
        op_type: int,
        module: int,
        rows: list[list[float]],
        out_ids: list[int],
        in_ids: list[int],
    ) -> None:
        self.kind.append(kind)
        self.index.append(index)
        self.step.append(step)
        self.phase.append(phase)
        self.op_type.append(op_type)
        self.module.append(module)
        self.n_out.append(len(rows))
        for r in rows:
            self.rows.extend(r)
        self.out_ids.extend(out_ids)
        self.n_in.append(len(in_ids))
        self.in_ids.extend(in_ids)


_NAN_ROW = [math.nan] * len(OUTPUT_COLUMNS)
_NAN_TAIL = _NAN_ROW[8:]  # ranges and statistics, not recorded


def _row(
    summary: np.ndarray | None,
    mode: int,
    ranges: tuple[float, float] | None,
    statistics: tuple[float, float, float, float] | None,
) -> list[float]:
    """One output's columns from its summary (any mode), ranges and statistics."""
    row = list(_NAN_ROW)
    if summary is not None:
        if mode == _FULL_HEALTH and len(summary) >= 11:
            # FULL_HEALTH: [id, device, dtype, rank, size, -inf, +inf, nan, neg, zero, pos].
            row[0] = float(summary[2])
            row[1:8] = summary[4:11].tolist()
        else:
            h = of_summary(mode, summary)
            if h.size is not None:
                row[1] = float(h.size)
            for i, v in enumerate((h.neg_inf, h.pos_inf, h.nan, h.neg, h.zero, h.pos)):
                if v is not None:
                    row[2 + i] = float(v)
    if ranges is not None:
        row[8], row[9] = ranges
    if statistics is not None:
        row[10:14] = statistics
    return row


def _full_tensor_row(value: np.ndarray | None) -> list[float]:
    """A FULL_TENSOR output's columns, computed from its value."""
    if value is None:
        return list(_NAN_ROW)
    arr = np.asarray(value)
    h = of_summary(TensorDebugMode.FULL_TENSOR, arr)
    row = list(_NAN_ROW)
    found = of_value(arr)
    if found is not None:
        row[0] = float(found[0])
        row[8], row[9] = found[1]
        s = stats_format.statistics_of(arr)
        row[10:14] = (s.mean, s.std, s.l2, math.nan if s.hash is None else float(s.hash))
    if h.size is not None:
        row[1] = float(h.size)
    for i, v in enumerate((h.neg_inf, h.pos_inf, h.nan, h.neg, h.zero, h.pos)):
        if v is not None:
            row[2 + i] = float(v)
    return row


def _records(
    reader: DumpReader, kind: str, indices: np.ndarray
) -> Iterator[tuple[int, pb.DebugEvent | None]]:
    """``(index, event)`` for each of ``indices`` (one process's, in file order), read in
    blocks from the file the reader indexed; ``None`` where the record cannot be read."""
    if not len(indices):
        return
    rows = reader.index(kind)
    proc = reader._processes[int(reader.processes_of(kind)[indices[0]])]  # see the module docstring
    efile = proc.executions if kind == EXECUTIONS else proc.traces
    offsets = rows["offset"][indices].astype(np.int64)
    lengths = rows["length"][indices].astype(np.int64)
    i, n = 0, len(indices)
    while i < n:
        start = int(offsets[i])
        # The records that fit in one block from here, in file order and contiguous reads.
        j = int(np.searchsorted(offsets, start + _BLOCK, side="left"))
        j = max(j, i + 1)
        end = int(offsets[j - 1] + lengths[j - 1])
        try:
            blob = efile.read(start, end - start)
        except (OSError, *UNREADABLE):
            blob = b""
        view = memoryview(blob)
        for k in range(i, j):
            at = int(offsets[k]) - start
            ln = int(lengths[k])
            idx = int(indices[k])
            if at + ln > len(view) or ln < HEADER_SIZE + FOOTER_SIZE:
                yield idx, _careful(reader, kind, idx)
                continue
            try:
                yield idx, parse_event(view[at + HEADER_SIZE : at + ln - FOOTER_SIZE])
            except DecodeError:
                yield idx, _careful(reader, kind, idx)
        i = j


def _careful(reader: DumpReader, kind: str, index: int) -> pb.DebugEvent | None:
    """The reader's own read of one record (it reports why one cannot be read)."""
    try:
        return reader._event_at(kind, index).event  # see the module docstring
    except (OSError, *UNREADABLE):
        return None


def _statistics(
    ex: pb.Execution | pb.GraphExecutionTrace, n: int
) -> list[tuple[float, float, float, float] | None]:
    """Each output's (mean, std, l2, hash) where the record holds statistics."""
    flat = list(getattr(ex, "output_statistics", ()))
    per = stats_format.PER_OUTPUT
    out: list[tuple[float, float, float, float] | None] = []
    for slot in range(n):
        part = flat[per * slot : per * (slot + 1)]
        if len(part) < per or all(math.isnan(x) for x in part):
            out.append(None)
        else:
            out.append((part[0], part[1], part[2], part[3]))
    return out


def build_table(reader: DumpReader, process: int, strings: Strings) -> OpTable:
    """The ops of ``process`` in ``reader`` as an :class:`OpTable`."""
    exec_idx = np.flatnonzero(reader.processes_of(EXECUTIONS) == process)
    trace_idx = np.flatnonzero(reader.processes_of(TRACES) == process)
    exec_rows = reader.index(EXECUTIONS)
    trace_rows = reader.index(TRACES)
    unreadable = 0
    type_ids: dict[int, int] = {}  # the reader's string id -> ours

    def type_id(sid: int) -> int:
        t = type_ids.get(sid)
        if t is None:
            t = type_ids[sid] = strings.id(reader.string(sid))
        return t

    # -- executions ----------------------------------------------------------------------
    # The hot loop: about a million iterations for a large run, so plain lists and
    # struct, no numpy scalars (each costs a microsecond).
    exec_part = _Builder()
    steps_col = exec_rows["step"][exec_idx].tolist()
    phases_col = exec_rows["phase"][exec_idx].tolist()
    names_col = exec_rows["name"][exec_idx].tolist()
    module_ids = strings.ids
    e = exec_part
    e_kind, e_index, e_step, e_phase = e.kind.append, e.index.append, e.step.append, e.phase.append
    e_type, e_module, e_nout, e_nin = (
        e.op_type.append,
        e.module.append,
        e.n_out.append,
        e.n_in.append,
    )
    e_rows, e_outids, e_inids = e.rows.extend, e.out_ids.extend, e.in_ids.extend
    for k, (idx, event) in enumerate(_records(reader, EXECUTIONS, exec_idx)):
        if event is None:
            unreadable += 1
            exec_part.add(0, idx, steps_col[k], phases_col[k], type_id(names_col[k]), 0,
                          [], [], [])  # fmt: skip
            continue
        ex = event.execution
        mode = ex.tensor_debug_mode
        protos = ex.tensor_protos
        if mode == _FULL_TENSOR:
            values = tensor_values(list(protos), TensorDebugMode.FULL_TENSOR)
            rows = [_full_tensor_row(v) for v in values]
        else:
            ranges_flat = ex.output_ranges
            stats_flat = ex.output_statistics if _HAS_STATISTICS else ()
            rows = []
            for slot, p in enumerate(protos):
                content = p.tensor_content
                if mode == _FULL_HEALTH and p.dtype == 2 and len(content) == 88:  # DT_DOUBLE
                    v = _UNPACK_11(content)
                    row = [v[2], v[4], v[5], v[6], v[7], v[8], v[9], v[10], *_NAN_TAIL]
                else:
                    (summary,) = tensor_values([p], TensorDebugMode(mode)) if mode else (None,)
                    row = _row(summary, mode, None, None)
                if len(ranges_flat) >= 2 * slot + 2:
                    row[8] = ranges_flat[2 * slot]
                    row[9] = ranges_flat[2 * slot + 1]
                if len(stats_flat) >= 4 * slot + 4:
                    row[10:14] = stats_flat[4 * slot : 4 * slot + 4]
                rows.append(row)
        out_ids = list(ex.output_tensor_ids)
        if len(out_ids) != len(rows):
            out_ids = (out_ids + [0] * len(rows))[: len(rows)]
        path = ex.module_path
        module = module_ids.get(path)
        if module is None:
            module = strings.id(path)
        ins = ex.input_tensor_ids
        # exec_part.add(...), inlined: this loop runs once per event.
        e_kind(0)
        e_index(idx)
        e_step(event.step or steps_col[k])
        e_phase(ex.phase)
        e_type(type_id(names_col[k]))
        e_module(module)
        e_nout(len(rows))
        for r in rows:
            e_rows(r)
        e_outids(out_ids)
        e_nin(len(ins))
        e_inids(ins)

    # -- graph execution traces ----------------------------------------------------------
    trace_part = _Builder()
    if len(trace_idx):
        types = reader.trace_op_types(trace_idx)
        modules: dict[tuple[int, int], int] = {}
        for k, (idx, event) in enumerate(_records(reader, TRACES, trace_idx)):
            row = trace_rows[idx]
            key = (int(row["graph"]), int(row["name"]))
            module = modules.get(key)
            if module is None:
                op = reader.graph_op(reader.string(key[0]), reader.string(key[1]), process)
                module = modules[key] = strings.id(op.module_path if op else "")
            if event is None:
                unreadable += 1
                trace_part.add(1, idx, int(row["step"]), 0, type_id(int(types[k])), module,
                               [], [], [])  # fmt: skip
                continue
            tr = event.graph_execution_trace
            tmode = int(tr.tensor_debug_mode)
            rows = []
            if tr.HasField("tensor_proto"):
                (value,) = tensor_values([tr.tensor_proto], TensorDebugMode(tmode)) if tmode else (
                    None,
                )  # fmt: skip
                if tmode == int(TensorDebugMode.FULL_TENSOR):
                    rows = [_full_tensor_row(value)]
                else:
                    st = _statistics(tr, 1)[0] if _HAS_STATISTICS else None
                    rows = [_row(value, tmode, None, st)]
            trace_part.add(
                1,
                idx,
                int(event.step) or int(row["step"]),
                0,
                type_id(int(types[k])),
                module,
                rows,
                [0] * len(rows),
                [],
            )

    # -- merged in the order they ran ----------------------------------------------------
    # A graph's traces carry the time its call began, before the call's own record: sorting
    # by (wall time, traces first) puts each call's ops just before the call.
    times = np.concatenate(
        [exec_rows["wall_time"][_np(exec_part.index, "i8")],
         trace_rows["wall_time"][_np(trace_part.index, "i8")]]
    )  # fmt: skip
    kinds = np.concatenate(
        [np.ones(len(exec_part.index), np.int8), np.zeros(len(trace_part.index), np.int8)]
    )
    pos = np.arange(len(times))
    order = np.lexsort((pos, kinds, times)) if len(trace_part.index) else pos
    b = exec_part  # the traces appended to it, in place
    t = trace_part
    b.kind += t.kind
    b.index += t.index
    b.step += t.step
    b.phase += t.phase
    b.op_type += t.op_type
    b.module += t.module
    b.n_out += t.n_out
    b.n_in += t.n_in
    b.rows += t.rows
    b.out_ids += t.out_ids
    b.in_ids += t.in_ids
    return _assemble(b, order, process, unreadable)


def _np(a: array, dtype: str) -> np.ndarray:  # type: ignore[type-arg]
    out: np.ndarray = np.frombuffer(a, dtype=dtype) if len(a) else np.zeros(0, dtype=dtype)
    return out


def _assemble(b: _Builder, order: np.ndarray, process: int, unreadable: int) -> OpTable:
    n = len(b.kind)
    n_out = _np(b.n_out, "i4").astype(np.int64)
    n_in = _np(b.n_in, "i4").astype(np.int64)
    out_start0 = np.concatenate([[0], np.cumsum(n_out)]).astype(np.int64)
    in_start0 = np.concatenate([[0], np.cumsum(n_in)]).astype(np.int64)
    outputs0 = _np(b.rows, "f8").reshape(-1, len(OUTPUT_COLUMNS))
    if n and np.array_equal(order, np.arange(n)):
        # In the order read (executions only): no copy of the columns (a large run's
        # outputs take hundreds of MB).
        return OpTable(
            process=process,
            kind=_np(b.kind, "i1"),
            index=_np(b.index, "i8"),
            step=_np(b.step, "i8"),
            phase=_np(b.phase, "i1"),
            op_type=_np(b.op_type, "i4"),
            module=_np(b.module, "i4"),
            out_start=out_start0,
            outputs=outputs0,
            out_ids=_np(b.out_ids, "i8"),
            in_start=in_start0,
            in_ids=_np(b.in_ids, "i8"),
            unreadable=unreadable,
        )
    # Reorder the ragged parts: gather each op's rows in the new order.
    out_rows = _ragged_take(out_start0, order)
    in_rows = _ragged_take(in_start0, order)
    phase = _np(b.phase, "i1")[order]
    kind = _np(b.kind, "i1")[order]
    # A trace takes the phase of the execution after it (the graph call that ran it).
    if n and (kind == 1).any():
        is_exec = kind == 0
        nxt = np.where(is_exec, np.arange(n), n)
        nxt = np.minimum.accumulate(nxt[::-1])[::-1]
        inherit = (kind == 1) & (nxt < n)
        phase[inherit] = phase[nxt[inherit]]
    return OpTable(
        process=process,
        kind=kind,
        index=_np(b.index, "i8")[order],
        step=_np(b.step, "i8")[order],
        phase=phase,
        op_type=_np(b.op_type, "i4")[order],
        module=_np(b.module, "i4")[order],
        out_start=np.concatenate([[0], np.cumsum(n_out[order])]).astype(np.int64),
        outputs=outputs0[out_rows],
        out_ids=_np(b.out_ids, "i8")[out_rows],
        in_start=np.concatenate([[0], np.cumsum(n_in[order])]).astype(np.int64),
        in_ids=_np(b.in_ids, "i8")[in_rows],
        unreadable=unreadable,
    )


def _ragged_take(start: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The flat row numbers of ragged parts ``start[i]:start[i + 1]`` taken in ``order``."""
    lengths = (start[1:] - start[:-1])[order]
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    firsts = start[:-1][order]
    # Each row: its part's first row, plus its place within the part.
    offsets = np.repeat(firsts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    out: np.ndarray = offsets + np.arange(total)
    return out
