"""What was running when an op ran: the nn.Module path, the phase, the training step.

Global module hooks keep a per-thread stack of module paths; global optimizer
hooks mark the optimizer phase and count steps (a step ends when
``optimizer.step()`` returns). Backward ops are recognised by the autograd node
that the engine is running.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from nanscope.events import Phase
from nanscope.format.strings import StringTable


class _Local(threading.local):
    def __init__(self) -> None:
        # (module, path) of the modules whose forward is running, outermost first.
        self.modules: list[tuple[torch.nn.Module, str]] = []
        self.in_optimizer = 0


class RunContext:
    """Tracks module paths, the optimizer phase and the step count while installed.

    A module's path is its attribute path under the outermost running module,
    which is named by its class: ``MLP.fc1``, ``Transformer.layers.3.attn``.
    """

    def __init__(self) -> None:
        self._local = _Local()
        # module -> {parent path: path}: a module run on its own and inside its
        # parent has two paths.
        self._names: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, str]] = (
            weakref.WeakKeyDictionary()
        )
        self._handles: list[RemovableHandle] = []
        self.step = 0
        # The native recorder keeps its own per-thread copy of what is running:
        # module paths as indices into ``module_names``.
        self.mirror: Any = None
        self._module_table = StringTable()
        self.on_step: Any = None  # called after a step ends

    # -- installation ------------------------------------------------------------------------

    def install(self) -> None:
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim

        self._handles = [
            nn_module.register_module_forward_pre_hook(self._enter_module),
            nn_module.register_module_forward_hook(self._exit_module, always_call=True),
            optim.register_optimizer_step_pre_hook(self._enter_optimizer),
            optim.register_optimizer_step_post_hook(self._exit_optimizer),
        ]

    def uninstall(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    # -- module paths ------------------------------------------------------------------------

    def _name_of(self, module: torch.nn.Module) -> str:
        stack = self._local.modules
        parent_path = stack[-1][1] if stack else ""
        names = self._names.get(module)
        if names is None:
            names = self._names[module] = {}
        name = names.get(parent_path)
        if name is not None:
            return name
        if stack and getattr(stack[-1][0], "_orig_mod", None) is module:
            name = parent_path  # the model inside torch.compile's OptimizedModule
        elif stack:
            parent = stack[-1][0]
            child = next(
                (key for key, sub in parent.named_children() if sub is module),
                type(module).__name__,
            )
            name = f"{parent_path}.{child}"
        else:
            # torch.compile(model) is an OptimizedModule: name it by the model.
            name = type(getattr(module, "_orig_mod", module)).__name__
        names[parent_path] = name
        return name

    def _enter_module(self, module: torch.nn.Module, args: Any) -> None:
        # Inside a frame that torch.compile traces, the hooks must be no-ops:
        # Dynamo cannot trace this bookkeeping, and compiled graphs take their
        # module paths from the nodes' ``nn_module_stack`` instead.
        if torch.compiler.is_compiling():
            return
        path = self._name_of(module)
        self._local.modules.append((module, path))
        if self.mirror is not None:
            self.mirror.set_module(self.module_index(path))

    def _exit_module(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if torch.compiler.is_compiling():
            return
        stack = self._local.modules
        if stack and stack[-1][0] is module:
            stack.pop()
        if self.mirror is not None:
            self.mirror.set_module(self.module_index(stack[-1][1]) if stack else 0)

    def module_index(self, path: str) -> int:
        """A small number for a module path (see ``module_names``)."""
        return self._module_table.intern(path)

    @property
    def module_names(self) -> list[str]:
        """Module paths by :meth:`module_index` (0 is "")."""
        return self._module_table.strings

    def module_path(self) -> str:
        stack = self._local.modules
        return stack[-1][1] if stack else ""

    # -- optimizer and steps -----------------------------------------------------------------

    def _enter_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._local.in_optimizer += 1
        if self.mirror is not None:
            self.mirror.set_optimizer(self._local.in_optimizer)

    def _exit_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._local.in_optimizer = max(0, self._local.in_optimizer - 1)
        if self.mirror is not None:
            self.mirror.set_optimizer(self._local.in_optimizer)
        if self._local.in_optimizer == 0:
            self.step += 1
            if self.mirror is not None:
                self.mirror.set_step(self.step)
            if self.on_step is not None:
                self.on_step()

    def phase(self, node: Any = False) -> Phase:
        """The phase now; ``node`` is the current autograd node when the caller has it."""
        if self._local.in_optimizer:
            return Phase.OPTIMIZER
        if node is False:
            node = torch._C._current_autograd_node()
        return Phase.BACKWARD if node is not None else Phase.FORWARD
