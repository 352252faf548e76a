"""Reporters: each renders one :class:`nanscope.analysis.Analysis`; none reads files."""

from nanscope.report.text import render_text

__all__ = ["render_text"]
