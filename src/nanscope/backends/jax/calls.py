"""Call time: instrumented programs run, one :class:`~.plan.GraphPlan` per closed jaxpr (made
by :mod:`.rewrite`).

Shared by dumping (:mod:`.session`) and checking (:mod:`.check_numerics`):
both run the instrumented program in place of the original, take its extra
outputs off (the user's code never sees them) and look at them.

Guarded plans (the health modes, every value selected) count only the guards at
each call (:class:`~.guards.Flow`): nothing in the program was non-finite
exactly when no guard was. A call whose guards were is *replayed*: the same
arguments go through the plan that counts every value (compiled then, once),
whose counts stand for the call's. So a guarded program keeps its arguments
alive until its call has been looked at (:meth:`Call.settle`) and donates none
of them.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nanscope.backends.jax.plan import GraphPlan, Selection
from nanscope.backends.jax.rewrite import instrument
from nanscope.format.modes import TensorDebugMode


class _Failed:
    """A jaxpr that could not be instrumented: it runs as it was."""


FAILED = _Failed()


def is_primitive_call(closed: Any, name: str) -> bool:
    """Whether a compiled program is one eagerly applied primitive (JAX jits each on its own)."""
    eqns = closed.jaxpr.eqns
    return len(eqns) == 1 and eqns[0].primitive.name == name


class Call:
    """One run of a plan's program, until it has been looked at (:meth:`settle`)."""

    __slots__ = ("_lock", "_run", "_settled", "extra", "plan")

    def __init__(
        self, plan: GraphPlan, extra: list[Any], run: tuple[Callable[..., Any], Any, Any] | None
    ) -> None:
        self.plan = plan
        self.extra = extra
        self._run = run  # guarded: (original, args, params), for a replay
        self._settled: tuple[GraphPlan, np.ndarray | None] | None = None
        self._lock = threading.Lock()

    @property
    def waits(self) -> bool:
        """Whether it holds its arguments for a replay and has not been looked at yet."""
        return self._run is not None

    def settle(
        self, replay: Callable[[GraphPlan, np.ndarray], bool]
    ) -> tuple[GraphPlan, np.ndarray | None]:
        """The plan and host counts that stand for this call (waiting for them).

        A guarded call whose guards held Inf/NaN and for which ``replay(plan, counts)``
        says so is replayed; its arguments are let go either way.
        """
        with self._lock:
            if self._settled is None:
                plan = self.plan
                counts = np.asarray(self.extra[0]) if self.extra else None
                if (
                    self._run is not None
                    and counts is not None
                    and plan.troubled(counts)
                    and replay(plan, counts)
                ):
                    plan, counts = _replay(plan, *self._run) or (plan, counts)
                self._settled = (plan, counts)
                self._run = None
                self.extra = []
            return self._settled


class Programs:
    """Instrumented programs, by the closed jaxpr they stand for (dropped with it)."""

    def __init__(self, mode: TensorDebugMode, selection: Selection, guards: bool = True) -> None:
        self.mode = mode
        self.selection = selection
        # Guards only where every value is wanted: a selection names what to count.
        # NANSCOPE_JAX_GUARDS=0: every value at every call (no guards, no replays).
        self.guards = (
            guards
            and os.environ.get("NANSCOPE_JAX_GUARDS", "1") != "0"
            and selection.op_regex is None
            and selection.dtypes is None
        )
        self._plans: weakref.WeakKeyDictionary[Any, GraphPlan | _Failed] = (
            weakref.WeakKeyDictionary()
        )
        self._warned = False

    def plan(self, closed: Any, name: str) -> GraphPlan | None:
        if not closed.jaxpr.eqns:
            return None  # nothing computed (an identity, a cast to the same type)
        found = self._plans.get(closed)
        if found is None:
            try:
                found = instrument(closed, name, self.mode, self.selection, self.guards)
                found.primitive = is_primitive_call(closed, name)
                if found.kept is not None:
                    found.source = weakref.ref(closed)
                    found.selection = self.selection
            except Exception as exc:  # never break the user's program: it runs as it was
                found = FAILED
                if not self._warned:
                    self._warned = True
                    print(
                        f"nanscope: could not instrument the JAX program {name!r} "
                        f"({type(exc).__name__}: {exc}); it runs unrecorded",
                        file=sys.stderr,
                    )
            self._plans[closed] = found
        return found if isinstance(found, GraphPlan) else None

    def call(
        self,
        original: Callable[..., Any],
        args: Sequence[Any],
        params: dict[str, Any],
        look: Callable[[Call, Sequence[Any], list[Any]], None],
    ) -> Any:
        """A handler's :meth:`~.intercept.Handler.call`: run the instrumented program, hand
        ``look`` the call, the arguments and the outputs, and return what JAX expects, with
        no executable (the next call comes back through Python)."""
        plan = self.plan(params["jaxpr"], str(params.get("name", "")))
        if plan is None:
            return original(*args, **params)
        guarded = plan.kept is not None
        outs, extra, const_args = run(original, args, params, plan, donate=not guarded)
        look(Call(plan, extra, (original, args, params) if guarded else None), args, outs)
        return outs, None, None, const_args


