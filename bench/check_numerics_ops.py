"""Benchmark: what check_numerics adds to each op, native checker against the Python mode.

Runs a chain of small ops (``z = z * 0.5 + y`` on 16-element tensors, so an
op's own work is small and the checker's share shows) plain, under the native
checker and under the Python dispatch-mode checker, interleaved round by round
in one process, and prints the median time per op of each and what each
checker adds. A second table runs a small attention model whose ``-inf`` mask
buffer is held for the whole run (the case where the checker must watch
storages), one training step at a time.

    PYTHONPATH=src .venv/bin/python bench/check_numerics_ops.py
    PYTHONPATH=src .venv/bin/python bench/check_numerics_ops.py --rounds 15
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import nanscope

CHAIN = 2000  # iterations of the chain; two ops each


def _chain() -> Callable[[], Any]:
    x, y = torch.randn(16), torch.randn(16)

    def run() -> Any:
        z = x
        for _ in range(CHAIN):
            z = z * 0.5 + y
        return z

    return run


class _MaskedAttention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(32, 96)
        self.out = torch.nn.Linear(32, 32)
        self.register_buffer("mask", torch.full((16, 16), float("-inf")).triu(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, -1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(32) + self.get_buffer("mask")
        loss: torch.Tensor = self.out(torch.softmax(scores, -1) @ v).pow(2).mean()
        return loss


def _attention() -> Callable[[], Any]:
    torch.manual_seed(0)
    model = _MaskedAttention()  # made while checking: its mask is a storage holding -inf
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    x = torch.randn(8, 16, 32)

    def run() -> Any:
        opt.zero_grad()
        model(x).backward()
        opt.step()

    return run


def _checking(kind: str) -> Callable[[], None]:
    """Turn checking on (``native`` or ``python``); returns what turns it off."""
    if kind == "plain":
        return lambda: None
    if kind == "python":
        os.environ["NANSCOPE_TORCH_RECORDER"] = "python"
    try:
        nanscope.enable_check_numerics()
    finally:
        os.environ.pop("NANSCOPE_TORCH_RECORDER", None)
    return nanscope.disable_check_numerics


def measure(make: Callable[[], Callable[[], Any]], rounds: int, repeat: int) -> dict[str, float]:
    """Median seconds of ``repeat`` calls, per variant, the variants interleaved each round."""
    times: dict[str, list[float]] = {"plain": [], "native": [], "python": []}
    for _ in range(rounds):
        for kind in times:
            off = _checking(kind)
            try:
                run = make()
                run()  # warm-up: first ops and stacks
                start = time.perf_counter()
                for _ in range(repeat):
                    run()
                times[kind].append((time.perf_counter() - start) / repeat)
            finally:
                off()
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    chain = measure(_chain, args.rounds, 1)
    per_op = {k: v / (2 * CHAIN) * 1e6 for k, v in chain.items()}
    print(f"check_numerics per op ({2 * CHAIN} ops on 16 elements, {args.rounds} rounds)\n")
    print("| variant | us per op (median) | added per op |")
    print("|---|---|---|")
    for kind, us in per_op.items():
        print(f"| {kind} | {us:.2f} | {us - per_op['plain']:+.2f} |")
    steps = measure(_attention, args.rounds, 20)
    print("\nattention training step with a -inf mask buffer held all run (20 steps a round)\n")
    print("| variant | step ms (median) | ratio |")
    print("|---|---|---|")
    for kind, sec in steps.items():
        print(f"| {kind} | {sec * 1e3:.2f} | {sec / steps['plain']:.2f}x |")


if __name__ == "__main__":
    main()
