"""How far two runs' values may be apart and still agree: tolerances per float format.

Two values ``a`` and ``b`` of one statistic agree when ``|a - b| <= atol + rtol * max(|a|, |b|)``
(``torch.isclose``'s rule, made symmetric). ``rtol`` depends on the float format the
comparison is made at: the coarser of the two outputs' formats, and, because an error
made upstream stays in every value computed from it, the coarsest format either run
computed in before (the *precision floor*, see :class:`Tolerance`). The defaults and why
are in docs/DIFF.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nanscope.format.proto.types_pb2 import DataType

# Each float format's rank: a coarser format has a higher rank (0: not a float, or unknown).
_RANK_OF_DTYPE: dict[int, int] = {
    DataType.DT_DOUBLE: 1,
    DataType.DT_FLOAT: 2,
    DataType.DT_HALF: 3,
    DataType.DT_BFLOAT16: 4,
    DataType.DT_FLOAT8_E4M3FN: 5,
    DataType.DT_FLOAT8_E5M2: 6,
}
FORMAT_NAMES = ("", "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")

# The default relative tolerance of each format (index: its rank; 0, unknown, as float32).
# A whole program is compared, not one op on equal inputs: each op's inputs already differ
# within the tolerance, reductions are reordered (torch.compile, another BLAS blocking, an
# all-reduce), and errors compound through depth and steps. bfloat16 takes torch.testing's
# 1.6e-2 (two bfloat16 ulps of 2**-7 at 1.0): a tiny Llama's float32 and autocast runs
# stay within 1.4e-2 over two training steps. float16 has 3 bits more: 2e-3. float32 is
# far wider than torch.testing's 1.3e-6 (about 840 ulps): eager and torch.compile, whose
# reductions run in another order, must agree over many layers and steps.
DEFAULT_RTOL = (1e-4, 1e-9, 1e-4, 2e-3, 1.6e-2, 0.125, 0.25)
# Below this, differences are noise whatever the format (torch.testing's atol for float32).
DEFAULT_ATOL = 1e-5
# Finite elements whose sign or zeroness may differ between the runs, as a fraction of the
# output's elements (at least one element), before the counts alone say the outputs part.
DEFAULT_COUNT_TOLERANCE = 0.25


def rank_of(dtype: int) -> int:
    """The rank of a ``DataType`` number (0: not a float format nanscope knows)."""
    return _RANK_OF_DTYPE.get(int(dtype), 0)


def ranks_of(dtypes: np.ndarray) -> np.ndarray:
    """:func:`rank_of` over an array of ``DataType`` numbers."""
    table = np.zeros(max(_RANK_OF_DTYPE) + 1, dtype=np.int8)
    for dt, r in _RANK_OF_DTYPE.items():
        table[dt] = r
    d = dtypes.astype(np.int64)
    out: np.ndarray = np.where((d >= 0) & (d < len(table)), table[np.clip(d, 0, len(table) - 1)], 0)
    return out.astype(np.int8)


@dataclass(frozen=True)
class Tolerance:
    """The tolerances a diff applies.

    - ``rtol``: one relative tolerance for every format (``--rtol``), or ``None`` for
      each format's default (:data:`DEFAULT_RTOL`), taken at the comparison's format:
      the coarser of the two outputs' formats, or the *precision floor* when coarser:
      the coarsest float format either run had computed in up to that op, in that
      step or an earlier one (a bfloat16 matmul's error stays in the float32 softmax
      after it, and in every weight the step updates).
    - ``atol``: the absolute floor (``--atol``).
    - ``count_tolerance``: for outputs compared by their counts alone (no statistics
      or ranges recorded), the fraction of elements whose sign or zeroness may differ.
    """

    rtol: float | None = None
    atol: float = DEFAULT_ATOL
    count_tolerance: float = DEFAULT_COUNT_TOLERANCE
    per_format: tuple[float, ...] = field(default=DEFAULT_RTOL)

    def rtol_of_rank(self, rank: int) -> float:
        """The relative tolerance at a format's rank."""
        if self.rtol is not None:
            return self.rtol
        return self.per_format[rank] if 0 <= rank < len(self.per_format) else self.per_format[0]

    def rtols(self, ranks: np.ndarray) -> np.ndarray:
        """:meth:`rtol_of_rank` over an array of ranks."""
        if self.rtol is not None:
            return np.full(len(ranks), self.rtol, dtype=np.float64)
        table = np.asarray(self.per_format, dtype=np.float64)
        out: np.ndarray = table[np.clip(ranks.astype(np.int64), 0, len(table) - 1)]
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "rtol": self.rtol,
            "atol": self.atol,
            "count_tolerance": self.count_tolerance,
            "default_rtol": {
                name: self.per_format[r] for r, name in enumerate(FORMAT_NAMES) if name
            },
        }
