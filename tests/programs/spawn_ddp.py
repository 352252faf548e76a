"""A tiny DDP training run launched from one script with ``torch.multiprocessing.spawn``.

``spawn_ddp.py PORT BAD_RANK BAD_STEP STEPS`` (``BAD_RANK`` -1: a healthy run). Written
the way such scripts are, with no nanscope in it: each worker sets up gloo with its rank
from ``spawn``'s index (no ``RANK`` in its environment), trains the same model on its own
batches, and at step ``BAD_STEP`` rank ``BAD_RANK``'s batch goes through ``sqrt`` of a
negative value (the line marked ``# <- origin``): NaN. DDP's gradient allreduce then
carries it to every other rank in the same step.

The oracle: where ``SPAWN_ORACLE_DIR`` is set (by the test only), each worker writes
``rank<R>.json`` there: its rank, its pid, and the op, step and line where it first made
NaN itself (checked with ``torch.isnan`` right after the op, no nanscope involved), or
none.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(x)
        return out


def worker(rank: int, world: int, port: int, bad_rank: int, bad_step: int, steps: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    made_nan: dict[str, Any] | None = None
    for step in range(steps):
        x = torch.rand(2, 4, generator=gen) + 0.5
        shift = 10.0 if (rank == bad_rank and step == bad_step) else 0.0
        x = torch.sqrt(x - shift)  # <- origin
        if made_nan is None and bool(torch.isnan(x).any()):
            made_nan = {"op": "sqrt", "step": step, "line": _origin_line()}
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    oracle = os.environ.get("SPAWN_ORACLE_DIR")
    if oracle:
        seen = {"rank": rank, "world": world, "pid": os.getpid(), "made_nan": made_nan}
        with open(os.path.join(oracle, f"rank{rank}.json"), "w") as f:
            json.dump(seen, f)
    dist.destroy_process_group()


def _origin_line() -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if line.rstrip().endswith("# <- origin"))


if __name__ == "__main__":
    port, bad_rank, bad_step, steps = map(int, sys.argv[1:5])
    world = 2
    spawn_args = (world, port, bad_rank, bad_step, steps)
    mp.spawn(worker, args=spawn_args, nprocs=world, join=True)  # type: ignore[attr-defined,no-untyped-call]
