"""Exceptions that nanscope raises into the user's program."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Frame = tuple[str, int, str]  # (file, line, function)


@dataclass(frozen=True)
class Birth:
    """Where the Inf/NaN that a :class:`NonFiniteError` is about were born.

    The birth is the op that wrote them while none of its inputs held Inf/NaN that
    check_numerics was following: ``op_type``, ``module_path``, ``phase``, ``step``,
    ``counts`` (``{"neg_inf", "pos_inf", "nan", "size"}`` of what it wrote),
    ``source`` and, for a backward op, ``forward_op`` and ``forward_source``.
    ``entered`` is true when that op's inputs already held Inf/NaN that no op
    made while checking was on (data loaded with them, tensors made before).
    """

    op_type: str
    module_path: str = ""
    phase: str = ""
    step: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    source: Frame | None = None
    forward_op: str = ""
    forward_source: Frame | None = None
    entered: bool = False


class NonFiniteError(FloatingPointError):
    """Inf or NaN that matter appeared while ``nanscope.enable_check_numerics()`` was on.

    Attributes of the op that noticed them: ``op_type``, ``module_path``,
    ``phase``, ``step``, ``counts`` (``{"neg_inf", "pos_inf", "nan", "size"}``),
    ``source`` and, for a backward op, ``forward_op`` and ``forward_source``
    (``(file, line, function)``). ``reason`` says why they matter: ``"nan"``,
    ``"loss"`` (``backward()`` was called on them), ``"gradient"`` (a backward op
    wrote them), ``"parameter"``, ``"optimizer state"``, ``"unchecked scaled
    gradient"`` (GradScaler's inf check did not find them) or ``"unread at the
    end"``. ``birth`` (a :class:`Birth`) is where they were born, which may be
    the op that noticed them.
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
        self.reason: str = facts.get("reason", "")
        self.birth: Birth | None = facts.get("birth")
