"""``enable_check_numerics`` for JAX: raise at the first harmful Inf/NaN, naming the equation.

Each compiled program runs instrumented (:mod:`.rewrite`) with three counts
per floating-point guard (-inf, +inf, and the finite ones: NaN is the rest;
the guards are the values no Inf/NaN gets past unseen, :mod:`.guards`),
computed inside the program and fused by XLA. After each run the counts come
to the host (one small copy per run, none per equation); when they say the run
would raise, it is run again counting every value, and:

* a NaN anywhere raises :class:`~nanscope.NonFiniteError`, naming the first
  equation that made NaN (its primitive, source line, module path, counts)
  and, following the data edges back, the equation where the Inf/NaN that led
  to it were born;
* an Inf in an output of a program that computes gradients (a jitted training
  step: its loss, gradients, updated parameters or optimizer state) raises
  likewise (not an argument it returns as it was, like a mask in a module's
  state that ``nnx.jit`` hands back);
* an Inf that stays inside a program (a causal mask that softmax absorbs) or
  comes out of one that computes no gradients (an eager ``jnp.where`` writing
  a mask) raises nothing: what it later turns into NaN raises there.
"""

from __future__ import annotations

import linecache
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nanscope.backends.jax import intercept
from nanscope.backends.jax.calls import Call, Programs
from nanscope.backends.jax.plan import GraphPlan, Selection
from nanscope.errors import Birth, NonFiniteError
from nanscope.format.modes import TensorDebugMode
from nanscope.format.tensors import dtype_name

_SIZE, _NINF, _PINF, _NAN = 1, 2, 3, 4  # CONCISE_HEALTH columns


