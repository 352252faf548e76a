"""Reporters: each renders one :class:`nanscope.analysis.Analysis`; none reads files.

The words are theirs: the analysis holds facts, and the headline and the notes are
written from them here (``_sentences.py``), for the JSON report (``_json.py``), the
terminal report (``_text.py``) and the GUI alike.
"""

from nanscope.report._json import report_json
from nanscope.report._sentences import headline, note_texts
from nanscope.report._text import console_for, render_text

__all__ = ["console_for", "headline", "note_texts", "render_text", "report_json"]
