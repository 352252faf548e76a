"""A tabular regression whose ``Dataset`` log-transforms some feature columns in place, fed by a
``DataLoader`` into an MLP trained with SGD.

    python dataset_log_features.py --steps 4                # some rows hold a 0 in a logged column
    python dataset_log_features.py --steps 4 --no-zeros     # every logged value is positive
    python dataset_log_features.py --steps 4 --workers 2    # two DataLoader worker processes

``__getitem__`` copies a row and writes ``log`` of its first columns back into it through a
view (``x[:4] = torch.log(x[:4])``). A 0 there becomes ``-inf`` in the row; the
``DataLoader``'s collate stacks the rows into the batch, the model's first ``Linear``
spreads the ``-inf`` and the loss is NaN.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class LogFeatures(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Rows of ``features``; the first ``logged`` columns are log-transformed on the way out."""

    def __init__(self, features: torch.Tensor, targets: torch.Tensor, logged: int = 4) -> None:
        self.features = features
        self.targets = targets
        self.logged = logged

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.features[i].clone()
        x[: self.logged] = torch.log(x[: self.logged])
        return x, self.targets[i]


def make_data(n: int, zeros: bool) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    features = torch.rand(n, 8, generator=gen) * 10 + 0.5
    if zeros:
        features[n // 2, 1] = 0.0  # a counter that was 0 for one record
    targets = features[:, 4:].sum(dim=1, keepdim=True)
    return features, targets


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--no-zeros", action="store_true")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader's num_workers")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    batch = 8
    features, targets = make_data(args.steps * batch, zeros=not args.no_zeros)
    loader = DataLoader(
        LogFeatures(features, targets), batch_size=batch, shuffle=False, num_workers=args.workers
    )
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step, (x, y) in enumerate(loader):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
