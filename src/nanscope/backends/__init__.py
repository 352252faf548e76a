"""Framework backends: each instruments one framework and reports into the event writer.

Every backend offers the same entry points, in a module of its own (:class:`Entry`):
start dumping, start checking numerics. :data:`BACKENDS` is the one table of them, in
the order :func:`detect` tries them; :mod:`nanscope.api` looks a framework up there.
Backends import their framework lazily; nothing here imports one, nor an entry module
until it is used.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from nanscope.format.modes import TensorDebugMode


@dataclass(frozen=True)
class DumpSettings:
    """What :func:`nanscope.enable_dump_debug_info` was asked for, parsed."""

    logdir: str
    mode: TensorDebugMode
    circular_buffer_size: int
    op_regex: str | None
    tensor_dtypes: Any
    framework: str
    # FULL_HEALTH summaries carry each float output's statistics (nanscope.format.statistics).
    statistics: bool = False

    def recording(self) -> dict[str, Any]:
        """What a recording session is made with: the logdir, mode and filters, by name
        (and ``statistics`` when asked for)."""
        made = {
            "logdir": self.logdir,
            "mode": self.mode,
            "circular_buffer_size": self.circular_buffer_size,
            "op_regex": self.op_regex,
            "tensor_dtypes": self.tensor_dtypes,
        }
        if self.statistics:
            made["statistics"] = True
        return made


class Session(Protocol):
    """A running dump (or numerics check) of one framework."""

    framework: str

    def flush(self) -> object: ...

    def close(self) -> None: ...


class Checking(Protocol):
    """Numerics checking of one framework while it is on; :meth:`close` turns it off."""

    framework: str

    def close(self) -> None: ...


class Entry(Protocol):
    """The entry points a backend's entry module defines."""

    def start_dump(self, settings: DumpSettings, options: dict[str, Any]) -> Session:
        """Start recording every op into a dump; ``options`` go to the writer."""
        ...

    def start_checking(self, sync_every: int) -> Checking:
        """Start raising at the first harmful Inf/NaN (``sync_every``: PyTorch's)."""
        ...


@dataclass(frozen=True)
class Backend:
    """One framework nanscope knows: how a program is seen to use it, and its entry points."""

    name: str  # as ``framework=`` names it, and the top-level module its import makes
    entry: str | None  # the module with its entry points (None: not recorded)

    @property
    def recorded(self) -> bool:
        """Whether nanscope can record programs of this framework."""
        return self.entry is not None

    def in_use(self) -> bool:
        """Whether the program has imported the framework."""
        return self.name in sys.modules

    def installed(self) -> bool:
        """Whether the framework can be imported (found without importing it)."""
        return importlib.util.find_spec(self.name) is not None

    def start_dump(self, settings: DumpSettings, options: dict[str, Any]) -> Session:
        """Start dumping this framework's program (see :class:`Entry`)."""
        if self.entry is None:
            raise NotImplementedError(
                f"dumping {self.name} programs is not supported yet; PyTorch and TensorFlow are"
            )
        return self._entry().start_dump(settings, options)

    def start_checking(self, sync_every: int) -> Checking:
        """Start checking this framework's numerics (see :class:`Entry`)."""
        if self.entry is None:
            raise NotImplementedError(f"check_numerics for {self.name} is not supported yet")
        return self._entry().start_checking(sync_every)

    def _entry(self) -> Entry:
        assert self.entry is not None
        return cast(Entry, importlib.import_module(self.entry))


# The frameworks nanscope knows, in the order detect() tries them.
BACKENDS: dict[str, Backend] = {
    backend.name: backend
    for backend in (
        Backend("torch", "nanscope.backends.torch.entry"),
        Backend("tensorflow", "nanscope.backends.tensorflow"),
        Backend("jax", "nanscope.backends.jax.entry"),
    )
}
# Whether nanscope can record programs of each framework.
FRAMEWORKS: dict[str, bool] = {name: backend.recorded for name, backend in BACKENDS.items()}
RECORDED = tuple(name for name, recorded in FRAMEWORKS.items() if recorded)


def detect(framework: str = "auto") -> str:
    """The framework to instrument: the one already imported, else the one installed."""
    if framework != "auto":
        if framework not in BACKENDS:
            raise ValueError(
                f"unknown framework {framework!r}; use one of: auto, {', '.join(BACKENDS)}"
            )
        return framework
    for backend in BACKENDS.values():
        if backend.in_use():
            return backend.name
    for backend in BACKENDS.values():
        if backend.installed():
            return backend.name
    raise RuntimeError(
        "no supported framework is installed (PyTorch, TensorFlow or JAX); "
        "install one, e.g. pip install 'nanscope[torch]'"
    )


def backend(framework: str = "auto") -> Backend:
    """The backend for ``framework`` (``"auto"``: see :func:`detect`)."""
    return BACKENDS[detect(framework)]
