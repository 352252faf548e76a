"""A small MLP classifier trained under ``torch.compile`` with SGD, on synthetic data.

    python compiled_mlp.py --lr 0.1     # trains
    python compiled_mlp.py              # --lr 1e8: the second step's forward overflows

The model is ``torch.compile(model)`` (its forward and backward graphs compiled by
inductor); the loss and the optimizer run eagerly.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, n_in: int, hidden: int, n_out: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.fc1(x))
        h = F.relu(self.fc2(h))
        return self.head(h)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(args.seed)
    model = MLP(16, 32, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    compiled = torch.compile(model)
    for step in range(args.steps):
        x = torch.randn(args.batch, 16, generator=gen) * 10
        y = torch.randint(0, 4, (args.batch,), generator=gen)
        loss = F.cross_entropy(compiled(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
