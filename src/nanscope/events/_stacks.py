"""Stack-frame and source-file interning.

Each distinct ``(file, line, function)`` becomes one ``StackFrameWithId``
record and each distinct file one ``SourceFile`` record, written once per
process; events then refer to a whole stack by a small integer. Lookups on the
hot path are dictionary hits keyed by code objects, so a stack that was seen
before costs one walk over the Python frames and no formatting.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence
from types import CodeType, FrameType
from typing import Literal

from nanscope._paths import is_library_file, is_nanscope_file
from nanscope.events._queue import NewSourceFile, NewStackFrame

SnapshotPolicy = Literal["user", "all", "none"]

# Frames of the wrappers torch puts around a dispatch mode's handler: noise.
_WRAPPER_FILES = (
    os.path.join("torch", "_dynamo", "eval_frame.py"),
    os.path.join("torch", "_compile.py"),
)

# A sink receives, in order, each new file and each new frame (a file before its frames).
Sink = Callable[[NewSourceFile | NewStackFrame], None]


class StackInterner:
    """Assigns ids to frames, files and whole stacks, announcing new ones to ``sink``."""

    def __init__(self, sink: Sink, snapshot: SnapshotPolicy = "user") -> None:
        self._sink = sink
        self._snapshot = snapshot
        self._lock = threading.Lock()
        self._files: dict[str, int] = {}
        self._frames: dict[tuple[str, int, str], str] = {}
        self._per_code: dict[int, tuple[CodeType, dict[int, str] | None]] = {}
        self._stacks: dict[tuple[str, ...], int] = {}
        self.stacks: list[tuple[str, ...]] = []
        # Frames are looked up by id string when a reader resolves them; keep
        # the reverse map for backends that want to print a stack.
        self.frame_info: dict[str, tuple[str, int, str]] = {}

    def _file_index(self, path: str) -> int:
        index = self._files.get(path)
        if index is None:
            index = len(self._files)
            self._files[path] = index
            if self._snapshot == "all":
                snap = True
            elif self._snapshot == "none":
                snap = False
            else:
                snap = not is_library_file(path)
            self._sink(NewSourceFile(file_index=index, path=path, snapshot=snap))
        return index

    def frame_id(self, path: str, line: int, func: str) -> str:
        """The id of one frame, announcing its file and itself the first time."""
        key = (path, line, func)
        fid = self._frames.get(key)
        if fid is not None:
            return fid
        with self._lock:
            fid = self._frames.get(key)
            if fid is None:
                file_index = self._file_index(path)
                fid = f"{len(self._frames):x}"
                self._frames[key] = fid
                self.frame_info[fid] = key
                self._sink(NewStackFrame(frame_id=fid, file_index=file_index, line=line, func=func))
        return fid

    def intern(self, frame_ids: tuple[str, ...]) -> int:
        """The stack id of a tuple of frame ids (outermost first)."""
        sid = self._stacks.get(frame_ids)
        if sid is None:
            with self._lock:
                sid = self._stacks.get(frame_ids)
                if sid is None:
                    sid = len(self.stacks)
                    self.stacks.append(frame_ids)
                    self._stacks[frame_ids] = sid
        return sid

    def intern_frames(self, frames: list[tuple[str, int, str]]) -> int:
        """The stack id of explicit ``(file, line, function)`` frames, outermost first."""
        return self.intern(tuple(self.frame_id(*f) for f in frames))

    def _code_entry(self, code: CodeType) -> tuple[CodeType, dict[int, str] | None]:
        drop = is_nanscope_file(code.co_filename) or code.co_filename.endswith(_WRAPPER_FILES)
        entry = self._per_code[id(code)] = (code, None if drop else {})
        return entry

    def intern_code_frames(self, frames: Sequence[tuple[CodeType, int]], limit: int = 64) -> int:
        """The stack id of ``(code object, line)`` frames given innermost first.

        For stacks walked outside Python (the native recorder): the same frames
        are left out and the same ``limit`` applies as in :meth:`capture`.
        """
        ids: list[str] = []
        per_code = self._per_code
        for code, line in frames:
            entry = per_code.get(id(code))
            if entry is None or entry[0] is not code:
                entry = self._code_entry(code)
            if entry[1] is None:
                continue
            ids.append(self.frame_id(_path_of(code), line, code.co_name))
            if len(ids) >= limit:
                break
        ids.reverse()
        return self.intern(tuple(ids))

    def capture(self, frame: FrameType | None = None, limit: int = 64) -> int:
        """The stack id of the running Python stack, nanscope's own frames left out.

        ``frame`` defaults to the caller's caller. At most ``limit`` innermost
        frames are kept (deep recursion would otherwise make every record huge).
        """
        f: FrameType | None = frame if frame is not None else sys._getframe(2)
        ids: list[str] = []
        append = ids.append
        per_code = self._per_code
        while f is not None:
            code = f.f_code
            # id(code) -> (code, None for a frame to leave out, or {instruction
            # offset: frame id}). Keyed by id: hashing a code object hashes all
            # the code nested in it (a whole module for <module> frames); the
            # entry holds the code object, so its id cannot be reused.
            entry = per_code.get(id(code))
            if entry is None or entry[0] is not code:
                entry = self._code_entry(code)
            known = entry[1]
            if known is not None:
                # Keyed by f_lasti: f_lineno searches the line table on every access.
                fid = known.get(f.f_lasti)
                if fid is None:
                    fid = self.frame_id(_path_of(code), f.f_lineno, code.co_name)
                    known[f.f_lasti] = fid
                append(fid)
                if len(ids) >= limit:
                    break
            f = f.f_back
        ids.reverse()
        return self.intern(tuple(ids))


def _path_of(code: CodeType) -> str:
    name = code.co_filename
    # "<frozen runpy>", "<string>": not files, keep them as Python names them.
    return name if name.startswith("<") else os.path.abspath(name)


def read_source_lines(path: str) -> list[str]:
    """The lines of a source file without newlines; empty when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().splitlines()
    except OSError:
        return []
