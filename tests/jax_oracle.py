"""An independent oracle for JAX programs: the first Inf/NaN of a jaxpr, found with NumPy.

Given a function and its arguments (or a ``ClosedJaxpr`` from ``jax.make_jaxpr`` and its flat
inputs), it evaluates the jaxpr equation by equation with NumPy, recursing into the jaxprs of
``jit``, ``closed_call``, ``custom_jvp_call``, ``custom_vjp_call``, ``remat2`` (checkpoint),
``scan`` (iteration by iteration), ``while`` (its ``cond_jaxpr`` before each iteration) and
``cond`` (the branch its index picks), and reports the first equation output, in evaluation
order, that holds an Inf or NaN: its primitive, the user's file and line, the name stack,
whether it is a backward equation, its counts and the loop iterations it sits in. It also
reports the first equation output holding +-Inf and the first holding NaN separately. It shares
no code with nanscope and does not import it: it is the yardstick nanscope's JAX backend is
held against.

Definitions:

* *Equation outputs* are the outputs of first-order equations, including the ones inside
  nested jaxprs (a ``jit`` equation's own outputs are those of the equations inside it).
  Outputs bound to ``_`` (dropped) are checked too: the equation computed them. Inputs and
  constants are not equation outputs; ``nonfinite_inputs`` lists the inputs that hold Inf/NaN.
* *Counts* follow TensorFlow's FULL_HEALTH: size, -inf, +inf, NaN, and the negative, zero and
  positive counts of the *finite* values (so the six counts add up to the size).
* The *line* is JAX's user frame of the equation (``source_info_util.user_frame``: the
  innermost frame outside JAX's own sources). Equations inside jnp's own jitted functions have
  no user frame; they take the nearest enclosing equation's. A ``custom_vjp`` backward rule's
  equations have the rule's own lines: :func:`evaluate` traces the rule with the live
  traceback (JAX would give them the traceback of the line that called the custom function,
  where the bug is not). The *name stack* is the enclosing
  equations' name stacks and the equation's own, joined. An equation is *backward* when its
  name stack contains ``transpose`` (JAX's name for the backward pass); note that JAX computes
  some derivative coefficients (sqrt's 0.5 / sqrt(x)) with the forward pass, under ``jvp``.
* *Loops*: for each enclosing ``scan`` or ``while``, outermost first, which iteration was
  running, counted from 0 in execution order (a reversed scan's iteration 0 reads the last
  element; ``index`` says which).
* A *birth* is an equation output holding Inf/NaN from an equation whose floating inputs were
  all finite (the first ``MAX_BIRTHS`` are kept).

The numbers follow XLA on CPU, not NumPy's defaults, where they differ: float16 and bfloat16
are computed in float32 and rounded back to their type, and subnormal float32/bfloat16 values
are flushed to zero (XLA's CPU backend runs with flush-to-zero and denormals-are-zero: exp(-88)
is 0 there, and log of a subnormal is -inf). ``flush_denormals=False`` turns that off.

A primitive without a NumPy rule is evaluated with JAX, that one equation alone, eagerly
(``eqn.primitive.bind``); ``Result.fallbacks`` names them.

Use from Python::

    result = evaluate(train_step, params, opt_state, x, y)
    result.first        # Event: primitive, file, line, counts, loops...
    result.first_nan

    program = evaluate_program(lambda: train(steps))  # eager ops and jitted calls, whole
    program.lineages    # each birth, what it carries, whether harmful (and why)
    program.cause       # the birth to fix
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax._src import source_info_util
from jax.extend import core as jcore

MAX_BIRTHS = 100
MAX_WHILE_ITERATIONS = 1_000_000

Kind = Literal["nan", "-inf", "+inf"]


# -- What the oracle reports -------------------------------------------------------------------


@dataclass(frozen=True)
class Counts:
    """FULL_HEALTH's counts: negative, zero and positive count finite values only."""

    size: int
    neg_inf: int
    pos_inf: int
    nan: int
    negative: int
    zero: int
    positive: int

    @classmethod
    def of(cls, value: np.ndarray) -> Counts:
        a = np.asarray(value)
        if _is_low_float(a.dtype):
            a = a.astype(np.float32)
        finite = np.isfinite(a)
        fin = a[finite]
        return cls(
            size=int(a.size),
            neg_inf=int(np.count_nonzero(a == -np.inf)),
            pos_inf=int(np.count_nonzero(a == np.inf)),
            nan=int(np.count_nonzero(np.isnan(a))),
            negative=int(np.count_nonzero(fin < 0)),
            zero=int(np.count_nonzero(fin == 0)),
            positive=int(np.count_nonzero(fin > 0)),
        )

    @property
    def nonfinite(self) -> int:
        return self.neg_inf + self.pos_inf + self.nan


@dataclass(frozen=True)
class Loop:
    """One enclosing loop of an equation, and which of its iterations was running."""

    primitive: str  # "scan" or "while"
    iteration: int  # body evaluations before this one
    index: int  # scan: the position of the slice of xs being read; while: = iteration
    length: int | None  # scan's length; None for while
    line: int | None  # the loop's own line


@dataclass(frozen=True)
class Event:
    """An equation output that holds Inf or NaN."""

    index: int  # equations evaluated before this one (each loop iteration counts anew)
    primitive: str
    output: int  # which of the equation's outputs
    dtype: str
    shape: tuple[int, ...]
    counts: Counts
    file: str | None
    line: int | None
    function: str | None
    name_stack: str
    backward: bool
    loops: tuple[Loop, ...]
    inputs_finite: bool  # all floating inputs were finite: the Inf/NaN was born here

    @property
    def kind(self) -> Kind:
        """ "nan" if the output holds a NaN, else the sign of its (first counted) infinities."""
        if self.counts.nan:
            return "nan"
        return "-inf" if self.counts.neg_inf else "+inf"

    @property
    def loop(self) -> str | None:
        """The innermost enclosing loop's primitive."""
        return self.loops[-1].primitive if self.loops else None

    @property
    def iteration(self) -> int | None:
        """The innermost enclosing loop's iteration."""
        return self.loops[-1].iteration if self.loops else None


