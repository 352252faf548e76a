"""Turning JAX recording on and off, and recording each run of a compiled program.

A jitted function's run is an ``Execution`` of its graph (``graph_id`` set)
and one ``GraphExecutionTrace`` per summarised value, from the counts that
the instrumented program computed (:mod:`.rewrite`); an eagerly applied
primitive's run is an ``Execution`` of that primitive with the summaries of
its inputs and outputs. The counts stay a device array until the writer's
thread copies them to the host; the training thread looks at a guarded call's
counts itself one call later (so that its arguments, kept for a replay, are let
go), by which time they are ready.

Steps: a run of a program that holds backward equations (a jitted training
step) ends a step; without one (eager training), the first forward run after
a backward pass starts the next. :meth:`JaxDumpSession.set_step` (the public
``DebugSession.set_step``) sets the count.
"""

from __future__ import annotations

import collections
import contextlib
import re
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nanscope.backends.jax import intercept
from nanscope.backends.jax.calls import Call, Programs
from nanscope.backends.jax.plan import GraphPlan, Selection
from nanscope.events import DumpWriter, ExecutionEvent, Graph, GraphOp, Phase
from nanscope.format.modes import TensorDebugMode


def dtype_filter(tensor_dtypes: Any) -> Callable[[Any], bool] | None:
    """``tensor_dtypes`` as TensorFlow takes it: dtypes (or their names), or a predicate."""
    if tensor_dtypes is None:
        return None
    if callable(tensor_dtypes) and not isinstance(tensor_dtypes, type):
        return tensor_dtypes  # type: ignore[no-any-return]
    if isinstance(tensor_dtypes, (list, tuple, set, frozenset)):
        wanted = set()
        for d in tensor_dtypes:
            try:
                wanted.add(np.dtype(d).name)
            except TypeError:
                raise ValueError(f"tensor_dtypes: {d!r} is not a dtype or dtype name") from None
        return lambda dtype: np.dtype(dtype).name in wanted
    raise ValueError(
        "tensor_dtypes must be a list of dtypes (e.g. [jnp.float32, 'bfloat16']) or a "
        f"predicate; got {type(tensor_dtypes).__name__}"
    )


class _ArrayIds:
    """Tensor ids for JAX arrays: a new id for each array a recorded run returns.

    Arrays are held by weak references without callbacks (a callback per array is
    a closure per output at every call); the entries of arrays that have died are
    swept out when the table has doubled since the last sweep.
    """

    def __init__(self) -> None:
        self._next = 1
        self._ids: dict[int, tuple[weakref.ref[Any], int]] = {}
        self._sweep_at = 1024

    def new(self, array: Any) -> int:
        tid = self._next
        self._next += 1
        # Not weak-referenceable (a Python number): no later lookups.
        with contextlib.suppress(TypeError):
            self._ids[id(array)] = (weakref.ref(array), tid)
            if len(self._ids) >= self._sweep_at:
                self._sweep()
        return tid

    def _sweep(self) -> None:
        self._ids = {k: e for k, e in self._ids.items() if e[0]() is not None}
        self._sweep_at = max(1024, 2 * len(self._ids))

    def get(self, array: Any) -> int:
        entry = self._ids.get(id(array))
        if entry is not None and entry[0]() is array:
            return entry[1]
        return -1


class _CallSummaries:
    """One run's summaries: its counts copied to the host and laid out once, on the writer
    thread (the training thread may have looked at them first: ``JaxDumpSession._hold``)."""

    __slots__ = ("_matrix", "_replay", "call", "chosen", "counted", "iterations")

    def __init__(self, call: Call, replay: Callable[[GraphPlan, np.ndarray], bool]) -> None:
        self.call = call
        self._replay = replay
        self._matrix: Any = None
        self.iterations: np.ndarray | None = None  # per row: loop iteration + 1 (0: none)
        # The rows the writer writes (None: all), and as a mask (None: all).
        self.chosen: np.ndarray | None = None
        self.counted: np.ndarray | None = None

    def resolve(self) -> Any:
        if self._matrix is None:
            call = self.call
            if call.plan.mode == TensorDebugMode.FULL_TENSOR:
                self._matrix = [np.asarray(v) for v in call.extra]
                call.extra = []
            else:
                plan, counts = call.settle(self._replay)
                self._matrix, self.iterations = plan.matrix(counts)
                self.chosen, self.counted = plan.kept, plan.counted
        return self._matrix


