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

    @staticmethod
    def run(
        original: Callable[..., Any], args: Sequence[Any], params: dict[str, Any], plan: GraphPlan
    ) -> tuple[list[Any], list[Any], Any]:
        """Run ``plan``'s program: its outputs, its extra outputs, and JAX's const args."""
        from jax._src.sharding_impls import UNSPECIFIED  # type: ignore[attr-defined]

        n = plan.n_extra
        run_params = dict(params)
        run_params["jaxpr"] = plan.closed
        if n:
            run_params["out_shardings"] = (*params["out_shardings"], *[UNSPECIFIED] * n)
            run_params["out_layouts"] = (*params["out_layouts"], *[None] * n)
        outs, _, _, const_args = original(*args, **run_params)
        outs = list(outs)
        extra = outs[len(outs) - n :] if n else []
        if n:
            del outs[-n:]
        return outs, extra, const_args