@dataclass
class Result:
    """What the oracle found in one evaluation."""

    outputs: list[np.ndarray]  # the jaxpr's outputs, flat
    first: Event | None = None  # the first equation output holding Inf or NaN
    first_inf: Event | None = None  # ... holding -inf or +inf
    first_nan: Event | None = None  # ... holding NaN
    births: list[Event] = field(default_factory=list)
    nonfinite_inputs: list[int] = field(default_factory=list)  # flat input positions
    num_equations: int = 0  # equations evaluated (loop bodies count once per iteration)
    fallbacks: list[str] = field(default_factory=list)  # primitives evaluated with JAX


def evaluate(fn: Callable[..., Any], *args: Any, flush_denormals: bool = True) -> Result:
    """Trace ``fn(*args)`` with ``jax.make_jaxpr`` and evaluate its jaxpr with NumPy."""
    closed = trace(fn, *args)
    return evaluate_jaxpr(closed, jax.tree_util.tree_leaves(args), flush_denormals=flush_denormals)


def evaluate_jaxpr(
    closed: jcore.ClosedJaxpr, flat_args: Sequence[Any], *, flush_denormals: bool = True
) -> Result:
    """Evaluate ``closed`` on its flat inputs, equation by equation."""
    jaxpr = closed.jaxpr
    if len(flat_args) != len(jaxpr.invars):
        raise ValueError(f"the jaxpr takes {len(jaxpr.invars)} inputs, got {len(flat_args)}")
    ev = _Evaluator(flush_denormals)
    args = [ev.value(a, _dtype(v)) for a, v in zip(flat_args, jaxpr.invars, strict=True)]
    nonfinite = [i for i, a in enumerate(args) if _is_float(a.dtype) and not _all_finite(a)]
    with np.errstate(all="ignore"):
        outputs = ev.run(jaxpr, closed.consts, args, _Context.top())
    return Result(
        outputs=outputs,
        first=ev.first,
        first_inf=ev.first_inf,
        first_nan=ev.first_nan,
        births=ev.births,
        nonfinite_inputs=nonfinite,
        num_equations=ev.count,
        fallbacks=sorted(ev.fallbacks),
    )


def evaluate_calls(
    fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], *, stop_at_first: bool = True
) -> list[Result]:
    """Evaluate ``fn`` on the arguments of each call in turn (a training loop's steps, as the
    program called them); with ``stop_at_first``, stop after the first call whose equations
    produced an Inf or NaN. The list's length minus one is then that call's step."""
    results: list[Result] = []
    for args in calls:
        results.append(evaluate(fn, *args))
        if stop_at_first and results[-1].first is not None:
            break
    return results


def trace(fn: Callable[..., Any], *args: Any) -> jcore.ClosedJaxpr:
    """``jax.make_jaxpr(fn)(*args)``, with each ``custom_vjp`` backward rule's equations at the
    rule's own lines (traced again, JAX's caches cleared around it, when it may hold one: a
    custom_vjp call or a gradient)."""
    closed = jax.make_jaxpr(fn)(*args)
    # A custom_vjp's forward call may be gone from a jitted gradient's jaxpr (its residuals
    # inlined): any gradient may hold a backward rule.
    if not _has_custom_vjp(closed.jaxpr) and not _has_backward(closed.jaxpr):
        return closed
    from jax._src.interpreters import ad

    rule = ad.primitive_transposes[ad.custom_lin_p]

    def with_live_traceback(*a: Any, **kw: Any) -> Any:
        context = source_info_util._source_info_context
        saved = context.context
        context.context = source_info_util.SourceInfo(None, saved.name_stack)
        try:
            return rule(*a, **kw)
        finally:
            context.context = saved

    jax.clear_caches()
    ad.primitive_transposes[ad.custom_lin_p] = with_live_traceback
    try:
        closed = jax.make_jaxpr(fn)(*args)
    finally:
        ad.primitive_transposes[ad.custom_lin_p] = rule
        jax.clear_caches()
    return closed


def _has_custom_vjp(jaxpr: jcore.Jaxpr) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name.startswith("custom_vjp"):
            return True
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                inner = sub.jaxpr if isinstance(sub, jcore.ClosedJaxpr) else sub
                if isinstance(inner, jcore.Jaxpr) and _has_custom_vjp(inner):
                    return True
    return False


# -- Evaluation ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Context:
    """What an equation inherits from the equations that enclose it."""

    name_stack: source_info_util.NameStack
    frame: source_info_util.Frame | None
    loops: tuple[Loop, ...]

    @classmethod
    def top(cls) -> _Context:
        return cls(source_info_util.NameStack(), None, ())

    def enter(self, eqn: jcore.JaxprEqn) -> _Context:
        """The context of ``eqn`` itself (and of the equations inside it)."""
        frame = source_info_util.user_frame(eqn.source_info.traceback)
        return _Context(
            self.name_stack + eqn.source_info.name_stack, frame or self.frame, self.loops
        )

    def in_loop(self, loop: Loop) -> _Context:
        return _Context(self.name_stack, self.frame, (*self.loops, loop))


