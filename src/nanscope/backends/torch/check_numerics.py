"""``enable_check_numerics`` for PyTorch: raise at the first op that makes Inf or NaN.

No history is kept. Each floating-point output is checked with one
vectorised sum (Inf and NaN propagate through it); only when that fails are
the categories counted and the error built. For backward ops the error names
the forward op and the line that created it, remembered cheaply (one frame
per autograd node) while the forward pass runs. On accelerators the checks
are queued on the device and looked at every ``sync_every`` ops and at each
optimizer step, so the training thread does not wait on the device after
every op; the error then comes a few ops late but still names the right op.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from types import FrameType
from typing import Any

import numpy as np
import torch
from torch._C._autograd import _get_sequence_nr
from torch.utils._python_dispatch import TorchDispatchMode

from nanscope._paths import is_library_file, is_nanscope_file
from nanscope.backends.torch.context import RunContext
from nanscope.backends.torch.dispatch import InstalledMode
from nanscope.backends.torch.ops import OpCache, OpInfo, tensors_of
from nanscope.backends.torch.summaries import FLOAT_DTYPES, any_nonfinite, counts, host_view
from nanscope.errors import Frame, NonFiniteError
from nanscope.events import Phase


def user_frame(frame: FrameType | None) -> Frame | None:
    """The innermost frame of the user's own code (not a library, not nanscope)."""
    f = frame
    while f is not None:
        path = f.f_code.co_filename
        if not is_library_file(path) and not is_nanscope_file(path):
            return (path, f.f_lineno, f.f_code.co_name)
        f = f.f_back
    return None


def _source_line(frame: Frame | None) -> str:
    if frame is None:
        return ""
    try:
        with open(frame[0], encoding="utf-8", errors="replace") as fh:
            for i, line in enumerate(fh, 1):
                if i == frame[1]:
                    return line.strip()
    except OSError:
        pass
    return ""


def describe_tensor(t: torch.Tensor) -> str:
    shape = "x".join(str(d) for d in t.shape) or "scalar"
    head = f"{str(t.dtype).replace('torch.', '')}[{shape}] on {t.device}"
    if t.dtype not in FLOAT_DTYPES:
        return head
    if t.device.type != "cpu":
        t = t.detach().cpu()
    ni, pi, nn, neg, zero, pos = counts(host_view(t))
    parts = [f"{n} {k}" for n, k in ((ni, "-inf"), (pi, "+inf"), (nn, "NaN")) if n]
    finite = f"{neg} negative, {zero} zero, {pos} positive"
    return f"{head}: {', '.join(parts) + '; ' if parts else ''}{finite}"


@dataclass
class _Queued:
    flag: torch.Tensor
    info: OpInfo
    index: int
    context: tuple[str, Phase, int, Frame | None, tuple[str, Frame | None] | None]
    output: torch.Tensor


class _Local(threading.local):
    def __init__(self) -> None:
        self.last_seq_nr = -1


