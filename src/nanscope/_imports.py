"""Running code right after a module finishes importing, without importing it first.

``nanscope run`` starts recording when the program imports its framework, and
the PyTorch backend instruments ``torch.compile`` only once the program
imports Dynamo or inductor: importing them itself would add seconds to every
recorded program that never compiles.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``callback(name)`` right after each of the modules ``names`` finished importing.

    A finder first on ``sys.meta_path`` until :meth:`remove`: for the names it
    watches, it finds the module as the other finders would, and wraps the
    loader's ``exec_module`` so that the callback runs once the module's code
    has run. A module that is already imported is not watched: the caller
    handles it. Each name fires at most once.
    """

    def __init__(self, names: Iterable[str], callback: Callable[[str], None]) -> None:
        self.names = set(names)
        self.callback = callback
        self._busy: set[str] = set()
        self._lock = threading.Lock()
        sys.meta_path.insert(0, self)

    def remove(self) -> None:
        """Stop watching (the callbacks not yet made are never made)."""
        self.names.clear()
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.names:  # every import of the program passes here: keep it short
            return None
        with self._lock:
            if fullname in self._busy:
                return None
            self._busy.add(fullname)
        try:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            for finder in sys.meta_path:
                if spec is not None:
                    break
                if finder is not self and hasattr(finder, "find_spec"):
                    spec = finder.find_spec(fullname, path, target)
        finally:
            with self._lock:
                self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            # Every watcher of the name (recording and checking may both wait for it):
            # the first finder to find the module is the only one asked.
            for finder in list(sys.meta_path):
                if isinstance(finder, AfterImport) and fullname in finder.names:
                    finder.names.discard(fullname)
                    finder.callback(fullname)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
