"""Alerts and root cause: where the first Inf/NaN was born, and why."""

from nanscope.analysis.explain import explain, op_family
from nanscope.analysis.rootcause import SCHEMA, Alerts, Analysis, analyze
from nanscope.analysis.views import EventView, InputView, Producer, Source, ViewBuilder

__all__ = [
    "SCHEMA",
    "Alerts",
    "Analysis",
    "EventView",
    "InputView",
    "Producer",
    "Source",
    "ViewBuilder",
    "analyze",
    "explain",
    "op_family",
]
