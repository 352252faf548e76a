"""A tiny transformers Llama trained a few steps and recorded by nanscope: one run of a pair.

``diff_pairs.py LOGDIR [--steps N] [--autocast-bf16] [--compile] [--inject-bug LAYER]
[--statistics] [--ddp-corrupt RANK --corrupt-step S]``

Every run starts from the same weights (seed 0) and trains on the same batches, so two
runs differ only in what the flags change:

- ``--autocast-bf16``: the forward pass under CPU autocast to bfloat16;
- ``--compile``: the model under ``torch.compile`` (eager and compiled should agree);
- ``--inject-bug LAYER``: layer LAYER's MLP activation is scaled by 1.05, on the line
  marked ``# <- injected`` (the op a diff against a clean run must name);
- ``--ddp-corrupt RANK`` (under torchrun, gloo on CPU): every rank trains on the same
  batch, except RANK, whose batch at step ``--corrupt-step`` has its tokens shifted.

:func:`build` and :func:`batch` are the model and the data, for tests that run the
model themselves.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch

import nanscope

VOCAB, HIDDEN, LAYERS, SEQ, BATCH = 64, 32, 3, 8, 2
BUG_SCALE = 1.05


def build() -> Any:
    """The tiny Llama, seeded: the same weights in every run."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2 * SEQ,
    )
    config._attn_implementation = "eager"  # the same attention ops in every run
    return LlamaForCausalLM(config)


def batch(step: int) -> torch.Tensor:
    """The token ids of one step (the same in every run and on every rank)."""
    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)


def inject_bug(model: Any, layer: int) -> None:
    """Scale layer ``layer``'s MLP activation (the module path stays the same)."""
    act = model.model.layers[layer].mlp.act_fn
    original = act.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = original(x) * BUG_SCALE  # <- injected
        return out

    act.forward = forward


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("logdir")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--autocast-bf16", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--inject-bug", type=int, default=None, metavar="LAYER")
    p.add_argument("--statistics", action="store_true")
    p.add_argument("--ddp-corrupt", type=int, default=None, metavar="RANK")
    p.add_argument("--corrupt-step", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(1)
    rank = 0
    if args.ddp_corrupt is not None:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
    model = build()
    if args.inject_bug is not None:
        inject_bug(model, args.inject_bug)
    net: Any = model
    if args.ddp_corrupt is not None:
        net = torch.nn.parallel.DistributedDataParallel(model)
    if args.compile:
        net = torch.compile(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    session = nanscope.enable_dump_debug_info(
        args.logdir, "FULL_HEALTH", circular_buffer_size=-1, statistics=args.statistics
    )
    for step in range(args.steps):
        ids = batch(step)
        if rank == args.ddp_corrupt and step == args.corrupt_step:
            ids = (ids + 1) % VOCAB  # this rank's batch is corrupted
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast_bf16):
            loss = net(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    session.close()
    if args.ddp_corrupt is not None:
        import torch.distributed as dist

        dist.destroy_process_group()
    os.environ.pop("NANSCOPE_RUN_ID", None)


if __name__ == "__main__":
    main()
