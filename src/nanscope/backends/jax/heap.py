"""glibc's heap while JAX programs run instrumented on the CPU: freed memory kept, not re-faulted.

XLA:CPU allocates a run's temporary buffers and results with ``malloc`` at every
call and frees them after it. An instrumented program often needs a temporary
buffer that the plain one does not (a guard that XLA would have fused must exist
to be counted: on the seed's MLP, one 784x500 value). Freeing it can leave more
free memory at the top of glibc's heap than its trim threshold, and glibc then
gives those pages back to the kernel; the next call takes them again, one page
fault each (about 1,500 a call on the MLP, more time than the step itself).
Which calls trim depends on the heap's history, so the cost comes and goes from
one process to the next.

While recording or checking, nanscope asks glibc to keep up to :data:`TOP_PAD`
bytes of free memory at the top of each heap (``mallopt(M_TOP_PAD)``): a call
reuses the pages the previous one freed. The process's resident memory may stay
up to that much higher than it would; its peak does not grow (kept pages were
touched before). Switching off sets the documented default back.

Left alone: anything but glibc, a process whose ``MALLOC_TOP_PAD_`` (or the
``glibc.malloc.top_pad`` tunable) says how it wants it, and
``NANSCOPE_JAX_HEAP=0``.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

M_TOP_PAD = -2  # <malloc.h>
TOP_PAD = 64 << 20
DEFAULT_TOP_PAD = 128 << 10  # glibc's default (mallopt(3))

_lock = threading.Lock()
_users = 0
_set: ctypes._CFuncPtr | None = None  # type: ignore[name-defined]  # mallopt, while kept


def _mallopt() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    if os.environ.get("NANSCOPE_JAX_HEAP", "1") == "0":
        return None
    if "MALLOC_TOP_PAD_" in os.environ or "top_pad" in os.environ.get("GLIBC_TUNABLES", ""):
        return None  # the user's own setting stands
    try:
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None


def keep() -> bool:
    """Keep freed memory at the top of glibc's heaps (counted: one per ``release``).
    Returns whether the setting is nanscope's now."""
    global _users, _set
    with _lock:
        if _users == 0:
            _set = _mallopt()
            if _set is None:
                return False
            _set(M_TOP_PAD, TOP_PAD)
        _users += 1
    return True


def release() -> None:
    """Undo one :func:`keep` (nothing when none is in force); the last sets glibc's
    default back."""
    global _users, _set
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0 and _set is not None:
            _set(M_TOP_PAD, DEFAULT_TOP_PAD)
            _set = None
