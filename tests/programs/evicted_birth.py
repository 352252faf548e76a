"""An Inf born early that is carried for many steps before it makes the first NaN.

    python evicted_birth.py [--steps 70] [--birth 10] [--nan 60]

A linear model trains with SGD. Before training, a gate ``1 / (1 + exp(200))`` overflows
in ``exp`` and the reciprocal absorbs it (benign). At step ``--birth`` the program adds
``exp(200)`` to a running statistic it keeps across steps: ``+inf``, born by ``exp`` and
carried by ``add`` (op types that the gate already made Inf with at step 0). From step ``--nan`` on, the statistic is centred (``state - state``: inf - inf =
NaN) and joins the loss.

Recorded with a small circular buffer (``nanscope run --circular-buffer-size 200``), the
birth is dropped: the writer keeps a window around the first Inf of each op type (step 0's
gate) and around the first NaN (step ``--nan``), and the last events, but not step
``--birth``. The report must still say harmful, name the earliest event kept that carries
the statistic's values, and say that the birth was dropped and in which steps.
"""

from __future__ import annotations

import argparse

import torch

BIG = 200.0  # exp(200) overflows float32


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=70)
    parser.add_argument("--birth", type=int, default=10)
    parser.add_argument("--nan", type=int, default=60)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    big = torch.full((4,), BIG)
    state = torch.zeros(4)  # a running statistic, kept across steps
    # Benign: 1/(1 + inf) = 0, once before training (the reciprocal absorbs the +inf).
    gate = torch.reciprocal(torch.add(torch.exp(big), 1.0))
    for step in range(args.steps):
        if step == args.birth:
            state = torch.add(state, torch.exp(big))  # <- birth: +inf kept in the statistic
        state = torch.add(state, gate)  # carried from step to step
        loss = torch.nn.functional.mse_loss(model(x), y)
        if step >= args.nan:
            loss = loss + (state - state).mean()  # <- first NaN: inf - inf
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
