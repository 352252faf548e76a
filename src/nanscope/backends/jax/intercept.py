"""Where nanscope meets JAX: each run of a compiled program, jitted or eager.

JAX compiles what it runs: a jitted function, and eagerly each primitive (a
``jit`` of its own). The first call of either goes through
``jax._src.pjit._pjit_call_impl_python``, which returns the compiled
executable that later calls reuse from C++ without Python. While a handler is
installed, that function is replaced: the handler runs an instrumented
program instead and returns no executable, so that every later call comes
back through Python, and to the handler. Installing clears JAX's caches
(functions jitted and called before recording began are caught too);
uninstalling clears them again, so that the uninstrumented executables
return. On the CPU, glibc keeps the memory a run frees while a handler is
installed (:mod:`.heap`).

One handler at a time (dumping or checking). A handler's own use of JAX
(tracing the instrumented program) runs uninstrumented.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from nanscope.backends.jax import heap


class Handler(Protocol):
    def call(
        self, original: Callable[..., Any], args: Sequence[Any], params: dict[str, Any]
    ) -> Any:
        """Run one program (``params["jaxpr"]``) on ``args``; returns what ``original`` does."""
        ...


_lock = threading.Lock()
_handler: Handler | None = None
_original: Callable[..., Any] | None = None
_inside = threading.local()


def _call_impl(*args: Any, **params: Any) -> Any:
    handler = _handler
    original = _original
    assert original is not None
    if handler is None or getattr(_inside, "active", False):
        return original(*args, **params)
    _inside.active = True
    try:
        return handler.call(original, args, params)
    finally:
        _inside.active = False


class uninstrumented:
    """A context in which this thread's JAX calls run as they would without nanscope."""

    def __enter__(self) -> None:
        self._was = getattr(_inside, "active", False)
        _inside.active = True

    def __exit__(self, *exc: object) -> None:
        _inside.active = self._was


def install(handler: Handler) -> None:
    """Send every compiled program's runs to ``handler``."""
    global _handler, _original
    import jax
    from jax._src import pjit

    with _lock:
        if _handler is not None:
            raise RuntimeError(
                "nanscope is already recording or checking this JAX program; "
                "turn that off first (nanscope.disable_dump_debug_info() or "
                "nanscope.disable_check_numerics())"
            )
        if _original is None:
            _original = pjit._pjit_call_impl_python
            pjit._pjit_call_impl_python = _call_impl
        _handler = handler
        if jax.default_backend() == "cpu":
            heap.keep()
    jax.clear_caches()  # executables compiled before: their next call comes through here


def uninstall(handler: Handler) -> None:
    """Stop sending runs to ``handler`` (if it is the one installed)."""
    global _handler
    import jax

    with _lock:
        if _handler is not handler:
            return
        _handler = None
        heap.release()  # nothing when install did not keep it
    jax.clear_caches()  # the plain executables come back on the next call
