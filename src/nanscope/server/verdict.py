"""The run's verdict and what is missing from its dump, as the page shows them.

The page never shows an all-clear over a dump that lost events: the analysis JSON carries
``verdict`` (``harmful``, ``clean``, ``absorbed`` or ``incomplete``) and ``incomplete`` (what
could not be read or was not kept, each ``{"message", "file", "offset", "severity"}``), and
``/api/runs`` says whether each run is incomplete. The analysis computes both
(``nanscope.analysis``); one without them (an older analysis) is completed here from the
reader's :attr:`~nanscope.reader.DumpReader.incomplete`, and an all-clear beside a list of
damage is not believed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from nanscope.reader import DumpReader

HARMFUL, INCOMPLETE, ABSORBED, CLEAN = "harmful", "incomplete", "absorbed", "clean"
VERDICTS = (HARMFUL, INCOMPLETE, ABSORBED, CLEAN)

# "<file>: record at byte offset 1234: ..." and "<file>: ends in an incomplete record at
# byte offset 1234 ...": the reader's problems name the file first and the offset inline.
_FILE = re.compile(r"^(?P<file>[^\n]+?): ")
_OFFSET = re.compile(r"\bbyte offset (?P<offset>\d+)\b")


def damage_entry(problem: Mapping[str, Any]) -> dict[str, Any]:
    """A problem's JSON as a damage entry: ``{"message", "file", "offset", "severity"}``;
    ``file`` and ``offset`` are taken from the message when the problem does not give them
    (``None`` when the message names neither)."""
    message = str(problem.get("message", ""))
    file = problem.get("file")
    offset = problem.get("offset")
    if file is None:
        m = _FILE.match(message)
        # Only a path: a sentence that holds a colon names no file.
        if m and ("/" in m["file"] or "\\" in m["file"]):
            file = m["file"]
    if offset is None:
        m = _OFFSET.search(message)
        offset = int(m["offset"]) if m else None
    severity = problem.get("severity")
    return {
        "message": message,
        "file": str(file) if file is not None else None,
        "offset": int(offset) if isinstance(offset, int) and not isinstance(offset, bool) else None,
        "severity": severity if severity in ("error", "warning") else "error",
    }


def reader_damage(reader: DumpReader) -> list[dict[str, Any]]:
    """What the reader found missing from the dump so far (events not indexed or not
    readable), as damage entries. Cheap: ``/api/runs`` asks it of every run on every poll."""
    return [damage_entry(p.to_json()) for p in reader.incomplete]


def with_verdict(analysis: Mapping[str, Any], reader: DumpReader) -> dict[str, Any]:
    """``analysis`` (``Analysis.to_json()``) with ``verdict`` and ``incomplete``, completed
    from ``reader`` where the analysis does not carry them, and entries in the page's form."""
    out = dict(analysis)
    given = out.get("incomplete")
    damage = (
        [damage_entry(p) for p in given if isinstance(p, Mapping)]
        if isinstance(given, list)
        else reader_damage(reader)
    )
    out["incomplete"] = damage
    verdict = out.get("verdict")
    if verdict not in VERDICTS:
        if out.get("found_harmful"):
            verdict = HARMFUL
        elif damage:
            verdict = INCOMPLETE
        else:
            verdict = ABSORBED if out.get("found_nonfinite") else CLEAN
    elif verdict in (ABSORBED, CLEAN) and damage:
        # Whatever said so, an all-clear over missing events is not given.
        verdict = INCOMPLETE
    out["verdict"] = verdict
    return out
