"""How bench/overhead_torch.py times its variants: interleaved rounds, ratios to plain steps."""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from overhead_models import Step

# switch(variant, logdir): a context manager that has the variant on while it is entered.
Switch = Callable[[str, Path], AbstractContextManager[Any]]


def time_steps(step: Step, k: int) -> tuple[list[float], float, float]:
    """K steps: per-step wall seconds, process CPU and main-thread CPU seconds per step."""
    import gc

    gc.collect()
    walls = []
    c0 = time.process_time()
    m0 = time.thread_time()
    for _ in range(k):
        t0 = time.perf_counter()
        step()
        walls.append(time.perf_counter() - t0)
    return walls, (time.process_time() - c0) / k, (time.thread_time() - m0) / k


def interleave(
    variants: list[str],
    rounds: int,
    steps: int,
    warmup: int,
    switch: Switch,
    step: Step,
    label: str,
) -> dict[str, Any]:
    """Rounds of all variants in a shuffled order; per-round medians and CPU totals."""
    import random
    import shutil

    per: dict[str, dict[str, list[float]]] = {
        v: {
            "wall": [],
            "mean": [],
            "p99": [],
            "max": [],
            "cpu": [],
            "main_cpu": [],
            "ops_per_step": [],
        }
        for v in variants
    }
    root = Path(tempfile.mkdtemp(prefix=f"nanscope-bench-{label}-"))
    try:
        for r in range(rounds):
            order = list(variants)
            random.Random(1000 + r).shuffle(order)
            for v in order:
                logdir = root / f"{v}-r{r}"
                with switch(v, logdir) as sw:
                    for _ in range(warmup):
                        step()
                    walls, cpu, main_cpu = time_steps(step, steps)
                per[v]["wall"].append(statistics.median(walls))
                per[v]["mean"].append(statistics.mean(walls))
                # The 99th percentile step: the stalls a long run feels (flushes, GIL waits).
                per[v]["p99"].append(sorted(walls)[min(len(walls) - 1, int(0.99 * len(walls)))])
                per[v]["max"].append(max(walls))
                per[v]["cpu"].append(cpu)
                per[v]["main_cpu"].append(main_cpu)
                executions = getattr(sw, "executions", 0)
                if executions:
                    per[v]["ops_per_step"].append(executions / (warmup + steps))
                shutil.rmtree(logdir, ignore_errors=True)
            line = "  ".join(f"{v}={per[v]['wall'][-1] * 1e3:.1f}" for v in variants)
            print(f"[{label}] round {r + 1}/{rounds} ms: {line}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return summarize(per)


def summarize(per: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """Each variant's figures, its ratios taken to ``plain`` round by round."""
    plain = per["plain"]
    out: dict[str, Any] = {}
    for v, d in per.items():
        ratios = [w / p for w, p in zip(d["wall"], plain["wall"], strict=True)]
        means = [w / p for w, p in zip(d["mean"], plain["mean"], strict=True)]
        p99s = [w / p for w, p in zip(d["p99"], plain["p99"], strict=True)]
        out[v] = {
            "step_p99_ms": statistics.median(d["p99"]) * 1e3,
            "ratio_p99": statistics.median(p99s),
            "step_max_ms": max(d["max"]) * 1e3,
            # Mean step over mean plain step, median over rounds: what a long run's
            # throughput sees, periodic stalls (flushes, GIL waits) included.
            "ratio_mean": statistics.median(means),
            "step_mean_ms": statistics.median(d["mean"]) * 1e3,
            "step_ms": statistics.median(d["wall"]) * 1e3,
            "ratio_wall": statistics.median(ratios),
            "ratio_wall_min": min(ratios),
            "ratio_wall_max": max(ratios),
            "ratio_cpu": sum(d["cpu"]) / sum(plain["cpu"]),
            "ratio_main_cpu": sum(d["main_cpu"]) / sum(plain["main_cpu"]),
            "cpu_ms": statistics.mean(d["cpu"]) * 1e3,
            "main_cpu_ms": statistics.mean(d["main_cpu"]) * 1e3,
            "main_cpu_min_ms": min(d["main_cpu"]) * 1e3,
            "other_cpu_min_ms": min(c - m for c, m in zip(d["cpu"], d["main_cpu"], strict=True))
            * 1e3,
            "ops_per_step": statistics.mean(d["ops_per_step"]) if d["ops_per_step"] else None,
            "rounds_wall_ms": [w * 1e3 for w in d["wall"]],
        }
    return out
