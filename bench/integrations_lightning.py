"""Benchmark: what ``NanscopeCallback`` costs a Lightning fit, beside ``detect_anomaly``.

A Lightning fit of the seed tutorial's MLP (784-500-10, batch 100, generated
data, ``F.cross_entropy``, SGD) on one compute thread, measured three ways:

* **plain**: ``Trainer(...)`` alone, on batches made beforehand
  (``DataLoader(batches, batch_size=None)``);
* **callback**: with ``NanscopeCallback(logdir)`` (FULL_HEALTH, the default
  circular buffer of 1000), and with ``stop_on_harmful=True`` as well;
* **detect_anomaly**: ``Trainer(detect_anomaly=True)`` (PyTorch's anomaly
  mode around every training step), what Lightning offers for the same question;
* **loop**, **loop_recorded**: for reference, the same model and batches in a
  hand-written PyTorch loop without and with ``enable_dump_debug_info``
  (FULL_HEALTH): what recording costs without Lightning (ratio against ``loop``).

Method (as bench/overhead_torch.py): every fit runs in its own child process
(``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``; nanscope's writer thread may
use another core). Rounds are interleaved: in each round every variant runs once,
in a shuffled order. A fit runs ``--warmup`` steps, then ``--steps`` timed steps
(the time between one ``on_train_batch_start`` and the next, so Lightning's own
per-step work counts); a variant's ratio is the median over rounds of (its
median step time / plain's in the same round). CPU time (``time.process_time``,
all threads, so the writer's thread counts) is summed over the timed steps of
all rounds. The end-of-fit analysis (``nanscope.analysis.analyze``) is timed
separately: it runs once per fit, after the last step.

    .venv/bin/python bench/integrations_lightning.py                 # 5 rounds of 300 steps
    .venv/bin/python bench/integrations_lightning.py --rounds 3 --steps 100   # quick
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import tempfile
import time
from typing import Any

from harness import (
    ONE_THREAD_ENV,
    ChildFailed,
    fmt_ratio,
    log,
    machine,
    pin_torch_threads,
    run_child,
    source_state,
    table_head,
    table_row,
)

VARIANTS = ("plain", "callback", "callback_stop", "detect_anomaly", "loop", "loop_recorded")
# What each variant's ratio is taken against (the loops: a reference without Lightning).
BASELINE = {v: "loop" if v.startswith("loop") else "plain" for v in VARIANTS}


def fit_child(cfg: dict[str, Any]) -> dict[str, Any]:
    """One fit of ``cfg["variant"]``: its step times and CPU time over the timed steps."""
    torch = pin_torch_threads()
    import lightning.pytorch as pl
    from torch import nn
    from torch.nn import functional as F
    from torch.utils.data import DataLoader

    from nanscope.integrations.lightning import NanscopeCallback

    warmup, steps, variant = cfg["warmup"], cfg["steps"], cfg["variant"]

    class MLP(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(784, 500), nn.Linear(500, 10)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return F.cross_entropy(self.fc2(torch.relu(self.fc1(x))), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Clock(pl.Callback):
        """Times each step, from one batch's start to the next's."""

        def __init__(self) -> None:
            self.walls: list[float] = []
            self.cpus: list[float] = []

        def on_train_batch_start(self, *args: Any) -> None:
            self.walls.append(time.perf_counter())
            self.cpus.append(time.process_time())

    if variant.startswith("loop"):
        return loop_child(cfg)
    gen = torch.Generator().manual_seed(0)
    # Batches made beforehand: a DataLoader collating samples in this process would add
    # two indexing ops per sample to every step (recorded like any op; with workers,
    # collation runs in their processes).
    batches = [
        (torch.rand(100, 784, generator=gen), torch.randint(0, 10, (100,), generator=gen))
        for _ in range(warmup + steps + 2)
    ]
    clock = Clock()
    callbacks: list[Any] = [clock]
    logdir = tempfile.mkdtemp(prefix="nanscope-bench-lightning-")
    if variant.startswith("callback"):
        callbacks.append(NanscopeCallback(logdir, stop_on_harmful=variant == "callback_stop"))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=warmup + steps + 1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        detect_anomaly=variant == "detect_anomaly",
        callbacks=callbacks,
    )
    started = time.perf_counter()
    trainer.fit(MLP(), DataLoader(batches, batch_size=None))
    fit_s = time.perf_counter() - started
    walls = clock.walls[warmup:]  # steps+2 starts: the timed steps lie between them
    cpus = clock.cpus[warmup:]
    step_times = [b - a for a, b in itertools.pairwise(walls)][:steps]
    after_last_step = time.perf_counter() - clock.walls[-1]  # the last step + the fit's end
    return {
        "median_step_s": statistics.median(step_times),
        "cpu_s": cpus[min(steps, len(cpus) - 1)] - cpus[0],
        "fit_s": fit_s,
        "end_s": after_last_step,
    }


def loop_child(cfg: dict[str, Any]) -> dict[str, Any]:
    """The same model and batches in a hand-written PyTorch loop, ``enable_dump_debug_info``
    around it or not: what recording costs without Lightning, for reference."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    import nanscope

    warmup, steps = cfg["warmup"], cfg["steps"]
    gen = torch.Generator().manual_seed(0)
    batches = [
        (torch.rand(100, 784, generator=gen), torch.randint(0, 10, (100,), generator=gen))
        for _ in range(warmup + steps + 2)
    ]
    fc1, fc2 = nn.Linear(784, 500), nn.Linear(500, 10)
    opt = torch.optim.SGD([*fc1.parameters(), *fc2.parameters()], lr=0.01)
    session = None
    if cfg["variant"] == "loop_recorded":
        session = nanscope.enable_dump_debug_info(
            tempfile.mkdtemp(prefix="nanscope-bench-lightning-")
        )
    walls, cpus = [], []
    for x, y in batches:
        walls.append(time.perf_counter())
        cpus.append(time.process_time())
        opt.zero_grad()
        F.cross_entropy(fc2(torch.relu(fc1(x))), y).backward()
        opt.step()
    ended = time.perf_counter()
    if session is not None:
        session.close()
    walls, cpus = walls[warmup:], cpus[warmup:]
    return {
        "median_step_s": statistics.median(b - a for a, b in itertools.pairwise(walls)),
        "cpu_s": cpus[min(steps, len(cpus) - 1)] - cpus[0],
        "end_s": time.perf_counter() - ended,
    }


