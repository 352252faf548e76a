"""nanscope run's bootstrap for the Python processes a recorded program starts.

``nanscope run`` puts this file's directory first on ``PYTHONPATH`` and its settings in
``NANSCOPE_RUN_CHILD`` (JSON), in its own environment, which every child inherits: a
worker of ``torch.multiprocessing.spawn``, of a spawn or forkserver ``multiprocessing``
pool, a ``subprocess`` running Python. Python imports ``sitecustomize`` at startup, so
this runs in each of them before the program's code. It is standalone on purpose:

- without ``NANSCOPE_RUN_CHILD`` it does nothing but hand over to the next
  ``sitecustomize`` on the path (the interpreter's or the environment's own);
- it imports nothing of nanscope until the process imports a framework (PyTorch,
  TensorFlow, JAX): a child that never does, pays nothing;
- in an interpreter where nanscope cannot be imported (another environment), a child that
  imports a framework leaves a ``tfdbg_events.*.nsunrecorded`` note in the dump instead,
  so that the report does not read as an all-clear.

Its directory is taken off ``sys.path`` again: the program sees the path it would see
without nanscope (the environment variables stay, for the program's own children).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from typing import Any

ENV = "NANSCOPE_RUN_CHILD"
WATCHED = ("torch", "tensorflow", "jax")
UNRECORDED_SUFFIX = "nsunrecorded"  # nanscope.format.files.UNRECORDED


def _note_unrecorded(settings: dict[str, Any], framework: str, why: str) -> None:
    """Leave a note in the dump that this process ran unrecorded (standalone: no nanscope)."""
    import json
    import secrets
    import socket
    import time

    try:
        host = "".join(c if c.isalnum() or c in "._-" else "_" for c in socket.gethostname())
        pid = os.getpid()
        name = f"tfdbg_events.{int(time.time())}.{host}-pid{pid}-{secrets.token_hex(3)}"
        os.makedirs(settings["logdir"], exist_ok=True)
        path = os.path.join(settings["logdir"], f"{name}.{UNRECORDED_SUFFIX}")
        note = {
            "pid": pid,
            "host": socket.gethostname(),
            "run_id": settings.get("run_id", ""),
            "executable": sys.executable,
            "argv": list(getattr(sys, "orig_argv", sys.argv)),
            "framework": framework,
            "why": why,
        }
        with open(path, "x", encoding="utf-8") as f:
            json.dump(note, f)
    except Exception as exc:  # never take the program down
        print(f"nanscope: could not note an unrecorded process: {exc}", file=sys.stderr)


class _Watch:
    """A finder first on ``sys.meta_path``: the first import of a framework starts recording."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in WATCHED:
            return None
        self.remove()
        watcher = _start(self.settings, fullname)
        # The finder that start_child put first finds the framework, as it would have.
        return watcher.find_spec(fullname, path, target) if watcher is not None else None

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def _start(settings: dict[str, Any], framework: str) -> Any:
    """nanscope's own start (:func:`nanscope.cli._children.start_child`), or a note that
    this process runs unrecorded where nanscope cannot be imported."""
    try:
        from nanscope.cli._children import start_child
    except Exception as exc:
        if (
            framework not in sys.modules
            and importlib.machinery.PathFinder.find_spec(framework) is None
        ):
            return None  # not installed here either: the import fails, nothing to record
        why = f"nanscope cannot be imported by {sys.executable}: {exc}"
        _note_unrecorded(settings, framework, why)
        print(f"nanscope: this process runs unrecorded: {why}", file=sys.stderr)
        return None
    try:
        return start_child(settings)
    except Exception as exc:  # never take the program down: it runs on, unrecorded
        why = f"recording could not start: {type(exc).__name__}: {exc}"
        _note_unrecorded(settings, framework, why)
        print(f"nanscope: this process runs unrecorded: {why}", file=sys.stderr)
        return None


def _install() -> None:
    raw = os.environ.get(ENV)
    if not raw:
        return
    import json

    try:
        settings = json.loads(raw)
    except ValueError:
        return
    if not isinstance(settings, dict) or "logdir" not in settings:
        return
    settings["pid"] = os.getpid()  # the process this ran in (a fork of it inherits the hooks)
    already = [name for name in WATCHED if name in sys.modules]
    if already:  # imported at startup (by a .pth file): start now
        _start(settings, already[0])
    else:
        sys.meta_path.insert(0, _Watch(settings))


def _chain() -> None:
    """Import the next ``sitecustomize`` on the path, as Python would without this one."""
    here = os.path.dirname(os.path.abspath(__file__))
    me = sys.modules.pop(__name__, None)
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        if importlib.util.find_spec("sitecustomize") is not None:
            import sitecustomize  # type: ignore[import-not-found]  # noqa: F401  (the next one)
        elif me is not None:
            sys.modules[__name__] = me
    except Exception as exc:  # as site.py does for a failing sitecustomize
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{exc}", file=sys.stderr)
    finally:
        sys.path[:] = [p for p in saved if os.path.abspath(p or os.curdir) != here]


try:
    _install()
except Exception as _exc:  # never take the program down
    print(f"nanscope: recording of this process is off: {_exc}", file=sys.stderr)
_chain()
