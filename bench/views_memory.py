"""Benchmark: the memory that recording adds to views that cost none.

An attention-mask pattern, ``w.expand(250000, 1024)`` (1 GB if it were
materialised), and an overlapping sliding window (``unfold``, 8x the elements of
its 1M-element base) are made three times, each run in a fresh child process:
plain, recorded in FULL_HEALTH with each PyTorch recorder, and under
check_numerics. Each cell is the peak resident memory the loop added (MiB,
``ru_maxrss`` after minus before).

    .venv/bin/python bench/views_memory.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from typing import Any

import harness

VIEWS = ("expand 250000x1024", "unfold 1M x8")
WAYS = ("plain", "native FULL_HEALTH", "python FULL_HEALTH", "check_numerics")


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    torch = harness.pin_torch_threads()
    import nanscope

    if cfg["view"].startswith("expand"):
        base = torch.randn(1, 1024)

        def make() -> Any:
            return base.expand(250_000, 1024)
    else:
        base = torch.randn(1 << 20)

        def make() -> Any:
            return base.unfold(0, 8, 1)

    def loop() -> None:
        for _ in range(3):
            view = make()
            view[:2].sum()

    loop()  # the first call's own allocations are not the recorder's
    before = harness.peak_rss_mib()
    way = cfg["way"]
    if way == "plain":
        loop()
    elif way == "check_numerics":
        nanscope.enable_check_numerics()
        loop()
        nanscope.disable_check_numerics()
    else:
        with nanscope.enable_dump_debug_info(tempfile.mkdtemp(), "FULL_HEALTH"):
            loop()
    return {"extra_mib": harness.peak_rss_mib() - before}


CHILDREN = {"views": child}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    state = harness.source_state()
    print(f"Machine: {harness.machine()}. {harness.source_line(state, state)}")
    print()
    print(harness.table_row(["view", *WAYS]))
    print(harness.table_row(["---", *(["---:"] * len(WAYS))]))
    for view in VIEWS:
        cells: list[str] = []
        for way in WAYS:
            recorder = way.split()[0] if "FULL_HEALTH" in way else "auto"
            env = {**harness.QUIET_ENV, "NANSCOPE_TORCH_RECORDER": recorder}
            harness.log(f"{view}: {way}")
            result = harness.run_child("views_memory", "views", {"view": view, "way": way}, env=env)
            cells.append(harness.fmt_mib(result["extra_mib"]))
        print(harness.table_row([view, *cells]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
