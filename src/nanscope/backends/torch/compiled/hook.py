"""Where nanscope meets inductor: each aten graph it compiles, and each call of the result.

Both the ``torch.compile`` recorder (:mod:`.rewrite`) and check_numerics'
graph checks (:mod:`.checks`) instrument graphs the same way. While an
:class:`InductorHook` is installed, inductor's ``compile_fx`` (what
``torch.compile``'s default backend calls, at the first call of a compiled
function) hands its ``inner_compile``: AOTAutograd calls that once per aten
graph (forward, backward, or inference), after decomposition and partitioning
and before inductor's post-grad passes and lowering. :func:`wrap_output_code`
wraps the compiled graph that comes back so that each call goes through
nanscope, which takes the extra outputs it added off.

Dynamo's and inductor's own tracing (fake tensors) is suspended for both
recorders and the native checker (:data:`~nanscope.backends.torch.suspension.SUSPENDED`).
"""

from __future__ import annotations

import contextlib
import functools
import operator
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from nanscope._imports import AfterImport
from nanscope.backends.torch.compiled.plan import drop_output_strides
from nanscope.backends.torch.suspension import SUSPENDED


class InductorHook:
    """Instruments every graph inductor compiles while installed.

    ``instrument(gm, kw)`` changes the graph before inductor compiles it and
    returns its plan (with ``n_extra``, the outputs it appended); ``wrap(compiled,
    plan)`` wraps the compiled graph; ``failed(exc)`` is told when instrumenting
    fails, and the graph is then compiled as it is (the user's program never
    breaks for it).

    Dynamo and inductor cost seconds to import: a program that never compiles
    must not pay for them. Those already imported are hooked at
    :meth:`install`; the others the moment the program imports them.

    Recording and checking at once both instrument a graph. ``checks`` marks
    check_numerics' hook: its wrapper is the outer one at run time, so that a
    call it raises at is recorded first.
    """

    def __init__(
        self,
        instrument: Callable[[torch.fx.GraphModule, dict[str, Any]], Any],
        wrap: Callable[[Any, Any], Any],
        failed: Callable[[Exception], None],
        *,
        checks: bool = False,
    ) -> None:
        self.instrument = instrument
        self.wrap = wrap
        self.failed = failed
        self.checks = checks
        self.active = False
        self._original: Any = None
        self._patched: Any = None
        self._callbacks: list[Any] = []
        self._after_import: AfterImport | None = None

    def install(self) -> None:
        self.active = True
        if "torch._dynamo" in sys.modules:
            # Code compiled before (plainly, or for another session) would run as it is.
            torch._dynamo.reset()
        modules: dict[str, Callable[[], None]] = {
            "torch._dynamo.callback": self._register_callbacks,
            "torch._inductor.compile_fx": self._patch_compile_fx,
        }
        pending = []
        for name, hook in modules.items():
            if name in sys.modules:
                hook()
            else:
                pending.append(name)
        if pending:
            self._after_import = AfterImport(pending, lambda name: modules[name]())

    def uninstall(self) -> None:
        self.active = False
        if self._after_import is not None:
            self._after_import.remove()
            self._after_import = None
        if "torch._dynamo" in sys.modules:
            # Our graphs would go on computing what nobody looks at.
            torch._dynamo.reset()
        if self._original is not None:
            from torch._inductor import compile_fx as cfx

            if cfx.compile_fx is self._patched:
                cfx.compile_fx = self._original
            self._original = None
        for handler in self._callbacks:
            with contextlib.suppress(ValueError):
                handler.remove_start_callback(SUSPENDED.compile_started)
            with contextlib.suppress(ValueError):
                handler.remove_end_callback(SUSPENDED.compile_ended)
        self._callbacks = []

    def _patch_compile_fx(self) -> None:
        from torch._inductor import compile_fx as cfx

        original = cfx.compile_fx
        inner_default = cfx.compile_fx_inner
        hook = self

        @functools.wraps(original)
        def compile_fx(model_: Any, example_inputs_: Any, *args: Any, **kwargs: Any) -> Any:
            if not hook.active or args:
                return original(model_, example_inputs_, *args, **kwargs)
            kwargs["inner_compile"] = hook._chain(kwargs.get("inner_compile", inner_default))
            # AOTAutograd's cache would skip our inner_compile.
            with torch._functorch.config.patch(enable_autograd_cache=False):
                return original(model_, example_inputs_, **kwargs)

        self._original = original
        cfx.compile_fx = compile_fx
        self._patched = compile_fx

    def _chain(self, inner: Any) -> Any:
        """Our inner_compile around ``inner``: outermost if ours checks, else beneath checks'."""
        if not self.checks and getattr(inner, "nanscope_checks", False):
            outer = functools.partial(inner.func, self._chain(inner.args[0]))
        else:
            outer = functools.partial(self._inner_compile, inner)
        if self.checks or getattr(inner, "nanscope_checks", False):
            outer.nanscope_checks = True  # type: ignore[attr-defined]
        return outer

    def _inner_compile(
        self, inner: Callable[..., Any], gm: torch.fx.GraphModule, example_inputs: Any, **kw: Any
    ) -> Any:
        """What inductor calls for each aten graph: instrument it, compile it, wrap it."""
        SUSPENDED.enter()
        try:
            try:
                plan = self.instrument(gm, kw)
            except Exception as exc:  # never break the user's program: compile it plainly
                self.failed(exc)
                return inner(gm, example_inputs, **kw)
            compiled = inner(gm, example_inputs, **kw)
            drop_output_strides(plan.n_extra)
            return self.wrap(compiled, plan)
        finally:
            SUSPENDED.leave()

    def _register_callbacks(self) -> None:
        from torch._dynamo.callback import callback_handler

        # Dynamo's own tracing (fake tensors) is not the user's computation.
        callback_handler.register_start_callback(SUSPENDED.compile_started)
        callback_handler.register_end_callback(SUSPENDED.compile_ended)
        self._callbacks = [callback_handler]


