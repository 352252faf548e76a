"""Compile time: a jitted function's closed jaxpr, described as graphs and rewritten to summarise.

A :class:`~.plan.GraphPlan` is made once per closed jaxpr (JAX keeps one per function
and argument signature). :func:`instrument` walks the jaxpr equation by
equation, as an interpreter traced by ``jax.make_jaxpr``, and so builds a new
closed jaxpr that computes the same outputs plus one more: the counts of every
instrumented value, concatenated into one ``int32`` vector (FULL_TENSOR: the
values themselves). XLA compiles the counts with the program and fuses each
reduction into the computation that produces its value: no host callback, no
synchronisation per equation.

Along the way it describes the program TensorFlow's way: one graph per jaxpr
(a nested ``jit``, a loop body, a branch is a graph inside its caller's), one
op per equation, with its inputs as ``producer:slot``, the user's source line
(the equation's ``source_info``), its module path (the ``name_stack``: Flax
modules, ``jax.named_scope``) and whether it belongs to a backward pass (its
name stack holds a ``transpose``; JAX gives such equations the forward
equation's line, which becomes their forward source too). The function's
arguments and constants are ``Placeholder`` ops whose values are summarised
at the start, so that an Inf/NaN that arrives with the data is seen arriving.

Control flow is rewritten with its own primitives: ``scan`` and ``while``
loops carry, besides their state, the first iteration at which a value of the
body was not finite and the body's counts at that iteration (else at the
last), so no iteration's counts are stored but the first bad one's; each
branch of a ``cond`` adds its counts to a vector that has room for every
branch's, the branches not taken leaving theirs empty (size 0).
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nanscope.backends.jax.guards import Flow, passes_through
from nanscope.backends.jax.plan import (
    COUNTS_PER_VALUE,
    GraphInfo,
    GraphPlan,
    OpInfo,
    Pending,
    Row,
    Selection,
    block_rows,
    dtype_enum,
    nonfinite_rows,
    numel,
)
from nanscope.format.modes import TensorDebugMode

_graph_ids = itertools.count(1)

# Primitives whose sub-jaxpr is evaluated in place (its equations recorded in a graph of its own).
_CALLS = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "remat": "jaxpr",
    "remat2": "jaxpr",
    "checkpoint": "jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "custom_lin": None,
}


def _frames(traceback: Any) -> list[tuple[str, int, str]]:
    """The user's frames of an equation's traceback, outermost first."""
    from jax._src import source_info_util

    if traceback is None:
        return []
    frames = [
        (f.file_name, f.start_line, f.function_name)
        for f in source_info_util.user_frames(traceback)
    ]
    return frames[::-1][-32:]


def _scopes(name_stack: Any) -> tuple[list[str], bool]:
    """A name stack's scope names (the module path) and whether it holds a ``transpose``."""
    from jax._src.source_info_util import Scope, Transform

    scopes: list[str] = []
    backward = False
    for elem in name_stack.stack:
        if isinstance(elem, Scope):
            scopes.append(elem.name)
        elif isinstance(elem, Transform) and elem.name == "transpose":
            backward = True
    return scopes, backward


class _Level:
    """One graph being interpreted: its ops, the names of its values and its counts."""

    def __init__(
        self, build: _Build, graph_id: str, name_stack: Any, frames: list[Any], prefix: str = ""
    ) -> None:
        self.build = build
        self.graph_id = graph_id
        self.prefix = prefix  # a loop body's or branch's ops: "scan_4/"
        self.name_stack = name_stack
        self.frames = frames  # the calling equation's: for equations with no traceback
        self.names: dict[Any, str] = {}  # Var -> "op:slot"
        # In row order: a value to count (Pending) or the counts of a loop's or branch's rows.
        self.counts: list[Any] = []
        self.rows: list[Row] = []
        self.values: list[Any] = []  # FULL_TENSOR: the values themselves
        self.n_ops = 0
        self.out_names: list[str] = []  # a body's: the producers of its results
        self.constants: set[Any] = set()  # vars computed from literals alone

    def op_name(self, prim: str) -> str:
        self.n_ops += 1
        return f"{self.prefix}{prim}_{self.n_ops}"


