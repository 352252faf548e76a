"""Turning check_numerics on and off for PyTorch: the mode, its hooks into
``backward()``, ``optimizer.step()`` and ``GradScaler``, and compiled graphs' checks."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from nanscope.backends.torch.check_numerics.compiled import GraphChecks
from nanscope.backends.torch.check_numerics.native import NativeChecking, NativeCheckNumericsMode
from nanscope.backends.torch.check_numerics.rule import CheckNumericsMode
from nanscope.backends.torch.context import RunContext, subclasses
from nanscope.backends.torch.dispatch import InstalledMode
from nanscope.backends.torch.native import native_library


class TorchCheckNumerics:
    """The session object behind :func:`nanscope.enable_check_numerics` for PyTorch."""

    framework = "torch"

    def __init__(self, sync_every: int = 64, queue_cpu: bool = False) -> None:
        self.context = RunContext()
        # The native checker unless NANSCOPE_TORCH_RECORDER=python or no compiler
        # (queue_cpu, for tests of the device queue, is the Python mode's).
        lib = None if queue_cpu else native_library()
        self.native = lib is not None
        self.context.install()
        self._undo: list[Callable[[], None]] = []
        self._installed: InstalledMode | Any
        self.mode: CheckNumericsMode
        if lib is not None:
            native = NativeCheckNumericsMode(self.context, lib, sync_every)
            self.mode = native
            self._hook_in()
            self._installed = NativeChecking(native)
            # Inductor's kernels bypass the dispatcher: compiled graphs count their own values.
            graphs = GraphChecks(native)
            graphs.install()
            self._undo.append(graphs.uninstall)
        else:
            self.mode = CheckNumericsMode(self.context, sync_every, queue_cpu)
            self._hook_in()
            self._installed = InstalledMode(self.mode)
        self._closed = False

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        checking = make(original)
        session = self

        # Wrapped again by someone else (the recorder's context) and not undone when checking
        # ends, the patch must pass calls on from then on.
        @functools.wraps(original)
        def patched(*args: Any, **kwargs: Any) -> Any:
            return (original if session._closed else checking)(*args, **kwargs)

        setattr(owner, name, patched)

        def undo() -> None:
            if (
                owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name)
            ) is patched:
                setattr(owner, name, original)

        self._undo.append(undo)

    def _hook_in(self) -> None:
        from torch.optim import optimizer as optim

        mode = self.mode
        handles = [
            optim.register_optimizer_step_pre_hook(lambda opt, a, k: mode.before_step(opt)),
            optim.register_optimizer_step_post_hook(lambda opt, a, k: mode.after_step(opt)),
        ]
        self._undo += [h.remove for h in handles]

        def backward(real: Any) -> Any:
            @functools.wraps(real)
            def checked(tensors: Any, *args: Any, **kwargs: Any) -> Any:
                if not mode.before_backward(tensors):
                    return real(tensors, *args, **kwargs)
                mode.scaled_backward(1)
                try:
                    return real(tensors, *args, **kwargs)
                finally:
                    mode.scaled_backward(-1)

            return checked

        # Tensor.backward() calls torch.autograd.backward.
        self._patch(torch.autograd, "backward", backward)

        def scale(real: Any) -> Any:
            @functools.wraps(real)
            def checked(scaler: Any, outputs: Any) -> Any:
                mode.scaling(1)
                try:
                    result = real(scaler, outputs)
                finally:
                    mode.scaling(-1, opened=bool(scaler.is_enabled()))
                return result

            return checked

        def update(real: Any) -> Any:
            @functools.wraps(real)
            def checked(scaler: Any, *args: Any, **kwargs: Any) -> Any:
                result = real(scaler, *args, **kwargs)
                mode._close_scaler_iteration()
                return result

            return checked

        for cls in (torch.amp.GradScaler, *subclasses(torch.amp.GradScaler)):
            if "scale" in cls.__dict__:
                self._patch(cls, "scale", scale)
            if "update" in cls.__dict__:
                self._patch(cls, "update", update)

    def flush(self) -> None:
        self.mode.check_queue()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.mode.finish()
        finally:
            self._installed.remove()
            for undo in reversed(self._undo):
                undo()
            self.context.uninstall()
            self.mode._holds.clear()
