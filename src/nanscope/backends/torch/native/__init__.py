"""Building and loading the native recorder (``recorder.cpp`` and the sources beside it).

The extension is compiled against the installed PyTorch the first time it is
needed (about half a minute, once) and cached under
``$NANSCOPE_CACHE_DIR`` (default ``~/.cache/nanscope``), keyed by the sources,
PyTorch and Python versions. Without a C++ compiler, nanscope records with
its Python dispatch mode instead. ``python -m nanscope.backends.torch.native``
builds it ahead of time. :func:`native_library` is where recording and
check_numerics ask for it (``NANSCOPE_TORCH_RECORDER`` chooses).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import threading
from pathlib import Path
from types import ModuleType

_HERE = Path(__file__).parent
# Every file of the extension: the .cpp files are compiled, and all of them
# (headers too) make up the cache key.
SOURCES = (
    "recorder.cpp",
    "checker.cpp",
    "counts.cpp",
    "encoder.cpp",
    "frames.cpp",
    "stacks.cpp",
    "graph_counts.cpp",
    "checker.h",
    "counts.h",
    "encoder.h",
    "event.h",
    "frames.h",
    "ivalues.h",
    "stacks.h",
    "pool.h",
    "flat_map.h",
    "recent_table.h",
    "inline_vec.h",
    "op_keys.h",
)
# NDEBUG as PyTorch is built: without it, its headers assert on their own internals.
CFLAGS = ["-O3", "-DNDEBUG"]
# NANSCOPE_NATIVE_SANITIZE=address builds a separate AddressSanitizer copy
# (`make stress`; Python must then run with libasan preloaded).
SANITIZE_ENV = "NANSCOPE_NATIVE_SANITIZE"


def _flags() -> tuple[list[str], list[str]]:
    """Compiler and linker flags for this build."""
    sanitize = os.environ.get(SANITIZE_ENV, "")
    if not sanitize:
        return CFLAGS, []
    if sanitize != "address":
        raise ValueError(f"{SANITIZE_ENV}={sanitize!r}: the one sanitizer supported is 'address'")
    extra = ["-fsanitize=address", "-fno-omit-frame-pointer"]
    return ["-O1", "-g", "-DNDEBUG", *extra], extra


_lock = threading.Lock()
_loaded: ModuleType | None = None
_failure: str | None = None


def cache_dir() -> Path:
    root = os.environ.get("NANSCOPE_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "nanscope"
    )
    return Path(root) / "native"


def build_key() -> str:
    """A name that changes with the sources, PyTorch and Python."""
    import torch

    h = hashlib.sha256()
    for name in SOURCES:
        h.update((_HERE / name).read_bytes())
    h.update(torch.__version__.encode())
    h.update(sys.version.encode())
    h.update(" ".join(_flags()[0]).encode())
    return f"nanscope_native_{h.hexdigest()[:16]}"


def load(verbose: bool = False) -> ModuleType | None:
    """The compiled extension, building it if needed; ``None`` if it cannot be built.

    :func:`failure` then says why.
    """
    global _loaded, _failure
    with _lock:
        if _loaded is not None or _failure is not None:
            return _loaded
        try:
            _loaded = _build(verbose)
        except Exception as exc:  # no compiler, no headers, a build error
            _failure = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        return _loaded


def failure() -> str | None:
    """Why :func:`load` returned ``None`` (``None`` before a failed attempt)."""
    return _failure


def _build(verbose: bool) -> ModuleType:
    import importlib.util

    name = build_key()
    build = cache_dir() / name
    so = build / f"{name}.so"
    if so.is_file():  # built before: load it without asking ninja
        spec = importlib.util.spec_from_file_location(name, so)
        if spec is not None and spec.loader is not None:
            import torch  # noqa: F401  (the extension links against torch's libraries)

            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    from torch.utils.cpp_extension import load as cpp_load

    _put_ninja_on_path()
    build.mkdir(parents=True, exist_ok=True)
    if not verbose:
        print(
            "nanscope: building the native recorder (once per PyTorch version, ~30 s)",
            file=sys.stderr,
        )
    cflags, ldflags = _flags()
    return cpp_load(  # type: ignore[no-any-return]
        name,
        [str(_HERE / source) for source in SOURCES if source.endswith(".cpp")],
        extra_cflags=cflags,
        extra_ldflags=ldflags,
        build_directory=str(build),
        verbose=verbose,
    )


def _put_ninja_on_path() -> None:
    """PyTorch runs ``ninja`` from PATH; the PyPI package's binary may not be on it."""
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja
    except ImportError:
        return  # PyTorch then says that ninja is missing
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def loaded() -> ModuleType | None:
    """The extension if it has been loaded in this process (never builds it)."""
    return _loaded


RECORDER_ENV = "NANSCOPE_TORCH_RECORDER"


def native_library() -> ModuleType | None:
    """The native recorder's extension, unless ``NANSCOPE_TORCH_RECORDER=python``.

    ``auto`` (the default) falls back to the Python dispatch mode, with one
    line on stderr, when the extension cannot be built; ``native`` makes
    that an error.
    """
    choice = os.environ.get(RECORDER_ENV, "auto").strip().lower() or "auto"
    if choice not in ("auto", "native", "python"):
        raise ValueError(f"{RECORDER_ENV}={choice!r}: use auto, native or python")
    if choice == "python":
        return None
    lib = load()
    if lib is None:
        if choice == "native":
            raise RuntimeError(
                f"{RECORDER_ENV}=native, but the native recorder could not be built "
                f"({failure()}); install a C++ compiler or set {RECORDER_ENV}=python"
            )
        global _told
        if not _told:
            _told = True
            print(
                f"nanscope: recording with the Python dispatch mode (slower); the native "
                f"recorder could not be built: {failure()}",
                file=sys.stderr,
            )
    return lib


# The fallback is said once per process.
_told = False
