"""The standard mixed-precision recipe: ``torch.autocast`` in float16 plus
``torch.amp.GradScaler``, on a small MLP classifier with synthetic data.

    python amp_gradscaler.py                        # init scale 2**24: the first steps overflow
    python amp_gradscaler.py --init-scale 65536     # GradScaler's default scale

The scaled float16 gradients overflow on purpose while the scale is too high: GradScaler
finds the Inf/NaN in the gradients, skips ``optimizer.step()`` and halves the scale, until
the gradients fit. A healthy run: every step's Inf/NaN is handled.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, n_in: int, n_hidden: int, n_classes: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(n_in, n_hidden)
        self.fc2 = nn.Linear(n_hidden, n_hidden)
        self.head = nn.Linear(n_hidden, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.head(x)


def make_data(n: int, n_in: int, n_classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian blobs, one per class."""
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(n_classes, n_in, generator=gen) * 2
    y = torch.randint(0, n_classes, (n,), generator=gen)
    x = centers[y] + torch.randn(n, n_in, generator=gen)
    return x, y


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--init-scale", type=float, default=2.0**24)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    device = args.device
    x_all, y_all = make_data(args.steps * args.batch, 32, 10, args.seed)

    model = MLP(32, 64, 10).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler(device, init_scale=args.init_scale)

    for step in range(args.steps):
        x = x_all[step * args.batch : (step + 1) * args.batch].to(device)
        y = y_all[step * args.batch : (step + 1) * args.batch].to(device)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.float16):
            output = model(x)
            loss = loss_fn(output, y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        print(f"step {step} loss {loss.item():.4f} scale {scaler.get_scale():.0f}", flush=True)


if __name__ == "__main__":
    main()
