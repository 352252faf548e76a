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

While a handler is installed, the equations of a ``custom_vjp`` backward rule
keep the rule's own source lines (:func:`_own_lines`): JAX traces the rule
while it transposes, under the traceback of the forward call, so its
equations would all carry the line that called the custom function.

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
_transpose: Callable[..., Any] | None = None  # JAX's transpose rule of custom_lin
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
        _own_lines(True)
        if jax.default_backend() == "cpu":
            heap.keep()
    jax.clear_caches()  # executables (and jaxprs) made before: their next call comes here


def uninstall(handler: Handler) -> None:
    """Stop sending runs to ``handler`` (if it is the one installed)."""
    global _handler
    import jax

    with _lock:
        if _handler is not handler:
            return
        _handler = None
        _own_lines(False)
        heap.release()  # nothing when install did not keep it
    jax.clear_caches()  # the plain executables come back on the next call


def _own_lines(on: bool) -> None:
    """Give a ``custom_vjp`` backward rule's equations the rule's own lines (``on``), or
    JAX's attribution back.

    JAX transposes each equation of a gradient under the source info of the forward
    equation (``ad.backward_pass``), so the equations that the backward rule's Python
    code makes while it is traced all get the traceback of the line that called the
    custom function: the bug in the rule would be reported at that call. The rule is
    traced instead with the current traceback (the name stack, ``transpose`` included,
    stays): its innermost user frame is the rule's line. Only source info changes.
    """
    global _transpose
    try:
        from jax._src import source_info_util
        from jax._src.interpreters import ad
    except ImportError:  # another JAX: its own attribution
        return
    rules = ad.primitive_transposes
    prim = getattr(ad, "custom_lin_p", None)
    if prim is None:
        return
    if not hasattr(source_info_util, "_source_info_context"):
        return
    if not on:
        if _transpose is not None and rules.get(prim) is _rule:
            rules[prim] = _transpose
        return
    if prim not in rules or rules[prim] is _rule:
        return
    if not _transpose:  # this file's frame (_rule) is plumbing, never the user's line
        source_info_util.register_exclusion(__file__)
    _transpose = rules[prim]  # kept: a trace under way when recording stops still needs it
    rules[prim] = _rule


def _rule(*args: Any, **params: Any) -> Any:
    from jax._src import source_info_util

    original = _transpose
    if original is None:  # not reached: _rule is installed only after it is set
        raise RuntimeError("nanscope: custom_lin transpose rule missing")
    ctx = source_info_util._source_info_context
    previous = ctx.context
    # No traceback in the context: JAX takes the live one for each new equation.
    ctx.context = source_info_util.SourceInfo(None, previous.name_stack)
    try:
        return original(*args, **params)
    finally:
        ctx.context = previous
