"""A classifier on log-intensities (an MLP with BatchNorm, Adam) that trains well until one
batch holds a dead sensor's reading of 0: ``log`` makes it -inf, and the loss NaN.

    python mlp_late.py --steps 300                    # healthy
    python mlp_late.py --steps 300 --poison-at 250    # step 250's batch holds a 0
    python mlp_late.py ... --sentinel LOGDIR --on-nan skip   # each step through nanscope's
                                                             # sentinel, the bad batch skipped
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn


def make_data(n: int, n_in: int, n_classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positive intensities: exp of Gaussian blobs, one per class."""
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(n_classes, n_in, generator=gen)
    y = torch.randint(0, n_classes, (n,), generator=gen)
    x = torch.exp(centers[y] + 0.5 * torch.randn(n, n_in, generator=gen))
    return x, y


def main(argv: list[str] | None = None) -> nn.Module:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--poison-at", type=int, default=None, metavar="STEP")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sentinel", metavar="LOGDIR", help="check each step with a Sentinel")
    parser.add_argument("--on-nan", choices=["stop", "skip"], default="stop")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    x_all, y_all = make_data(args.steps * args.batch, 16, 4, args.seed)
    model = nn.Sequential(
        nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        features = torch.log(x)  # a reading of 0 makes -inf
        loss = F.cross_entropy(model(features), y)
        loss.backward()
        optimizer.step()
        return loss

    run = train_step
    sentinel = None
    if args.sentinel:
        from nanscope.sentinel import Sentinel

        sentinel = Sentinel(args.sentinel, model=model, optimizer=optimizer, on_nan=args.on_nan)

        def run(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return sentinel.step(train_step, x, y)

    try:
        for step in range(args.steps):
            x = x_all[step * args.batch : (step + 1) * args.batch].clone()
            y = y_all[step * args.batch : (step + 1) * args.batch]
            if step == args.poison_at:
                x[3, 5] = 0.0  # the dead sensor
            loss = run(x, y)
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    finally:
        if sentinel is not None:
            sentinel.close()
    return model


if __name__ == "__main__":
    main()
