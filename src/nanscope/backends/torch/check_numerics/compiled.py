"""check_numerics inside ``torch.compile`` graphs (with the native checker).

Inductor's generated kernels do not go through the dispatcher, so the native
checker never sees the ops inside a compiled graph. While checking is on,
each graph that inductor compiles gets, for each floating-point value its
nodes compute, three counts (-inf, +inf, NaN) appended as one extra output,
as the recorder's summaries are (:mod:`nanscope.backends.torch.compiled.rewrite`); inductor fuses them into
the producing kernels. After each call of the graph the counts are looked at
(on an accelerator, that is one copy to the host per call), and:

* a NaN anywhere in the graph raises :class:`~nanscope.NonFiniteError` at
  that call, naming the first node that made NaN (its op, FX node, module
  and source line) and, when an earlier node made Inf, that node as the birth;
* Inf in an output of a backward graph (a gradient) raises likewise;
* Inf in an output of a forward graph is handed to the eager checker as
  written by the node that first made Inf, so that the lineage rules (an Inf
  that softmax absorbs, a loss that is not finite) go on in eager code;
* Inf that stays inside a graph (a mask that softmax absorbed) raises nothing,
  and nothing raises in a backward scaled by ``GradScaler`` (its inf check
  runs eagerly on the gradients).

Ops inside the graph's call (its extern kernels) are not checked one by one:
the graph is checked as a whole. Dynamo's and inductor's own tracing is not
checked either.
"""

from __future__ import annotations

import operator
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from nanscope.backends.torch.check_numerics.native import NativeCheckNumericsMode
from nanscope.backends.torch.check_numerics.records import OpCall, OpContext, Where
from nanscope.backends.torch.check_numerics.report import source_line, user_frame
from nanscope.backends.torch.compiled.hook import (
    InductorHook,
    OutputItems,
    append_outputs,
    graph_kind,
    graph_outputs,
    wrap_output_code,
)
from nanscope.backends.torch.compiled.plan import numel
from nanscope.backends.torch.compiled.rewrite import (
    _fake_propagate,
    _module_path,
    _op_type,
    _same_elements_base,
    parse_stack_trace,
)
from nanscope.backends.torch.ops import UNINITIALISED, OpInfo
from nanscope.backends.torch.summaries import FLOAT_DTYPES
from nanscope.backends.torch.suspension import SUSPENDED
from nanscope.errors import Birth, Frame, NonFiniteError
from nanscope.events import Phase


@dataclass
class _Value:
    """A value a node computes, and where its counts are in the extra output."""

    node: str  # the FX node's name
    op_type: str
    slot: int
    module_path: str
    frame: Frame | None  # the node's innermost source frame (for backward: the forward line)
    size: int
    dtype: str
    value: torch.fx.Node


@dataclass
class _Plan:
    graph_name: str
    kind: str  # "forward", "backward" or "inference"
    values: list[_Value] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)  # graph output -> value index, or -1
    n_extra: int = 0


