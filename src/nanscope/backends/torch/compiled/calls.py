"""Call time: each call of an instrumented graph recorded, from the summaries it computed.

The compiled graph (see :mod:`.rewrite`) returns one extra output, the
vector of its summaries' counts. Its wrapper takes that output off (the rest
of torch never sees it) and hands it to the writer with one ``write_traces``
call and one ``Execution`` for the call (``graph_id`` set). On CPU the vector
is just a tensor; on an accelerator it is copied into pinned memory with
``non_blocking=True`` and an event, and only the writer thread waits for it.
The static columns (dtype, rank, shape) are filled in on the writer thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from nanscope.backends.torch.compiled.hook import wrap_output_code
from nanscope.backends.torch.compiled.plan import GraphPlan
from nanscope.backends.torch.context import RunContext
from nanscope.backends.torch.recorders.base import Recorder
from nanscope.backends.torch.summaries import full_value, summarize_host
from nanscope.backends.torch.suspension import SUSPENDED
from nanscope.events import DumpWriter, ExecutionEvent, Phase
from nanscope.format.modes import TensorDebugMode


class GraphCalls:
    """Records the calls of instrumented graphs while :attr:`active`."""

    def __init__(self, eager: Recorder, writer: DumpWriter, context: RunContext) -> None:
        self.eager = eager  # tensor ids and devices are the eager recorder's
        self.writer = writer
        self.context = context
        self.active = False

    def wrap(self, compiled: Any, plan: GraphPlan) -> Any:
        """Inductor's compiled graph ``compiled``, wrapped so that each call is recorded."""
        return wrap_output_code(
            compiled, plan.n_extra, lambda inputs: self.call(compiled, plan, inputs)
        )

    def call(self, compiled: Any, plan: GraphPlan, inputs: Any) -> Any:
        """Run the compiled graph once; record the call while active."""
        n_extra = plan.n_extra
        if not self.active:
            out = compiled(inputs)
            if n_extra:
                out = list(out)
                del out[-n_extra:]
            return out
        eager = self.eager
        ids = eager.ids
        # One per graph input (its placeholder), 0 for a number (a SymInt).
        in_ids = [ids.get(t) if isinstance(t, torch.Tensor) else 0 for t in inputs]
        # The inputs, summarised when the call made Inf/NaN (the call empties ``inputs``).
        held = list(inputs) if plan.native_counts else None
        SUSPENDED.enter()  # the graph's extern kernels and our copies are not eager ops
        try:
            out = compiled(inputs)
            try:
                out = list(out)
                extra = out[len(out) - n_extra :] if n_extra else []
                if n_extra:
                    del out[-n_extra:]
                self._record(plan, out, extra, in_ids, held)
            except Exception as exc:  # never break the user's program
                eager.failed(exc)
        finally:
            SUSPENDED.leave()
        return out

    def _record(
        self,
        plan: GraphPlan,
        out: list[Any],
        extra: list[Any],
        in_ids: list[int],
        held: list[Any] | None = None,
    ) -> None:
        writer = self.writer
        ctx = self.context
        eager = self.eager
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
            if plan.statistics:  # the statistics' outputs come after the counts'
                stats, extra = extra[len(extra) - plan.statistics :], extra[: -plan.statistics]
            else:
                stats = []
            call = _CallSummaries(
                plan, extra if plan.native_counts else extra[0] if extra else None, stats
            )
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
                r
                for r, t in zip(plan.output_traces, out, strict=False)
                if isinstance(t, torch.Tensor)
            ]
        elif isinstance(outputs, list):
            outputs = [s for s, t in zip(outputs, out, strict=False) if isinstance(t, torch.Tensor)]
        node = torch._C._current_autograd_node()
        phase = ctx.phase(node)
        eager.sync()  # the eager ops recorded before this call go first
        writer.write_execution(
            ExecutionEvent(
                op_type=plan.graph_name,
                output_tensor_ids=[eager.ids.new(t) for t in tensors],
                input_tensor_ids=in_ids,
                output_device_ids=[
                    eager.cpu_device if t.is_cpu else eager.device_id(t) for t in tensors
                ],
                summaries=outputs,
                input_summaries=self._input_summaries(plan, extra, held),
                num_outputs=len(tensors),
                graph_id=plan.graph_id,
                stack=writer.capture_stack(),
                module_path=ctx.module_path() if phase != Phase.BACKWARD else "",
                phase=phase,
                step=step,
            )
        )

    def _input_summaries(
        self, plan: GraphPlan, extra: list[Any], held: list[Any] | None
    ) -> list[Any]:
        """The graph inputs' summaries, one per input (``None``: a number), when a traced
        value of the call holds Inf/NaN: the inputs are not traced, and what came in through
        them is no birth inside the graph (docs/ROOT_CAUSE.md, "Compiled graphs' inputs")."""
        if held is None or not extra or not plan.native_counts:
            return []
        if not bool(torch.stack(extra)[:, :3].any()):  # -inf, +inf, NaN of every value
            return []
        mode = self.writer.mode
        return [
            summarize_host(t, mode) if isinstance(t, torch.Tensor) and t.is_cpu else None
            for t in held
        ]


class _CallSummaries:
    """One graph call's summaries: resolved once, on the writer thread."""

    __slots__ = ("_event", "_host", "_matrix", "_plan", "_stats")

    def __init__(
        self,
        plan: GraphPlan,
        extra: torch.Tensor | list[torch.Tensor] | None,
        stats: list[torch.Tensor] | None = None,
    ) -> None:
        self._plan = plan
        self._event: Any = None
        self._matrix: np.ndarray | None = None
        self._stats: Any = None
        if stats:
            # [rows, 4], copied like the counts: off an accelerator without a sync.
            s = torch.stack(stats)
            if s.is_cuda:
                host = torch.empty(s.shape, dtype=s.dtype, pin_memory=True)
                host.copy_(s, non_blocking=True)
                s = host
            elif not s.is_cpu:
                s = s.cpu()
            self._stats = s
        if isinstance(extra, list):  # nanscope_graph::counts's CPU vectors, one per row
            self._host: Any = extra
            return
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
            host = self._host
            if isinstance(host, list):
                counts = np.concatenate([t.numpy() for t in host]) if host else None
            else:
                counts = None if host is None else host.numpy()
            stats = None if self._stats is None else self._stats.numpy()
            self._matrix = self._plan.matrix(counts, stats)
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
