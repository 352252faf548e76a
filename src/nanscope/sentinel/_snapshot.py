"""What a replay restores: the state a training step began with.

:class:`StepStart` is taken at every step's start and is cheap: the random number
generators' states, the model's buffers (BatchNorm statistics: copied into tensors
kept from step to step, no allocation) and the optimizers' hyperparameters (a
scheduler may change the learning rate inside the step). :class:`StateCopy` holds
the parameters and the optimizer state: taken before every optimizer step only with
``snapshot_state=True`` (it doubles their memory), and once at a replay's start.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from typing import Any

import torch


def _rng_states(numpy_rng: bool) -> dict[str, Any]:
    states: dict[str, Any] = {"torch": torch.default_generator.get_state()}
    if torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    states["python"] = random.getstate()
    numpy = sys.modules.get("numpy") if numpy_rng else None
    if numpy is not None:
        states["numpy"] = numpy.random.get_state()
    return states


def _set_rng_states(states: dict[str, Any]) -> None:
    torch.default_generator.set_state(states["torch"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])
    random.setstate(states["python"])
    if "numpy" in states:
        sys.modules["numpy"].random.set_state(states["numpy"])


def _hyperparameters(optimizers: Sequence[torch.optim.Optimizer]) -> list[list[dict[str, Any]]]:
    # Taken at every step: a dict copy and one pass (tensor values, a learning rate held
    # as a tensor, are cloned: the optimizer may change them in place).
    out = []
    for opt in optimizers:
        groups = []
        for g in opt.param_groups:
            saved = g.copy()
            del saved["params"]
            for k, v in saved.items():
                if isinstance(v, torch.Tensor):
                    saved[k] = v.clone()
            groups.append(saved)
        out.append(groups)
    return out


def _set_hyperparameters(
    optimizers: Sequence[torch.optim.Optimizer], saved: list[list[dict[str, Any]]]
) -> None:
    for opt, groups in zip(optimizers, saved, strict=False):
        for group, values in zip(opt.param_groups, groups, strict=False):
            for k, v in values.items():
                if isinstance(v, torch.Tensor) and isinstance(group.get(k), torch.Tensor):
                    group[k].copy_(v)
                else:
                    group[k] = v


LOOKS = 2  # steps a buffer's values are compared before it is taken for a constant


class Buffers:
    """The model's buffers as the step began: copies of those that training writes.

    A buffer that changes from step to step (BatchNorm's statistics) is copied each
    step, into a tensor allocated once; one that stays as it was for the first steps
    (an attention mask) is not copied after them, and needs no restoring unless its
    version counter (``tensor._version``, bumped by in-place writes) says it changed.
    Changes are seen by the version counter, and for the first steps by comparing
    values (``batch_norm`` updates its running statistics without bumping it). A
    buffer replaced by a new tensor is found again by its name.
    """

    def __init__(self, model: torch.nn.Module | None) -> None:
        self._slots = (
            []
            if model is None
            else [(m, n) for m in model.modules() for n, b in m._buffers.items() if b is not None]
        )
        k = len(self._slots)
        self._live: list[torch.Tensor | None] = [None] * k
        self._versions = [0] * k  # each buffer's version when the step began
        self._saved: list[torch.Tensor | None] = [None] * k
        self._written = [False] * k  # seen written by a step: copied every step
        self._looks = [0] * k  # steps whose values were compared with the copy

    def save(self) -> None:
        for i, (m, n) in enumerate(self._slots):
            b = m._buffers.get(n)
            if b is None:
                self._live[i] = self._saved[i] = None
                continue
            saved = self._saved[i]
            if b is not self._live[i]:  # first seen, or replaced: copy it
                self._saved[i] = b.detach().clone()
                self._written[i], self._looks[i] = False, 0
                copy = False
            else:
                if not self._written[i]:
                    if b._version != self._versions[i]:
                        self._written[i] = True
                    elif saved is not None and self._looks[i] < LOOKS:
                        # Kernels that update running statistics (batch_norm) do not
                        # bump the version: the values say it for the first steps.
                        self._looks[i] += 1
                        self._written[i] = not torch.equal(b, saved)
                copy = self._written[i]
                if not copy and self._looks[i] >= LOOKS:
                    self._saved[i] = None  # unchanged for LOOKS steps: no copy kept
            if copy:
                if saved is None or saved.shape != b.shape or saved.dtype != b.dtype:
                    self._saved[i] = b.detach().clone()
                else:
                    with torch.no_grad():
                        saved.copy_(b.detach())
            self._live[i] = b
            self._versions[i] = b._version

    def restore(self) -> None:
        """Put back the buffers' tensors and the values they began the step with (one
        taken for a constant has no copy: it keeps its values)."""
        with torch.no_grad():
            for i, (m, n) in enumerate(self._slots):
                live, saved = self._live[i], self._saved[i]
                if live is None:
                    continue
                m._buffers[n] = live  # the tensor the step began with
                if saved is not None:  # (batch_norm's writes do not bump the version)
                    live.copy_(saved)
                self._versions[i] = live._version


class StepStart:
    """The cheap part of a step's start state: RNG states, buffers, hyperparameters."""

    def __init__(self, model: torch.nn.Module | None, numpy_rng: bool = False) -> None:
        self.numpy_rng = numpy_rng
        self.buffers = Buffers(model)
        self.rng: dict[str, Any] = {}
        self.hyperparameters: list[list[dict[str, Any]]] = []

    def save(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        self.rng = _rng_states(self.numpy_rng)
        self.buffers.save()
        self.hyperparameters = _hyperparameters(optimizers)

    def restore(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        _set_rng_states(self.rng)
        self.buffers.restore()
        _set_hyperparameters(optimizers, self.hyperparameters)


class Now:
    """RNG states and hyperparameters as they are now (to put back after a replay)."""

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        self.rng = _rng_states(numpy_rng=True)
        self.hyperparameters = _hyperparameters(optimizers)

    def restore(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        _set_rng_states(self.rng)
        _set_hyperparameters(optimizers, self.hyperparameters)


class StateCopy:
    """A copy of parameters and optimizer state, kept in tensors reused from step to step."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] = ()
        self._live: list[torch.Tensor] = []
        self._saved: list[torch.Tensor] = []
        # Per optimizer: param -> its state's non-tensor values, or None (no state yet).
        self._plain: list[dict[torch.Tensor, dict[str, Any] | None]] = []
        self.taken = False

    @staticmethod
    def _layout(
        params: Sequence[torch.Tensor], optimizers: Sequence[torch.optim.Optimizer]
    ) -> tuple[tuple[Any, ...], list[torch.Tensor]]:
        live = [p.detach() for p in params]
        key: list[Any] = [len(live)]
        for opt in optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    state = opt.state.get(p)
                    if not state:
                        key.append(None)
                        continue
                    names = []
                    for k, v in state.items():
                        if isinstance(v, torch.Tensor):
                            names.append(k)
                            live.append(v.detach())
                    key.append(tuple(names))
        return tuple(key), live

    def take(
        self, params: Sequence[torch.Tensor], optimizers: Sequence[torch.optim.Optimizer]
    ) -> None:
        key, live = self._layout(params, optimizers)
        with torch.no_grad():
            if key != self._key or any(
                a.shape != b.shape or a.dtype != b.dtype
                for a, b in zip(live, self._saved, strict=False)
            ):
                self._saved = [t.clone() for t in live]
                self._key = key
            elif live:
                torch._foreach_copy_(self._saved, live)
        self._live = live
        self._plain = [
            {
                p: (
                    None
                    if not opt.state.get(p)
                    else {k: v for k, v in opt.state[p].items() if not isinstance(v, torch.Tensor)}
                )
                for g in opt.param_groups
                for p in g["params"]
            }
            for opt in optimizers
        ]
        self.taken = True

    def restore(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """Put the values back, into the same tensors (the optimizer keeps its references)."""
        if not self.taken:
            return
        with torch.no_grad():
            if self._live:
                torch._foreach_copy_(self._live, self._saved)
        for opt, plain in zip(optimizers, self._plain, strict=False):
            for p, values in plain.items():
                if values is None:
                    opt.state.pop(p, None)  # state the step created: gone again
                else:
                    opt.state[p].update(values)