CHILDREN = {"fit": fit_child}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    args = ap.parse_args(argv)
    rng = random.Random(0)
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        order = list(VARIANTS)
        rng.shuffle(order)
        for variant in order:
            log(f"round {r + 1}/{args.rounds}: {variant}")
            cfg = {"variant": variant, "steps": args.steps, "warmup": args.warmup}
            try:
                results[variant].append(
                    run_child("integrations_lightning", "fit", cfg, env=ONE_THREAD_ENV, timeout=900)
                )
            except ChildFailed as exc:
                exc.exit()
    print(f"\n{machine()}; {source_state()}; {args.rounds} rounds of {args.steps} steps")
    print(
        "\n".join(
            table_head(
                [
                    "variant",
                    "median step (ms)",
                    "wall ratio",
                    "CPU ratio",
                    "after the last step (s)",
                    "against",
                ]
            )
        )
    )
    for variant in VARIANTS:
        mine, plain = results[variant], results[BASELINE[variant]]
        ratios = [m["median_step_s"] / p["median_step_s"] for m, p in zip(mine, plain, strict=True)]
        cpu = sum(m["cpu_s"] for m in mine) / sum(p["cpu_s"] for p in plain)
        step_ms = statistics.median(m["median_step_s"] for m in mine) * 1e3
        end_s = statistics.median(m["end_s"] for m in mine)
        print(
            table_row(
                [
                    variant,
                    f"{step_ms:.2f}",
                    fmt_ratio(statistics.median(ratios), 1.0, ".2f"),
                    fmt_ratio(cpu, 1.0, ".2f"),
                    f"{end_s:.2f}",
                    BASELINE[variant],
                ]
            )
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