class _Build:
    """The state of one :func:`instrument` call."""

    def __init__(self, mode: TensorDebugMode, selection: Selection, guards: bool = False) -> None:
        self.mode = mode
        self.selection = selection
        self.guards = guards
        self.flow = Flow()
        self.ops: list[OpInfo] = []
        self.backward = False
        self.describing = True  # False while a loop body is traced again (described once)
        self.loop_outputs: list[str] = []  # the producers of a loop's or branch's results

    # -- summaries, traced inside the program ----------------------------------------------

    def summarise(self, level: _Level, value: Any, op_type: str, op_name: str, slot: int) -> None:
        """Add ``value``'s summary (if wanted) to ``level``."""
        import jax.numpy as jnp

        aval = getattr(value, "aval", None)
        dtype = getattr(aval if aval is not None else value, "dtype", None)
        shape = tuple(getattr(aval if aval is not None else value, "shape", ()))
        if dtype is None or not self.selection.wants(op_type, dtype, self.mode):
            return
        if any(not isinstance(d, int) for d in shape):
            return
        mode = self.mode
        if mode in COUNTS_PER_VALUE:
            if not jnp.issubdtype(dtype, jnp.inexact) or jnp.issubdtype(dtype, jnp.complexfloating):
                return
            level.counts.append(Pending(value))
        elif mode == TensorDebugMode.FULL_TENSOR:
            level.values.append(value)
        level.rows.append(Row(level.graph_id, op_name, slot, dtype_enum(dtype), shape))

    # -- interpretation --------------------------------------------------------------------

    def add_op(self, op: OpInfo) -> None:
        if self.describing:
            self.ops.append(op)

    def placeholder(self, level: _Level, var: Any, value: Any, name: str, op_type: str) -> None:
        self.add_op(OpInfo(level.graph_id, op_type, name, [], 1, level.frames, "", False))
        level.names[var] = f"{name}:0"
        aval = getattr(var, "aval", None)
        if getattr(aval, "weak_type", False) and not getattr(aval, "shape", ()):
            # A Python number passed in (softmax's initial -inf to a max, say): a constant of
            # the caller's code, not data.
            return
        self.summarise(level, value, op_type, name, 0)

    def run(
        self,
        level: _Level,
        jaxpr: Any,
        consts: Sequence[Any],
        args: Sequence[Any],
        arg_names: Sequence[str] | None = None,
    ) -> list[Any]:
        """Evaluate ``jaxpr`` (being traced), recording its equations into ``level``.

        With ``arg_names`` (the outermost jaxpr) its arguments and constants are
        ``Placeholder`` and ``Const`` ops; otherwise (an inlined call, a loop
        body) they are the caller's values, already named in ``level.names`` by
        :meth:`bind_names`.
        """
        from jax._src import core

        env: dict[Any, Any] = {}

        def read(v: Any) -> Any:
            return v.val if isinstance(v, core.Literal) else env[v]

        for i, (v, x) in enumerate(zip(jaxpr.constvars, consts, strict=True)):
            env[v] = x
            if arg_names is not None:
                self.placeholder(level, v, x, f"const_{i}", "Const")
        for i, (v, x) in enumerate(zip(jaxpr.invars, args, strict=True)):
            env[v] = x
            if arg_names is not None:
                label = arg_names[i] if i < len(arg_names) and arg_names[i] else f"arg_{i}"
                self.placeholder(level, v, x, _clean(label), "Placeholder")
        for eqn in jaxpr.eqns:
            outs = self.equation(level, eqn, [read(v) for v in eqn.invars])
            for v, o in zip(eqn.outvars, outs, strict=True):
                env[v] = o
        return [read(v) for v in jaxpr.outvars]

    @staticmethod
    def bind_names(
        level: _Level, outer: _Level, inner_vars: Sequence[Any], outer_vars: Sequence[Any]
    ) -> None:
        """Name a sub-jaxpr's inputs after the caller's values that feed them."""
        from jax._src import core

        for iv, ov in zip(inner_vars, outer_vars, strict=False):
            if not isinstance(ov, core.Literal) and ov in outer.names:
                level.names[iv] = outer.names[ov]

    def equation(self, level: _Level, eqn: Any, invals: list[Any]) -> list[Any]:
        from jax._src import core, source_info_util

        prim = eqn.primitive.name
        name_stack = level.name_stack + eqn.source_info.name_stack
        scopes, backward = _scopes(name_stack)
        frames = _frames(eqn.source_info.traceback) or level.frames
        self.backward = self.backward or backward
        op_name = level.op_name(prim)
        inputs = []
        for i, v in enumerate(eqn.invars):
            if isinstance(v, core.Literal):
                # A number in the program: a Const op of its own, so that input slots count
                # as the equation's operands do (TensorFlow's consumers go by slot).
                name = f"{op_name}/literal_{i}"
                self.add_op(OpInfo(level.graph_id, "Const", name, [], 1, frames, "", False))
                inputs.append(f"{name}:0")
            else:
                inputs.append(level.names.get(v, ""))
        op = OpInfo(
            level.graph_id,
            prim,
            op_name,
            [n for n in inputs if n],
            len(eqn.outvars),
            frames,
            "/".join(scopes),
            backward,
        )
        self.add_op(op)
        self.loop_outputs = []
        inner = _sub_jaxpr(eqn)
        summarise_outputs = True
        with source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack):
            if inner is not None:
                outs = self._call(level, eqn, inner, invals, name_stack, frames)
                summarise_outputs = False  # summarised inside, where they were computed
            elif prim == "scan":
                outs = self._scan(level, eqn, invals, name_stack, frames, op_name)
            elif prim == "while":
                outs = self._while(level, eqn, invals, name_stack, frames, op_name)
            elif prim == "cond":
                outs = self._cond(level, eqn, invals, name_stack, frames, op_name)
            else:
                with eqn.ctx.manager:
                    params = eqn.primitive.get_bind_params(eqn.params)
                    outs = eqn.primitive.bind(*invals, **params)
                if not eqn.primitive.multiple_results:
                    outs = [outs]
        outs = list(outs)
        if self.guards and inner is None:  # an inlined call's equations record their uses
            self.flow.use(eqn, invals, outs)
        # A loop's or branch's results come from its body's last ops: data edges too.
        op.input_names.extend(n for n in self.loop_outputs if n and n not in op.input_names)
        if (
            inner is None
            and not eqn.effects
            and all(isinstance(v, core.Literal) or v in level.constants for v in eqn.invars)
        ):
            # Computed from constants alone (zeros_like, iota, a broadcast literal): XLA folds
            # it at compile time, and would fold its summary too, slowly. Not summarised.
            level.constants.update(eqn.outvars)
            summarise_outputs = False
        elif summarise_outputs and passes_through(eqn) and op.input_names:
            # Same values in another shape: consumers are shown the producer's summary.
            level.names[eqn.outvars[0]] = op.input_names[0]
            return outs
        for slot, (v, o) in enumerate(zip(eqn.outvars, outs, strict=True)):
            if summarise_outputs or v not in level.names:
                level.names[v] = f"{op_name}:{slot}"
            if summarise_outputs and not isinstance(v, core.DropVar):
                self.summarise(level, o, prim, op_name, slot)
        return outs

    def _call(
        self,
        level: _Level,
        eqn: Any,
        inner: Any,
        invals: list[Any],
        name_stack: Any,
        frames: list[Any],
    ) -> list[Any]:
        """A nested ``jit``, ``remat``, ``custom_jvp``/``custom_vjp`` call, inlined.

        Its equations become ops of the caller's graph (JAX's compiler inlines
        them too); what it returns is named after the ops inside that made it.
        """
        jaxpr, consts = (inner.jaxpr, inner.consts) if hasattr(inner, "jaxpr") else (inner, ())
        # custom_vjp_call's operands may follow leading ones of its own.
        args = invals[len(invals) - len(jaxpr.invars) :]
        sub = _Level(self, level.graph_id, name_stack, frames, level.prefix)
        sub.n_ops, sub.names, sub.constants = level.n_ops, dict(level.names), level.constants
        self.bind_names(sub, level, jaxpr.invars, eqn.invars[len(invals) - len(jaxpr.invars) :])
        outs = self.run(sub, jaxpr, consts, args)
        level.n_ops = sub.n_ops
        level.rows.extend(sub.rows)
        level.counts.extend(sub.counts)
        level.values.extend(sub.values)
        for ov, iv in zip(eqn.outvars, jaxpr.outvars, strict=True):
            name = sub.names.get(iv)
            if name:
                level.names[ov] = name
        return outs

    def _body(self, level: _Level, op_name: str, name_stack: Any, frames: list[Any]) -> _Level:
        return _Level(self, level.graph_id, name_stack, frames, f"{op_name}/")

    def _describe(self, body: _Level, closed: Any, args: Sequence[Any]) -> int | None:
        """Record a loop body's or branch's ops and rows into ``body``, once, by tracing it
        aside; the width of its counts (None: it counts nothing)."""
        import jax

        def trial(*xs: Any) -> Any:
            self.run(body, closed.jaxpr, closed.consts, list(xs))
            return _gather(body.counts, self.mode) if body.counts else None

        names = dict(body.names)
        avals = [jax.ShapeDtypeStruct(np.shape(a), _dtype(a)) for a in args]
        counts = jax.eval_shape(trial, *avals)
        outputs = [body.names.get(v, "") for v in closed.jaxpr.outvars if hasattr(v, "aval")]
        body.counts = []
        body.names = names
        body.out_names = outputs
        if self.mode not in COUNTS_PER_VALUE or counts is None:
            return None
        return int(counts.shape[0])

    def _again(self, body: _Level, closed: Any, args: Sequence[Any]) -> tuple[list[Any], Any]:
        """Trace a described body for real: its outputs and its counts vector."""
        import jax.numpy as jnp

        sub = _Level(self, body.graph_id, body.name_stack, body.frames, body.prefix)
        sub.names = dict(body.names)
        describing, self.describing = self.describing, False
        try:
            outs = self.run(sub, closed.jaxpr, closed.consts, list(args))
        finally:
            self.describing = describing
        counts = _gather(sub.counts, self.mode) if sub.counts else jnp.zeros(0, jnp.int32)
        return outs, counts

    def _scan(
        self,
        level: _Level,
        eqn: Any,
        invals: list[Any],
        name_stack: Any,
        frames: list[Any],
        op_name: str,
    ) -> list[Any]:
        import jax.numpy as jnp
        from jax import lax

        p = eqn.params
        closed = p["jaxpr"]
        nc, ncarry = p["num_consts"], p["num_carry"]
        consts, init, xs = invals[:nc], invals[nc : nc + ncarry], invals[nc + ncarry :]
        body = self._body(level, op_name, name_stack, frames)
        self.bind_names(body, level, closed.jaxpr.invars, eqn.invars)
        width = self._describe(body, closed, [*consts, *init, *[_slice0(x) for x in xs]])
        if width is None:  # nothing counted inside: the loop as it was
            return list(eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(p)))
        sizes = _sizes(body)

        def step(carry: Any, x: Any) -> Any:
            state, it, first, at_first, _ = carry
            outs, counts = self._again(body, closed, [*consts, *state, *x])
            first, at_first = _first_bad(self.mode, sizes, counts, it, first, at_first)
            return (outs[:ncarry], it + 1, first, at_first, counts), outs[ncarry:]

        zeros = jnp.zeros(width, jnp.int32)
        carry0 = (list(init), jnp.int32(0), jnp.int32(-1), zeros, zeros)
        (state, _, first, at_first, last), ys = lax.scan(
            step, carry0, list(xs), length=p["length"], reverse=p["reverse"], unroll=p["unroll"]
        )
        last_index = p["length"] - 1
        chosen = jnp.where(first >= 0, at_first, last)
        index = jnp.where(first >= 0, first, last_index)
        if p["reverse"]:  # the iterations ran from the end of xs
            index = last_index - index
        self._absorb(level, body, _with_iteration(chosen, index, self.mode))
        self.loop_outputs = body.out_names
        return [*state, *ys]

    def _while(
        self,
        level: _Level,
        eqn: Any,
        invals: list[Any],
        name_stack: Any,
        frames: list[Any],
        op_name: str,
    ) -> list[Any]:
        import jax.numpy as jnp
        from jax import lax
        from jax._src import core

        p = eqn.params
        cond, closed = p["cond_jaxpr"], p["body_jaxpr"]
        ncc, nbc = p["cond_nconsts"], p["body_nconsts"]
        cconsts, bconsts, init = invals[:ncc], invals[ncc : ncc + nbc], invals[ncc + nbc :]
        body = self._body(level, op_name, name_stack, frames)
        self.bind_names(body, level, closed.jaxpr.invars, eqn.invars[ncc:])
        width = self._describe(body, closed, [*bconsts, *init])
        if width is None:
            return list(eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(p)))
        sizes = _sizes(body)

        def keep_going(carry: Any) -> Any:
            return core.eval_jaxpr(cond.jaxpr, cond.consts, *cconsts, *carry[0])[0]

        def step(carry: Any) -> Any:
            state, it, first, at_first, _ = carry
            outs, counts = self._again(body, closed, [*bconsts, *state])
            first, at_first = _first_bad(self.mode, sizes, counts, it, first, at_first)
            return (outs, it + 1, first, at_first, counts)

        zeros = jnp.zeros(width, jnp.int32)
        state, it, first, at_first, last = lax.while_loop(
            keep_going, step, (list(init), jnp.int32(0), jnp.int32(-1), zeros, zeros)
        )
        # A loop that never ran leaves its rows empty (-1: did not run).
        chosen = jnp.where(first >= 0, at_first, jnp.where(it > 0, last, -1))
        index = jnp.where(first >= 0, first, it - 1)
        self._absorb(level, body, _with_iteration(chosen, index, self.mode))
        self.loop_outputs = body.out_names
        return list(state)

    def _cond(
        self,
        level: _Level,
        eqn: Any,
        invals: list[Any],
        name_stack: Any,
        frames: list[Any],
        op_name: str,
    ) -> list[Any]:
        import jax.numpy as jnp
        from jax import lax

        branches = eqn.params["branches"]
        index, ops = invals[0], invals[1:]
        bodies = []
        widths = []
        for b, closed in enumerate(branches):
            body = self._body(level, f"{op_name}/branch_{b}", name_stack, frames)
            self.bind_names(body, level, closed.jaxpr.invars, eqn.invars[1:])
            widths.append(self._describe(body, closed, ops) or 0)
            bodies.append(body)
        if not any(widths):
            return list(eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params)))
        offsets = np.cumsum([0, *widths]).tolist()

        def branch(b: int) -> Callable[..., Any]:
            def run_branch(*xs: Any) -> Any:
                outs, counts = self._again(bodies[b], branches[b], xs)
                # The other branches' rows: -1, "did not run".
                full = jnp.full(offsets[-1], -1, jnp.int32)
                if widths[b]:
                    full = lax.dynamic_update_slice(full, counts, (offsets[b],))
                return outs, full

            return run_branch

        outs, counts = lax.switch(index, [branch(b) for b in range(len(branches))], *ops)
        for body in bodies:
            level.rows.extend(body.rows)
        level.counts.append(counts)
        self.loop_outputs = [n for body in bodies for n in body.out_names]
        return list(outs)

    @staticmethod
    def _absorb(level: _Level, body: _Level, counts: Any) -> None:
        level.rows.extend(body.rows)
        level.counts.append(counts)


