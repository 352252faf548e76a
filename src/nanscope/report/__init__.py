"""Reporters: each renders one :class:`nanscope.analysis.Analysis`; none reads files."""

from nanscope.report._text import console_for, render_text

__all__ = ["console_for", "render_text"]
