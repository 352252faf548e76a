"""The ranges table before the first Inf (the report's Headroom section) measured against the
format asked with ``nanscope report --headroom-format``, ordered nearest to overflow first.

The dump is written here: three modules over five steps, then an Inf. Each level the test
expects is the module's largest ``|x|`` over the asked format's largest value, computed in
the test from the formats' published limits (float16: 65,504; bfloat16: about 3.39e38).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import nanscope
from nanscope.analysis import analyze_headroom
from nanscope.analysis._headroom import headroom_table
from nanscope.events import DumpWriter, ExecutionEvent, Phase
from nanscope.format.proto.types_pb2 import DataType

HALF, F32 = int(DataType.DT_HALF), int(DataType.DT_FLOAT)
FLOAT16_MAX, FLOAT16_NORMAL = 65504.0, 2.0**-14
BFLOAT16_MAX, BFLOAT16_NORMAL = 3.3895313892515355e38, 2.0**-126

# module -> (dtype, its largest |x| at steps 0..4). "wide" holds 1e5 in float32: past
# float16's largest value, far from bfloat16's. "half" sits at 46% of float16's maximum.
# "peaked" came near float16's maximum two steps before the Inf, then fell.
MODULES = {
    "wide": (F32, [1e5] * 5),
    "half": (HALF, [3e4] * 5),
    "peaked": (HALF, [1.0, 1.0, 6e4, 2.0, 2.0]),
}
INF_STEP = 5
TABLED = list(range(1, INF_STEP))  # the 5 tabled steps end at the Inf's own, which has none


def summary(amax: float, dtype: int, pos_inf: int = 0) -> np.ndarray:
    """A recorded FULL_HEALTH summary: tfdbg2's 11 slots, then the ranges."""
    return np.array([-1, -1, dtype, 1, 10, 0, pos_inf, 0, 4, 1, 5 - pos_inf, amax, 1e-3])


@pytest.fixture()
def dump(tmp_path: Path) -> tuple[Path, tuple[int, int, int]]:
    """The dump, and its first Inf as ``(process, step, index)``."""
    w = DumpWriter(tmp_path, "FULL_HEALTH", circular_buffer_size=-1)
    index = 0
    for step in range(INF_STEP):
        for module, (dtype, values) in MODULES.items():
            w.write_execution(
                ExecutionEvent(
                    "aten.mm.default",
                    [index + 1],
                    [index],
                    summaries=[summary(values[step], dtype)],
                    module_path=module,
                    phase=Phase.FORWARD,
                    step=step,
                )
            )
            index += 1
    w.write_execution(
        ExecutionEvent(
            "aten.exp.default",
            [index + 1],
            [index],
            summaries=[summary(1e4, HALF, pos_inf=1)],
            module_path="out",
            phase=Phase.FORWARD,
            step=INF_STEP,
        )
    )
    w.close()
    return tmp_path, (0, INF_STEP, index)


def _modules(rows: list[dict[str, Any]]) -> list[str]:
    """The table's modules in the order it lists them."""
    return list(dict.fromkeys(str(r["module"]) for r in rows))


def _levels(rows: list[dict[str, Any]], module: str) -> list[float]:
    return [float(r["level"]) for r in rows if r["module"] == module]


def test_the_table_is_measured_against_the_asked_format(
    dump: tuple[Path, tuple[int, int, int]],
) -> None:
    logdir, first_inf = dump
    with nanscope.open_dump(logdir) as r:
        own = headroom_table(r, first_inf)
        f16 = headroom_table(r, first_inf, "float16")
        bf16 = headroom_table(r, first_inf, "bfloat16")
    wide16 = [row for row in f16 if row["module"] == "wide"]
    # 1e5 against float16: past its largest value (1.53x); the tensor's own dtype stays.
    assert [row["step"] for row in wide16] == TABLED
    for row in wide16:
        assert (row["dtype"], row["format"]) == ("float32", "float16")
        assert row["level"] == pytest.approx(1e5 / FLOAT16_MAX)
        assert row["of_normal"] == pytest.approx(1e5 / FLOAT16_NORMAL)
    # Against bfloat16 the same value is far from its largest: 1e5 / 3.39e38.
    for row in (row for row in bf16 if row["module"] == "wide"):
        assert row["format"] == "bfloat16"
        assert row["level"] == pytest.approx(1e5 / BFLOAT16_MAX)
        assert row["of_normal"] == pytest.approx(1e5 / BFLOAT16_NORMAL)
    # float16 values measured against bfloat16 too, not against their own float16.
    assert _levels(bf16, "half") == pytest.approx([3e4 / BFLOAT16_MAX] * len(TABLED))
    # Without a format asked, each value against its own: float32's 1e5 is nowhere near.
    assert _levels(own, "wide") == pytest.approx([1e5 / 3.4028234663852886e38] * len(TABLED))
    assert {row["format"] for row in own if row["module"] == "half"} == {"float16"}


def test_the_table_is_ordered_nearest_to_overflow_first(
    dump: tuple[Path, tuple[int, int, int]],
) -> None:
    logdir, first_inf = dump
    with nanscope.open_dump(logdir) as r:
        own = headroom_table(r, first_inf)
        f16 = headroom_table(r, first_inf, "float16")
        bf16 = headroom_table(r, first_inf, "bfloat16")
    # By each module's level at the last step before the Inf, the level the report prints
    # ("peaked" came to 0.92 of float16's maximum at step 2, but is at 2 / 65,504 now).
    assert _modules(own) == ["half", "peaked", "wide"]  # 0.46, 3.1e-5, 2.9e-34
    assert _modules(f16) == ["wide", "half", "peaked"]  # 1.53, 0.46, 3.1e-5
    assert _modules(bf16) == ["wide", "half", "peaked"]  # 1e5, 3e4, 2 over one maximum
    # Every module is listed ahead of those whose level at that step is lower.
    for rows in (own, f16, bf16):
        last = {str(r["module"]): float(r["level"]) for r in rows}
        levels = [last[m] for m in _modules(rows)]
        assert levels == sorted(levels, reverse=True)
    # Each module's steps in order (the Inf's own step holds none of theirs).
    for rows in (own, f16, bf16):
        for module in MODULES:
            steps = [row["step"] for row in rows if row["module"] == module]
            assert steps == TABLED, (module, steps)


def test_the_analysis_carries_the_asked_format_into_the_table(
    dump: tuple[Path, tuple[int, int, int]],
) -> None:
    logdir, first_inf = dump
    with nanscope.open_dump(logdir) as r:
        h = analyze_headroom(r, "float16", first_inf)
        expected = headroom_table(r, first_inf, "float16")
    assert h is not None and h.target == "float16" and h.before_step == INF_STEP
    assert h.before_inf == expected
    assert _modules(h.before_inf)[0] == "wide"


def test_an_unknown_format_is_refused(dump: tuple[Path, tuple[int, int, int]]) -> None:
    logdir, first_inf = dump
    with nanscope.open_dump(logdir) as r, pytest.raises(ValueError, match="unknown format"):
        headroom_table(r, first_inf, "float13")