class _Evaluator:
    def __init__(self, flush_denormals: bool) -> None:
        self.flush = flush_denormals
        self.count = 0
        self.first: Event | None = None
        self.first_inf: Event | None = None
        self.first_nan: Event | None = None
        self.births: list[Event] = []
        self.fallbacks: set[str] = set()

    def value(self, x: Any, dtype: Any) -> np.ndarray:
        if _is_key(dtype):
            return x  # type: ignore[no-any-return]  # a PRNG key stays a JAX array
        a = np.asarray(x, dtype=dtype)
        return _flush(a) if self.flush else a

    def run(
        self, jaxpr: jcore.Jaxpr, consts: Sequence[Any], args: Sequence[np.ndarray], ctx: _Context
    ) -> list[np.ndarray]:
        env: dict[jcore.Var, np.ndarray] = {}

        def read(v: Any) -> np.ndarray:
            if isinstance(v, jcore.Literal):
                return self.value(v.val, _dtype(v))
            return env[v]

        for var, c in zip(jaxpr.constvars, consts, strict=True):
            env[var] = self.value(c, _dtype(var))
        for var, a in zip(jaxpr.invars, args, strict=True):
            env[var] = a
        for eqn in jaxpr.eqns:
            outs = self.eqn(eqn, [read(v) for v in eqn.invars], ctx)
            for var, out in zip(eqn.outvars, outs, strict=True):
                if not isinstance(var, jcore.DropVar):
                    env[var] = out
        return [read(v) for v in jaxpr.outvars]

    def eqn(self, eqn: jcore.JaxprEqn, ins: list[np.ndarray], outer: _Context) -> list[np.ndarray]:
        self.count += 1
        index = self.count - 1
        ctx = outer.enter(eqn)
        name = eqn.primitive.name
        nested = _NESTED.get(name)
        if nested is not None:
            return list(nested(self, eqn, ins, ctx))
        rule = _RULES.get(name)
        if rule is not None:
            outs = rule(ins, eqn.params)
            raw = outs if isinstance(outs, list) else [outs]
        else:
            self.fallbacks.add(name)
            bound = eqn.primitive.bind(*ins, **eqn.params)
            raw = list(bound) if eqn.primitive.multiple_results else [bound]
        outs = []
        for var, out in zip(eqn.outvars, raw, strict=True):
            if _is_key(getattr(var.aval, "dtype", None)):
                outs.append(out)  # a PRNG key (random_seed, random_wrap): JAX computes with it
                continue
            a = _to_dtype(np.asarray(out), _dtype(var))
            if a.shape != _shape(var):
                raise AssertionError(f"{name}: computed shape {a.shape}, jaxpr says {var.aval}")
            outs.append(_flush(a) if self.flush else a)
        self.check(eqn, ins, outs, ctx, index)
        return outs

    def check(
        self,
        eqn: jcore.JaxprEqn,
        ins: list[np.ndarray],
        outs: list[np.ndarray],
        ctx: _Context,
        index: int,
    ) -> None:
        for i, out in enumerate(outs):
            if not _is_float(out.dtype) or _all_finite(out):
                continue
            stack = str(ctx.name_stack)
            event = Event(
                index=index,
                primitive=eqn.primitive.name,
                output=i,
                dtype=str(out.dtype),
                shape=tuple(out.shape),
                counts=Counts.of(out),
                file=ctx.frame.file_name if ctx.frame else None,
                line=ctx.frame.start_line if ctx.frame else None,
                function=ctx.frame.function_name if ctx.frame else None,
                name_stack=stack,
                backward="transpose" in stack,
                loops=ctx.loops,
                inputs_finite=all(_all_finite(a) for a in ins if _is_float(a.dtype)),
            )
            if self.first is None:
                self.first = event
            if self.first_inf is None and (event.counts.neg_inf or event.counts.pos_inf):
                self.first_inf = event
            if self.first_nan is None and event.counts.nan:
                self.first_nan = event
            if event.inputs_finite and len(self.births) < MAX_BIRTHS:
                self.births.append(event)


# -- Nested jaxprs -----------------------------------------------------------------------------


def _jaxpr_and_consts(j: Any) -> tuple[jcore.Jaxpr, Sequence[Any]]:
    if isinstance(j, jcore.ClosedJaxpr):
        return j.jaxpr, j.consts
    return j, ()


def _call(param: str) -> Callable[[_Evaluator, jcore.JaxprEqn, list[np.ndarray], _Context], Any]:
    """A primitive that calls one jaxpr on all its inputs (jit, checkpoint, custom rules)."""

    def run(ev: _Evaluator, eqn: jcore.JaxprEqn, ins: list[np.ndarray], ctx: _Context) -> Any:
        jaxpr, consts = _jaxpr_and_consts(eqn.params[param])
        if len(jaxpr.invars) != len(ins):
            raise AssertionError(f"{eqn.primitive.name}: {len(ins)} inputs for {jaxpr}")
        return ev.run(jaxpr, consts, ins, ctx)

    return run


def _scan(ev: _Evaluator, eqn: jcore.JaxprEqn, ins: list[np.ndarray], ctx: _Context) -> Any:
    p = eqn.params
    jaxpr, consts = _jaxpr_and_consts(p["jaxpr"])
    n_consts, n_carry, length = p["num_consts"], p["num_carry"], p["length"]
    body_consts, carry, xs = (
        ins[:n_consts],
        ins[n_consts : n_consts + n_carry],
        ins[n_consts + n_carry :],
    )
    ys = [np.empty(_shape(v), _dtype(v)) for v in eqn.outvars[n_carry:]]
    line = ctx.frame.start_line if ctx.frame else None
    for i in range(length):
        idx = length - 1 - i if p["reverse"] else i
        inner = ctx.in_loop(Loop("scan", i, idx, length, line))
        outs = ev.run(jaxpr, consts, [*body_consts, *carry, *(x[idx] for x in xs)], inner)
        carry = outs[:n_carry]
        for y, out in zip(ys, outs[n_carry:], strict=True):
            y[idx] = out
    return [*carry, *ys]


