"""The source files a dump recorded: which ones, and one file's text, highlighted."""

from __future__ import annotations

from typing import Any

from nanscope.reader import UNREADABLE, DumpReader
from nanscope.server.provider.events import NotFound
from nanscope.server.runs import Run
from nanscope.server.source import HIGHLIGHTER


def recorded_files(reader: DumpReader, process: int | None) -> dict[str, Any]:
    """``/api/source_files``: the files whose text the dump holds (of one process, or all)."""
    procs = range(len(reader.processes)) if process is None else [process]
    return {"files": [f.to_json() for p in procs for f in reader.source_files(p) if f.num_lines]}


def source_text(
    run: Run, reader: DumpReader, process: int, file_index: int | None, path: str | None
) -> dict[str, Any]:
    """A recorded file's raw lines, named by its index or its exact recorded path (one of
    them given). Only what the dump recorded is served, never a file read from the disk.

    Call under the run's lock; :func:`highlighted` then gives ``/api/source``'s answer.
    """
    recorded = reader.source_files(process)
    if file_index is None:
        matches = [f for f in recorded if f.file_path == path]
        if not matches:
            raise NotFound("that file was not recorded in this dump")
        info = matches[0]
    elif file_index < len(recorded):
        info = recorded[file_index]
    else:
        raise NotFound(f"no source file #{file_index} in this dump")

    def compute() -> dict[str, Any]:
        try:
            lines = reader.source_lines(info.index, process)
        except (OSError, *UNREADABLE) as exc:
            raise NotFound(f"the recorded copy of {info.file_path} cannot be read: {exc}") from None
        if not lines:
            raise NotFound(f"the dump did not record the text of {info.file_path}")
        return {
            "process": process,
            "file_index": info.index,
            "path": info.file_path,
            "host": info.host_name,
            "num_lines": len(lines),
            "lines": list(lines),
        }

    return run.cached(("source", process, info.index), compute)


def highlighted(found: dict[str, Any]) -> dict[str, Any]:
    """``/api/source``: :func:`source_text`'s answer with its lines highlighted. Called after
    the run's lock is released: a file slow to highlight (they come from the dump, so may be
    crafted) then delays only its own request, never a refresh of the run."""
    text = HIGHLIGHTER(found["path"], found["lines"])
    return {**found, "lines": text.lines, "highlighted": text.highlighted}