class GraphChecks:
    """Checks the graphs that inductor compiles while installed."""

    def __init__(self, mode: NativeCheckNumericsMode) -> None:
        self.mode = mode
        self._hook = InductorHook(self._instrument, self._wrap, _not_checked, checks=True)

    @property
    def active(self) -> bool:
        return self._hook.active

    def install(self) -> None:
        self._hook.install()

    def uninstall(self) -> None:
        self._hook.uninstall()

    # -- compile time ------------------------------------------------------------------------

    def _wrap(self, compiled: Any, plan: _Plan) -> Any:
        return wrap_output_code(
            compiled, plan.n_extra, lambda inputs: self.call(compiled, plan, inputs)
        )

    def _instrument(self, gm: torch.fx.GraphModule, kw: dict[str, Any]) -> _Plan:
        graph = gm.graph
        kind = graph_kind(kw)
        compile_id = torch._guards.CompileContext.current_compile_id()
        plan = _Plan(graph_name=f"torch.compile {compile_id} {kind}", kind=kind)
        root = self.mode.context.module_path()
        nodes = list(graph.nodes)
        output = nodes[-1]
        items = OutputItems(graph)
        for n in nodes:
            if n.op != "call_function" or n.target is operator.getitem:
                continue
            name = _op_type(n)
            if name.rsplit(".", 1)[0] in UNINITIALISED or _same_elements_base(n) is not None:
                continue  # garbage, or the same elements as a value counted already
            val = n.meta.get("val")
            vals = list(val) if isinstance(val, list | tuple) else [val]
            frames = parse_stack_trace(n.meta.get("stack_trace") or "")
            for slot, v in enumerate(vals):
                if not isinstance(v, torch.Tensor) or v.dtype not in FLOAT_DTYPES:
                    continue
                value = items.of(n, slot, v) if isinstance(val, list | tuple) else n
                size = numel(v.shape)
                plan.values.append(
                    _Value(
                        node=n.name,
                        op_type=name,
                        slot=slot,
                        module_path=_module_path(n, root),
                        frame=frames[-1] if frames else None,
                        size=size,
                        dtype=str(v.dtype).replace("torch.", ""),
                        value=value,
                    )
                )
        if not plan.values:
            return plan
        outs = graph_outputs(output)
        index = {v.value: i for i, v in enumerate(plan.values)}
        plan.outputs = [index.get(o, -1) if isinstance(o, torch.fx.Node) else -1 for o in outs]
        append_outputs(output, [self._add_counts(graph, plan)])
        gm.recompile()
        plan.n_extra = 1
        return plan

    def _add_counts(self, graph: torch.fx.Graph, plan: _Plan) -> torch.fx.Node:
        """Append -inf, +inf and NaN counts of every value, as one vector; returns its node."""
        aten = torch.ops.aten
        new: list[torch.fx.Node] = []
        small = all(0 < v.size < 2**31 for v in plan.values)
        dt = torch.int32 if small else torch.int64

        def call(target: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
            node = graph.call_function(target, args, kwargs)
            new.append(node)
            return node

        def count(x: torch.fx.Node, target: Any, *args: Any) -> torch.fx.Node:
            total = call(aten.sum.default, call(target, x, *args), dtype=dt)
            return call(aten.view.default, total, [1])

        output = next(iter(reversed(graph.nodes)))
        parts: list[torch.fx.Node] = []
        with graph.inserting_before(output):
            for v in plan.values:
                x = v.value
                parts += [
                    count(x, aten.eq.Scalar, -float("inf")),
                    count(x, aten.eq.Scalar, float("inf")),
                    count(x, aten.ne.Tensor, x),  # x != x: NaN (isnan is decomposed away)
                ]
            cat = call(aten.cat.default, parts)
        _fake_propagate(new, graph)
        return cat

    # -- call time ---------------------------------------------------------------------------

    def call(self, compiled: Any, plan: _Plan, inputs: Any) -> Any:
        """Run the compiled graph once, with its extern kernels unchecked; then check it."""
        SUSPENDED.enter()
        try:
            out = compiled(inputs)
        finally:
            SUSPENDED.leave()
        if not plan.n_extra:
            return out
        out = list(out)
        counts = out.pop()
        if self.active:
            c = counts.detach().cpu().numpy().reshape(-1, 3)
            if c.any():
                self._found(plan, c.astype(np.int64), out)
        return out

    def _found(self, plan: _Plan, c: np.ndarray, out: list[Any]) -> None:
        mode = self.mode
        if mode._scaled_backward > 0 or mode._in_scale > 0:
            return  # GradScaler's inf check looks at the gradients, eagerly
        bad = np.nonzero(c.any(axis=1))[0]
        first = int(bad[0])
        nan = np.nonzero(c[:, 2])[0]
        if len(nan):
            raise self._error(plan, int(nan[0]), c, first, "nan")
        rows = [(i, r) for i, r in enumerate(plan.outputs) if r >= 0 and c[r].any()]
        if not rows:
            return  # absorbed inside the graph
        if plan.kind == "backward":
            raise self._error(plan, rows[0][1], c, first, "gradient")
        # Forward: the eager checker follows them from the node that first made Inf.
        birth = plan.values[first]
        tensors = [out[i] for i, _ in rows if isinstance(out[i], torch.Tensor)]
        if not tensors:
            return
        info = OpInfo(
            name=f"{birth.op_type} (node {birth.node} of {plan.graph_name})",
            skip=False,
            same_elements=False,
            inplace=False,
            record_values=True,
        )
        where = Where(birth.module_path, Phase.FORWARD, mode.context.step, birth.frame, None)
        ctx = OpContext(where, backward=False, deferring=False, stepping=tuple(mode._stepping))
        with mode.outside():
            mode._process(
                OpCall(None, info, (), None, tensors, ctx=ctx), list(range(len(tensors))), now=True
            )
        mode._rewatch()

    def _error(
        self, plan: _Plan, row: int, c: np.ndarray, first: int, reason: str
    ) -> NonFiniteError:
        v = plan.values[row]
        ninf, pinf, nan = (int(x) for x in c[row])
        kinds = " and ".join(k for n, k in ((ninf, "-inf"), (pinf, "+inf"), (nan, "NaN")) if n)
        backward = plan.kind == "backward"
        phase = "backward" if backward else "forward"
        step = self.mode.context.step
        where = f"{phase} pass, step {step}" + (
            f", module {v.module_path}" if v.module_path else ""
        )
        lines = [
            f"{v.op_type} produced {kinds} in output {v.slot} ({where})",
            f"  node {v.node} of the compiled graph {plan.graph_name!r}"
            f" ({v.dtype}, {v.size} elements)",
        ]
        if reason == "gradient":
            lines.append("  it is a gradient: the backward graph returns it")
        call = user_frame(sys._getframe(2))
        source = call if backward else v.frame
        forward = v.frame if backward else None
        if source is not None:
            lines += [
                f"  at {source[0]}:{source[1]} in {source[2]}",
                f"      {source_line(source)}",
            ]
        if forward is not None:
            lines += [
                f"  backward of the node created at {forward[0]}:{forward[1]} in {forward[2]}",
                f"      {source_line(forward)}",
            ]
        b = plan.values[first]
        bn, bp, bnan = (int(x) for x in c[first])
        born = Birth(
            op_type=b.op_type,
            module_path=b.module_path,
            phase=phase,
            step=step,
            counts={"neg_inf": bn, "pos_inf": bp, "nan": bnan, "size": b.size},
            source=None if backward else b.frame,
            forward_source=b.frame if backward else None,
        )
        if first != row:
            at = f" {b.frame[0]}:{b.frame[1]}" if b.frame else ""
            lines.append(f"  born at {b.op_type} (node {b.node}){at}")
        return NonFiniteError(
            "\n".join(lines),
            op_type=v.op_type,
            module_path=v.module_path,
            phase=phase,
            step=step,
            counts={"neg_inf": ninf, "pos_inf": pinf, "nan": nan, "size": v.size},
            source=source,
            forward_source=forward,
            reason=reason,
            birth=born,
            forward_op=v.op_type if backward else "",
        )


def _not_checked(exc: Exception) -> None:
    print(f"nanscope: a compiled graph is not checked ({exc!r})", file=sys.stderr)
