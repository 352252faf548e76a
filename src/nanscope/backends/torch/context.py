"""What was running when an op ran: the nn.Module path, the phase, the training step.

Global module hooks keep a per-thread stack of the modules whose forward is
running, each with its path (:class:`ModuleNames`). The native recorder and
checker read the modules off the thread's frames of ``nn.Module.__call__``
instead, and ask for a path once per list of modules
(:meth:`RunContext.follow_frames`). The phase and the step follow the training
loop (see :class:`RunContext`): global optimizer hooks, and while recording
``torch.autograd.backward``, ``GradScaler.step`` and ``GradScaler.update``
wrapped (restored when recording stops). Backward ops are recognised by the
autograd node that the engine is running.
"""

from __future__ import annotations

import functools
import gc
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any, cast

import torch
from torch._C._autograd import _get_sequence_nr
from torch.utils.hooks import RemovableHandle

from nanscope.events import Phase
from nanscope.format.strings import StringTable

# -- module paths ----------------------------------------------------------------------------


def module_label(qualified: str, cls: str) -> str:
    """A module's path as the dump records it: ``transformer.h.1.ln_1 (LayerNorm)``.

    ``qualified`` is the module's name in ``named_modules()`` of the
    outermost module running; the outermost module itself (``qualified``
    empty) is named by its class alone: ``GPT2LMHeadModel``.
    """
    return f"{qualified} ({cls})" if qualified else cls


def qualified_name(label: str) -> str:
    """The qualified name in a module path (``transformer.h.1.ln_1``); "" for the outermost."""
    name, sep, _ = label.rpartition(" (")
    return name if sep else ""


def join_names(prefix: str, name: str) -> str:
    """``prefix.name``, either part possibly empty."""
    return f"{prefix}.{name}" if prefix and name else prefix or name


def _model_of(module: torch.nn.Module) -> torch.nn.Module:
    """The model inside ``torch.compile(model)`` (an ``OptimizedModule``), else the module.

    Tested by name: importing Dynamo to test the type costs seconds.
    """
    if type(module).__name__ == "OptimizedModule":
        inner = module._modules.get("_orig_mod")
        if inner is not None:
            return inner
    return module


# PyTorch warns at every call of a ``torch.compile(module)`` while any global module hook is
# registered, as nanscope's are while it records or checks: the hooks then run for the
# ``OptimizedModule`` wrapper and again for the module inside it (the wrapper's ``__call__``
# is ``Module.__call__``, whose forward calls the inner module's ``__call__``). nanscope's
# hooks expect that: the wrapper and its model share one path (``ModuleNames.add``), and the
# pair pushes and pops its two entries in order, so the ops inside are named as the model's
# either way. The warning tells the program nothing it can act on, so while nanscope's hooks
# are installed that one message is ignored (only it: other warnings, and this one before
# and after, are shown as usual).
_COMPILE_HOOK_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks on modules"
_quiet_lock = threading.Lock()
_quiet_users = 0
_quiet_filter: Any = None


def _quiet_compile_hook_warning() -> Callable[[], None]:
    """Ignore PyTorch's warning about global module hooks under ``torch.compile(module)``
    until the returned function is called (counted: several contexts may be installed)."""
    global _quiet_users, _quiet_filter
    with _quiet_lock:
        _quiet_users += 1
        if _quiet_users == 1:
            warnings.filterwarnings("ignore", message=_COMPILE_HOOK_WARNING, category=UserWarning)
            _quiet_filter = warnings.filters[0]

    def restore() -> None:
        global _quiet_users, _quiet_filter
        with _quiet_lock:
            _quiet_users -= 1
            if _quiet_users or _quiet_filter is None:
                return
            # The filter is taken out by identity: the program may have added its own since.
            filters = cast("list[Any]", warnings.filters)  # a list, typed as a Sequence
            for i, item in enumerate(filters):
                if item is _quiet_filter:
                    del filters[i]
                    # Warnings' caches follow a version number that this bumps; where it is
                    # missing, nothing is stale: an ignored warning leaves no cache entry.
                    mutated = getattr(warnings, "_filters_mutated", None)
                    if mutated is not None:
                        mutated()
                    break
            _quiet_filter = None

    return restore


# (a weak reference to the module, its path, the path's index in RunContext.module_names)
_Label = tuple["weakref.ref[torch.nn.Module]", str, int]


