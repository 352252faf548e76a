"""Running PyTorch code that nanscope does not record."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def not_recorded() -> Iterator[None]:
    """Ops run on this thread inside the block are not recorded (by either recorder).

    For nanscope's own work on the user's thread, and for tests that prepare
    values behind the recorder's back.
    """
    from torch.utils._python_dispatch import _disable_current_modes

    from nanscope.backends.torch import native

    lib = native.loaded()
    if lib is not None:
        lib.pause()
    try:
        with _disable_current_modes():
            yield
    finally:
        if lib is not None:
            lib.resume()
