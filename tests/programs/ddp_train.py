"""A tiny DDP training run (gloo, CPU) recorded by nanscope; one rank makes -inf at one step.

Started by torchrun: ``ddp_train.py LOGDIR BAD_RANK BAD_STEP STEPS``. Every rank
trains the same model on its own batches; at step ``BAD_STEP`` the batch of
rank ``BAD_RANK`` holds a zero, and the model's ``log`` makes -inf there (the
line marked ``# <- origin``). DDP's gradient allreduce then carries the
non-finite values to every other rank. Each rank prints one JSON line: its
rank, pid, the run id its writer chose, and the launcher's variables.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import nanscope


class LogFeatures(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = torch.log(x)  # <- origin
        out: torch.Tensor = self.fc(features)
        return out


def main() -> None:
    logdir, bad_rank, bad_step, steps = sys.argv[1], *map(int, sys.argv[2:5])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    session = nanscope.enable_dump_debug_info(logdir, "FULL_HEALTH", circular_buffer_size=-1)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(LogFeatures())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for step in range(steps):
        x = torch.rand(2, 4, generator=gen) + 0.5
        if rank == bad_rank and step == bad_step:
            x[1, 2] = 0.0  # a zero in this rank's data: log(0) = -inf
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    session.close()
    env = {k: os.environ.get(k) for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")}
    seen = {"rank": rank, "world": world, "pid": os.getpid(), "run_id": session.writer.run_id}
    sys.stdout.write(json.dumps({**seen, "env": env}) + "\n")  # one write: ranks share stdout
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