class ModuleNames:
    """The paths of the modules under one *base* module, from its ``named_modules()``.

    The base is the outermost module running (its path: its class), or a
    module called inside it that it does not hold (kept in a plain list,
    made on the fly, another model): such a module is named ``<Class>``
    after its caller, ``h.1.<Teacher>``, and its own modules under that,
    ``h.1.<Teacher>.fc1``. A module registered under two names takes the
    first. ``torch.compile(m)`` is named as ``m``: its ``_orig_mod`` is left
    out of the names.
    """

    __slots__ = ("base", "inner", "intern", "labels", "loose")

    def __init__(
        self, base: torch.nn.Module, prefix: str | None, intern: Callable[[str], int]
    ) -> None:
        self.base = weakref.ref(base)
        self.intern = intern
        # id(module) -> its label. Keyed by id, not weakly by module: a
        # WeakKeyDictionary lookup makes a weak reference each time, and this
        # is read at every module call. The label holds a weak reference
        # that tells a module from a later one at the same address.
        self.labels: dict[int, _Label] = {}
        self.add(base, prefix or "")  # no prefix: the outermost module, named by its class
        # Modules called under these that the base does not hold: id -> (module, the
        # step when it was found missing); and their own names, by (id, caller's path).
        self.loose: dict[int, tuple[weakref.ref[torch.nn.Module], int]] = {}
        self.inner: dict[tuple[int, str], ModuleNames] = {}

    def add(self, root: torch.nn.Module, name: str) -> None:
        """Name ``root`` (its qualified name: ``name``) and the modules under it."""
        for sub, m in _model_of(root).named_modules():
            qualified = ".".join(p for p in join_names(name, sub).split(".") if p != "_orig_mod")
            label = module_label(qualified, type(_model_of(m)).__name__)
            if id(m) not in self.labels or self.labels[id(m)][0]() is not m:
                self.labels[id(m)] = (weakref.ref(m), label, self.intern(label))
        # torch.compile(model) runs as the model: both have the model's path.
        model = self.labels[id(_model_of(root))]
        self.labels[id(root)] = (weakref.ref(root), model[1], model[2])


# (module, path, path's index, the names its submodules are looked up in)
_Running = tuple[torch.nn.Module, str, int, ModuleNames]


# -- phases and steps ------------------------------------------------------------------------


class _Local(threading.local):
    def __init__(self) -> None:
        # The modules whose forward is running, outermost first.
        self.modules: list[_Running] = []
        # optimizer.step(), GradScaler.step() and GradScaler.update() calls running.
        self.in_optimizer = 0
        # After backward() returned: the autograd sequence number then, until the
        # step ends or a forward pass begins (-1 otherwise). A forward pass has
        # begun when an op made an autograd node since (the number moved on).
        self.after_backward = -1


