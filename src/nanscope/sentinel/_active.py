"""The active sentinel of the process (``nanscope run --sentinel``); imports no framework."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nanscope.sentinel._torch import Sentinel

_active: Sentinel | None = None


def start(logdir: str | os.PathLike[str], **options: Any) -> Sentinel:
    """Start the process's sentinel (options as :class:`Sentinel`'s) and return it.

    Without ``optimizer``, each ``optimizer.step()`` of any optimizer is checked
    (``torch.optim``'s global step hooks) and ends a step, so that a loop with no
    code change is still watched: the history is kept and a trip stops (or skips)
    the step, but is not replayed unless the step runs through :func:`step`.
    Raises ``RuntimeError`` when a sentinel is active already.
    """
    global _active
    if _active is not None:
        raise RuntimeError(
            f"a sentinel is active already (logging to {_active.logdir}); "
            "call nanscope.sentinel.stop() first"
        )
    from nanscope.sentinel._torch import Sentinel

    sentinel = Sentinel(logdir, **options)
    sentinel._implicit = True
    _active = sentinel
    return sentinel


def stop(error: str | None = None) -> None:
    """Stop the active sentinel (writes its history's end); does nothing without one.

    ``error``: the exception ending the program, in words, when one is.
    """
    global _active
    sentinel, _active = _active, None
    if sentinel is not None:
        sentinel.close(error)


def step(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` as one checked step of the active sentinel (its
    :meth:`Sentinel.step`); without one, just the call: a script marked this way runs
    unchanged under plain ``python``."""
    if _active is None:
        return fn(*args, **kwargs)
    return _active.step(fn, *args, **kwargs)


def active() -> Sentinel | None:
    """The active sentinel, or ``None``."""
    return _active
