"""Helpers shared by the benchmark scripts (imported as a sibling: ``python bench/x.py``)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def peak_rss_mib() -> float:
    """This process's peak resident memory (``ru_maxrss``), in MiB."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def source_state() -> str:
    """The commit measured, and whether src/ had uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"], cwd=root, capture_output=True, text=True
        ).stdout.split("\n")
    except OSError:
        return "unknown (no git)"
    changed = [ln[3:] for ln in dirty if ln.strip()]
    return f"git {head or '?'}" + (
        f" + uncommitted changes in {', '.join(changed)}" if changed else " (src/ clean)"
    )


def fmt_s(x: float | None) -> str:
    """Seconds for a table: 3 decimals below 10 s, "-" when not measured."""
    if x is None:
        return "-"
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def fmt_ratio(tf: float | None, ns: float | None) -> str:
    """TensorFlow's time over nanscope's, "-" when either is missing."""
    if tf is None or ns is None or ns <= 0:
        return "-"
    r = tf / ns
    return f"{r:,.0f}x" if r >= 100 else f"{r:.1f}x"