def _sizes(body: _Level) -> np.ndarray:
    return np.array([numel(r.shape) for r in body.rows], dtype=np.int64)


def _with_iteration(block: Any, index: Any, mode: TensorDebugMode) -> Any:
    """A loop's chosen counts with its rows' iteration column set to ``index + 1``.

    Rows of a loop nested in the body keep their own (inner) iteration; rows that
    did not run keep -1.
    """
    import jax.numpy as jnp

    k = COUNTS_PER_VALUE[mode]
    c = block.reshape(-1, k + 1)
    col = c[:, k]
    col = jnp.where(c[:, 0] < 0, -1, jnp.where(col > 0, col, index + 1))
    return c.at[:, k].set(col).reshape(-1)


def _first_bad(
    mode: TensorDebugMode, sizes: np.ndarray, counts: Any, it: Any, first: Any, at_first: Any
) -> tuple[Any, Any]:
    """The carry of "the first iteration with a non-finite value, and its counts then"."""
    import jax.numpy as jnp

    c = counts.reshape(-1, COUNTS_PER_VALUE[mode] + 1)
    ninf, pinf, nan = nonfinite_rows(mode, c, jnp.asarray(sizes, jnp.int32))
    now = (first < 0) & jnp.any(ninf | pinf | nan)
    return jnp.where(now, it, first), jnp.where(now, counts, at_first)


