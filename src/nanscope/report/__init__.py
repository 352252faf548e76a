"""Reporters: each renders one :class:`nanscope.analysis.Analysis`; none reads files.

The words are theirs: the analysis holds facts, and the headline and the notes are
written from them here (``_sentences.py``; the headroom warnings in
``_headroom_words.py``), for the JSON report (``_json.py``), the
terminal report (``_text.py``) and the GUI alike.
"""

from nanscope.report._headroom_words import (
    headroom_json,
    headroom_warnings,
    warning_json,
    warning_text,
)
from nanscope.report._json import ranks_json, report_json
from nanscope.report._sentences import headline, note_text, note_texts, rank_note_texts
from nanscope.report._text import console_for, render_text

__all__ = [
    "console_for",
    "headline",
    "headroom_json",
    "headroom_warnings",
    "note_text",
    "note_texts",
    "rank_note_texts",
    "ranks_json",
    "render_text",
    "report_json",
    "warning_json",
    "warning_text",
]