class RunContext:
    """Tracks module paths, phases and steps while installed.

    *Module paths*: a module's qualified name in ``named_modules()`` of the
    outermost module running, with its class: ``transformer.h.1.ln_1
    (LayerNorm)``; the outermost module is named by its class
    (``GPT2LMHeadModel``). See :class:`ModuleNames`.

    *Steps* count training iterations, one per weight update, from 0:

    - a step ends when ``optimizer.step()`` returns (the outermost one: an
      optimizer calling another is one update);
    - once ``GradScaler.step()`` has been called, a step ends when
      ``GradScaler.update()`` returns instead, so the iterations whose
      ``optimizer.step()`` the scaler skipped count too;
    - with neither (weights updated by hand, no optimizer object at all), a
      step ends when a forward pass begins after a ``backward()``.

    With gradient accumulation a step holds several backward passes: the
    steps end at the updates.

    *Phases*: backward for the ops the autograd engine runs; optimizer inside
    ``optimizer.step()`` (except in the closure it was given: its forward and
    backward are phases of their own, as without one) and the scaler's ``step()`` and ``update()``, and
    from the moment ``backward()`` returns until the step ends or a forward
    pass begins (gradient clipping, the scaler's unscaling and checks, a
    hand-written update); forward otherwise. A forward pass begins at a
    module's forward or at the first op that autograd records (grad mode on,
    an input that requires grad).
    """

    def __init__(self) -> None:
        self._local = _Local()
        self._roots: weakref.WeakKeyDictionary[torch.nn.Module, ModuleNames] = (
            weakref.WeakKeyDictionary()
        )
        self._handles: list[RemovableHandle] = []
        self._module_hooks: list[RemovableHandle] = []
        # The native recorder when it reads the modules off the frames (follow_frames),
        # and the modules it has named a path for, by id, until they die.
        self._frames: Any = None
        self._watched: dict[int, weakref.ref[torch.nn.Module]] = {}
        self._restore: list[Callable[[], None]] = []
        self._installed = False
        self.step = 0
        self._updates = False  # a step ended at an optimizer's or a scaler's update
        self._scaler = False  # GradScaler.step() was called: steps end at its update()
        self._optimizer_exists: bool | None = None
        # The native recorder keeps its own per-thread copy of what is running:
        # module paths as indices into ``module_names``.
        self.mirror: Any = None
        self._module_table = StringTable()
        self.on_step: Any = None  # called after a step ends

    # -- installation ------------------------------------------------------------------------

    def install(self) -> None:
        from torch.optim import optimizer as optim

        self._installed = True
        self._hook_modules()
        self._handles = [
            optim.register_optimizer_step_pre_hook(self._enter_optimizer),
            optim.register_optimizer_step_post_hook(self._exit_optimizer),
        ]
        self._restore.append(_quiet_compile_hook_warning())
        self._wrap(torch.autograd, "backward", self._backward)
        from torch.amp.grad_scaler import GradScaler

        # Subclasses that define their own (FSDP's ShardedGradScaler.update).
        for cls in (GradScaler, *subclasses(GradScaler)):
            for name in ("step", "update"):
                if name in vars(cls):
                    self._wrap(cls, name, functools.partial(self._scaler_call, name))

    def uninstall(self) -> None:
        self._installed = False
        self.unfollow_frames()
        for h in (*self._module_hooks, *self._handles):
            h.remove()
        self._module_hooks = []
        self._handles = []
        for restore in reversed(self._restore):
            restore()
        self._restore = []

    def _wrap(self, owner: Any, name: str, around: Callable[..., Any]) -> None:
        """Replace ``owner.name`` by ``around(original, *args, **kwargs)`` until uninstalled.

        Put back only if still ours; otherwise (wrapped again on top since) left
        in place, passing calls through.
        """
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        context = self

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not context._installed:
                return original(*args, **kwargs)
            return around(original, *args, **kwargs)

        setattr(owner, name, wrapper)

        def restore() -> None:
            current = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name)
            if current is wrapper:
                setattr(owner, name, original)

        self._restore.append(restore)

    # -- module paths ------------------------------------------------------------------------

    def _hook_modules(self) -> None:
        from torch.nn.modules import module as nn_module

        if not self._module_hooks:
            self._module_hooks = [
                nn_module.register_module_forward_pre_hook(self._enter_module),
                nn_module.register_module_forward_hook(self._exit_module, always_call=True),
            ]

    def follow_frames(self, lib: Any) -> bool:
        """Take module paths from the native recorder ``lib``'s walk of the thread's
        frames of ``nn.Module.__call__`` (each frame's ``self``) instead of hooks.

        Global forward hooks send every module call down ``nn.Module``'s slow path
        and run two Python functions in it (bench/HISTORY.md: about a tenth of a
        small-op program's time); a frame walk costs a compare per frame of a stack
        the recorder walks anyway. Paths are the hooks' (:meth:`module_index_of`).
        False where it cannot (another Python than 3.11, ``__call__`` replaced):
        the hooks stay.
        """
        if self._frames is not None:
            return True
        call = torch.nn.Module.__call__
        code = getattr(call, "__code__", None)
        if (
            call is not getattr(torch.nn.Module, "_wrapped_call_impl", None)
            or code is None
            or code.co_argcount < 1
            or code.co_varnames[0] != "self"
            or "self" in code.co_cellvars  # a cell: the frame's first slot holds the cell
            or not lib.set_module_frames(code)
        ):
            return False
        self._frames = lib
        for h in self._module_hooks:
            h.remove()
        self._module_hooks = []
        return True

    def unfollow_frames(self) -> None:
        """Back to hooks (while installed) from :meth:`follow_frames`."""
        if self._frames is None:
            return
        self._frames.set_module_frames(None)
        self._frames = None
        self._watched.clear()
        if self._installed:
            self._hook_modules()

    def module_index_of(self, modules: list[torch.nn.Module]) -> int:
        """The path index of the innermost of ``modules`` (running, outermost first),
        named as the hooks name it."""
        running: _Running | None = None
        for module in modules:
            running = self._running(module, running)
            self._watch(module)
        return running[2] if running is not None else 0

    def _watch(self, module: torch.nn.Module) -> None:
        """When ``module`` dies, the native recorder forgets the paths it named by
        modules' addresses: another module may take its address."""
        key = id(module)
        if key in self._watched:
            return

        def died(_: Any, key: int = key) -> None:
            self._watched.pop(key, None)
            if self._frames is not None:
                self._frames.forget_modules()

        self._watched[key] = weakref.ref(module, died)

    def _running(self, module: torch.nn.Module, top: _Running | None) -> _Running:
        """``module`` called inside ``top`` (None: outside every module), with its path."""
        if top is None:
            return self._outermost(module)
        names = top[3]
        hit = names.labels.get(id(module))
        if hit is not None and hit[0]() is module:
            return (module, hit[1], hit[2], names)
        return self._lookup(module, top)

    def _enter_module(self, module: torch.nn.Module, args: Any) -> None:
        # Inside a frame that torch.compile traces, the hooks must be no-ops:
        # Dynamo cannot trace this bookkeeping, and compiled graphs take their
        # module paths from the nodes' ``nn_module_stack`` instead.
        if torch.compiler.is_compiling():
            return
        local = self._local
        if local.after_backward >= 0 and not local.in_optimizer:
            self.forward_began()
        stack = local.modules
        running = self._running(module, stack[-1] if stack else None)
        stack.append(running)
        if self.mirror is not None:
            self.mirror.set_module(running[2])

    def _outermost(self, module: torch.nn.Module) -> _Running:
        names = self._roots.get(module)
        if names is None:
            names = self._roots[module] = ModuleNames(module, None, self.module_index)
        _, path, index = names.labels[id(module)]
        return (module, path, index, names)

    def _lookup(self, module: torch.nn.Module, caller: _Running) -> _Running:
        """A module that the caller's names do not hold: one added since they were
        read (looked for among the caller's modules), or one its base does not hold."""
        names = caller[3]
        key = id(module)
        loose = names.loose.get(key)
        # Known to be loose in this step: not looked for again until the next one.
        if loose is None or loose[0]() is not module or loose[1] != self.step:
            for sub, m in caller[0].named_modules():
                if m is module:
                    names.add(module, join_names(qualified_name(caller[1]), sub))
                    _, path, index = names.labels[key]
                    return (module, path, index, names)
            names.loose[key] = (weakref.ref(module), self.step)
        inner = names.inner.get((key, caller[1]))
        if inner is None or inner.base() is not module:
            cls = type(_model_of(module)).__name__
            prefix = join_names(qualified_name(caller[1]), f"<{cls}>")
            inner = names.inner[(key, caller[1])] = ModuleNames(module, prefix, self.module_index)
        _, path, index = inner.labels[key]
        return (module, path, index, inner)

    def _exit_module(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if torch.compiler.is_compiling():
            return
        stack = self._local.modules
        if stack and stack[-1][0] is module:
            stack.pop()
        if self.mirror is not None:
            self.mirror.set_module(stack[-1][2] if stack else 0)

    def module_index(self, path: str) -> int:
        """A small number for a module path (see ``module_names``)."""
        return self._module_table.intern(path)

    @property
    def module_names(self) -> list[str]:
        """Module paths by :meth:`module_index` (0 is "")."""
        return self._module_table.strings

    def module_path(self) -> str:
        """The path of the module running on this thread ("" outside every module)."""
        if self._frames is not None:
            index = self._frames.current_module()
            names = self.module_names
            return names[index] if index < len(names) else ""
        stack = self._local.modules
        return stack[-1][1] if stack else ""

    # -- phases and steps --------------------------------------------------------------------

    def sync_mirror(self) -> None:
        """Give the mirror (just set) this thread's module, phase and step."""
        if self.mirror is not None:
            self.mirror.set_module(self._local.modules[-1][2] if self._local.modules else 0)
            self.mirror.set_step(self.step)
            self._mirror_phase()

    def _mirror_phase(self) -> None:
        if self.mirror is not None:
            local = self._local
            self.mirror.set_optimizer(local.in_optimizer, local.after_backward)

    def _enter_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        self._local.in_optimizer += 1
        self._mirror_phase()
        # optimizer.step(closure): the closure's forward and backward (Lightning runs every
        # training step in one, LBFGS several) are not update work.
        if kwargs.get("closure") is not None:
            return args, {**kwargs, "closure": self._outside_optimizer(kwargs["closure"])}
        # args: (optimizer, closure, ...) as passed to step, the optimizer first.
        if len(args) > 1 and callable(args[1]):
            return (args[0], self._outside_optimizer(args[1]), *args[2:]), kwargs
        return None

    def _outside_optimizer(self, closure: Callable[[], Any]) -> Callable[[], Any]:
        """``closure`` run with the optimizer phase suspended (the step stays the same)."""

        @functools.wraps(closure)
        def run() -> Any:
            local = self._local
            depth, local.in_optimizer = local.in_optimizer, 0
            self._mirror_phase()
            try:
                return closure()
            finally:
                local.in_optimizer = depth
                self._mirror_phase()

        return run

    def _exit_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        local = self._local
        local.in_optimizer = max(0, local.in_optimizer - 1)
        if local.in_optimizer == 0 and not self._scaler:
            self._end_step(update=True)
        else:
            self._mirror_phase()

    def _scaler_call(self, name: str, original: Any, *args: Any, **kwargs: Any) -> Any:
        """``GradScaler.step`` or ``GradScaler.update``: the optimizer phase; update ends a step."""
        local = self._local
        if name == "step":
            self._scaler = True
        local.in_optimizer += 1
        self._mirror_phase()
        try:
            return original(*args, **kwargs)
        finally:
            local.in_optimizer = max(0, local.in_optimizer - 1)
            if local.in_optimizer == 0 and name == "update":
                self._end_step(update=True)
            else:
                self._mirror_phase()

    def _backward(self, original: Any, *args: Any, **kwargs: Any) -> Any:
        """``torch.autograd.backward`` (what ``loss.backward()`` calls)."""
        local = self._local
        # A backward inside a backward (a reentrant checkpoint recomputing) or
        # inside a module's forward is part of that pass, not the iteration's.
        if torch._C._current_autograd_node() is not None or local.modules:
            return original(*args, **kwargs)
        if local.after_backward >= 0:  # its ops are backward ops, not update work
            local.after_backward = -1
            self._mirror_phase()
        result = original(*args, **kwargs)
        local.after_backward = _get_sequence_nr()
        self._mirror_phase()
        return result

    def forward_began(self) -> None:
        """A forward pass began after ``backward()`` returned (on this thread).

        Ends the step when nothing else will: no optimizer step or scaler
        update has been seen and no optimizer exists (weights updated by hand).
        """
        self._local.after_backward = -1
        if self._updates or self._scaler or self._has_optimizer():
            self._mirror_phase()
        else:
            self._end_step(update=False)

    def _has_optimizer(self) -> bool:
        """Whether an optimizer exists, whose first step has not come yet (gradient
        accumulation). Looked for once, among all objects: only programs that
        update weights by hand, or accumulate gradients before their first
        update, ever ask."""
        if self._optimizer_exists is None:
            classes = {torch.optim.Optimizer, *subclasses(torch.optim.Optimizer)}
            self._optimizer_exists = any(type(o) in classes for o in gc.get_objects())
        return self._optimizer_exists

    def set_step(self, step: int) -> None:
        """Number the steps from here as a trainer does (its global step): recording that
        resumes from a checkpoint goes on with the trainer's numbers, not from 0."""
        self.step = step
        if self.mirror is not None:
            self.mirror.set_step(step)

    def _end_step(self, update: bool) -> None:
        self._updates = self._updates or update
        self._local.after_backward = -1
        self.step += 1
        if self.mirror is not None:
            self.mirror.set_step(self.step)
        self._mirror_phase()
        if self.on_step is not None:
            self.on_step()

    def phase(self, node: Any = False) -> Phase:
        """The phase now; ``node`` is the current autograd node when the caller has it.

        Called for each op after it ran: an op that made an autograd node
        after ``backward()`` returned begins a forward pass.
        """
        local = self._local
        if local.in_optimizer:
            return Phase.OPTIMIZER
        if node is False:
            node = torch._C._current_autograd_node()
        if node is not None:
            return Phase.BACKWARD
        if local.after_backward >= 0:
            if _get_sequence_nr() == local.after_backward:
                return Phase.OPTIMIZER
            self.forward_began()
        return Phase.FORWARD


def subclasses(cls: type) -> list[type]:
    """Every subclass of ``cls`` defined so far, at any depth."""
    found: list[type] = []
    todo: list[type] = list(cls.__subclasses__())
    while todo:
        sub = todo.pop()
        if sub not in found:
            found.append(sub)
            todo.extend(sub.__subclasses__())
    return found
