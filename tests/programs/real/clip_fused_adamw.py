"""A rating model with a learned output noise, trained with gradient clipping and PyTorch's
fused AdamW (the Hugging Face ``Trainer``'s default optimizer); ``--foreach`` uses the
multi-tensor AdamW instead.

    python clip_fused_adamw.py --init-var 0.1   # trains
    python clip_fused_adamw.py                  # --init-var 0: NaN weights from step 0 on

The prediction is sampled with the reparameterisation trick (``mu + std * eps``, as in VAEs
and noisy networks), ``std = noise_var.clamp(min=0).sqrt()``. Started noiseless
(``noise_var = 0``), the derivative of ``sqrt`` at 0 is infinite: the first backward pass
gives ``noise_var`` a gradient of +-inf. ``clip_grad_norm_`` computes the total norm (inf),
scales every gradient by ``max_norm / inf = 0`` in place, and ``inf * 0`` is NaN; the fused
AdamW step then writes NaN into ``noise_var`` and its moments, and from the next step on
every prediction, gradient and weight is NaN.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class NoisyRater(nn.Module):
    """Embeds users and items, predicts a rating, and samples it with a learned noise."""

    def __init__(self, users: int, items: int, dim: int, init_var: float) -> None:
        super().__init__()
        self.users = nn.Embedding(users, dim)
        self.items = nn.Embedding(items, dim)
        self.head = nn.Sequential(nn.Linear(2 * dim, dim), nn.ReLU(), nn.Linear(dim, 1))
        self.noise_var = nn.Parameter(torch.full((1,), init_var))

    def forward(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        h = torch.cat([self.users(user), self.items(item)], dim=-1)
        mu = self.head(h).squeeze(-1)
        std = self.noise_var.clamp(min=0).sqrt()
        return mu + std * torch.randn_like(mu)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--init-var", type=float, default=0.0)
    parser.add_argument("--foreach", action="store_true", help="multi-tensor AdamW, not fused")
    parser.add_argument("--max-norm", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    users, items = 20, 30
    model = NoisyRater(users, items, 8, args.init_var)
    if args.foreach:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(args.seed)
    for step in range(args.steps):
        user = torch.randint(0, users, (args.batch_size,), generator=gen)
        item = torch.randint(0, items, (args.batch_size,), generator=gen)
        rating = torch.randint(1, 6, (args.batch_size,), generator=gen).float()
        optimizer.zero_grad()
        loss = F.mse_loss(model(user, item), rating)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
