"""A float16 model trained with a learning rate a little too high: the run diverges slowly.

    python fp16_divergence.py                 # diverges: float16 overflows after some hundreds of steps
    python fp16_divergence.py --lr-factor 0.5 # a stable learning rate: a healthy run

The model is cast to float16 whole (``model.half()``, as people do to halve its memory) and
trained with plain SGD on a regression task. The learning rate is set from the data: a
factor times the largest stable one for the last layer (2 / the largest eigenvalue of its
inputs' covariance). Above 1, the error grows by a few percent a step, so the outputs grow
geometrically until they pass float16's largest value, 65,504, and become Inf.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


class Regressor(nn.Module):
    def __init__(self, n_in: int, n_hidden: int) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(n_in, n_hidden), nn.Tanh())
        self.head = nn.Linear(n_hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x)).squeeze(-1)


def make_data(n: int, n_in: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, n_in, generator=gen)
    w = torch.randn(n_in, generator=gen)
    y = x @ w + 0.1 * torch.randn(n, generator=gen)
    return x, y


def stable_lr(model: Regressor, x: torch.Tensor) -> float:
    """2 / the largest eigenvalue of the head's inputs' second moment (gradient descent on a
    least-squares layer converges below this learning rate and diverges above it)."""
    with torch.no_grad():
        h = model.encoder(x.to(next(model.parameters()).dtype)).float()
        h1 = torch.cat([h, torch.ones(len(h), 1)], dim=1)  # the bias is a weight on a 1
        top = torch.linalg.eigvalsh(h1.T @ h1 / len(h1)).max().item()
    return 2.0 / (2.0 * top)  # the loss below is the mean squared error: its Hessian is 2 H


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr-factor", type=float, default=1.02)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    x, y = make_data(args.batch, 16, args.seed)
    model = Regressor(16, 32).half()
    lr = args.lr_factor * stable_lr(model, x)
    # Only the head is trained (a linear probe on a frozen encoder): its divergence rate is
    # the learning rate's factor over the stable one.
    for p in model.encoder.parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.SGD(model.head.parameters(), lr=lr)
    xh = x.half()
    for step in range(args.steps):
        optimizer.zero_grad()
        pred = model(xh)
        loss = ((pred.float() - y) ** 2).mean()  # the loss in float32, as people do
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.4g}")


if __name__ == "__main__":
    main()
