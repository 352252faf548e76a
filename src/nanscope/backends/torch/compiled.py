"""``torch.compile`` under nanscope: graphs recorded, summaries computed inside the compiled code.

While recording is on, inductor's ``compile_fx`` (what ``torch.compile``'s
default backend calls, at the first call of a compiled function) is replaced
by a wrapper that hands it our ``inner_compile``. AOTAutograd calls that once
per aten graph (forward, backward, or inference), after decomposition and
partitioning and before inductor's post-grad passes and lowering. There we

1. write the graph: a ``DebuggedGraph`` and one ``GraphOpCreation`` per FX
   node, with its inputs (``producer:slot``), module path (``nn_module_stack``)
   and the source line (the node's ``stack_trace``; backward nodes carry the
   forward line, recorded as their forward stack too);
2. append to the graph, per instrumented node output, the few reductions that
   the mode's summary needs (FULL_HEALTH: counts of -inf, +inf, < 0, == 0,
   > 0; NaN is the size less the last three, on the host, where the sizes are
   static, else counted as ``x != x``), concatenate all of them into one
   vector (int32 where no traced value has 2**31 elements, else int64) and
   make it one more graph output. Inductor compiles the summaries with the
   graph and fuses them into the producing kernels;
3. wrap the compiled graph: at each call it takes the extra output off (the
   rest of torch never sees it), and hands it to the writer with one
   ``write_traces`` call and one ``Execution`` for the call (``graph_id`` set).
   On CPU the vector is just a tensor; on an accelerator it is copied into
   pinned memory with ``non_blocking=True`` and an event, and only the writer
   thread waits for it. The static columns (dtype, rank, shape) are filled in
   on the writer thread.

While a compiled graph runs, the eager recorder (``DumpingMode``) is
suspended on that thread, so the extern kernels the graph calls (``mm``) are
not recorded twice; during compilation too.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import operator
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from nanscope.backends.torch.context import RunContext
from nanscope.backends.torch.dumping import SUSPENDED, DtypeFilter, DumpingMode
from nanscope.backends.torch.ops import SAME_ELEMENT_VIEWS, UNINITIALISED
from nanscope.backends.torch.summaries import DTYPE_ENUM, FLOAT_DTYPES, full_value
from nanscope.events import DumpWriter, ExecutionEvent, Graph, GraphOp, Phase
from nanscope.format.modes import SHAPE_SLOTS, TensorDebugMode

if TYPE_CHECKING:
    from nanscope.backends.torch.native_recorder import NativeRecorder

_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+), in (?P<func>.+)$', re.M)
_HEALTH = (
    TensorDebugMode.FULL_HEALTH,
    TensorDebugMode.CONCISE_HEALTH,
    TensorDebugMode.CURT_HEALTH,
)
_graph_ids = itertools.count(1)


def parse_stack_trace(text: str) -> list[tuple[str, int, str]]:
    """``(file, line, function)`` frames, outermost first, of a ``traceback``-style text."""
    return [(m["file"], int(m["line"]), m["func"].strip()) for m in _FRAME.finditer(text)]


def _op_type(node: torch.fx.Node) -> str:
    if node.op == "placeholder":
        return "Placeholder"
    target = node.target
    if isinstance(target, torch._ops.OpOverload | torch._ops.HigherOrderOperator):
        return str(target)
    name = getattr(target, "__name__", None) or str(target)
    module = getattr(target, "__module__", "") or ""
    return f"{module}.{name}" if module in ("_operator", "operator") else name


def _module_path(node: torch.fx.Node, root: str) -> str:
    """The eager recorder's path (``MLP.fc1``) from a node's ``nn_module_stack``.

    ``root`` is the path of the module whose forward Dynamo compiled (the
    eager recorder's path when compilation started); the stack holds the
    access paths of submodules under it: ``L['self'].layers[0].attn``.
    """
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return root
    path, _ = list(stack.values())[-1]
    path = re.sub(r"^L\[['\"][^'\"]*['\"]\]\.?|^L__self__\.?", "", str(path))
    path = re.sub(r"\._modules\[['\"]([^'\"]*)['\"]\]", r".\1", path)
    path = re.sub(r"\[['\"]?([^'\"\]]*)['\"]?\]", r".\1", path).strip(".")
    if not root:
        return path
    return f"{root}.{path}" if path else root


@dataclass
class _Trace:
    op_name: str
    slot: int
    value: torch.fx.Node  # the node whose value is traced (the op, or its getitem)
    dtype: int
    rank: int
    shape: tuple[Any, ...]
    row: int = -1  # row of the in-graph counts (-1: none needed)


@dataclass
class GraphPlan:
    """What one compiled graph records at each call."""

    graph_id: str
    graph_name: str
    mode: TensorDebugMode
    traces: list[_Trace] = field(default_factory=list)
    k: int = 0  # counts per computed row
    n_extra: int = 0  # extra graph outputs (0: NO_TENSOR, static SHAPE)
    device_name: str = ""
    op_names: list[str] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # Static sizes: the graph leaves NaN out of its counts, the size less the other classes.
    nan_from_size: bool = False
    sizes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    static: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    output_traces: list[int] = field(default_factory=list)  # graph output -> trace index, -1

    def finish(self) -> None:
        self.op_names = [t.op_name for t in self.traces]
        self.slots = [t.slot for t in self.traces]
        self.rows = np.array([t.row for t in self.traces], dtype=np.int64)
        if self.nan_from_size:
            self.sizes = np.array([_numel(t.shape) for t in self.traces], dtype=np.float64)
        if self.mode == TensorDebugMode.SHAPE:
            self.static = np.array(
                [
                    [-1, t.dtype, t.rank, _numel(t.shape), *_shape_slots(t.shape)]
                    for t in self.traces
                ],
                dtype=np.float64,
            ).reshape(len(self.traces), 4 + SHAPE_SLOTS)
        elif self.mode == TensorDebugMode.FULL_HEALTH:
            self.static = np.array(
                [[t.dtype, t.rank] for t in self.traces], dtype=np.float64
            ).reshape(len(self.traces), 2)

    def matrix(self, counts: np.ndarray | None) -> np.ndarray:
        """The ``[n, width]`` float64 summaries in the mode's layout."""
        mode = self.mode
        n = len(self.traces)
        if mode == TensorDebugMode.SHAPE:
            if counts is None:
                return self.static
            c = counts.reshape(-1, self.k)[self.rows].astype(np.float64)
            m = self.static.copy()
            m[:, 3:] = c  # numel, then the last six dims
            return m
        assert counts is not None
        c = counts.reshape(-1, self.k)[self.rows].astype(np.float64)
        out = np.empty((n, _WIDTH[mode]), dtype=np.float64)
        out[:, 0] = -1
        if mode == TensorDebugMode.CURT_HEALTH:
            out[:, 1] = c[:, 0] > 0
        elif mode == TensorDebugMode.CONCISE_HEALTH:
            if self.nan_from_size:
                ninf, pinf, finite = c.T
                nan = self.sizes - finite - ninf - pinf
            else:
                ninf, pinf, nan, finite = c.T
            out[:, 1] = finite + ninf + pinf + nan
            out[:, 2], out[:, 3], out[:, 4] = ninf, pinf, nan
        else:
            if self.nan_from_size:
                ninf, pinf, neg, zero, pos = c.T
                nan = self.sizes - neg - zero - pos
            else:
                ninf, pinf, nan, neg, zero, pos = c.T
            out[:, 1] = -1
            out[:, 2:4] = self.static
            out[:, 4] = neg + zero + pos + nan
            out[:, 5], out[:, 6], out[:, 7] = ninf, pinf, nan
            out[:, 8], out[:, 9], out[:, 10] = neg - ninf, zero, pos - pinf
        return out


_WIDTH = {
    TensorDebugMode.CURT_HEALTH: 2,
    TensorDebugMode.CONCISE_HEALTH: 5,
    TensorDebugMode.FULL_HEALTH: 11,
}
_K = {
    TensorDebugMode.CURT_HEALTH: 1,
    TensorDebugMode.CONCISE_HEALTH: 4,
    TensorDebugMode.FULL_HEALTH: 6,
    TensorDebugMode.SHAPE: 1 + SHAPE_SLOTS,
}


def _numel(shape: Sequence[Any]) -> int:
    n = 1
    for d in shape:
        n *= int(d) if isinstance(d, int) else 0
    return n


def _shape_slots(shape: Sequence[Any]) -> list[float]:
    dims = [float(d) if isinstance(d, int) else 0.0 for d in shape][-SHAPE_SLOTS:]
    return dims + [0.0] * (SHAPE_SLOTS - len(dims))


class _CallSummaries:
    """One graph call's summaries: resolved once, on the writer thread."""

    __slots__ = ("_event", "_host", "_matrix", "_plan")

    def __init__(self, plan: GraphPlan, extra: torch.Tensor | None) -> None:
        self._plan = plan
        self._event: Any = None
        self._matrix: np.ndarray | None = None
        if extra is not None and extra.is_cuda:
            host = torch.empty(extra.shape, dtype=extra.dtype, pin_memory=True)
            host.copy_(extra, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
            extra = host
        elif extra is not None and not extra.is_cpu:
            extra = extra.cpu()
        self._host = extra

    def resolve(self) -> np.ndarray:
        if self._matrix is None:
            if self._event is not None:
                self._event.synchronize()  # the writer thread waits, never the training thread
            counts = None if self._host is None else self._host.numpy()
            self._matrix = self._plan.matrix(counts)
        return self._matrix


class _OutputSummaries:
    """The summaries of a graph call's outputs (its ``Execution``), rows of the traces' matrix."""

    __slots__ = ("_call", "_rows")

    def __init__(self, call: _CallSummaries, rows: list[int]) -> None:
        self._call = call
        self._rows = rows

    def resolve(self) -> list[np.ndarray | None]:
        m = self._call.resolve()
        return [m[r].copy() if r >= 0 else None for r in self._rows]


class CompiledRecorder:
    """Instruments the graphs that ``torch.compile``'s inductor backend compiles while installed."""

    def __init__(
        self,
        mode: DumpingMode | NativeRecorder,
        writer: DumpWriter,
        context: RunContext,
        op_regex: re.Pattern[str] | None,
        dtype_filter: DtypeFilter | None,
    ) -> None:
        self.dumping = mode
        self.writer = writer
        self.mode = writer.mode
        self.context = context
        self.op_regex = op_regex
        self.dtype_filter = dtype_filter
        self.active = False
        self._stacks: dict[str, int] = {}
        self._original: Any = None
        self._callbacks: list[Any] = []

    # -- installation ------------------------------------------------------------------------

    def install(self) -> None:
        from torch._inductor import compile_fx as cfx

        # Code compiled before (plainly, or for another session) would run as it is.
        torch._dynamo.reset()

        original = cfx.compile_fx
        inner_default = cfx.compile_fx_inner
        recorder = self

        @functools.wraps(original)
        def compile_fx(model_: Any, example_inputs_: Any, *args: Any, **kwargs: Any) -> Any:
            if not recorder.active or args:
                return original(model_, example_inputs_, *args, **kwargs)
            if kwargs.get("inner_compile", inner_default) is inner_default:
                kwargs["inner_compile"] = functools.partial(recorder.inner_compile, inner_default)
            # AOTAutograd's cache would skip our inner_compile (no graph records).
            with torch._functorch.config.patch(enable_autograd_cache=False):
                return original(model_, example_inputs_, **kwargs)

        self._original = original
        cfx.compile_fx = compile_fx
        self._patched = compile_fx
        from torch._dynamo.callback import callback_handler

        # Dynamo's own tracing (fake tensors) is not the user's computation either.
        callback_handler.register_start_callback(_suspend)
        callback_handler.register_end_callback(_resume)
        self._callbacks = [callback_handler]
        self.active = True

    def uninstall(self) -> None:
        self.active = False
        # Our graphs would go on computing summaries that nobody records.
        torch._dynamo.reset()
        from torch._inductor import compile_fx as cfx

        if self._original is not None and cfx.compile_fx is self._patched:
            cfx.compile_fx = self._original
        for handler in self._callbacks:
            with contextlib.suppress(ValueError):
                handler.remove_start_callback(_suspend)
            with contextlib.suppress(ValueError):
                handler.remove_end_callback(_resume)
        self._callbacks = []

    # -- compile time ------------------------------------------------------------------------

    def inner_compile(
        self, inner: Callable[..., Any], gm: torch.fx.GraphModule, example_inputs: Any, **kw: Any
    ) -> Any:
        SUSPENDED.depth += 1
        try:
            try:
                plan = self._instrument(gm, kw)
            except Exception as exc:  # never break the user's program: compile it plainly
                self.dumping._failed(exc)
                return inner(gm, example_inputs, **kw)
            compiled = inner(gm, example_inputs, **kw)
            _drop_output_strides(plan.n_extra)
            return _make_instrumented(compiled, plan, self)
        finally:
            SUSPENDED.depth -= 1

    def _stack(self, text: str | None) -> int:
        if not text:
            return -1
        sid = self._stacks.get(text)
        if sid is None:
            frames = parse_stack_trace(text)
            sid = self._stacks[text] = self.writer.stack_from_frames(frames) if frames else -1
        return sid

    def _traced(self, node: torch.fx.Node, val: Any) -> bool:
        if not isinstance(val, torch.Tensor):
            return False
        name = _op_type(node)
        if name.rsplit(".", 1)[0] in UNINITIALISED:
            return False
        if self.op_regex is not None and self.op_regex.match(name) is None:
            return False
        if self.dtype_filter is not None and not self.dtype_filter(val.dtype):
            return False
        mode = self.mode
        if mode in _HEALTH:
            return val.dtype in FLOAT_DTYPES
        if mode == TensorDebugMode.SHAPE:
            return val.dtype in DTYPE_ENUM and not val.dtype.is_complex
        return True

    def _instrument(self, gm: torch.fx.GraphModule, kw: dict[str, Any]) -> GraphPlan:
        graph = gm.graph
        kind = (
            "backward"
            if kw.get("is_backward")
            else "inference"
            if kw.get("is_inference")
            else "forward"
        )
        number = next(_graph_ids)
        compile_id = torch._guards.CompileContext.current_compile_id()
        graph_id = f"torch_compile_{number}"
        graph_name = f"torch.compile {compile_id or number} {kind}"
        plan = GraphPlan(graph_id, graph_name, self.mode)
        backward = kind == "backward"
        root = self.context.module_path()
        writer = self.writer
        nodes = list(graph.nodes)
        output = nodes[-1]
        assert output.op == "output"

        # getitem users by (producer, index): multi-output ops' outputs.
        items: dict[tuple[torch.fx.Node, int], torch.fx.Node] = {}
        for n in nodes:
            if n.op == "call_function" and n.target is operator.getitem:
                src, index = n.args
                if isinstance(src, torch.fx.Node) and isinstance(index, int):
                    items[(src, index)] = n

        def name_of(n: torch.fx.Node) -> str:
            if n.op == "call_function" and n.target is operator.getitem:
                src, index = n.args
                if isinstance(src, torch.fx.Node):
                    return f"{src.name}:{index}"
            return f"{n.name}:0"

        devices: set[str] = set()
        ops: list[GraphOp] = []
        for n in nodes:
            if n.op not in ("placeholder", "call_function"):
                continue
            if n.op == "call_function" and n.target is operator.getitem:
                continue
            val = n.meta.get("val")
            inputs: list[str] = []
            for a in n.all_input_nodes:
                inputs.append(name_of(a))
            stack = self._stack(n.meta.get("stack_trace"))
            vals = val if isinstance(val, list | tuple) else [val]
            for v in vals:
                if isinstance(v, torch.Tensor):
                    devices.add(str(v.device))
            ops.append(
                GraphOp(
                    graph_id,
                    _op_type(n),
                    n.name,
                    graph_name,
                    inputs,
                    len(vals) if isinstance(val, list | tuple) else 1,
                    (),
                    next((str(v.device) for v in vals if isinstance(v, torch.Tensor)), ""),
                    stack,
                    _module_path(n, root),
                    stack if backward else -1,
                )
            )
            if n.op != "call_function":
                continue
            if isinstance(val, list | tuple):
                for i, v in enumerate(val):
                    if self._traced(n, v):
                        item = items.get((n, i))
                        if item is None:
                            with graph.inserting_after(n):
                                item = graph.call_function(operator.getitem, (n, i))
                            item.meta["val"] = v
                            items[(n, i)] = item
                        plan.traces.append(_trace(n.name, i, item, v))
            elif self._traced(n, val):
                plan.traces.append(_trace(n.name, 0, n, val))
        plan.device_name = next(iter(devices)) if len(devices) == 1 else ""
        writer.write_graph(Graph(graph_id, graph_name, "", [t.op_name for t in plan.traces]))
        for op in ops:
            writer.write_graph_op(op)

        # Graph outputs that are traced values: the call's Execution gets their summaries.
        out_args = output.args[0]
        outs = list(out_args) if isinstance(out_args, list | tuple) else [out_args]
        index = {(t.value, 0): i for i, t in enumerate(plan.traces)}
        plan.output_traces = [
            index.get((o, 0), -1) if isinstance(o, torch.fx.Node) else -1 for o in outs
        ]
        extras = self._add_summaries(gm, plan)
        if extras:
            output.args = (tuple(outs) + tuple(extras),)
            traces = output.meta.get("output_stack_traces")
            if isinstance(traces, list):
                traces.extend([None] * len(extras))
            gm.recompile()
        plan.n_extra = len(extras)
        plan.finish()
        return plan

    def _add_summaries(self, gm: torch.fx.GraphModule, plan: GraphPlan) -> list[torch.fx.Node]:
        """Append the summary computation to ``gm``; returns the extra output nodes."""
        mode = self.mode
        graph = gm.graph
        output = next(iter(reversed(graph.nodes)))
        if mode == TensorDebugMode.NO_TENSOR or not plan.traces:
            return []
        if mode == TensorDebugMode.FULL_TENSOR:
            return [t.value for t in plan.traces]
        if mode == TensorDebugMode.SHAPE and all(
            isinstance(d, int) for t in plan.traces for d in t.shape
        ):
            return []
        aten = torch.ops.aten
        k = plan.k = _K[mode]
        sizes = [_static_numel(t.shape) for t in plan.traces]
        # All sizes static: each element is exactly one of < 0, == 0, > 0 (infinities
        # included) and NaN, or of finite, -inf, +inf and NaN: the NaN count is the size less
        # the others, one count fewer per traced value.
        static = all(n is not None for n in sizes)
        if static and mode in (TensorDebugMode.FULL_HEALTH, TensorDebugMode.CONCISE_HEALTH):
            plan.nan_from_size = True
            k = plan.k = k - 1
        new: list[torch.fx.Node] = []
        parts: list[torch.fx.Node] = []
        rows: dict[torch.fx.Node, int] = {}
        inf = float("inf")

        def call(target: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
            node = graph.call_function(target, args, kwargs)
            new.append(node)
            return node

        def count(x: torch.fx.Node, dtype: torch.dtype, target: Any, *args: Any) -> torch.fx.Node:
            return call(aten.sum.default, call(target, x, *args), dtype=dtype)

        def finite(x: torch.fx.Node) -> torch.fx.Node:
            # |x| < inf: false for Inf and NaN (aten.isfinite is decomposed away by now).
            return call(aten.lt.Scalar, call(aten.abs.default, x), inf)

        # int32 counts where none can overflow: twice the lanes of int64 per vector, and the
        # one vector is int32 too (no conversion of each count to int64).
        small = all(n is not None and n < 2**31 for n in sizes)
        dt = torch.int32 if small and mode != TensorDebugMode.SHAPE else torch.int64

        with graph.inserting_before(output):
            for t in plan.traces:
                x = t.value
                base = _same_elements_base(x)
                if base is not None and base in rows and mode != TensorDebugMode.SHAPE:
                    t.row = rows[base]
                    rows[x] = t.row
                    continue
                if mode in (TensorDebugMode.FULL_HEALTH, TensorDebugMode.CONCISE_HEALTH):
                    cs = [count(x, dt, aten.eq.Scalar, -inf), count(x, dt, aten.eq.Scalar, inf)]
                    if not plan.nan_from_size:
                        cs.append(count(x, dt, aten.ne.Tensor, x))  # x != x; isnan is scalar
                    if mode == TensorDebugMode.FULL_HEALTH:
                        cs += [
                            count(x, dt, aten.lt.Scalar, 0),
                            count(x, dt, aten.eq.Scalar, 0),
                            count(x, dt, aten.gt.Scalar, 0),
                        ]
                    else:
                        cs.append(call(aten.sum.default, finite(x), dtype=dt))
                elif mode == TensorDebugMode.CURT_HEALTH:
                    cs = [
                        call(aten.sum.default, call(aten.logical_not.default, finite(x)), dtype=dt)
                    ]
                else:  # SHAPE with symbolic sizes: numel and the last six dims, computed
                    dims: list[Any] = [call(aten.sym_size.int, x, d) for d in range(len(t.shape))]
                    dims = dims[-SHAPE_SLOTS:] + [0] * (SHAPE_SLOTS - min(SHAPE_SLOTS, len(dims)))
                    cs = [
                        call(aten.scalar_tensor.default, s, dtype=torch.int64)
                        for s in [call(aten.sym_numel.default, x), *dims]
                    ]
                t.row = rows[x] = len(parts) // k
                parts.extend(call(aten.view.default, c, [1]) for c in cs)
            cat = call(aten.cat.default, parts)
        _fake_propagate(new, graph)
        return [cat]


def _static_numel(shape: Sequence[Any]) -> int | None:
    """The number of elements of a static shape; ``None`` for a symbolic one."""
    if not all(isinstance(d, int) for d in shape):
        return None
    return _numel(shape)


def _trace(op_name: str, slot: int, value: torch.fx.Node, val: torch.Tensor) -> _Trace:
    shape = tuple(int(d) if isinstance(d, int) else d for d in val.shape)
    return _Trace(op_name, slot, value, DTYPE_ENUM.get(val.dtype, 0), val.dim(), shape)


# Copies whose elements are their input's (a different layout at most): the same counts.
_SAME_ELEMENT_COPIES = frozenset({"aten.clone"})


def _same_elements_base(node: torch.fx.Node) -> torch.fx.Node | None:
    """The input whose elements a same-element view or copy shows (the same summary counts)."""
    if node.op != "call_function" or not node.args:
        return None
    name = str(node.target)
    packet = name.rsplit(".", 1)[0]
    if (packet not in SAME_ELEMENT_VIEWS and packet not in _SAME_ELEMENT_COPIES) or (
        name == "aten.view.dtype"
    ):
        return None
    base = node.args[0]
    return base if isinstance(base, torch.fx.Node) else None


def _fake_propagate(new: list[torch.fx.Node], graph: torch.fx.Graph) -> None:
    """Give the added nodes their ``meta['val']`` (inductor's passes read it)."""
    from torch._guards import detect_fake_mode

    vals = [n.meta["val"] for n in graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    fake_mode = detect_fake_mode(vals)
    ctx: Any = fake_mode if fake_mode is not None else _null()
    with ctx:
        for n in new:
            args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: a.meta["val"])
            n.meta["val"] = n.target(*args, **kwargs)  # type: ignore[operator]


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _drop_output_strides(n: int) -> None:
    """Forget inductor's strides of our extra outputs (AOTAutograd aligns them with its own)."""
    if n <= 0:
        return
    tc = torch._guards.TracingContext.try_get()
    if tc is not None and tc.output_strides:
        del tc.output_strides[-n:]


_suspended_compiles = threading.local()


def _suspend(*args: Any, **kwargs: Any) -> None:
    SUSPENDED.depth += 1
    _suspended_compiles.n = getattr(_suspended_compiles, "n", 0) + 1


def _resume(*args: Any, **kwargs: Any) -> None:
    n = getattr(_suspended_compiles, "n", 0)
    if n > 0:
        _suspended_compiles.n = n - 1
        SUSPENDED.depth = max(0, SUSPENDED.depth - 1)


def _make_instrumented(compiled: Any, plan: GraphPlan, recorder: CompiledRecorder) -> Any:
    from torch._inductor.output_code import OutputCode

    class InstrumentedGraph(OutputCode):
        """The compiled graph, less its summary outputs, recording each call."""

        def __init__(self) -> None:
            self.__dict__["inner"] = compiled
            self.__dict__["_boxed_call"] = True
            for name in ("_fx_graph_cache_key", "_fx_graph_cache_debug_lines", "_time_taken_ns"):
                self.__dict__[name] = getattr(compiled, name, None)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.__dict__["inner"], name)

        def __call__(self, inputs: Sequence[Any]) -> Any:
            return _call(compiled, plan, recorder, inputs)

        def post_compile(self, *args: Any, **kwargs: Any) -> None:
            compiled.post_compile(*args, **kwargs)
            _drop_output_strides(plan.n_extra)

        def prepare_for_serialization(self) -> None:
            compiled.prepare_for_serialization()

        def set_triton_bundle(self, triton_bundle: Any) -> None:
            compiled.set_triton_bundle(triton_bundle)

    return InstrumentedGraph()


def _call(compiled: Any, plan: GraphPlan, recorder: CompiledRecorder, inputs: Any) -> Any:
    n_extra = plan.n_extra
    if not recorder.active:
        out = compiled(inputs)
        if n_extra:
            out = list(out)
            del out[-n_extra:]
        return out
    mode = recorder.dumping
    ids = mode.ids
    in_ids = [ids.get(t) for t in inputs if isinstance(t, torch.Tensor)]
    SUSPENDED.depth += 1  # the graph's extern kernels and our copies are not eager ops
    try:
        out = compiled(inputs)
        try:
            out = list(out)
            extra = out[len(out) - n_extra :] if n_extra else []
            if n_extra:
                del out[-n_extra:]
            _record_call(plan, recorder, out, extra, in_ids)
        except Exception as exc:  # never break the user's program
            mode._failed(exc)
    finally:
        SUSPENDED.depth -= 1
    return out


def _record_call(
    plan: GraphPlan,
    recorder: CompiledRecorder,
    out: list[Any],
    extra: list[Any],
    in_ids: list[int],
) -> None:
    writer = recorder.writer
    ctx = recorder.context
    mode = recorder.dumping
    step = ctx.step
    wmode = plan.mode
    summaries: Any
    outputs: Any = ()
    if wmode == TensorDebugMode.NO_TENSOR:
        summaries = None
    elif wmode == TensorDebugMode.FULL_TENSOR:
        summaries = [full_value(t) for t in extra]
        outputs = [summaries[i] if i >= 0 else None for i in plan.output_traces]
    else:
        call = _CallSummaries(plan, extra[0] if extra else None)
        summaries = call
        outputs = _OutputSummaries(call, plan.output_traces)
    if plan.traces:
        writer.write_traces(
            plan.graph_id,
            plan.op_names,
            plan.slots,
            summaries,
            device_name=plan.device_name,
            step=step,
        )
    tensors = [t for t in out if isinstance(t, torch.Tensor)]
    if isinstance(outputs, _OutputSummaries):
        outputs._rows = [
            r for r, t in zip(plan.output_traces, out, strict=False) if isinstance(t, torch.Tensor)
        ]
    elif isinstance(outputs, list):
        outputs = [s for s, t in zip(outputs, out, strict=False) if isinstance(t, torch.Tensor)]
    node = torch._C._current_autograd_node()
    phase = ctx.phase(node)
    sync = getattr(mode, "sync", None)
    if sync is not None:  # the native recorder's buffered eager ops go first
        sync()
    writer.write_execution(
        ExecutionEvent(
            plan.graph_name,
            [mode.ids.new(t) for t in tensors],
            in_ids,
            [mode._cpu_device if t.is_cpu else mode._device_id(t) for t in tensors],
            outputs,
            (),
            len(tensors),
            plan.graph_id,
            writer.capture_stack(),
            ctx.module_path() if phase != Phase.BACKWARD else "",
            phase,
            step,
        )
    )