def _while(ev: _Evaluator, eqn: jcore.JaxprEqn, ins: list[np.ndarray], ctx: _Context) -> Any:
    p = eqn.params
    cond_jaxpr, cond_consts_closed = _jaxpr_and_consts(p["cond_jaxpr"])
    body_jaxpr, body_consts_closed = _jaxpr_and_consts(p["body_jaxpr"])
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cond_consts, body_consts, carry = ins[:nc], ins[nc : nc + nb], ins[nc + nb :]
    line = ctx.frame.start_line if ctx.frame else None
    for i in range(MAX_WHILE_ITERATIONS):
        inner = ctx.in_loop(Loop("while", i, i, None, line))
        (go,) = ev.run(cond_jaxpr, cond_consts_closed, [*cond_consts, *carry], inner)
        if not bool(go):
            return carry
        carry = ev.run(body_jaxpr, body_consts_closed, [*body_consts, *carry], inner)
    raise RuntimeError(f"while: still running after {MAX_WHILE_ITERATIONS} iterations")


def _cond(ev: _Evaluator, eqn: jcore.JaxprEqn, ins: list[np.ndarray], ctx: _Context) -> Any:
    branches = eqn.params["branches"]
    index = min(max(int(ins[0]), 0), len(branches) - 1)  # lax.cond clamps the index
    jaxpr, consts = _jaxpr_and_consts(branches[index])
    return ev.run(jaxpr, consts, ins[1:], ctx)


_NESTED: dict[str, Callable[[_Evaluator, jcore.JaxprEqn, list[np.ndarray], _Context], Any]] = {
    "jit": _call("jaxpr"),
    "pjit": _call("jaxpr"),
    "closed_call": _call("call_jaxpr"),
    "core_call": _call("call_jaxpr"),
    "remat2": _call("jaxpr"),
    "checkpoint": _call("jaxpr"),
    "custom_jvp_call": _call("call_jaxpr"),
    "custom_vjp_call": _call("call_jaxpr"),
    "custom_vjp_call_jaxpr": _call("fun_jaxpr"),
    "scan": _scan,
    "while": _while,
    "cond": _cond,
}


# -- Whole programs: eager ops and jitted calls as one data flow ---------------------------------
#
# ``evaluate_program(fn)`` traces a whole program (its eager ops and its calls of jitted
# functions: ``jax.make_jaxpr`` makes each eager op an equation and each jitted call a ``jit``
# equation holding the function's jaxpr) and evaluates it as above, following each birth's
# values along the jaxpr's variables, through every call and back:
#
# * a *birth* is an equation output holding Inf/NaN where no input carried a lineage's values
#   (inputs and constants carry none); its *lineage* is every equation output that received its
#   values. Where lineages meet, NaN is passed on by those that carried NaN (all of them when
#   none did), infinities by those that carried infinities; each carries on only what it
#   explains (a lineage passed on for its infinities does not take up a NaN made beside it);
# * an equation whose floating outputs are all finite *absorbs* the lineages it read (a
#   comparison, a cast to an integer, with no floating output, does not);
# * a lineage is *harmful* when, born outside a backward pass, it reaches a backward equation
#   (the loss and the gradients); when a call of a training step (a jitted function holding
#   backward equations) other than the one that made it returns values it computed from them
#   (kept in the parameters or the optimizer state; an argument returned as it was is not);
#   or when the program returns its values and nothing
#   ever absorbed them. Else it is *benign*;
# * the *cause* is the birth of the harmful lineage that made the first NaN, else of the
#   harmful lineage with the earliest NaN, else of the first harmful lineage.


@dataclass
class ProgramLineage:
    """One birth in a whole program and what became of its values."""

    birth: Event
    call: int  # the program's top-level equation (an eager op or a jitted call) it was born in
    carries: set[str] = field(default_factory=set)  # "inf", "nan"
    members: list[int] = field(default_factory=list)  # Event.index of each equation output
    first_nan: int | None = None
    absorbed: bool = False
    reaches: list[str] = field(default_factory=list)

    @property
    def harmful(self) -> bool:
        return bool(self.reaches)


@dataclass
class ProgramResult:
    """What the oracle found in a whole program."""

    result: Result
    lineages: list[ProgramLineage]

    @property
    def harmful(self) -> list[ProgramLineage]:
        return [lin for lin in self.lineages if lin.harmful]

    @property
    def cause(self) -> ProgramLineage | None:
        harmful = self.harmful
        first_nan = self.result.first_nan
        if first_nan is not None:
            for lin in harmful:
                if first_nan.index in lin.members:
                    return lin
        with_nan = [lin for lin in harmful if lin.first_nan is not None]
        if with_nan:
            return min(with_nan, key=lambda lin: lin.first_nan or 0)
        return harmful[0] if harmful else None


def evaluate_program(fn: Callable[[], Any], *, flush_denormals: bool = True) -> ProgramResult:
    """Trace the whole program ``fn()`` (eager ops and jitted calls) and evaluate it, following
    every lineage (see above)."""
    closed = trace(fn)
    ev = _FlowEvaluator(flush_denormals)
    with np.errstate(all="ignore"):
        outputs = ev.run(closed.jaxpr, closed.consts, [], _Context.top())
    for out in outputs:
        for li in ev.lineage_of.get(id(out), ()):
            lin = ev.lineages[li]
            if not lin.absorbed:
                _reach(lin, "the end of the program, still non-finite")
    result = Result(outputs=outputs, first=ev.first, first_inf=ev.first_inf,
                    first_nan=ev.first_nan, births=ev.births, num_equations=ev.count,
                    fallbacks=sorted(ev.fallbacks))  # fmt: skip
    return ProgramResult(result, ev.lineages)


def _reach(lin: ProgramLineage, what: str) -> None:
    if what not in lin.reaches:
        lin.reaches.append(what)


def _kinds_of(a: np.ndarray) -> set[str]:
    if not _is_float(a.dtype) or _all_finite(a):
        return set()
    c = Counts.of(a)
    return ({"nan"} if c.nan else set()) | ({"inf"} if c.neg_inf or c.pos_inf else set())