class _Rows:
    """Some rows of a run's summaries (an Execution's outputs or inputs)."""

    __slots__ = ("_call", "_rows")

    def __init__(self, call: _CallSummaries, rows: list[int]) -> None:
        self._call = call
        self._rows = rows

    def resolve(self) -> list[Any]:
        m = self._call.resolve()
        counted = self._call.counted
        return [
            None
            if r < 0 or (counted is not None and not counted[r])
            else (m[r] if isinstance(m, list) else m[r].copy())
            for r in self._rows
        ]


def _phase() -> Phase:
    """BACKWARD while JAX transposes (eager gradients), else UNKNOWN."""
    from jax._src import source_info_util
    from jax._src.source_info_util import Transform

    for elem in source_info_util.current_name_stack().stack:
        if isinstance(elem, Transform) and elem.name == "transpose":
            return Phase.BACKWARD
    # An eager gradient: JAX's backward_pass evaluates the transposed equations one by one.
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_name == "backward_pass" and f.f_code.co_filename.endswith("ad.py"):
            return Phase.BACKWARD
        f = f.f_back  # type: ignore[assignment]
    return Phase.UNKNOWN


def _module_path() -> str:
    from jax._src import source_info_util
    from jax._src.source_info_util import Scope

    stack = source_info_util.current_name_stack().stack
    return "/".join(e.name for e in stack if isinstance(e, Scope))


# Runs of a guarded program whose arguments wait for the writer (see _hold), and the
# replays of each program (see _replay).
WAITING = 1
REPLAYS = 16