def _replay(
    plan: GraphPlan, original: Callable[..., Any], args: Sequence[Any], params: dict[str, Any]
) -> tuple[GraphPlan, np.ndarray] | None:
    """Run a guarded call again counting every value: the full plan and its counts (None:
    the full plan could not be made)."""
    full = plan.full
    if full is None:
        closed = plan.source() if plan.source is not None else None
        if closed is None:
            return None
        try:
            full = instrument(
                closed,
                plan.name,
                plan.mode,
                plan.selection or Selection(None, None),
                graph_id=plan.graph_id,
            )
        except Exception as exc:  # the guarded counts stand
            print(f"nanscope: could not replay {plan.name!r} ({exc})", file=sys.stderr)
            plan.source = None
            return None
        if full.op_names != plan.op_names or full.slots != plan.slots:
            plan.source = None  # not the same rows: cannot stand for the call
            return None
        full.primitive = plan.primitive
        plan.full = full
    _, extra, _ = run(original, args, params, full, donate=False)
    return full, np.asarray(extra[0])


def run(
    original: Callable[..., Any],
    args: Sequence[Any],
    params: dict[str, Any],
    plan: GraphPlan,
    donate: bool = True,
) -> tuple[list[Any], list[Any], Any]:
    """Run ``plan``'s program: its outputs, its extra outputs, and JAX's const args.

    ``donate=False``: the arguments outlive the run (for a replay), whatever the
    function donates.
    """
    from jax._src.sharding_impls import UNSPECIFIED  # type: ignore[attr-defined]

    if not donate and any(params.get("donated_invars", ())):
        params = {**params, "donated_invars": (False,) * len(params["donated_invars"])}
    n = plan.n_extra
    key = _signature(args, params)
    found = plan.executables.get(key) if key is not None else None
    if found is not None:
        # The executable this signature compiled to: JAX's own Python path would look
        # it up again through several caches, converting every argument's type.
        compiled, const_args, direct = found
        if direct is not None and not _checking_special():
            outs = direct.xla_executable.execute_sharded([*const_args, *args])
            outs = outs.consume_with_handlers(direct.out_handler.handlers)
        else:
            outs = compiled.unsafe_call(*const_args, *args)
    else:
        run_params = dict(params)
        run_params["jaxpr"] = plan.closed
        if n:
            run_params["out_shardings"] = (*params["out_shardings"], *[UNSPECIFIED] * n)
            run_params["out_layouts"] = (*params["out_layouts"], *[None] * n)
        outs, compiled, _, const_args = original(*args, **run_params)
        if key is not None and compiled is not None:
            plan.executables[key] = (compiled, const_args, _direct(compiled, [*const_args, *args]))
    outs = list(outs)
    extra = outs[len(outs) - n :] if n else []
    if n:
        del outs[-n:]
    return outs, extra, const_args


def _signature(args: Sequence[Any], params: dict[str, Any]) -> tuple[Any, ...] | None:
    """What selects the executable for ``args``: each array's type, sharding and whether it
    is committed (None when an argument is not a JAX array: JAX's own path decides)."""
    from jax._src.array import ArrayImpl

    parts: list[Any] = [params.get("donated_invars")]
    for a in args:
        if type(a) is not ArrayImpl:
            return None
        aval = a.aval
        parts.append((aval.shape, aval.dtype, aval.weak_type, a.sharding, a._committed))
    return tuple(parts)


def _direct(compiled: Any, inputs: Sequence[Any]) -> Any:
    """``compiled``'s runner, when its arguments can go to the executable as they are
    (else None): JAX's input handling (a sharding check and a copy that reuses each
    buffer, about 0.3 ms a call on the MLP) would change nothing. So: one device's
    arrays already where the executable wants them, every argument used, nothing but
    arrays in and out (no effects, callbacks or mutable state)."""
    from jax._src.array import ArrayImpl
    from jax._src.interpreters import pxla

    try:
        call = compiled.unsafe_call
    except Exception:
        return None
    if (
        type(call) is not pxla.ExecuteReplicated
        or call.mut is not None
        or call.ordered_effects
        or call.has_unordered_effects
        or call.has_host_callbacks
        or call.pgle_profiler is not None
        or call.kept_var_idx != set(range(len(inputs)))
    ):
        return None
    handler = call.in_handler
    if len(handler.in_shardings) != len(inputs) or any(
        layout is not None for layout in handler.in_layouts
    ):
        return None
    try:
        for x, sharding in zip(inputs, handler.in_shardings, strict=True):
            if type(x) is not ArrayImpl or x.sharding != sharding or len(sharding.device_set) != 1:
                return None
    except Exception:  # an argument already donated, a sharding that cannot compare
        return None
    return call


def _checking_special() -> bool:
    """Whether JAX checks every result for NaN/Inf (``jax_debug_nans``/``jax_debug_infs``):
    its own path does that."""
    from jax._src import dispatch

    return bool(dispatch.needs_check_special())