def _has_backward(jaxpr: jcore.Jaxpr) -> bool:
    for eqn in jaxpr.eqns:
        if "transpose" in str(eqn.source_info.name_stack):
            return True
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                inner = sub.jaxpr if isinstance(sub, jcore.ClosedJaxpr) else sub
                if isinstance(inner, jcore.Jaxpr) and _has_backward(inner):
                    return True
    return False


class _FlowEvaluator(_Evaluator):
    """The evaluator, following lineages by the arrays each equation reads and writes."""

    def __init__(self, flush_denormals: bool) -> None:
        super().__init__(flush_denormals)
        self.lineages: list[ProgramLineage] = []
        self.lineage_of: dict[int, set[int]] = {}  # id(array) -> lineages
        self._alive: list[np.ndarray] = []  # arrays with lineages, kept so that ids stay unique
        self.depth = 0
        self.call = -1  # the top-level equation being evaluated
        self.training = False  # ... is a call of a function with backward equations

    def eqn(self, eqn: jcore.JaxprEqn, ins: list[np.ndarray], outer: _Context) -> list[np.ndarray]:
        top = self.depth == 0
        if top:
            self.call += 1
            sub = [
                p for p in eqn.params.values() if isinstance(p, (jcore.Jaxpr, jcore.ClosedJaxpr))
            ]
            self.training = any(
                _has_backward(p.jaxpr if isinstance(p, jcore.ClosedJaxpr) else p) for p in sub
            )
        index = self.count
        self.depth += 1
        try:
            outs = super().eqn(eqn, ins, outer)
        finally:
            self.depth -= 1
        if eqn.primitive.name not in _NESTED:
            self._follow(eqn, ins, outs, outer.enter(eqn), index)
        if top and self.training:
            for out in outs:
                if any(out is a for a in ins):
                    continue  # an argument returned as it was (a mask in a module's state)
                for li in self.lineage_of.get(id(out), ()):
                    if self.lineages[li].call < self.call:
                        _reach(self.lineages[li], "a later training step (the parameters)")
        return outs

    def _follow(self, eqn: jcore.JaxprEqn, ins: list[np.ndarray], outs: list[np.ndarray],
                ctx: _Context, index: int) -> None:  # fmt: skip
        contributors: set[int] = set()
        for a in ins:
            contributors |= self.lineage_of.get(id(a), set())
        floats = [o for o in outs if _is_float(o.dtype)]
        bad = [(i, o, _kinds_of(o)) for i, o in enumerate(outs) if _kinds_of(o)]
        if not bad:
            if floats:
                for li in contributors:
                    self.lineages[li].absorbed = True
            return
        stack = str(ctx.name_stack)
        backward = "transpose" in stack
        for slot, out, kinds in bad:
            if contributors:
                passed: set[int] = set()
                if "nan" in kinds:
                    carriers = {li for li in contributors if "nan" in self.lineages[li].carries}
                    passed |= carriers or contributors
                if "inf" in kinds:
                    passed |= {li for li in contributors if "inf" in self.lineages[li].carries}
                passed = passed or contributors
                nan_carriers = any("nan" in self.lineages[li].carries for li in contributors)
                for li in contributors - passed:
                    self.lineages[li].absorbed = True
            else:
                event = Event(
                    index=index, primitive=eqn.primitive.name, output=slot, dtype=str(out.dtype),
                    shape=tuple(out.shape), counts=Counts.of(out),
                    file=ctx.frame.file_name if ctx.frame else None,
                    line=ctx.frame.start_line if ctx.frame else None,
                    function=ctx.frame.function_name if ctx.frame else None,
                    name_stack=stack, backward=backward, loops=ctx.loops, inputs_finite=True,
                )  # fmt: skip
                self.lineages.append(ProgramLineage(event, self.call))
                passed = {len(self.lineages) - 1}
                nan_carriers = False
            for li in passed:
                lin = self.lineages[li]
                explained = kinds
                if "nan" in kinds and "nan" not in lin.carries and nan_carriers:
                    explained = kinds - {"nan"}
                lin.carries |= explained
                lin.members.append(index)
                if "nan" in explained and lin.first_nan is None:
                    lin.first_nan = index
                if backward and not lin.birth.backward:
                    _reach(lin, "the loss and the gradients")
            self.lineage_of[id(out)] = set(passed)
            self._alive.append(out)


# -- dtypes -----------------------------------------------------------------------------------


def _dtype(var: Any) -> np.dtype[Any]:
    """The dtype of a jaxpr variable or literal (its aval is a ShapedArray); a PRNG key's
    own (extended) dtype."""
    if _is_key(var.aval.dtype):
        return var.aval.dtype  # type: ignore[no-any-return]
    dtype: np.dtype[Any] = np.dtype(var.aval.dtype)
    return dtype


def _is_key(dtype: Any) -> bool:
    return dtype is not None and bool(jnp.issubdtype(dtype, jax.dtypes.extended))


def _shape(var: Any) -> tuple[int, ...]:
    return tuple(var.aval.shape)


def _is_float(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, np.floating))


def _is_low_float(dtype: Any) -> bool:
    return _is_float(dtype) and np.dtype(dtype).itemsize < 4


def _all_finite(a: np.ndarray) -> bool:
    if _is_low_float(a.dtype):
        a = a.astype(np.float32)
    return bool(np.isfinite(a).all())


_FLUSHED = {np.dtype(np.float32), np.dtype(np.float64), np.dtype(ml_dtypes.bfloat16)}


def _flush(a: np.ndarray) -> np.ndarray:
    """Subnormal values to (signed) zero, as XLA's CPU backend does (float16 keeps them: XLA
    computes it in float32, where they are normal)."""
    if a.dtype not in _FLUSHED or a.size == 0:
        return a
    f = a.astype(np.float32) if a.dtype == ml_dtypes.bfloat16 else a
    tiny = np.finfo(np.float64 if a.dtype == np.float64 else np.float32).tiny
    sub = (f != 0) & (np.abs(f) < tiny)
    if not sub.any():
        return a
    out = np.array(a, copy=True)
    out[sub] = np.copysign(np.zeros((), a.dtype), a[sub])
    return out


