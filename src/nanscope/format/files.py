"""File-set naming and discovery.

A dump root holds one or more file sets, each
``tfdbg_events.<10-digit seconds>.<host>.<suffix>`` for the six suffixes
below. TensorFlow writes one set per host; nanscope writes one set per
process and puts the rank (when known), the pid and a random tag into the
host part (:func:`process_host`), so two processes never share a file, even
two of the same rank started in the same second on one machine.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

PREFIX = "tfdbg_events"
METADATA = "metadata"
SOURCE_FILES = "source_files"
STACK_FRAMES = "stack_frames"
GRAPHS = "graphs"
EXECUTION = "execution"
GRAPH_EXECUTION_TRACES = "graph_execution_traces"

# Creation order, as TensorFlow creates them.
SUFFIXES = (SOURCE_FILES, STACK_FRAMES, GRAPHS, METADATA, EXECUTION, GRAPH_EXECUTION_TRACES)
CIRCULAR_SUFFIXES = (EXECUTION, GRAPH_EXECUTION_TRACES)

# nanscope's sidecar index next to each circular file (see events/sidecar.py).
INDEX_SUFFIX = ".nsidx"

# nanscope's range history (nanscope.format.headroom): per module, each step's |x| extremes.
RANGES = "nsranges"

# nanscope's report of events the writer had to drop (disk full, ...): JSON, see docs/FORMAT.md.
DROPS = "nsdrops"

# A note that a process of the run ran unrecorded (``nanscope run``'s child whose
# interpreter cannot import nanscope): JSON, see docs/FORMAT.md and cli/_bootstrap.
UNRECORDED = "nsunrecorded"

_SAFE_HOST = re.compile(r"[^A-Za-z0-9._-]+")


def file_set_prefix(logdir: str | os.PathLike[str], seconds: float, host: str) -> Path:
    """The common prefix of one file set, e.g. ``<root>/tfdbg_events.1593123456.myhost``."""
    host = _SAFE_HOST.sub("_", host) or "localhost"
    return Path(logdir) / f"{PREFIX}.{int(seconds):010d}.{host}"


def process_host(host: str, rank: int | None, pid: int, tag: str) -> str:
    """The host part of a nanscope process's file names: ``<host>[-rank<R>]-pid<P>-<tag>``.

    ``tag`` is random (a few hex digits): pids are reused, and two machines
    writing to one shared directory may have the same host name.
    """
    who = f"-rank{rank}" if rank is not None else ""
    return f"{host}{who}-pid{pid}-{tag}"


@dataclass(frozen=True)
class FileSet:
    """The six files that one writer (one TensorFlow host, one nanscope process) produced."""

    prefix: Path

    def path(self, suffix: str) -> Path:
        return Path(f"{self.prefix}.{suffix}")

    @property
    def name(self) -> str:
        """``<seconds>.<host>``: what tells this set from its siblings."""
        return self.prefix.name[len(PREFIX) + 1 :]

    @property
    def host(self) -> str:
        return self.name.split(".", 1)[1] if "." in self.name else self.name

    def missing(self) -> list[str]:
        return [s for s in SUFFIXES if not self.path(s).is_file()]


class DumpNotFoundError(Exception):
    """The dump root does not exist or holds no tfdbg2 file set."""


def discover(logdir: str | os.PathLike[str]) -> list[FileSet]:
    """The file sets directly under ``logdir``, found by their ``.metadata`` file.

    Like TensorFlow's reader, this does not recurse: point it at the dump root.
    """
    root = Path(logdir)
    if not root.exists():
        raise DumpNotFoundError(f"{root}: no such directory; pass the logdir the program wrote to")
    if not root.is_dir():
        raise DumpNotFoundError(f"{root}: not a directory; pass the dump root directory")
    suffix = "." + METADATA
    sets = [
        FileSet(Path(str(p)[: -len(suffix)]))
        for p in sorted(root.glob(f"{PREFIX}.*{suffix}"))
        if p.is_file()
    ]
    if not sets:
        hint = ""
        subdirs = sorted(
            p.name for p in root.iterdir() if p.is_dir() and any(p.glob(f"{PREFIX}.*{suffix}"))
        )
        if subdirs:
            hint = f" (found dumps in subdirectories: {', '.join(subdirs[:5])}; pass one of them)"
        raise DumpNotFoundError(f"{root}: no tfdbg2 dump here (no {PREFIX}.*.metadata file){hint}")
    return sets


def unrecorded_note(path: Path) -> str:
    """What a ``.nsunrecorded`` note says, in one sentence (a damaged note: that it is one)."""
    try:
        note = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(note, dict):
            raise ValueError("not an object")
    except (OSError, ValueError) as exc:
        return f"{path}: a process of the run ran unrecorded (the note is unreadable: {exc})"
    argv = note.get("argv")
    command = " ".join(str(a) for a in argv) if isinstance(argv, list) else "?"
    if len(command) > 200:
        command = command[:197] + "..."
    return (
        f"{path}: pid {note.get('pid', '?')} on {note.get('host', '?')} ({command}) imported "
        f"{note.get('framework') or 'a framework'} but ran unrecorded: {note.get('why', '?')}; "
        "what it computed is not in the dump"
    )
