"""Running instrumented programs: one :class:`~.instrument.GraphPlan` per closed jaxpr.

Shared by dumping (:mod:`.session`) and checking (:mod:`.check_numerics`):
both run the instrumented program in place of the original, take its extra
outputs off (the user's code never sees them) and look at them.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from nanscope.backends.jax.instrument import GraphPlan, Selection, instrument
from nanscope.format.modes import TensorDebugMode


class _Failed:
    """A jaxpr that could not be instrumented: it runs as it was."""


FAILED = _Failed()


def is_primitive_call(closed: Any, name: str) -> bool:
    """Whether a compiled program is one eagerly applied primitive (JAX jits each on its own)."""
    eqns = closed.jaxpr.eqns
    return len(eqns) == 1 and eqns[0].primitive.name == name


class Programs:
    """Instrumented programs, by the closed jaxpr they stand for (dropped with it)."""

    def __init__(self, mode: TensorDebugMode, selection: Selection) -> None:
        self.mode = mode
        self.selection = selection
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
                found = instrument(closed, name, self.mode, self.selection)
                found.primitive = is_primitive_call(closed, name)
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
        look: Callable[[GraphPlan, Sequence[Any], list[Any], list[Any]], None],
    ) -> Any:
        """A handler's :meth:`~.intercept.Handler.call`: run the instrumented program, hand
        ``look`` the plan, the arguments, the outputs and the extra outputs, and return what
        JAX expects, with no executable (the next call comes back through Python)."""
        plan = self.plan(params["jaxpr"], str(params.get("name", "")))
        if plan is None:
            return original(*args, **params)
        outs, extra, const_args = self.run(original, args, params, plan)
        look(plan, args, outs, extra)
        return outs, None, None, const_args

    @staticmethod
    def run(
        original: Callable[..., Any], args: Sequence[Any], params: dict[str, Any], plan: GraphPlan
    ) -> tuple[list[Any], list[Any], Any]:
        """Run ``plan``'s program: its outputs, its extra outputs, and JAX's const args."""
        from jax._src.sharding_impls import UNSPECIFIED  # type: ignore[attr-defined]

        n = plan.n_extra
        key = _signature(args, params)
        found = plan.executables.get(key) if key is not None else None
        if found is not None:
            # The executable this signature compiled to: JAX's own Python path would look
            # it up again through several caches, converting every argument's type.
            compiled, const_args = found
            outs = compiled.unsafe_call(*const_args, *args)
        else:
            run_params = dict(params)
            run_params["jaxpr"] = plan.closed
            if n:
                run_params["out_shardings"] = (*params["out_shardings"], *[UNSPECIFIED] * n)
                run_params["out_layouts"] = (*params["out_layouts"], *[None] * n)
            outs, compiled, _, const_args = original(*args, **run_params)
            if key is not None and compiled is not None:
                plan.executables[key] = (compiled, const_args)
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
