"""The sentinel for JAX: a jitted training step checked once per step, and the bad step
replayed with everything recorded (docs/SENTINEL.md, "JAX").

JAX is functional: a step's arguments (parameters, optimizer state, batch, PRNG key)
are the whole state it starts from, and JAX arrays never change. So
:meth:`JaxSentinel.step` keeps references to them while the step runs (no copy), and
when the step's outputs hold Inf/NaN it calls the step again on the same arguments
while nanscope records every value (FULL_HEALTH), into ``<logdir>/replay-step-<N>``.

This module imports no framework; JAX is imported when a sentinel is made.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nanscope.sentinel._errors import SentinelTripped, error_words
from nanscope.sentinel._history import Cause, Header, HistoryWriter, StepRecord, Trip
from nanscope.sentinel._replay import NOT_REPRODUCED, analyse_replay, replay_dir_name

if TYPE_CHECKING:
    from nanscope.sentinel._jax_checks import Figures, Layout

ACTIONS = ("stop", "skip")
# Replays after this many trips (``on_nan="skip"``) are not made: each compiles the step
# twice more (instrumented, then plain again) and writes a dump.
MAX_REPLAYS = 8


class JaxSentinel:
    """Checks each call of a (jitted) JAX training step, and replays a bad one recorded.

    ::

        sentinel = JaxSentinel("/tmp/sentinel", on_nan="stop")
        for batch in batches:
            params, opt_state, loss = sentinel.step(train_step, params, opt_state, batch)
        sentinel.close()

    **Arguments**

    - ``logdir``: where the history (``sentinel.jsonl``) and the replays go.
    - ``on_nan``: ``"stop"`` raises :class:`SentinelTripped` at the first step whose
      outputs hold Inf/NaN; ``"skip"`` drops that step and goes on: :meth:`step` returns
      the step's outputs with its new state (each output that has the structure of an
      argument: parameters, optimizer state, a ``TrainState``) replaced by the state it
      was given, so that ``params, opt_state, loss = sentinel.step(...)`` carries on
      from before the bad step (the loss returned is the bad one, for logging).
    - ``replay``: replay a bad step recorded (``False``: record the trip only).
    - ``run_id``: the history's run id (default: a fresh one).
    - ``flush_every``: write the history every this many steps (and at each trip).
    - ``detail_every``: measure the largest ``|x|`` figures every this many steps (and
      at each step that holds Inf/NaN); the other steps record the loss and the norms.
    - ``loss``: a function of the step's outputs that returns the loss, where the
      outputs do not name it (see below).

    **What is checked.** The step's outputs: the loss (a floating scalar named ``loss``,
    or the tuple's lone floating scalar, or ``loss=``), the gradients (named ``grads``
    or ``gradients``), the new parameters (named ``params``, or the output with the
    structure of an argument) and optimizer state (named ``opt_state``, or any optax
    state). One jitted reduction measures them, and one copy to the host per step
    reads the figures the history keeps: the loss, the L2 norms of the gradients and
    the parameters (a sum keeps every Inf and NaN: the check), and every
    ``detail_every`` steps the largest ``|x|`` of the gradients, the parameters, the
    optimizer state and each top-level parameter subtree (``module_amax``, the
    header's ``modules``). Other outputs are not checked: an intended ``-inf`` (a
    mask) there, or inside the step, trips nothing.

    **Donated arguments** (``jax.jit(..., donate_argnums=...)``) are freed by the step,
    so a donating step cannot be replayed or skipped: :meth:`step` raises ``ValueError``
    at its first call, unless ``replay=False`` and ``on_nan="stop"``.
    """

    def __init__(
        self,
        logdir: str | os.PathLike[str],
        *,
        on_nan: str = "stop",
        replay: bool = True,
        run_id: str | None = None,
        flush_every: int = 50,
        detail_every: int = 50,
        loss: Callable[[Any], Any] | None = None,
        fuse: bool = True,
    ) -> None:
        if on_nan not in ACTIONS:
            raise ValueError(f"on_nan must be 'stop' or 'skip', not {on_nan!r}")
        if int(detail_every) < 1:
            raise ValueError(f"detail_every must be 1 or more, not {detail_every}")
        if loss is not None and not callable(loss):
            raise ValueError(
                "loss must be a function of the step's outputs that returns the loss "
                f"(e.g. loss=lambda out: out[1]['loss']), not {type(loss).__name__}"
            )
        import jax  # noqa: F401  (the sentinel is JAX's: fail here, not at the first step)

        self.logdir = Path(logdir)
        self.on_nan = on_nan
        self.replay = bool(replay)
        self.run_id = run_id or uuid.uuid4().hex[:8]
        self.flush_every = int(flush_every)
        self.detail_every = int(detail_every)
        self._loss = loss
        self._next = 0
        self._writer: HistoryWriter | None = None
        self._modules: tuple[str, ...] = ()
        self._layouts: dict[Any, Layout] = {}
        self._closed = False
        self._replays = 0
        self.trips: list[Trip] = []
        self._fuse = bool(fuse)
        # id(step function) -> (it, its version that also computes the norms, whether
        # that has run), or None where it has none (not a plain jax.jit function).
        self._fused: dict[int, tuple[Callable[..., Any], Callable[..., Any], bool] | None] = {}

    # -- the step ----------------------------------------------------------------------------

    @property
    def next_step(self) -> int:
        """The number the next call of :meth:`step` gets (0 first)."""
        return self._next

    def set_step(self, step: int) -> None:
        """Number the next step ``step`` (a run resumed from a checkpoint)."""
        self._next = int(step)

    def step(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)``, check its outputs, and return them.

        At Inf/NaN: records the trip (and the replay), then raises
        :class:`SentinelTripped` (``on_nan="stop"``) or returns the outputs with the
        state rolled back to ``args`` (``on_nan="skip"``).
        """
        if self._closed:
            raise RuntimeError(
                "this JaxSentinel is closed (it stopped at a trip, or close() was called); "
                "make a new one to go on"
            )
        import jax

        number = self._next
        first = id(fn) not in self._fused
        if first:
            self._refuse_donation(fn, _donated(fn))
            self._fused[id(fn)] = self._checked_version(fn, args, kwargs)
        fused = self._fused[id(fn)]
        norms: Any = None
        if fused is not None and fused[0] is fn:
            try:
                outputs, norms = fused[1](*args, **kwargs)
            except Exception:
                if fused[2]:
                    raise  # it ran before: the step's own error
                # It cannot run inside another jit: the step alone from now on.
                self._fused[id(fn)] = None
                outputs = fn(*args, **kwargs)
            else:
                if not fused[2]:
                    self._fused[id(fn)] = (fused[0], fused[1], True)
        else:
            outputs = fn(*args, **kwargs)
        if first and any(
            getattr(x, "is_deleted", lambda: False)()
            for x in jax.tree_util.tree_leaves((args, kwargs))
        ):
            self._refuse_donation(fn, "some")
        leaves, treedef = jax.tree_util.tree_flatten(outputs)
        layout = self._layouts.get(treedef)
        if layout is None:
            layout = self._layout(treedef, fn, outputs, args, kwargs)
        detail = number % self.detail_every == 0
        figures = layout.measure(leaves, self._selected(outputs), amax=detail, norms=norms)
        assert self._writer is not None
        self._writer.step(
            StepRecord(
                step=number,
                time=time.time(),
                loss=figures.loss,
                grad_norm=figures.grad_norm,
                grad_amax=figures.grad_amax,
                param_amax=figures.param_amax,
                state_amax=figures.state_amax,
                param_norm=figures.param_norm,
                module_amax=self._module_figures(layout, figures),
                bad=figures.bad,
            )
        )
        self._next = number + 1
        if not figures.bad:
            return outputs
        return self._trip(number, figures, layout, fn, outputs, args, kwargs)

    def _checked_version(
        self, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[Callable[..., Any], Callable[..., Any], bool] | None:
        """``fn`` with the norms computed inside it (see :func:`_fused`), from the
        structure of its outputs, which tracing it tells without running it; None where
        it has none."""
        import jax

        if not self._fuse or not _fusable(fn):
            return None
        try:
            abstract = jax.eval_shape(fn, *args, **kwargs)
        except Exception:  # the step's own error, raised when it runs
            return None
        treedef = jax.tree_util.tree_structure(abstract)
        layout = self._layouts.get(treedef) or self._layout(treedef, fn, abstract, args, kwargs)
        return fn, _fused(fn, layout, treedef, self._loss), False

    def _selected(self, outputs: Any) -> Any:
        return None if self._loss is None else self._loss(outputs)

    def _refuse_donation(self, fn: Callable[..., Any], donated: str | None) -> None:
        if donated is None or (not self.replay and self.on_nan == "stop"):
            return
        raise ValueError(
            f"{_name(fn)} donates {donated} of its arguments (jax.jit donate_argnums/"
            "donate_argnames): the step frees their buffers, so the sentinel cannot replay "
            "it or skip it from them. Jit the step without donation, or use "
            "JaxSentinel(..., replay=False, on_nan='stop')"
        )

    def _layout(
        self,
        treedef: Any,
        fn: Callable[..., Any],
        outputs: Any,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
    ) -> Layout:
        from nanscope.sentinel._jax_checks import OPTIMIZER_STATE, PARAMETERS, layout_of

        layout = layout_of(outputs, args, kwargs, selected_loss=self._loss is not None)
        if not layout.checks_anything:
            raise ValueError(
                f"JaxSentinel found nothing to check in what {_name(fn)} returns "
                f"({type(outputs).__name__}): name the outputs (a dict with 'loss', 'params', "
                "'opt_state', 'grads'), return (params, opt_state, loss), or pass "
                "loss=lambda outputs: ..."
            )
        has_state = any(layout.groups[g] for g in (PARAMETERS, OPTIMIZER_STATE))
        if self.on_nan == "skip" and has_state and not layout.state_items:
            raise ValueError(
                f"on_nan='skip' goes on from the state a bad step began with, but none of "
                f"what {_name(fn)} returns has the structure of one of its arguments: return "
                "the new parameters and optimizer state as they came in (the same pytrees), "
                "or use on_nan='stop'"
            )
        if self._writer is None:
            self._modules = layout.modules
            self._writer = HistoryWriter(
                self.logdir,
                Header(
                    run_id=self.run_id,
                    framework="jax",
                    started=time.time(),
                    modules=self._modules,
                    settings={
                        "on_nan": self.on_nan,
                        "replay": self.replay,
                        "flush_every": self.flush_every,
                        "detail_every": self.detail_every,
                        "loss": "selector" if self._loss is not None else "outputs",
                    },
                ),
                flush_every=self.flush_every,
            )
        self._layouts[treedef] = layout
        return layout

    def _module_figures(self, layout: Layout, figures: Figures) -> tuple[float | None, ...]:
        """The step's module figures in the header's order (None: not in this layout;
        none at all on a step that did not measure them)."""
        if not figures.module_amax or layout.modules == self._modules:
            return figures.module_amax
        mine = dict(zip(layout.modules, figures.module_amax, strict=True))
        return tuple(mine.get(m) for m in self._modules)

    # -- a trip ------------------------------------------------------------------------------

    def _trip(
        self,
        number: int,
        figures: Figures,
        layout: Layout,
        fn: Callable[..., Any],
        outputs: Any,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
    ) -> Any:
        replay, reproduced, reason, cause = self._replay(number, layout, fn, args, kwargs)
        trip = Trip(
            step=number,
            where=figures.bad,
            action=self.on_nan,
            replay=replay,
            reproduced=reproduced,
            reason=reason,
            cause=cause,
        )
        assert self._writer is not None
        self._writer.trip(trip)
        self.trips.append(trip)
        if self.on_nan == "stop":
            self.close()
            raise SentinelTripped(trip, self.logdir)
        from nanscope.sentinel._jax_checks import roll_back

        return roll_back(outputs, layout, args, kwargs)

    def _replay(
        self,
        number: int,
        layout: Layout,
        fn: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
    ) -> tuple[str | None, bool | None, str | None, Cause | None]:
        """Run the step again on its arguments, recorded: (replay dir relative to the
        logdir, reproduced, reason, cause)."""
        from nanscope import api

        if not self.replay:
            return None, None, "replay is off: JaxSentinel(replay=False)", None
        if self._replays >= MAX_REPLAYS:
            return None, None, f"not replayed: the first {MAX_REPLAYS} trips were", None
        if api._active is not None:
            return (
                None,
                None,
                f"not replayed: nanscope was already recording a dump ({api._active.logdir})",
                None,
            )
        self._replays += 1
        relative = replay_dir_name(number)
        where = self.logdir / relative
        if where.exists():  # a run before this one, in the same logdir
            shutil.rmtree(where)
        import jax

        again: Any = None
        failed: str | None = None
        session = _record_everything(where)
        try:
            session.set_step(number)
            again = fn(*args, **kwargs)
            jax.block_until_ready(again)
        except Exception as exc:  # the replay's failure is reported, not raised
            failed = f"the replay raised {type(exc).__name__}: {exc}"
        finally:
            session.close()
        try:
            cause, _ = analyse_replay(where)
        except Exception as exc:  # a replay that wrote no readable dump
            cause = None
            failed = failed or f"the replay's dump could not be read: {exc}"
        if failed is not None:
            return relative, None, failed, cause
        # Reproduced: the replay's outputs hold Inf/NaN again (what the sentinel saw).
        leaves, treedef = jax.tree_util.tree_flatten(again)
        bad = self._layouts.get(treedef, layout).measure(leaves, self._selected(again)).bad
        if not bad:
            return relative, False, NOT_REPRODUCED, cause
        return relative, True, None, cause

    # -- the end -----------------------------------------------------------------------------

    def close(self, error: str | None = None) -> None:
        """Write the history's end and close it; a second call does nothing.

        ``error``: the exception ending the program, in words, when one is.
        """
        self._closed = True
        if self._writer is not None:
            self._writer.close(error)

    def __enter__(self) -> JaxSentinel:
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        self.close(error_words(exc))


def _record_everything(where: Path) -> Any:
    """Start recording every value of every call into ``where`` (FULL_HEALTH, nothing
    evicted). The step is known to be bad: its values are counted at once
    (``NANSCOPE_JAX_GUARDS=0``, read when recording starts), not first its guards and
    then, the guards having seen Inf/NaN, every value: one compilation, not two."""
    from nanscope import api

    saved = os.environ.get(_GUARDS)
    os.environ[_GUARDS] = "0"
    try:
        return api.enable_dump_debug_info(where, "FULL_HEALTH", -1, framework="jax")
    finally:
        if saved is None:
            os.environ.pop(_GUARDS, None)
        else:
            os.environ[_GUARDS] = saved


_GUARDS = "NANSCOPE_JAX_GUARDS"


def _fusable(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is a plain ``jax.jit`` function: no static or donated arguments."""
    info = getattr(fn, "_jit_info", None)
    return info is not None and not any(
        getattr(info, name, ())
        for name in ("static_argnums", "static_argnames", "donate_argnums", "donate_argnames")
    )


def _fused(
    fn: Callable[..., Any], layout: Layout, treedef: Any, loss: Callable[[Any], Any] | None
) -> Callable[..., Any]:
    """``fn`` and the sentinel's norms in one jitted program (returns ``(outputs, norms)``,
    ``norms`` None where the outputs' structure is not ``treedef``), for a plain
    ``jax.jit`` function: the reductions then read the outputs where XLA makes them,
    and one program is launched per step, not two. None for any other function (a
    Python function may do things once per call that tracing would do once)."""
    import jax

    def checked(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        outputs = fn(*args, **kwargs)
        leaves, tree = jax.tree_util.tree_flatten(outputs)
        if tree != treedef:
            return outputs, None
        return outputs, layout.norms(leaves, None if loss is None else loss(outputs))

    checked.__name__ = f"{_name(fn)}_sentinel"
    return jax.jit(checked)


def _donated(fn: Callable[..., Any]) -> str | None:
    """Which arguments a ``jax.jit`` function donates (None: none, or not a jit)."""
    info = getattr(fn, "_jit_info", None)
    nums = tuple(getattr(info, "donate_argnums", ()) or ())
    names = tuple(getattr(info, "donate_argnames", ()) or ())
    if not nums and not names:
        return None
    return ", ".join([f"#{n}" for n in nums] + [repr(n) for n in names if n]) or "some"


def _name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__name__", None) or type(fn).__name__)