class CheckNumericsMode(TorchDispatchMode):
    """Raises :class:`NonFiniteError` at the first op with a non-finite output."""

    def __init__(self, context: RunContext, sync_every: int = 64) -> None:
        super().__init__()
        self.context = context
        self.sync_every = sync_every
        self._ops = OpCache(None)
        self._local = _Local()
        # autograd node sequence_nr -> (forward op, forward user frame, module path)
        self._forward: dict[int, tuple[str, Frame | None, str]] = {}
        self._queue: list[_Queued] = []
        self._last_step = 0

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        info = self._ops[func]
        if info.skip or info.same_elements or not info.record_values:
            # Views of checked tensors hold nothing new; allocations hold garbage.
            return out
        outs = tensors_of(out, [])
        node = torch._C._current_autograd_node()
        for i, t in enumerate(outs):
            if t.dtype not in FLOAT_DTYPES or t.numel() == 0:
                continue
            if t.device.type == "cpu":
                if any_nonfinite(host_view(t)):
                    self._raise(info, i, t, args, kwargs, node, sys._getframe(1))
            elif t.device.type != "meta":
                flag = torch.isfinite(t).all()
                self._queue.append(_Queued(flag, info, i, self._facts(node, sys._getframe(1)), t))
        if node is None and torch.is_grad_enabled():
            self._remember_forward(info, args, kwargs)
        if self._queue and (
            len(self._queue) >= self.sync_every or self.context.step != self._last_step
        ):
            self._last_step = self.context.step
            self.check_queue()
        return out

    def _remember_forward(self, info: OpInfo, args: Any, kwargs: Any) -> None:
        cur = _get_sequence_nr()
        local = self._local
        if cur == local.last_seq_nr:
            return
        local.last_seq_nr = cur
        ins = tensors_of(args, [])
        if kwargs:
            for v in kwargs.values():
                tensors_of(v, ins)
        if any(t.requires_grad for t in ins):
            links = self._forward
            links[cur - 1] = (info.name, user_frame(sys._getframe(2)), self.context.module_path())
            if len(links) > 1 << 20:
                for k in list(links)[: 1 << 19]:
                    del links[k]

    def _facts(
        self, node: Any, frame: FrameType | None
    ) -> tuple[str, Phase, int, Frame | None, tuple[str, Frame | None] | None]:
        link = self._forward.get(node._sequence_nr()) if node is not None else None
        module_path = link[2] if link is not None else self.context.module_path()
        forward = (link[0], link[1]) if link is not None else None
        return (module_path, self.context.phase(), self.context.step, user_frame(frame), forward)

    def check_queue(self) -> None:
        """Look at the queued device checks (one host sync for all of them)."""
        queue, self._queue = self._queue, []
        if not queue:
            return
        flags = torch.stack([q.flag for q in queue]).cpu()
        bad = np.flatnonzero(~flags.numpy())
        if bad.size:
            q = queue[int(bad[0])]
            self._raise_with(
                q.info, q.index, q.output, (), None, q.context, late=len(queue) - int(bad[0]) - 1
            )

    def _raise(
        self,
        info: OpInfo,
        index: int,
        t: torch.Tensor,
        args: Any,
        kwargs: Any,
        node: Any,
        frame: FrameType | None,
    ) -> None:
        self._raise_with(info, index, t, args, kwargs, self._facts(node, frame), late=0)

    def _raise_with(
        self, info: OpInfo, index: int, t: torch.Tensor, args: Any, kwargs: Any,
        facts: tuple[str, Phase, int, Frame | None, tuple[str, Frame | None] | None], late: int,
    ) -> None:  # fmt: skip
        module_path, phase, step, source, forward = facts
        host = t.detach().cpu() if t.device.type != "cpu" else t
        ni, pi, nn, _, _, _ = counts(host_view(host))
        kinds = [k for n, k in ((ni, "-inf"), (pi, "+inf"), (nn, "NaN")) if n]
        where = f"{phase.name.lower()} pass, step {step}" + (
            f", module {module_path}" if module_path else ""
        )
        lines = [
            f"{info.name} produced {' and '.join(kinds)} in output {index} ({where})",
            f"  output {index}: {describe_tensor(host)}",
        ]
        ins = tensors_of(args, [])
        if kwargs:
            for v in kwargs.values():
                tensors_of(v, ins)
        for i, x in enumerate(ins):
            lines.append(f"  input {i}: {describe_tensor(x)}")
        if source is not None:
            lines.append(f"  at {source[0]}:{source[1]} in {source[2]}")
            code = _source_line(source)
            if code:
                lines.append(f"      {code}")
        forward_op, forward_source = forward if forward is not None else ("", None)
        if forward_op:
            lines.append(f"  backward of {forward_op}" + (
                f", created at {forward_source[0]}:{forward_source[1]} in {forward_source[2]}"
                if forward_source else ""
            ))  # fmt: skip
            code = _source_line(forward_source)
            if code:
                lines.append(f"      {code}")
        if late:
            lines.append(f"  (found on the device {late} ops later)")
        raise NonFiniteError(
            "\n".join(lines),
            op_type=info.name,
            module_path=module_path,
            phase=phase.name.lower(),
            step=step,
            counts={"neg_inf": ni, "pos_inf": pi, "nan": nn, "size": int(t.numel())},
            source=source,
            forward_op=forward_op,
            forward_source=forward_source,
        )


class TorchCheckNumerics:
    """The session object behind :func:`nanscope.enable_check_numerics` for PyTorch."""

    framework = "torch"

    def __init__(self, sync_every: int = 64) -> None:
        self.context = RunContext()
        self.mode = CheckNumericsMode(self.context, sync_every)
        self.context.install()
        self._installed = InstalledMode(self.mode)
        self._closed = False

    def flush(self) -> None:
        self.mode.check_queue()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._installed.remove()
        self.context.uninstall()
