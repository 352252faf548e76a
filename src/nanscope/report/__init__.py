"""Reporters: each renders one :class:`nanscope.analysis.Analysis`; none reads files.

The words are theirs: the analysis holds facts, and the headline and the notes are
written from them here (``_sentences.py``; the headroom warnings in
``_headroom_words.py``), for the JSON report (``_json.py``), the
terminal report (``_text.py``) and the GUI alike. A sentinel's history (its steps,
trips and replay dumps, read by the caller) is reported by ``_sentinel.py``. A diff of two
runs (:class:`nanscope.analysis.DiffResult`) is worded by ``_diff.py``.
"""

from nanscope.report._diff import diff_json, diff_lines, render_diff_text
from nanscope.report._headroom_words import (
    headroom_json,
    headroom_warnings,
    warning_json,
    warning_text,
)
from nanscope.report._json import ranks_json, report_json
from nanscope.report._sentences import headline, note_text, note_texts, rank_note_texts
from nanscope.report._sentinel import (
    SentinelReplay,
    SentinelRun,
    render_sentinel_text,
    sentinel_headline,
    sentinel_json,
)
from nanscope.report._text import console_for, render_text

__all__ = [
    "SentinelReplay",
    "SentinelRun",
    "console_for",
    "diff_json",
    "diff_lines",
    "headline",
    "headroom_json",
    "headroom_warnings",
    "note_text",
    "note_texts",
    "rank_note_texts",
    "ranks_json",
    "render_diff_text",
    "render_sentinel_text",
    "render_text",
    "report_json",
    "sentinel_headline",
    "sentinel_json",
    "warning_json",
    "warning_text",
]