def _to_dtype(a: np.ndarray, dtype: Any) -> np.ndarray:
    """``a`` in ``dtype``, converting the way XLA does (float to int truncates, saturates, and
    NaN becomes 0)."""
    dtype = np.dtype(dtype)
    if a.dtype == dtype:
        return a
    if dtype == np.bool_:
        return np.asarray(a != 0)
    if jnp.issubdtype(dtype, np.integer) and _is_float(a.dtype):
        info = np.iinfo(dtype)
        f = np.nan_to_num(np.trunc(a.astype(np.float64)), nan=0.0)
        return np.asarray(np.clip(f, info.min, info.max).astype(dtype))
    return a.astype(dtype)


def _up(a: np.ndarray) -> np.ndarray:
    """float16/bfloat16 in float32 (XLA's CPU backend computes them so)."""
    return a.astype(np.float32) if _is_low_float(a.dtype) else a


# -- NumPy rules ------------------------------------------------------------------------------

Rule = Callable[[list[np.ndarray], dict[str, Any]], "np.ndarray | list[np.ndarray]"]


def _elementwise(fn: Callable[..., Any]) -> Rule:
    def rule(ins: list[np.ndarray], params: dict[str, Any]) -> np.ndarray:
        return np.asarray(fn(*(_up(a) for a in ins)))

    return rule


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if _is_float(a.dtype):
        return np.asarray(a / b)
    q = np.abs(a) // np.where(b == 0, 1, np.abs(b))
    return np.asarray(np.sign(a) * np.sign(b) * q)  # lax.div rounds toward zero


def _integer_pow(ins: list[np.ndarray], params: dict[str, Any]) -> np.ndarray:
    """x ** y by repeated squaring, each product rounded to x's dtype (as JAX lowers it)."""
    x, y = ins[0], int(params["y"])

    def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return _to_dtype(np.asarray(_up(a) * _up(b)), x.dtype)

    acc: np.ndarray | None = None
    base, n = x, abs(y)
    while n:
        if n & 1:
            acc = base if acc is None else mul(acc, base)
        n >>= 1
        if n:
            base = mul(base, base)
    if acc is None:
        return np.ones_like(x)
    return _to_dtype(np.asarray(1 / _up(acc)), x.dtype) if y < 0 else acc


def _round(ins: list[np.ndarray], params: dict[str, Any]) -> np.ndarray:
    x = _up(ins[0])
    if int(params.get("rounding_method", 0)) == 0:  # away from zero
        return np.asarray(np.sign(x) * np.floor(np.abs(x) + 0.5))
    return np.asarray(np.rint(x))


def _select_n(ins: list[np.ndarray], params: dict[str, Any]) -> np.ndarray:
    which, cases = ins[0], ins[1:]
    if which.ndim == 0:
        return cases[int(which)]
    return np.choose(which.astype(np.int32), cases)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.asarray(
        np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64)).astype(x.dtype)
    )


def _dot_general(ins: list[np.ndarray], params: dict[str, Any]) -> np.ndarray:
    lhs, rhs = _up(ins[0]), _up(ins[1])
    (lc, rc), (lb, rb) = params["dimension_numbers"]
    lc, rc, lb, rb = (list(map(int, d)) for d in (lc, rc, lb, rb))
    l_free = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
    r_free = [d for d in range(rhs.ndim) if d not in rc and d not in rb]
    batch = [lhs.shape[d] for d in lb]
    m = [lhs.shape[d] for d in l_free]
    n = [rhs.shape[d] for d in r_free]
    k = math.prod(lhs.shape[d] for d in lc)
    left = lhs.transpose(lb + l_free + lc).reshape(math.prod(batch), math.prod(m), k)
    right = rhs.transpose(rb + rc + r_free).reshape(math.prod(batch), k, math.prod(n))
    return np.asarray(np.matmul(left, right).reshape(batch + m + n))


def _reduce(fn: Callable[..., Any]) -> Rule:
    def rule(ins: list[np.ndarray], params: dict[str, Any]) -> np.ndarray:
        return np.asarray(fn(_up(ins[0]), axis=tuple(params["axes"])))

    return rule


def _arg(fn: Callable[..., Any]) -> Rule:
    def rule(ins: list[np.ndarray], params: dict[str, Any]) -> np.ndarray:
        (axis,) = params["axes"]
        return np.asarray(fn(_up(ins[0]), axis=axis))

    return rule


def _cumulative(fn: Callable[..., Any]) -> Rule:
    def rule(ins: list[np.ndarray], params: dict[str, Any]) -> np.ndarray:
        x, axis = _up(ins[0]), int(params["axis"])
        if params.get("reverse"):
            return np.flip(fn(np.flip(x, axis), axis=axis), axis)
        return np.asarray(fn(x, axis=axis))

    return rule


def _broadcast_in_dim(ins: list[np.ndarray], params: dict[str, Any]) -> np.ndarray:
    x, shape = ins[0], tuple(params["shape"])
    expanded = [1] * len(shape)
    for i, d in enumerate(params["broadcast_dimensions"]):
        expanded[d] = x.shape[i]
    return np.asarray(np.broadcast_to(x.reshape(expanded), shape).copy())


def _pad(ins: list[np.ndarray], params: dict[str, Any]) -> np.ndarray:
    x, fill = ins
    for axis, (lo, hi, interior) in enumerate(params["padding_config"]):
        n = x.shape[axis]
        size = n + max(n - 1, 0) * interior
        shape = list(x.shape)
        shape[axis] = size + max(lo, 0) + max(hi, 0)
        out = np.full(shape, fill, dtype=x.dtype)
        where = [slice(None)] * x.ndim
        where[axis] = slice(max(lo, 0), max(lo, 0) + size, interior + 1)
        out[tuple(where)] = x
        crop = [slice(None)] * x.ndim
        crop[axis] = slice(-min(lo, 0), shape[axis] + min(hi, 0))
        x = out[tuple(crop)]
    return x


