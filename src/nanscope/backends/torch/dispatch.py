"""Installing a dispatch mode on the calling thread and on the threads started later."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode, _push_mode


def follow_new_threads(mode: TorchDispatchMode) -> Callable[[], None]:
    """Push ``mode`` in every thread started from now on; returns the undo.

    Dispatch modes are per thread. A thread started by the ``threading``
    module runs its profile hook first: that is where the mode is pushed, so a
    training loop or a ``backward()`` call on a new thread is recorded too.
    """
    previous = threading.getprofile()

    def start(frame: Any, event: Any, arg: Any) -> None:
        sys.setprofile(previous)  # once per thread; give any profiler back its hook
        with contextlib.suppress(Exception):
            _push_mode(mode)
        if previous is not None:
            previous(frame, event, arg)

    threading.setprofile(start)

    def undo() -> None:
        if threading.getprofile() is start:
            threading.setprofile(previous)

    return undo


class InstalledMode:
    """A dispatch mode, on this thread and on threads started later, until :meth:`remove`."""

    def __init__(self, mode: TorchDispatchMode) -> None:
        self.mode = mode
        mode.__enter__()
        self._unfollow = follow_new_threads(mode)

    def remove(self) -> None:
        self._unfollow()
        # Fails when popped on another thread, or already popped by the user.
        with contextlib.suppress(Exception):
            self.mode.__exit__(None, None, None)
