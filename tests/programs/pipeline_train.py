"""A two-stage pipeline (gloo, CPU) recorded by nanscope; stage 1 makes -inf at one step.

Started by torchrun with 2 processes: ``pipeline_train.py LOGDIR BAD_STEP STEPS``.
Rank 0 holds the first stage and rank 1 the second, as model-parallel training
splits a model: rank 0 sends its activations to rank 1 (``dist.send``), rank 1
sends the gradient of its input back (``dist.recv`` on rank 0), and each rank
steps its own optimizer. At step ``BAD_STEP`` the batch holds a zero and rank
0's ``log`` makes -inf (the line marked ``# <- origin``); the send carries the
Inf/NaN to rank 1. Each rank prints one JSON line: its rank and pid.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import nanscope


def stage_one(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    features = torch.log(x)  # <- origin
    out: torch.Tensor = model(features)
    return out


def main() -> None:
    logdir, bad_step, steps = sys.argv[1], *map(int, sys.argv[2:4])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    session = nanscope.enable_dump_debug_info(logdir, "FULL_HEALTH", circular_buffer_size=-1)
    torch.manual_seed(rank)
    model = nn.Linear(8, 8) if rank == 0 else nn.Sequential(nn.Linear(8, 4), nn.Tanh())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(0)
    for step in range(steps):
        opt.zero_grad()
        if rank == 0:
            x = torch.rand(4, 8, generator=gen) + 0.5
            if step == bad_step:
                x[1, 3] = 0.0  # a zero in the batch: log(0) = -inf
            h = stage_one(model, x)
            dist.send(h.detach(), 1)  # activations to the next stage
            grad = torch.empty_like(h)
            dist.recv(grad, 1)  # the gradient of the next stage's input
            h.backward(grad)
        else:
            h = torch.empty(4, 8)
            dist.recv(h, 0)
            h.requires_grad_()
            loss = model(h).pow(2).mean()
            loss.backward()
            assert h.grad is not None
            dist.send(h.grad, 0)
        opt.step()
    session.close()
    sys.stdout.write(json.dumps({"rank": rank, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