class JaxDumpSession:
    """Records every run of a compiled JAX program into a :class:`DumpWriter`."""

    framework = "jax"

    def __init__(
        self,
        logdir: str,
        mode: TensorDebugMode,
        circular_buffer_size: int,
        op_regex: str | None,
        tensor_dtypes: Any,
        **writer_options: Any,
    ) -> None:
        import jax

        selection = Selection(
            re.compile(op_regex) if op_regex else None, dtype_filter(tensor_dtypes)
        )
        self.writer = DumpWriter(
            logdir,
            mode,
            circular_buffer_size,
            framework=f"jax {jax.__version__}",
            thread_init=_writer_thread,
            **writer_options,
        )
        self.mode = mode
        self.programs = Programs(mode, selection)
        self.ids = _ArrayIds()
        self.step = 0
        self._after_backward = False
        self._lock = threading.Lock()
        device = jax.devices()[0]
        self.device_name = (
            f"/job:localhost/replica:0/task:0/device:{device.platform.upper()}:{device.id}"
        )
        self.device_id = self.writer.register_device(self.device_name)
        self._closed = False
        self._waiting: collections.deque[_CallSummaries] = collections.deque()
        intercept.install(self)

    # -- the handler -------------------------------------------------------------------------

    def call(
        self, original: Callable[..., Any], args: Sequence[Any], params: dict[str, Any]
    ) -> Any:
        return self.programs.call(original, args, params, self._look)

    def _look(self, call: Call, args: Sequence[Any], outs: list[Any]) -> None:
        try:
            self._record(call, args, outs)
        except Exception as exc:  # never break the user's program
            self.writer.count_dropped(1)
            print(f"nanscope: could not record a run of {call.plan.name!r}: {exc}")

    def _replay(self, plan: GraphPlan, counts: np.ndarray) -> bool:
        """Whether a guarded call whose guards held Inf/NaN is replayed: when which guards
        held which kind is new for its program (a mask's -inf, the same at every step,
        is replayed once), for the first ``REPLAYS`` such patterns of each program."""
        pattern = plan.nonfinite(counts).tobytes()
        with self._lock:
            if pattern in plan.patterns or len(plan.patterns) >= REPLAYS:
                return False
            plan.patterns.add(pattern)
            return True

    def _record(self, call: Call, args: Sequence[Any], outs: list[Any]) -> None:
        writer = self.writer
        plan, primitive = call.plan, call.plan.primitive
        # JAX's dispatch is deep: the user's frames lie far below the innermost.
        stack = writer.capture_stack(limit=256)
        if not primitive and not plan.written:
            self._write_graph(plan, stack)
        phase = _phase()
        if phase == Phase.BACKWARD:
            self._after_backward = True
        elif self._after_backward:
            self._after_backward = False
            self.step += 1
        step = self.step
        summaries = _CallSummaries(call, self._replay)
        self._hold(summaries)
        traced: Any = summaries
        if self.mode in (TensorDebugMode.SHAPE, TensorDebugMode.NO_TENSOR):
            traced = plan.static if self.mode == TensorDebugMode.SHAPE else None
        if not primitive and plan.rows:
            writer.write_traces(
                plan.graph_id,
                plan.op_names,
                plan.slots,
                traced,
                device_name=self.device_name,
                step=step,
            )
        ids = self.ids
        no_values = self.mode == TensorDebugMode.NO_TENSOR
        writer.write_execution(
            ExecutionEvent(
                op_type=plan.name if not primitive else plan.ops[-1].op_type,
                output_tensor_ids=[ids.new(o) for o in outs],
                input_tensor_ids=[ids.get(a) for a in args],
                output_device_ids=[self.device_id] * len(outs),
                summaries=() if no_values else _Rows(summaries, plan.output_rows),
                input_summaries=() if no_values else _Rows(summaries, plan.input_rows),
                num_outputs=len(outs),
                graph_id="" if primitive else plan.graph_id,
                stack=stack,
                module_path=_module_path(),
                phase=phase,
                step=step,
            )
        )
        if plan.backward and not primitive:
            self.step += 1  # a training step (its gradients inside) has run

    def _hold(self, summaries: _CallSummaries) -> None:
        """Bound the runs whose arguments are kept for a replay: past ``WAITING``, the
        training thread looks at the oldest itself (its counts are ready by then)."""
        if not summaries.call.waits:
            return
        waiting = self._waiting
        waiting.append(summaries)
        while waiting and (not waiting[0].call.waits or len(waiting) > WAITING):
            waiting.popleft().call.settle(self._replay)

    def _write_graph(self, plan: GraphPlan, call_stack: int) -> None:
        """Write ``plan``'s graph and ops; ops with no line of their own (JAX's own
        helpers) get the stack of the call that ran the graph first."""
        writer = self.writer
        for g in plan.graphs:
            writer.write_graph(
                Graph(
                    graph_id=g.graph_id,
                    graph_name=g.name,
                    outer_graph_id=g.outer_graph_id,
                    instrumented_ops=sorted(set(plan.op_names)),
                )
            )
        for op in plan.ops:
            stack = writer.stack_from_frames(op.frames) if op.frames else call_stack
            writer.write_graph_op(
                GraphOp(
                    graph_id=op.graph_id,
                    op_type=op.op_type,
                    op_name=op.op_name,
                    graph_name=plan.name,
                    input_names=op.input_names,
                    num_outputs=op.num_outputs,
                    device_name=self.device_name,
                    stack=stack,
                    module_path=op.module_path,
                    forward_stack=stack if op.backward else -1,
                )
            )
        plan.written = True

    # -- the session -------------------------------------------------------------------------

    def set_step(self, step: int) -> None:
        self.step = step

    @property
    def context(self) -> JaxDumpSession:
        return self  # DebugSession.set_step calls context.set_step

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        intercept.uninstall(self)
        self.writer.close()


def _writer_thread() -> None:
    """The writer thread's own JAX work (copying counts to the host) is never recorded."""
    intercept.uninstrumented().__enter__()