class JaxCheckNumerics:
    """The handler that checks every run of a compiled JAX program (see the module)."""

    framework = "jax"

    def __init__(self) -> None:
        self.programs = Programs(TensorDebugMode.CONCISE_HEALTH, Selection(None, None))
        self.step = 0
        intercept.install(self)

    def call(
        self, original: Callable[..., Any], args: Sequence[Any], params: dict[str, Any]
    ) -> Any:
        return self.programs.call(original, args, params, self._look)

    def _look(self, call: Call, args: Sequence[Any], outs: list[Any]) -> None:
        if call.extra:
            # A guarded run whose guards would raise is run again counting every value,
            # which names the equation.
            plan, counts = call.settle(
                lambda plan, counts: _culprit(plan, plan.matrix(counts)[0]) is not None
            )
            if counts is None or not plan.troubled(counts):
                return self._ran(plan)
            m, iterations = plan.matrix(counts)
            found = _culprit(plan, m)
            if found is not None:
                row, reason = found
                iteration = int(iterations[row]) - 1 if iterations is not None else -1
                raise self._error(plan, m, row, reason, iteration)
        self._ran(call.plan)

    def _ran(self, plan: GraphPlan) -> None:
        if plan.backward:
            self.step += 1

    def _birth(self, plan: GraphPlan, m: np.ndarray, row: int) -> int:
        """The earliest row, along data edges back from ``row``, whose inputs were finite."""

        def bad(i: int) -> bool:
            return bool(m[i, _NINF] or m[i, _PINF] or m[i, _NAN])

        current, seen = row, {row}
        while True:
            op = plan.op_by_name.get(plan.rows[current].op_name)
            earlier = []
            for name in op.input_names if op else ():
                producer, _, slot = name.rpartition(":")
                i = plan.row_of.get((producer, int(slot)), -1)
                if 0 <= i < current and i not in seen and bad(i):
                    earlier.append(i)
            if not earlier:
                return current
            current = min(earlier)
            seen.add(current)

    def _error(
        self,
        plan: GraphPlan,
        m: np.ndarray,
        row: int,
        reason: str,
        iteration: int,
    ) -> NonFiniteError:
        r = plan.rows[row]
        op = plan.op_by_name.get(r.op_name)
        op_type = op.op_type if op else r.op_name
        ninf, pinf, nan, size = (int(m[row, k]) for k in (_NINF, _PINF, _NAN, _SIZE))
        kinds = " and ".join(k for n, k in ((ninf, "-inf"), (pinf, "+inf"), (nan, "NaN")) if n)
        backward = bool(op and op.backward)
        phase = "backward" if backward else "forward"
        where = f"{phase} pass, step {self.step}" + (
            f", module {op.module_path}" if op and op.module_path else ""
        )
        what = "an eager JAX op" if plan.primitive else f"the jitted function {plan.name!r}"
        lines = [
            f"{op_type} produced {kinds} in output {r.slot} ({where})",
            f"  equation {r.op_name} of {what} ({dtype_name(r.dtype)}, {size} elements)",
        ]
        if iteration >= 0:
            loop = r.op_name.split("/")[0]
            lines.append(f"  first at iteration {iteration} of the loop {loop}")
        if reason == "gradient":
            lines.append("  the function returns it (a loss, a gradient or an update)")
        frame = op.frames[-1] if op and op.frames else None
        if frame is not None:
            label = "in the backward pass of the line" if backward else "at"
            lines += [
                f"  {label} {frame[0]}:{frame[1]} in {frame[2]}",
                f"      {linecache.getline(frame[0], frame[1]).strip()}",
            ]
        first = self._birth(plan, m, row)
        b = plan.rows[first]
        bop = plan.op_by_name.get(b.op_name)
        bframe = bop.frames[-1] if bop and bop.frames else None
        born = Birth(
            op_type=bop.op_type if bop else b.op_name,
            module_path=bop.module_path if bop else "",
            phase="backward" if bop and bop.backward else "forward",
            step=self.step,
            counts={
                "neg_inf": int(m[first, _NINF]),
                "pos_inf": int(m[first, _PINF]),
                "nan": int(m[first, _NAN]),
                "size": int(m[first, _SIZE]),
            },
            source=bframe,
            forward_source=bframe if bop and bop.backward else None,
            entered=bool(bop and bop.op_type in ("Placeholder", "Const")),
        )
        if first != row:
            at = f" {bframe[0]}:{bframe[1]}" if bframe else ""
            lines.append(f"  born at {born.op_type} (equation {b.op_name}){at}")
        return NonFiniteError(
            "\n".join(lines),
            op_type=op_type,
            module_path=op.module_path if op else "",
            phase=phase,
            step=self.step,
            counts={"neg_inf": ninf, "pos_inf": pinf, "nan": nan, "size": size},
            source=frame,
            forward_source=frame if backward else None,
            forward_op=op_type if backward else "",
            reason=reason,
            birth=born,
        )

    def flush(self) -> None:
        pass

    def close(self) -> None:
        intercept.uninstall(self)


def _culprit(plan: GraphPlan, m: np.ndarray) -> tuple[int, str] | None:
    """The row that raises, and why: the first NaN, else (a program computing gradients)
    the first Inf it returns (a guarded plan: an Inf where a result's would show, which
    its replay settles)."""
    nan = np.flatnonzero(m[:, _NAN] > 0)
    if nan.size:
        return int(nan[0]), "nan"
    if plan.backward:
        # An argument it returns as it was (a mask in a module's state that nnx.jit hands
        # back) is no loss, gradient or update: its Inf came in with it.
        rows = [r for r in plan.output_rows if r >= 0 and not _argument(plan, r)]
        if plan.covering is not None:
            rows = [*rows, *plan.covering.tolist()]
        inf = [r for r in rows if r >= 0 and (m[r, _NINF] or m[r, _PINF])]
        if inf:  # the one computed first (a loss before the updates made from it)
            return min(inf), "gradient"
    return None


def _argument(plan: GraphPlan, row: int) -> bool:
    """Whether a row is an argument's or a captured constant's (not computed by the program)."""
    op = plan.op_by_name.get(plan.rows[row].op_name)
    return op is not None and op.op_type in ("Placeholder", "Const")