def _slice(ins: list[np.ndarray], params: dict[str, Any]) -> np.ndarray:
    strides = params.get("strides") or (1,) * ins[0].ndim
    return ins[0][
        tuple(
            slice(s, e, st)
            for s, e, st in zip(
                params["start_indices"], params["limit_indices"], strides, strict=True
            )
        )
    ]


def _clamped_starts(shape: Sequence[int], starts: Sequence[Any], sizes: Sequence[int]) -> list[int]:
    return [
        min(max(int(s), 0), dim - size) for s, dim, size in zip(starts, shape, sizes, strict=True)
    ]


def _dynamic_slice(ins: list[np.ndarray], params: dict[str, Any]) -> np.ndarray:
    x, sizes = ins[0], params["slice_sizes"]
    starts = _clamped_starts(x.shape, ins[1 : 1 + x.ndim], sizes)
    return np.asarray(x[tuple(slice(s, s + n) for s, n in zip(starts, sizes, strict=True))].copy())


def _dynamic_update_slice(ins: list[np.ndarray], params: dict[str, Any]) -> np.ndarray:
    x, update = ins[0], ins[1]
    starts = _clamped_starts(x.shape, ins[2:], update.shape)
    out = x.copy()
    out[tuple(slice(s, s + n) for s, n in zip(starts, update.shape, strict=True))] = update
    return np.asarray(out)


def _mode(params: dict[str, Any]) -> str:
    mode = params.get("mode")
    return str(getattr(mode, "name", mode))


def _fill_value(dtype: np.dtype[Any], fill: Any) -> Any:
    if fill is not None:
        return fill
    if _is_float(dtype):
        return np.nan
    if dtype == np.bool_:
        return True
    info = np.iinfo(dtype)
    return info.min if jnp.issubdtype(dtype, np.signedinteger) else info.max


def _gather(ins: list[np.ndarray], params: dict[str, Any]) -> np.ndarray:
    """XLA's gather, one index vector at a time (the index vector is the last dimension)."""
    operand, indices = ins
    dn = params["dimension_numbers"]
    sizes = tuple(params["slice_sizes"])
    collapsed = set(dn.collapsed_slice_dims) | set(dn.operand_batching_dims)
    window = [d for d in range(operand.ndim) if d not in collapsed]
    batch_shape = indices.shape[:-1]
    out_rank = len(batch_shape) + len(window)
    offset_dims = list(dn.offset_dims)
    batch_positions = [d for d in range(out_rank) if d not in offset_dims]
    out_shape = [0] * out_rank
    for pos, d in zip(batch_positions, range(len(batch_shape)), strict=True):
        out_shape[pos] = batch_shape[d]
    for pos, d in zip(offset_dims, window, strict=True):
        out_shape[pos] = sizes[d]
    out = np.empty(out_shape, operand.dtype)
    fill = _mode(params) == "FILL_OR_DROP"
    fill_value = _fill_value(operand.dtype, params.get("fill_value"))
    for b in np.ndindex(*batch_shape):
        start = [0] * operand.ndim
        for k, d in enumerate(dn.start_index_map):
            start[d] = int(indices[b][k])
        for od, idim in zip(dn.operand_batching_dims, dn.start_indices_batching_dims, strict=True):
            start[od] = b[idim]
        in_bounds = all(0 <= start[d] <= operand.shape[d] - sizes[d] for d in range(operand.ndim))
        start = _clamped_starts(operand.shape, start, sizes)
        piece = operand[tuple(slice(s, s + n) for s, n in zip(start, sizes, strict=True))]
        piece = piece.reshape([sizes[d] for d in window])
        target: list[Any] = [slice(None)] * out_rank
        for pos, d in zip(batch_positions, b, strict=True):
            target[pos] = d
        out[tuple(target)] = fill_value if fill and not in_bounds else piece
    return out


_SCATTER_COMBINE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "scatter-add": np.add,
    "scatter_add": np.add,
    "scatter-mul": np.multiply,
    "scatter_mul": np.multiply,
    "scatter-min": np.minimum,
    "scatter_min": np.minimum,
    "scatter-max": np.maximum,
    "scatter_max": np.maximum,
    "scatter": lambda old, new: new,
}


def _scatter(name: str) -> Rule:
    combine = _SCATTER_COMBINE[name]

    def rule(ins: list[np.ndarray], params: dict[str, Any]) -> np.ndarray:
        """XLA's scatter, one update window at a time (out-of-bounds windows are dropped; CLIP
        clamps them)."""
        operand, indices, updates = ins
        dn = params["dimension_numbers"]
        inserted = set(dn.inserted_window_dims) | set(dn.operand_batching_dims)
        window = [d for d in range(operand.ndim) if d not in inserted]
        update_window = list(dn.update_window_dims)
        scatter_dims = [d for d in range(updates.ndim) if d not in update_window]
        sizes = [1] * operand.ndim
        for d, ud in zip(window, update_window, strict=True):
            sizes[d] = updates.shape[ud]
        clip = _mode(params) == "CLIP"
        out = _up(operand).copy()
        upd = _up(updates)
        for u in np.ndindex(*[updates.shape[d] for d in scatter_dims]):
            start = [0] * operand.ndim
            for k, d in enumerate(dn.scatter_dims_to_operand_dims):
                start[d] = int(indices[u][k])
            for od, idim in zip(
                dn.operand_batching_dims, dn.scatter_indices_batching_dims, strict=True
            ):
                start[od] = u[idim]
            if clip:
                start = _clamped_starts(operand.shape, start, sizes)
            elif not all(0 <= start[d] <= operand.shape[d] - sizes[d] for d in range(operand.ndim)):
                continue
            source: list[Any] = [slice(None)] * updates.ndim
            for pos, d in zip(scatter_dims, u, strict=True):
                source[pos] = d
            piece = upd[tuple(source)]
            dest_shape = [sizes[d] for d in range(operand.ndim)]
            region = tuple(slice(s, s + n) for s, n in zip(start, sizes, strict=True))
            out[region] = combine(out[region], piece.reshape(dest_shape))
        return np.asarray(out)

    return rule


