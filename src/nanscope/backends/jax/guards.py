"""Which values of a program must be counted so that no Inf/NaN in it goes unseen (the guards).

:class:`Flow` follows each traced value into the equations that use it while
:mod:`.rewrite` rewrites a jaxpr; a guarded plan counts only the guards at each
call, and :mod:`.calls` replays a call whose guards held Inf/NaN counting every
value. :data:`_PROPAGATE` says through which primitives a non-finite element
always comes out; :func:`passes_through`, which move values without changing
them (their outputs are shown their producer's summary).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nanscope.backends.jax.plan import Pending, block_rows
from nanscope.format.modes import TensorDebugMode

# Ops that move or copy values without changing them: they cannot make Inf/NaN, and
# what they return has the counts of what they were given (times the repeats of a
# broadcast). Their outputs are not summarised again (each would cost a pass over memory).
_SAME_VALUES = frozenset(
    {"reshape", "broadcast_in_dim", "transpose", "squeeze", "expand_dims", "copy", "copy_p", "rev"}
)


def passes_through(eqn: Any) -> bool:
    """Whether an equation's output holds its first operand's values, moved or widened."""
    import jax.numpy as jnp
    import ml_dtypes

    name = eqn.primitive.name
    if name in _SAME_VALUES:
        return len(eqn.invars) == 1 or name == "broadcast_in_dim"
    if name == "convert_element_type":
        # A widening float cast keeps every value; a narrowing one may overflow (an origin).
        src, dst = eqn.invars[0].aval.dtype, eqn.outvars[0].aval.dtype
        return bool(
            jnp.issubdtype(src, jnp.floating)
            and jnp.issubdtype(dst, jnp.floating)
            and ml_dtypes.finfo(dst).max >= ml_dtypes.finfo(src).max
            and ml_dtypes.finfo(dst).bits >= ml_dtypes.finfo(src).bits
        )
    return False


# Primitives whose output holds an Inf/NaN wherever one of these operands (their positions;
# None: every operand) holds one: through them a non-finite value cannot vanish. Every
# other primitive may hide one (select_n, max, exp(-inf), x / inf, a slice, a comparison,
# a cast to an integer, a loop...), or is not known to keep it.
_PROPAGATE: dict[str, tuple[int, ...] | None] = {
    **dict.fromkeys(_SAME_VALUES, None),
    **dict.fromkeys(
        [
            "add",
            "add_any",
            "sub",
            "mul",
            "neg",
            "abs",
            "sqrt",
            "cbrt",
            "log",
            "log1p",
            "square",
            "integer_pow",
            "sin",
            "cos",
            "tan",
            "sinh",
            "cosh",
            "asinh",
            "round",
            "floor",
            "ceil",
            "reduce_precision",
            "dot_general",
            "reduce_sum",
            "reduce_prod",
            "cumsum",
            "cumprod",
            "concatenate",
            "optimization_barrier",
            "convert_element_type",
        ],
        None,
    ),
    "div": (0,),  # x / inf is 0: the divisor is a guard
    "pad": (0,),  # the padding value may not be used
}


class _Value:
    """What :class:`Flow` knows of one traced value."""

    __slots__ = ("consumers", "propagates", "root", "value")

    def __init__(self, value: Any) -> None:
        self.value = value  # kept alive, so that ids stay unique
        self.propagates = False  # some use keeps its non-finite elements (_PROPAGATE)
        self.root = id(value)  # whose row holds its summary (a reshape's: its producer's)
        self.consumers: list[_Value] = []  # the results of those uses


class Flow:
    """Where each value of a program goes: which values must be counted so that no Inf/NaN
    anywhere in the program goes unseen (the guards).

    A value with at least one use through which an Inf/NaN always comes out
    (:data:`_PROPAGATE`) need not be counted: a non-finite element in it makes one in
    the value that use computes, and so on, until a value that is counted (the chain
    ends: a program has finitely many values). Its other uses, even ones that may hide
    a non-finite element (``select_n``, ``max``, a divisor), change nothing. The guards
    are therefore the values with no such use: those that go only into operations that
    may hide (``exp``, a divisor, a slice, a comparison, a loop...), and those nothing
    uses (a program's results that nothing else uses, among them). Nothing in the
    program is non-finite exactly when no guard is. A result used inside the program
    too is seen through what is computed from it (an optimizer's moments through the
    updated parameters and the update's divisor), so its summary is written only when
    the call is replayed. On the MLP training step this leaves a ninth of the elements
    to count (the rest are fused by XLA into the guards' computations).
    """

    def __init__(self) -> None:
        self.seen: dict[int, _Value] = {}  # by id(value)
        self.kept: np.ndarray = np.zeros(0, dtype=np.int64)
        # Per kept row: whether a result's Inf/NaN shows there first (it is a result or a
        # chain of uses leads to it from a result not counted itself).
        self.covering: np.ndarray = np.zeros(0, dtype=bool)

    def _value(self, value: Any) -> _Value:
        v = self.seen.get(id(value))
        if v is None:
            v = self.seen[id(value)] = _Value(value)
        return v

    def use(self, eqn: Any, invals: Sequence[Any], outs: Sequence[Any]) -> None:
        """Record an equation's uses of its operands (traced values)."""
        from jax._src import core

        prim = eqn.primitive.name
        positions = _PROPAGATE.get(prim, ())
        if prim == "convert_element_type" and not _floating(eqn.outvars[0]):
            positions = ()  # to an integer or a bool: hidden
        elif prim == "integer_pow" and eqn.params.get("y") == 0:
            positions = ()
        elif prim == "pad" and any(lo < 0 or hi < 0 for lo, hi, _ in eqn.params["padding_config"]):
            positions = ()  # negative padding slices
        results = [self._value(o) for o in outs]
        for i, (var, x) in enumerate(zip(eqn.invars, invals, strict=True)):
            if isinstance(var, core.Literal) or (positions is not None and i not in positions):
                continue
            v = self._value(x)
            v.propagates = True
            v.consumers.extend(results)
        if passes_through(eqn) and outs and invals:
            # The output is not counted itself: if it must be, its producer's value is.
            results[0].root = self._value(invals[0]).root

    def guards(
        self,
        counts: Sequence[Any],
        mode: TensorDebugMode,
        outs: Sequence[Any],
        args: Sequence[Any] = (),
    ) -> list[Any]:
        """The entries of ``counts`` (the outermost graph's, in row order) to count (a loop's
        block always); sets ``kept`` and ``covering`` (``outs``: the program's results;
        ``args``: its arguments; one it returns as it was, like a mask in a module's state,
        is no result it computed)."""
        must = {v.root for v in self.seen.values() if not v.propagates}
        computed = [o for o in outs if not any(o is a for a in args)]
        covering = self._covering([self._value(o) for o in computed], must)
        kept: list[int] = []
        covers: list[bool] = []
        entries: list[Any] = []
        row = 0
        for c in counts:
            n = 1 if isinstance(c, Pending) else block_rows(c, mode)
            if not isinstance(c, Pending) or id(c.value) in must or id(c.value) not in self.seen:
                entries.append(c)
                kept.extend(range(row, row + n))
                covers.extend([isinstance(c, Pending) and id(c.value) in covering] * n)
            row += n
        self.kept = np.asarray(kept, dtype=np.int64)
        self.covering = np.asarray(covers, dtype=bool)
        return entries

    @staticmethod
    def _covering(results: list[_Value], must: set[int]) -> set[int]:
        """The counted values (ids) where a non-finite element of a result shows first."""
        found: set[int] = set()
        todo, visited = list(results), set()
        while todo:
            v = todo.pop()
            if id(v) in visited:
                continue
            visited.add(id(v))
            if v.root in must:
                found.add(v.root)
            else:
                todo.extend(v.consumers)
        return found


def _floating(var: Any) -> bool:
    import jax.numpy as jnp

    return bool(jnp.issubdtype(var.aval.dtype, jnp.floating))