# Values counted together in one reduction at most.
GROUP_LIMIT = int(os.environ.get("NANSCOPE_JAX_GROUP", "8"))


def _gather(entries: Sequence[Any], mode: TensorDebugMode) -> Any:
    """The counts of ``entries`` (values and blocks of counts), as one vector in their order.

    Values of one shape are counted together, in one variadic reduction over all
    of them (a tuple of int32 sums): XLA emits it as one loop that computes the
    values it can fuse in registers and counts them as it goes, rather than a
    pass over memory per value. (Sibling reductions fused the usual way are many
    times slower on the CPU.) Scalars are stacked per dtype and counted as one
    vector, and every sum is stacked once: on XLA:CPU each fused computation
    costs microseconds to launch, and a training step has dozens of scalars
    (the loss, an optimizer's step count and its powers).
    """
    import jax.numpy as jnp

    k = COUNTS_PER_VALUE[mode]
    groups: dict[tuple[int, ...], list[int]] = {}
    scalars: dict[Any, list[int]] = {}
    sizes: list[int] = []
    for i, e in enumerate(entries):
        if isinstance(e, Pending):
            if np.ndim(e.value) == 0:
                scalars.setdefault(np.dtype(_dtype(e.value)), []).append(i)
            else:
                groups.setdefault(tuple(np.shape(e.value)), []).append(i)
            sizes.append(1)
        else:
            sizes.append(block_rows(e, mode))
    sums: list[Any] = []  # k scalars per value of the large groups
    counted: list[Any] = []  # [values, k] counts of the scalars
    row_of: dict[int, int] = {}  # pending entry -> its row among the pending ones' counts
    for group in groups.values():
        # Bounded: one reduction with hundreds of accumulators takes long to compile.
        for start in range(0, len(group), GROUP_LIMIT):
            members = group[start : start + GROUP_LIMIT]
            sums.extend(_counts([entries[i].value for i in members], mode))
            row_of.update((i, len(row_of)) for i in members)
    n_large = len(row_of)
    for members in scalars.values():
        vector = jnp.stack([entries[i].value for i in members])
        counted.append(jnp.stack(_flags(vector, mode), axis=-1).astype(jnp.int32))
        row_of.update((i, len(row_of)) for i in members)
    pending: list[Any] = []
    if sums:
        pending.append(jnp.stack(sums).reshape(n_large, k))
    pending.extend(counted)
    parts: list[Any] = []
    first_row: dict[int, int] = {}  # entry -> its first row in the concatenated parts
    if pending:
        c = jnp.concatenate(pending) if len(pending) > 1 else pending[0]
        # The iteration column: 0 outside loops (a loop sets its rows' after it ran).
        parts.append(jnp.concatenate([c, jnp.zeros((len(row_of), 1), jnp.int32)], axis=1))
        first_row.update(row_of)
    n = len(row_of)
    for i, e in enumerate(entries):
        if not isinstance(e, Pending):
            parts.append(e.reshape(-1, k + 1))
            first_row[i] = n
            n += sizes[i]
    order = [first_row[i] + r for i in range(len(entries)) for r in range(sizes[i])]
    stacked = jnp.concatenate(parts) if len(parts) > 1 else parts[0]
    if order != list(range(n)):
        stacked = stacked[np.asarray(order)]
    return stacked.reshape(-1)