def _iota(ins: list[np.ndarray], params: dict[str, Any]) -> np.ndarray:
    shape, dim = tuple(params["shape"]), int(params["dimension"])
    ramp = np.arange(shape[dim], dtype=params["dtype"])
    expanded = [1] * len(shape)
    expanded[dim] = shape[dim]
    return np.asarray(np.broadcast_to(ramp.reshape(expanded), shape).copy())


def _split(ins: list[np.ndarray], params: dict[str, Any]) -> list[np.ndarray]:
    cuts = np.cumsum(params["sizes"])[:-1]
    return list(np.split(ins[0], cuts, axis=int(params["axis"])))


def _reduce_precision(ins: list[np.ndarray], params: dict[str, Any]) -> np.ndarray:
    formats = {(5, 10): np.float16, (8, 7): ml_dtypes.bfloat16, (8, 23): np.float32}
    target = formats.get((int(params["exponent_bits"]), int(params["mantissa_bits"])))
    if target is None:
        raise NotImplementedError(f"reduce_precision to {params}")
    return ins[0].astype(target).astype(ins[0].dtype)


def _identity(ins: list[np.ndarray], params: dict[str, Any]) -> np.ndarray:
    return ins[0]


def _identities(ins: list[np.ndarray], params: dict[str, Any]) -> list[np.ndarray]:
    return list(ins)


_RULES: dict[str, Rule] = {
    # arithmetic
    "add": _elementwise(np.add),
    "add_any": _elementwise(np.add),
    "sub": _elementwise(np.subtract),
    "mul": _elementwise(np.multiply),
    "div": _elementwise(_int_div),
    "rem": _elementwise(np.fmod),
    "neg": _elementwise(np.negative),
    "max": _elementwise(np.maximum),
    "min": _elementwise(np.minimum),
    "pow": _elementwise(np.power),
    "integer_pow": _integer_pow,
    "square": _elementwise(lambda x: x * x),
    "sqrt": _elementwise(np.sqrt),
    "rsqrt": _elementwise(lambda x: 1 / np.sqrt(x)),
    "cbrt": _elementwise(np.cbrt),
    "exp": _elementwise(np.exp),
    "exp2": _elementwise(np.exp2),
    "expm1": _elementwise(np.expm1),
    "log": _elementwise(np.log),
    "log1p": _elementwise(np.log1p),
    "tanh": _elementwise(np.tanh),
    "logistic": _elementwise(lambda x: 1 / (1 + np.exp(-x))),
    "sin": _elementwise(np.sin),
    "cos": _elementwise(np.cos),
    "atan2": _elementwise(np.arctan2),
    "abs": _elementwise(np.abs),
    "sign": _elementwise(np.sign),
    "floor": _elementwise(np.floor),
    "ceil": _elementwise(np.ceil),
    "round": _round,
    "is_finite": _elementwise(np.isfinite),
    "erf": _elementwise(_erf),
    "nextafter": _elementwise(np.nextafter),
    "clamp": _elementwise(lambda lo, x, hi: np.minimum(np.maximum(x, lo), hi)),
    "select_n": _select_n,
    # comparisons and logic
    "eq": _elementwise(np.equal),
    "ne": _elementwise(np.not_equal),
    "lt": _elementwise(np.less),
    "le": _elementwise(np.less_equal),
    "gt": _elementwise(np.greater),
    "ge": _elementwise(np.greater_equal),
    "and": _elementwise(np.bitwise_and),
    "or": _elementwise(np.bitwise_or),
    "xor": _elementwise(np.bitwise_xor),
    "not": _elementwise(lambda x: np.logical_not(x) if x.dtype == np.bool_ else np.invert(x)),
    # contractions and reductions
    "dot_general": _dot_general,
    "reduce_sum": _reduce(np.sum),
    "reduce_max": _reduce(np.max),
    "reduce_min": _reduce(np.min),
    "reduce_prod": _reduce(np.prod),
    "reduce_and": _reduce(np.all),
    "reduce_or": _reduce(np.any),
    "argmax": _arg(np.argmax),
    "argmin": _arg(np.argmin),
    "cumsum": _cumulative(np.cumsum),
    "cumprod": _cumulative(np.cumprod),
    "cummax": _cumulative(np.maximum.accumulate),
    "cummin": _cumulative(np.minimum.accumulate),
    # shapes, indexing, types
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": lambda ins, p: ins[0].reshape(p["new_sizes"]),
    "squeeze": lambda ins, p: np.squeeze(ins[0], axis=tuple(p["dimensions"])),
    "expand_dims": lambda ins, p: np.expand_dims(ins[0], tuple(p["dimensions"])),
    "transpose": lambda ins, p: np.transpose(ins[0], p["permutation"]).copy(),
    "rev": lambda ins, p: np.flip(ins[0], tuple(p["dimensions"])).copy(),
    "concatenate": lambda ins, p: np.concatenate(ins, axis=int(p["dimension"])),
    "pad": _pad,
    "slice": _slice,
    "dynamic_slice": _dynamic_slice,
    "dynamic_update_slice": _dynamic_update_slice,
    "gather": _gather,
    **{name: _scatter(name) for name in _SCATTER_COMBINE},
    "iota": _iota,
    "split": _split,
    "convert_element_type": lambda ins, p: _to_dtype(ins[0], p["new_dtype"]),
    "reduce_precision": _reduce_precision,
    "stop_gradient": _identity,
    "copy": _identity,
    "copy_p": _identity,
    "sharding_constraint": _identity,
    "optimization_barrier": _identities,
    "device_put": _identities,
}
