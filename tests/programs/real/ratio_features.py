"""A model that turns raw counts into rates in its forward pass, in place through a view, then
regresses with an MLP trained with Adam.

    python ratio_features.py --steps 4      # one record has a duration of 0

``forward`` clones its input and divides the events column by the duration column in place
(``x[:, 0] /= x[:, 1]``: ``div_`` on a view of ``x``). A duration of 0 makes ``+inf`` in
``x``, the first ``Linear`` spreads it and the loss is NaN.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


class RateModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, counts: torch.Tensor) -> torch.Tensor:
        x = counts.clone()
        x[:, 0] /= x[:, 1]  # events per second
        return self.mlp(x)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = RateModel()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(args.steps):
        counts = torch.rand(8, 4, generator=gen) * 5 + 1
        if step == 2:
            counts[3, 1] = 0.0  # a session that lasted no time
        target = counts[:, 2:3]
        loss = nn.functional.mse_loss(model(counts), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