def _flags(x: Any, mode: TensorDebugMode) -> tuple[Any, ...]:
    """What ``mode`` counts of ``x``'s elements (nanscope.format.counts), as booleans."""
    import jax.numpy as jnp

    if mode == TensorDebugMode.CURT_HEALTH:
        return (~jnp.isfinite(x),)
    if mode == TensorDebugMode.CONCISE_HEALTH:
        return (x == -jnp.inf, x == jnp.inf, jnp.isfinite(x))
    return (x == -jnp.inf, x == jnp.inf, x < 0, x == 0, x > 0)


def _counts(values: Sequence[Any], mode: TensorDebugMode) -> list[Any]:
    """The ``k`` counts (int32 scalars) of each of same-shaped ``values``, in order."""
    import jax.numpy as jnp
    from jax import lax

    i32 = jnp.int32
    operands = [f.astype(i32) for x in values for f in _flags(x, mode)]
    zeros = (i32(0),) * len(operands)
    return list(lax.reduce(tuple(operands), zeros, _add, tuple(range(np.ndim(values[0])))))


def _add(a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(p + q for p, q in zip(a, b, strict=True))


def _slice0(x: Any) -> Any:
    import jax

    return jax.ShapeDtypeStruct(np.shape(x)[1:], _dtype(x))


def _dtype(x: Any) -> Any:
    aval = getattr(x, "aval", None)
    return aval.dtype if aval is not None else x.dtype


def _sub_jaxpr(eqn: Any) -> Any:
    name = eqn.primitive.name
    if name not in _CALLS:
        return None
    key = _CALLS[name]
    return eqn.params.get(key) if key else None


def _arg_names(jaxpr: Any) -> list[str]:
    info = getattr(jaxpr, "debug_info", None)
    names = getattr(info, "arg_names", None) if info is not None else None
    return list(names) if names else []


def _clean(label: str) -> str:
    """An argument's path (``params['w1']``) as an op name (no ``:``, which names slots)."""
    return re.sub(r"[:\s]", "_", label) or "arg"


def instrument(
    closed: Any,
    name: str,
    mode: TensorDebugMode,
    selection: Selection,
    guards: bool = False,
    graph_id: str = "",
) -> GraphPlan:
    """The plan for one jitted function's closed jaxpr (see the module's docstring).

    ``guards``: count only the guards (:class:`Flow`) at each call; the plan's rows are
    still every value's, ``kept`` says which the program counts. ``graph_id``: the
    graph's (a guarded plan's, for the plan that replays its calls).
    """
    import jax
    from jax._src import source_info_util

    build = _Build(mode, selection, guards and mode in COUNTS_PER_VALUE)
    graph_id = graph_id or f"jax-{next(_graph_ids)}"
    top = _Level(build, graph_id, source_info_util.current_name_stack(), [])
    arg_names = [_clean(n) for n in _arg_names(closed.jaxpr)]
    arg_names += [f"arg_{i}" for i in range(len(arg_names), len(closed.jaxpr.invars))]
    extra: list[int] = []

    def program(*args: Any) -> Any:
        outs = build.run(top, closed.jaxpr, closed.consts, args, arg_names)
        if mode == TensorDebugMode.FULL_TENSOR:
            extra.append(len(top.values))
            return (*outs, *top.values)
        entries = top.counts
        if build.guards:
            entries = build.flow.guards(top.counts, mode, outs, args)
        if entries:
            extra.append(1)
            counts = _gather(entries, mode)
            if build.guards:
                counts = _with_flag(counts, top, build.flow.kept, mode)
            return (*outs, counts)
        extra.append(0)
        return tuple(outs)

    avals = [
        jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False))
        for a in closed.in_avals
    ]
    instrumented = jax.make_jaxpr(program)(*avals)
    plan = GraphPlan(graph_id, name, mode, instrumented, extra[-1])
    plan.graphs = [GraphInfo(graph_id, name, "")]
    plan.ops, plan.rows, plan.backward = build.ops, top.rows, build.backward
    if build.guards:
        plan.kept = build.flow.kept
        plan.counted = np.zeros(len(plan.rows), dtype=bool)
        plan.counted[plan.kept] = True
        plan.covering = plan.kept[build.flow.covering]
    plan.finish()
    # The rows of the arguments and of the outputs: their summaries go into the Execution.
    plan.input_rows = [
        plan.row_of.get((_clean(arg_names[i]), 0), -1) for i in range(len(closed.jaxpr.invars))
    ]
    plan.output_rows = [_output_row(v, top, plan.row_of) for v in closed.jaxpr.outvars]
    return plan


def _with_flag(counts: Any, top: _Level, kept: np.ndarray, mode: TensorDebugMode) -> Any:
    """``counts`` (the kept rows') and, last, how many of those rows held Inf/NaN."""
    import jax.numpy as jnp

    c = counts.reshape(-1, COUNTS_PER_VALUE[mode] + 1)
    sizes = np.array([numel(top.rows[i].shape) for i in kept], dtype=np.int32)
    if c.shape[0] != len(sizes):
        raise AssertionError(f"{c.shape[0]} rows of counts for {len(sizes)} guards")
    ninf, pinf, nan = nonfinite_rows(mode, c, jnp.asarray(sizes))
    flag = jnp.sum((ninf | pinf | nan).astype(jnp.int32), keepdims=True)
    return jnp.concatenate([counts, flag])


def _output_row(var: Any, top: _Level, row_of: dict[tuple[str, int], int]) -> int:
    from jax._src import core

    producer = "" if isinstance(var, core.Literal) else top.names.get(var, "")
    if not producer:
        return -1
    op, _, slot = producer.rpartition(":")
    return row_of.get((op, int(slot)), -1)
