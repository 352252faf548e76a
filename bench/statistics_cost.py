"""Benchmark: what statistics mode (statistics=True) costs beside FULL_HEALTH and a plain step.

Statistics mode records, per float output, its mean, standard deviation, L2 norm
and a hash of its bits (nanscope.format.statistics), in the same pass machinery as
FULL_HEALTH's counts. Three variants, each a fresh session on the same model:

* ``plain``: the training step alone;
* ``FULL_HEALTH``: ``enable_dump_debug_info(logdir, "FULL_HEALTH")`` (circular buffer 1000);
* ``FULL_HEALTH+statistics``: the same with ``statistics=True``.

Two models (bench/overhead_models.py): the seed tutorial's 784-500-10 MLP (batch
100, SGD) and ``nn.TransformerEncoder`` of 4 layers (d_model 256, 4 heads,
feed-forward 1024, dropout 0.1) with an embedding of 1000 tokens and a linear head,
batch ``--transformer-batch`` (default 16) of 128 tokens, SGD.

Method (the machine is shared and noisy), as bench/overhead_torch.py: one child
process per model with one compute thread; rounds in which every variant, in a
shuffled order, is switched on, warmed up, timed for K steps and switched off
(bench/overhead_timing.py). A variant's ratio is the median over rounds of its median
step over plain's median step in the same round; ``vs FULL_HEALTH`` is the same
against FULL_HEALTH's. The recorder is the one a session picks (the native one
where it builds; ``NANSCOPE_TORCH_RECORDER=python`` for the other).

    PYTHONPATH=src .venv/bin/python -m bench statistics_cost            # ~5 min
    PYTHONPATH=src .venv/bin/python -m bench statistics_cost --quick    # smoke run
    NANSCOPE_TORCH_RECORDER=python PYTHONPATH=src .venv/bin/python -m bench statistics_cost
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness import (
    ONE_THREAD_ENV,
    ChildFailed,
    log,
    machine,
    pin_torch_threads,
    run_child,
    source_line,
    source_state,
    table_head,
    table_row,
)

VARIANTS = ("plain", "FULL_HEALTH", "FULL_HEALTH+statistics")
MODELS = ("mlp", "transformer")


# -- the child's side -------------------------------------------------------------------------


@contextlib.contextmanager
def switch(variant: str, logdir: Path) -> Iterator[None]:
    """The variant on while entered: nothing, or a recording session."""
    if variant == "plain":
        yield
        return
    import nanscope

    with nanscope.enable_dump_debug_info(
        logdir,
        "FULL_HEALTH",
        circular_buffer_size=1000,
        statistics=variant == "FULL_HEALTH+statistics",
    ):
        yield


def child_time(cfg: dict[str, Any]) -> dict[str, Any]:
    """Interleaved rounds of every variant on one model (bench/overhead_timing.py)."""
    from overhead_models import torch_model
    from overhead_timing import interleave

    torch = pin_torch_threads()
    step = torch_model(torch, cfg)
    per = interleave(
        list(cfg["variants"]), cfg["rounds"], cfg["steps"], cfg["warmup"], switch, step,
        cfg["model"],
    )  # fmt: skip
    recorder = "python" if os.environ.get("NANSCOPE_TORCH_RECORDER") == "python" else "native"
    if recorder == "native":
        from nanscope.backends.torch.native import native_library

        recorder = "native" if native_library() is not None else "python"
    return {"recorder": recorder, "variants": per}


CHILDREN = {"time": child_time}


# -- the parent's side ------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench statistics_cost", description=(__doc__ or "").split("\n\n")[0]
    )
    ap.add_argument("--models", default=",".join(MODELS), help="mlp,transformer (default both)")
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds per model (default 5)")
    ap.add_argument("--mlp-steps", type=int, default=30, help="timed MLP steps (default 30)")
    ap.add_argument("--transformer-steps", type=int, default=5, help="default 5")
    ap.add_argument("--transformer-batch", type=int, default=16, help="default 16")
    ap.add_argument("--quick", action="store_true", help="2 rounds, few steps: a smoke run")
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r}; one of {', '.join(MODELS)}")
    rounds = 2 if args.quick else args.rounds
    steps = {
        "mlp": 10 if args.quick else args.mlp_steps,
        "transformer": 2 if args.quick else args.transformer_steps,
    }
    start = source_state()
    results: dict[str, dict[str, Any]] = {}
    for model in models:
        cfg = {
            "model": model,
            "batch": args.transformer_batch,
            "variants": list(VARIANTS),
            "rounds": rounds,
            "steps": steps[model],
            "warmup": 2,
        }
        log(f"{model}: {rounds} rounds of {steps[model]} steps")
        try:
            results[model] = run_child(
                "statistics_cost", "time", cfg, timeout=3600, env=ONE_THREAD_ENV,
                label=f"time {model}", capture_stderr=False,
            )  # fmt: skip
        except ChildFailed as exc:
            exc.exit()
    end = source_state()

    print()
    print(f"Machine: {machine()}; {source_line(start, end)}")
    print(f"Command: {' '.join(['python -m bench statistics_cost', *(argv or [])])}")
    print()
    head = ["model", "recorder", "variant", "step ms", "vs plain", "vs FULL_HEALTH", "CPU vs plain"]
    print("\n".join(table_head(head)))
    for model, res in results.items():
        per = res["variants"]
        full = per["FULL_HEALTH"]["rounds_wall_ms"]
        for v in VARIANTS:
            d = per[v]
            vs_full = statistics.median(
                w / f for w, f in zip(d["rounds_wall_ms"], full, strict=True)
            )
            print(
                table_row(
                    [
                        model,
                        res["recorder"],
                        v,
                        f"{d['step_ms']:.1f}",
                        f"{d['ratio_wall']:.2f}x",
                        f"{vs_full:.2f}x",
                        f"{d['ratio_cpu']:.2f}x",
                    ]
                )
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
