"""The one switch that stops PyTorch recording on a thread for a while.

Every reason not to record ops goes through :data:`SUSPENDED`, a per-thread
depth that both recorders read:

- a compiled graph runs (its extern kernels belong to one graph execution)
  or ``torch.compile`` compiles (fake tensors, not the user's computation);
- nanscope runs PyTorch ops of its own on the user's thread (copying device
  summaries to the host);
- a thread is nanscope's own (the writer's, the native recorder's drain
  thread): suspended for good;
- tests prepare values behind the recorder's back (:func:`not_recorded`).

The Python recorder reads the depth at each op. The native recorder's C++
half keeps a per-thread copy, set on the same thread whenever the depth
changes while its extension is loaded (for nanscope's own threads, its
cheaper per-thread exclusion instead).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from nanscope.backends.torch import native


class Suspension(threading.local):
    """Per thread: ``depth > 0`` while nothing is recorded on it."""

    def __init__(self) -> None:
        self.depth = 0  # read by the Python recorder at every op: a plain attribute
        # Compilations that suspended this thread (see compile_started).
        self._compiles = 0

    def enter(self) -> None:
        """Stop recording on this thread until the matching :meth:`leave`."""
        self._set(self.depth + 1)

    def leave(self) -> None:
        self._set(max(0, self.depth - 1))

    def _set(self, depth: int) -> None:
        self.depth = depth
        lib = native.loaded()
        if lib is not None:
            lib.set_suspended(depth)
            lib.check_suspend(depth)  # the native check_numerics passes ops on too

    def compile_started(self, *args: Any, **kwargs: Any) -> None:
        """Dynamo's compile-start callback: its tracing is not the user's computation."""
        self._compiles += 1
        self.enter()

    def compile_ended(self, *args: Any, **kwargs: Any) -> None:
        """Dynamo's compile-end callback.

        Only ends what :meth:`compile_started` began on this thread: the
        callbacks may be registered while a compilation is under way.
        """
        if self._compiles > 0:
            self._compiles -= 1
            self.leave()


SUSPENDED = Suspension()


@contextlib.contextmanager
def not_recorded() -> Iterator[None]:
    """Ops run on this thread inside the block are not recorded (by either recorder).

    For nanscope's own work on the user's thread, and for tests that prepare
    values behind the recorder's back.
    """
    SUSPENDED.enter()
    try:
        yield
    finally:
        SUSPENDED.leave()


def never_record_this_thread() -> None:
    """Mark the calling thread as nanscope's own: nothing it runs is ever recorded."""
    SUSPENDED.depth += 1
    lib = native.loaded()
    if lib is not None:
        # Not even looked at: the C++ half's callbacks return at once on this thread.
        lib.exclude_this_thread()
        lib.check_suspend(SUSPENDED.depth)