# -- the graph ---------------------------------------------------------------------------------


def graph_kind(kw: dict[str, Any]) -> str:
    """``forward``, ``backward`` or ``inference``: which graph AOTAutograd compiles."""
    if kw.get("is_backward"):
        return "backward"
    return "inference" if kw.get("is_inference") else "forward"


class OutputItems:
    """A graph's ``getitem`` nodes by (producer, index): multi-output ops' outputs."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.graph = graph
        self._items: dict[tuple[torch.fx.Node, int], torch.fx.Node] = {}
        for n in graph.nodes:
            if n.op == "call_function" and n.target is operator.getitem:
                src, index = n.args
                if isinstance(src, torch.fx.Node) and isinstance(index, int):
                    self._items[(src, index)] = n

    def of(self, node: torch.fx.Node, index: int, val: torch.Tensor) -> torch.fx.Node:
        """The node of ``node``'s output ``index`` (value ``val``), added when there is none."""
        item = self._items.get((node, index))
        if item is None:
            with self.graph.inserting_after(node):
                item = self.graph.call_function(operator.getitem, (node, index))
            item.meta["val"] = val
            self._items[(node, index)] = item
        return item


def graph_outputs(output: torch.fx.Node) -> list[Any]:
    """What the graph's ``output`` node returns."""
    args = output.args[0]
    return list(args) if isinstance(args, list | tuple) else [args]


def append_outputs(output: torch.fx.Node, extras: Sequence[torch.fx.Node]) -> None:
    """Return ``extras`` after the graph's own outputs (which nanscope's wrapper takes off)."""
    output.args = ((*graph_outputs(output), *extras),)
    traces = output.meta.get("output_stack_traces")
    if isinstance(traces, list):
        traces.extend([None] * len(extras))


def wrap_output_code(compiled: Any, n_extra: int, call: Callable[[Sequence[Any]], Any]) -> Any:
    """Inductor's compiled graph ``compiled``, each call going through ``call(inputs)``.

    ``n_extra``: the outputs nanscope appended (``call`` takes them off); their
    strides are forgotten again when AOTAutograd's cache loads the graph.
    """
    from torch._inductor.output_code import OutputCode

    class InstrumentedGraph(OutputCode):
        """The compiled graph, as nanscope calls it."""

        def __init__(self) -> None:
            self.__dict__["inner"] = compiled
            self.__dict__["_boxed_call"] = True
            for name in ("_fx_graph_cache_key", "_fx_graph_cache_debug_lines", "_time_taken_ns"):
                self.__dict__[name] = getattr(compiled, name, None)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.__dict__["inner"], name)

        def __call__(self, inputs: Sequence[Any]) -> Any:
            return call(inputs)

        def post_compile(self, *args: Any, **kwargs: Any) -> None:
            compiled.post_compile(*args, **kwargs)
            drop_output_strides(n_extra)

        def prepare_for_serialization(self) -> None:
            compiled.prepare_for_serialization()

        def set_triton_bundle(self, triton_bundle: Any) -> None:
            compiled.set_triton_bundle(triton_bundle)

    return InstrumentedGraph()
