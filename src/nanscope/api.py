"""The Python entry points: turn dumping or numerics checking on and off."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from nanscope.backends import Checking, DumpSettings, Session, backend, detect
from nanscope.format.modes import TensorDebugMode, parse_mode


class DebugSession:
    """The handle returned by :func:`enable_dump_debug_info`; also a context manager."""

    def __init__(self, settings: DumpSettings, session: Session) -> None:
        self._settings = settings
        self._session = session

    @property
    def logdir(self) -> str:
        return self._settings.logdir

    @property
    def framework(self) -> str:
        return self._settings.framework

    @property
    def writer(self) -> Any:
        """The :class:`nanscope.DumpWriter` (PyTorch), or ``None`` where the framework writes."""
        return getattr(self._session, "writer", None)

    def flush(self) -> None:
        """Write everything recorded so far to the dump."""
        self._session.flush()

    def set_step(self, step: int) -> None:
        """Call the current training step ``step`` (steps after it count on from there).

        nanscope counts steps by itself (each optimizer step ends one); a trainer with a
        global step of its own, resumed from a checkpoint say, sets it so that the dump's
        steps are the trainer's. Frameworks whose steps nanscope does not count ignore it.
        """
        context = getattr(self._session, "context", None)
        if context is not None:
            context.set_step(int(step))

    def close(self) -> None:
        """Stop recording and flush (same as :func:`disable_dump_debug_info`); never raises.

        What could not be written (a full disk, ...) is reported on stderr and in
        the dump, not raised: the training program's exit status stays its own.
        """
        global _active
        with _lock:
            if _active is self:
                _active = None
        try:
            self._session.close()
        except Exception as exc:
            print(f"nanscope: could not finish the dump in {self.logdir}: {exc}", file=sys.stderr)

    def __enter__(self) -> DebugSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_active: DebugSession | None = None
_lock = threading.Lock()


def enable_dump_debug_info(
    logdir: str | os.PathLike[str],
    tensor_debug_mode: TensorDebugMode | str | int = "FULL_HEALTH",
    circular_buffer_size: int = 1000,
    op_regex: str | None = None,
    tensor_dtypes: Any = None,
    *,
    framework: str = "auto",
    statistics: bool = False,
    **options: Any,
) -> DebugSession:
    """Record every op of the program into a tfdbg2 dump at ``logdir``.

    **Arguments** (as in TensorFlow's function of the same name, except the default mode):

    - ``tensor_debug_mode``: ``NO_TENSOR``, ``CURT_HEALTH``, ``CONCISE_HEALTH``,
      ``FULL_HEALTH`` (default), ``SHAPE`` or ``FULL_TENSOR``: a name, a number or
      a :class:`~nanscope.TensorDebugMode`.
    - ``circular_buffer_size``: keep the last N events (and always the first
      Inf/NaN with the events around it); ``-1`` keeps everything.
    - ``op_regex``: only ops whose type matches (``re.match``) get summaries,
      e.g. ``"aten\\.(log|exp)"``; every op is still recorded.
    - ``tensor_dtypes``: a list of dtypes (or names), or a predicate on a dtype.
    - ``framework``: ``"auto"`` (the framework the program imported), ``"torch"``,
      ``"jax"`` or ``"tensorflow"`` (TensorFlow's own dumping, into the same logdir).
    - ``statistics``: with ``FULL_HEALTH``, also record each float output's mean,
      standard deviation and L2 norm (of its finite elements) and a hash of its bits:
      what ``nanscope diff`` compares (``Execution.output_statistics``). PyTorch only.
    - ``options``: passed to :class:`nanscope.DumpWriter` (``flush_interval``,
      ``origin_window``, ``source_snapshots``, ...).

    **Returns** a :class:`DebugSession`, usable as a context manager. Calling
    again with the same settings returns the same session; with other settings
    it is an error. PyTorch: call it, and :func:`disable_dump_debug_info`, on
    the thread that runs the training loop.
    """
    global _active
    settings = DumpSettings(
        logdir=os.fspath(logdir),
        mode=parse_mode(tensor_debug_mode),  # the one parse; the enum goes on from here
        circular_buffer_size=int(circular_buffer_size),
        op_regex=op_regex,
        tensor_dtypes=tensor_dtypes,
        framework=detect(framework),
        statistics=bool(statistics),
    )
    if settings.statistics:
        _check_statistics(settings)
    with _lock:
        if _active is not None:
            if _active._settings == settings:
                return _active
            raise ValueError(
                f"nanscope is already dumping to {_active.logdir} with other settings; "
                "call nanscope.disable_dump_debug_info() first"
            )
        session = backend(settings.framework).start_dump(settings, options)
        _active = DebugSession(settings, session)
        return _active


# The frameworks whose recorders compute statistics (nanscope.format.statistics).
STATISTICS_FRAMEWORKS = ("torch",)


def _check_statistics(settings: DumpSettings) -> None:
    """``statistics=True`` is a FULL_HEALTH option of the frameworks that compute them."""
    if settings.mode != TensorDebugMode.FULL_HEALTH:
        raise ValueError(
            f"statistics=True needs tensor_debug_mode='FULL_HEALTH' (got {settings.mode.name}); "
            "the statistics are recorded beside FULL_HEALTH's counts"
        )
    if settings.framework not in STATISTICS_FRAMEWORKS:
        raise ValueError(
            f"statistics=True is not supported for {settings.framework} yet; "
            f"it is for: {', '.join(STATISTICS_FRAMEWORKS)}"
        )


def disable_dump_debug_info() -> None:
    """Stop recording and flush the dump; does nothing when nothing is recording."""
    session = _active
    if session is not None:
        session.close()


_checking: Checking | None = None


def enable_check_numerics(*, framework: str = "auto", sync_every: int = 64) -> None:
    """Raise at the first NaN or harmful Inf; keeps no history.

    PyTorch: raises :class:`nanscope.NonFiniteError` at the first NaN, or when an
    Inf reaches the loss, a gradient, a parameter or optimizer state, or is unread
    when checking ends (so at :func:`disable_check_numerics`); intended masks that
    softmax absorbs and overflow that ``torch.amp.GradScaler`` handles run on
    (docs/CHECK_NUMERICS.md). The error names the op, its module path, the counts,
    the inputs and the user's source line (for a backward op, also the forward op
    and line that created it), and where the Inf/NaN were born. On accelerators
    checks are looked at every ``sync_every`` ops. JAX: each run of a compiled
    program (a jitted function, an eager op) counts Inf/NaN inside the program and
    raises after it, at a NaN anywhere or an Inf that a training step returns
    (docs/JAX.md). TensorFlow: an op callback checks what ops write into variables and
    the forward values that the backward pass reads, so Keras' loss scaling and
    absorbed masks run on (docs/CHECK_NUMERICS.md, "TensorFlow"). Idempotent.
    """
    global _checking
    with _lock:
        if _checking is not None:
            return
        _checking = backend(framework).start_checking(sync_every)


def disable_check_numerics() -> None:
    """Turn :func:`enable_check_numerics` off.

    PyTorch: raises :class:`nanscope.NonFiniteError` (after turning checking off)
    when Inf/NaN were written that no op has read since: checking ends here. Not
    while an exception is on its way out (called in a ``finally`` block).
    """
    global _checking
    with _lock:
        session, _checking = _checking, None
    if session is not None:
        session.close()
