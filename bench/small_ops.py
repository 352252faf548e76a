"""Small-op programs under nanscope: per-op bookkeeping is the whole cost (issue 34).

Real programs made of tiny ops, from pytorch/examples (``bench/programs/``, on a
re-implemented CartPole-v1 since gym is not installed):

- ``reinforce``: ``reinforcement_learning/reinforce.py``, a 4-128-2 policy, one forward
  and a ``Categorical`` sample per environment step, one backward and Adam step per
  episode;
- ``actor_critic``: ``reinforcement_learning/actor_critic.py``, the same with a value
  head, and a per-step loop of ``value.item()`` and ``smooth_l1_loss`` in the update.

Each program runs in a child with one compute thread; its variants (plain, nanscope's
modes with the native and the Python recorder, ``check_numerics``, PyTorch's
``detect_anomaly``) take turns in rounds, in a shuffled order per round, each round of a
variant being whole episodes until ``--env-steps`` environment steps (after one untimed
episode) of a fresh program (the same seed for every variant of a round: the same
episodes, the first of training). A round's figure is wall time per environment step; ratios are paired (to
plain's figure of the same round), their median over rounds reported with their range.
The program runs under ``--depth`` extra Python frames (default 24), the depth of a
program started by ``nanscope run`` inside a small library's call, so that the stack
capture is measured under a realistic stack.

    python bench/small_ops.py                   # both programs, 1-3 minutes
    python bench/small_ops.py --quick           # a smoke run
    python bench/small_ops.py --programs reinforce --variants NO_TENSOR,FULL_HEALTH
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import (
    ONE_THREAD_ENV,
    ChildFailed,
    pin_torch_threads,
    run_child,
    source_state,
    table_head,
)

HERE = Path(__file__).resolve().parent
PROGRAMS = ("reinforce", "actor_critic")
VARIANTS = [
    "plain",
    "NO_TENSOR",
    "FULL_HEALTH",
    "check_numerics",
    "detect_anomaly",
    "python:NO_TENSOR",
    "python:FULL_HEALTH",
    "python:check_numerics",
]


def _under(depth: int, fn: Callable[[], Any]) -> Any:
    """``fn()`` called ``depth`` Python frames deeper."""
    if depth <= 0:
        return fn()
    return _under(depth - 1, fn)


def _make(program: str, seed: int) -> Any:
    sys.path.insert(0, str(HERE / "programs"))
    if program == "reinforce":
        from reinforce import Reinforce

        return Reinforce(seed)
    if program == "actor_critic":
        from actor_critic import ActorCritic

        return ActorCritic(seed)
    raise ValueError(f"unknown program {program!r}; choose from {PROGRAMS}")


def child_time(cfg: dict[str, Any]) -> dict[str, Any]:
    """One program's variants, interleaved: per variant, per-round figures."""
    torch = pin_torch_threads()
    from overhead_variants import TorchVariant

    seed = cfg.get("seed", 543)
    variants: list[str] = cfg["variants"]
    budget: int = cfg["env_steps"]
    depth: int = cfg["depth"]
    run = _make(cfg["program"], seed)
    for _ in range(cfg.get("warmup", 3)):  # plain episodes: imports, caches, allocator
        run.episode()

    def play(until: int) -> tuple[int, int, float, float, float]:
        episodes = steps = 0
        t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
        while steps < until:
            steps += run.episode()
            episodes += 1
        wall = time.perf_counter() - t0
        return episodes, steps, wall, time.process_time() - c0, time.thread_time() - m0

    per: dict[str, dict[str, list[float]]] = {
        v: {"wall": [], "cpu": [], "main": [], "ops": [], "episodes": []} for v in variants
    }
    root = Path(tempfile.mkdtemp(prefix="nanscope-small-ops-"))
    try:
        for r in range(cfg["rounds"]):
            order = list(variants)
            random.Random(2000 + r).shuffle(order)
            for v in order:
                logdir = root / f"{v.replace(':', '-')}-r{r}"
                # A fresh program with the same seed: every variant of a round runs the
                # same episodes (the first ones of training, short), so that the rounds
                # compare the same work, and the policy never learns to run 500 steps.
                run = _make(cfg["program"], seed + r)
                with TorchVariant(torch, v, logdir) as sw:
                    # One episode untimed: the session's first ops, and each op site's
                    # stack interned. Both calls come from one line, so that the timed
                    # episodes run under the same stacks (a training loop repeats its
                    # stacks for as long as it runs; a stack's first sight is a one-off).
                    played = [
                        _under(depth, functools.partial(play, until)) for until in (1, budget)
                    ]
                first = played[0][1]
                episodes, steps, wall, cpu, main = played[1]
                per[v]["wall"].append(wall / steps)
                per[v]["cpu"].append(cpu / steps)
                per[v]["main"].append(main / steps)
                per[v]["episodes"].append(episodes)
                if sw.executions:
                    per[v]["ops"].append(sw.executions / (first + steps))
                shutil.rmtree(logdir, ignore_errors=True)
            line = "  ".join(f"{v}={per[v]['wall'][-1] * 1e6:.0f}" for v in variants)
            print(f"[{cfg['program']}] round {r + 1} us/env step: {line}", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    plain = per["plain"]
    out: dict[str, Any] = {}
    for v, d in per.items():
        ratios = [w / p for w, p in zip(d["wall"], plain["wall"], strict=True)]
        out[v] = {
            "us_per_step": statistics.median(d["wall"]) * 1e6,
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "cpu_ratio": sum(d["cpu"]) / sum(plain["cpu"]),
            "main_cpu_us": statistics.median(d["main"]) * 1e6,
            "other_cpu_us": statistics.median(
                [c - m for c, m in zip(d["cpu"], d["main"], strict=True)]
            )
            * 1e6,
            "ops_per_step": statistics.median(d["ops"]) if d["ops"] else None,
        }
    return out


CHILDREN = {"time": child_time}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--programs", default=",".join(PROGRAMS))
    p.add_argument("--variants", default=",".join(VARIANTS[1:]), help="besides plain")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--env-steps", type=int, default=150, help="per variant and round")
    p.add_argument("--depth", type=int, default=24, help="extra Python frames under the program")
    p.add_argument("--quick", action="store_true", help="2 rounds of 60 environment steps")
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args(argv)
    variants = ["plain", *[v for v in args.variants.split(",") if v and v != "plain"]]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        sys.exit(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    rounds, env_steps = (2, 60) if args.quick else (args.rounds, args.env_steps)
    started = time.time()
    results: dict[str, Any] = {}
    for program in args.programs.split(","):
        cfg = {
            "program": program,
            "variants": variants,
            "rounds": rounds,
            "env_steps": env_steps,
            "depth": args.depth,
        }
        try:
            results[program] = run_child(
                "small_ops", "time", cfg, timeout=1200, env=ONE_THREAD_ENV, capture_stderr=False
            )
        except ChildFailed as exc:
            exc.exit()
    print(
        f"Small-op programs: {rounds} rounds x {env_steps} environment steps per variant "
        f"(whole episodes), interleaved, one thread, {args.depth} extra frames "
        f"({time.time() - started:.0f} s)"
    )
    print(f"{source_state()}  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    head = [
        "program",
        "variant",
        "ops/env step",
        "us/env step (median)",
        "wall ratio (min-max)",
        "CPU ratio",
        "main-thread CPU us",
        "other threads' CPU us",
    ]
    print("\n".join(table_head(head, numeric=False)))
    for program, res in results.items():
        for v in variants:
            r = res[v]
            ops = "" if r["ops_per_step"] is None else f"{r['ops_per_step']:.0f}"
            spread = "" if v == "plain" else f" ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})"
            print(
                f"| {program} | {v} | {ops} | {r['us_per_step']:.0f} | {r['ratio']:.2f}x{spread} "
                f"| {r['cpu_ratio']:.2f}x | {r['main_cpu_us']:.0f} | {r['other_cpu_us']:.0f} |"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
