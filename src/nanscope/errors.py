"""Exceptions that nanscope raises into the user's program."""

from __future__ import annotations

from typing import Any

Frame = tuple[str, int, str]  # (file, line, function)


class NonFiniteError(FloatingPointError):
    """An op produced Inf or NaN while ``nanscope.enable_check_numerics()`` was on.

    Attributes: ``op_type``, ``module_path``, ``phase``, ``step``, ``counts``
    (``{"neg_inf", "pos_inf", "nan", "size"}``), ``source`` and, for a
    backward op, ``forward_op`` and ``forward_source`` (``(file, line, function)``).
    """

    def __init__(self, message: str, **facts: Any) -> None:
        super().__init__(message)
        self.op_type: str = facts.get("op_type", "")
        self.module_path: str = facts.get("module_path", "")
        self.phase: str = facts.get("phase", "")
        self.step: int = facts.get("step", 0)
        self.counts: dict[str, int] = facts.get("counts", {})
        self.source: Frame | None = facts.get("source")
        self.forward_op: str = facts.get("forward_op", "")
        self.forward_source: Frame | None = facts.get("forward_source")
