"""Benchmark: what ``NanscopeCallback`` costs a Hugging Face ``Trainer`` step.

The tiny GPT-2 of tests/integration/test_hf_trainer.py (a config: 2 layers, width 32,
64 tokens, sequences of 16, batch 8; nothing downloaded), trained by
``transformers.Trainer`` on the CPU, in these variants:

* ``plain``: the Trainer alone;
* ``nanscope``: with ``NanscopeCallback(logdir)`` (FULL_HEALTH, circular buffer 1000);
* ``nanscope+stop``: the same with ``stop_on_harmful=True`` (one fused finiteness check
  of the gradients per step);
* ``underflow_overflow``: the Trainer's own ``debug="underflow_overflow"``
  (``transformers.debug_utils.DebugUnderflowOverflow``: forward hooks on every module),
  what users reach for today.

Method, as bench/overhead_torch.py: every run is a fresh child process with one compute
thread; in each round every variant runs once, in a shuffled order. A run trains
``--warmup`` steps, then ``--steps`` timed ones; a callback takes the time of each step
(``on_step_begin`` to ``on_step_end``). A variant's ratio is the median over rounds of
(its median step time / plain's in the same round). ``end s`` is the time from the
last step's end to ``trainer.train()`` returning: for nanscope, closing the dump and
analysing it; ``CPU`` is the child's whole process time (all threads: nanscope's writer
thread counts) per timed step, over all rounds.

    .venv/bin/python bench/integrations_transformers.py              # 3 rounds, 40 steps
    .venv/bin/python bench/integrations_transformers.py --rounds 5 --n-embd 128 --n-layer 4
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import (
    ONE_THREAD_ENV,
    ChildFailed,
    fmt_ratio,
    log,
    machine,
    pin_torch_threads,
    run_child,
    source_line,
    source_state,
    table_head,
    table_row,
)

VARIANTS = ("plain", "nanscope", "nanscope+stop", "underflow_overflow")


def train(cfg: dict[str, Any]) -> dict[str, Any]:
    """One Trainer run of ``cfg["variant"]``: its step times and its end."""
    torch = pin_torch_threads()
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    variant, steps = cfg["variant"], cfg["warmup"] + cfg["steps"]
    config = GPT2Config(
        n_layer=cfg["n_layer"],
        n_head=2,
        n_embd=cfg["n_embd"],
        vocab_size=64,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    gen = torch.Generator().manual_seed(0)
    start = torch.randint(0, 64, (8 * steps, 1), generator=gen)
    stride = torch.randint(1, 4, (8 * steps, 1), generator=gen)
    rows = (start + stride * torch.arange(16)) % 64
    data = [{"input_ids": r, "labels": r} for r in rows]

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.times: list[float] = []
            self.t0 = self.last_end = 0.0

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            self.last_end = time.perf_counter()
            self.times.append(self.last_end - self.t0)

    timer = StepTimer()
    callbacks: list[Any] = [timer]
    if variant.startswith("nanscope"):
        from nanscope.integrations.transformers import NanscopeCallback

        # First: its on_step_begin (set_step) runs before the timer starts, as it is cheap.
        callbacks.insert(
            0, NanscopeCallback(cfg["logdir"], stop_on_harmful=variant.endswith("stop"))
        )
    args = TrainingArguments(
        output_dir=cfg["logdir"] + "-trainer",
        max_steps=steps,
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        logging_steps=10,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        debug="underflow_overflow" if variant == "underflow_overflow" else "",
    )
    trainer = Trainer(
        model=GPT2LMHeadModel(config), args=args, train_dataset=data, callbacks=callbacks
    )
    cpu0 = time.process_time()
    trainer.train()
    end = time.perf_counter()
    timed = timer.times[cfg["warmup"] :]
    return {
        "step_s": statistics.median(timed),
        "cpu_per_step_s": (time.process_time() - cpu0) / steps,
        "end_s": end - timer.last_end,
        "global_step": trainer.state.global_step,
    }


CHILDREN = {"train": train}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--n-embd", type=int, default=32)
    parser.add_argument("--n-layer", type=int, default=2)
    args = parser.parse_args(argv)
    start = source_state()
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = list(VARIANTS)
            random.shuffle(order)
            for v in order:
                cfg = {
                    "variant": v,
                    "steps": args.steps,
                    "warmup": args.warmup,
                    "n_embd": args.n_embd,
                    "n_layer": args.n_layer,
                    "logdir": str(Path(tmp) / f"{v}-{r}"),
                }
                try:
                    res = run_child(
                        "integrations_transformers", "train", cfg, env=ONE_THREAD_ENV, timeout=900
                    )
                except ChildFailed as exc:
                    exc.exit()
                log(f"round {r + 1}/{args.rounds} {v}: {res['step_s'] * 1e3:.1f} ms/step")
                results[v].append(res)
    plain = results["plain"]
    print(
        f"Machine: {machine()}. GPT-2 n_layer={args.n_layer} n_embd={args.n_embd}, "
        f"batch 8 x 16 tokens, Trainer on the CPU, one compute thread; {args.rounds} rounds "
        f"x {args.steps} timed steps (after {args.warmup})."
    )
    print(source_line(start, source_state()))
    print()
    print(
        "\n".join(
            table_head(
                ["variant", "step ms (median)", "step ratio", "CPU ms/step", "CPU ratio", "end s"]
            )
        )
    )
    for v in VARIANTS:
        rs = results[v]
        ratio = statistics.median(a["step_s"] / b["step_s"] for a, b in zip(rs, plain, strict=True))
        cpu = sum(a["cpu_per_step_s"] for a in rs) / len(rs)
        cpu_plain = sum(a["cpu_per_step_s"] for a in plain) / len(plain)
        print(
            table_row(
                [
                    f"`{v}`",
                    f"{statistics.median(a['step_s'] for a in rs) * 1e3:.1f}",
                    f"{ratio:.1f}x",
                    f"{cpu * 1e3:.1f}",
                    fmt_ratio(cpu, cpu_plain),
                    f"{statistics.median(a['end_s'] for a in rs):.2f}",
                ]
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
