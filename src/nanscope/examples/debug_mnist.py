"""The Debugger V2 tutorial's example, in PyTorch: an MLP whose training collapses into NaN.

A 784-500-10 MLP is trained with a hand-written cross-entropy,
``-mean(labels * log(softmax(logits)))``. With the tutorial's learning rate a
softmax probability underflows to exactly 0, ``log`` turns it into -inf, the
loss and then the weights become NaN, and the accuracy collapses to chance.
``--fix`` clips the probabilities (``log(clamp(probs, 1e-6, 1))``) and the
model trains properly.

    python -m nanscope.examples.debug_mnist --dump_dir /tmp/logdir
    nanscope report /tmp/logdir
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from nanscope.examples import data

INIT_STD = 0.25


def parse_args(
    argv: Sequence[str] | None = None, description: str | None = None
) -> argparse.Namespace:
    """The example's flags (the same in every framework's version); ``description``: the
    version's own first docstring line (default: this module's)."""
    p = argparse.ArgumentParser(description=description or __doc__.split("\n\n")[0])
    p.add_argument("--max_steps", type=int, default=10, help="training steps (default 10)")
    p.add_argument("--train_batch_size", type=int, default=100)
    p.add_argument(
        "--learning_rate", type=float, default=0.006,
        help="Adam's learning rate (default 0.006: high enough to make a probability "
        "underflow to 0 within a few steps)",
    )  # fmt: skip
    p.add_argument("--dump_dir", help="record a nanscope dump into this directory")
    p.add_argument("--dump_tensor_debug_mode", default="FULL_HEALTH")
    p.add_argument("--dump_circular_buffer_size", type=int, default=-1)
    p.add_argument("--check_numerics", action="store_true", help="raise at the first Inf/NaN")
    p.add_argument("--fix", action="store_true", help="clip the probabilities: trains properly")
    p.add_argument("--data", help="a local MNIST .npz (default: built-in synthetic digits)")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args(argv)
    if args.dump_dir and args.check_numerics:
        p.error("--dump_dir and --check_numerics are mutually exclusive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    import nanscope

    torch.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = data.load(args.data, seed=args.seed)
    x_train_t, y_train_t = torch.from_numpy(x_train), torch.from_numpy(y_train)
    x_test_t, y_test_t = torch.from_numpy(x_test), torch.from_numpy(y_test)

    if args.dump_dir:
        nanscope.enable_dump_debug_info(
            args.dump_dir,
            tensor_debug_mode=args.dump_tensor_debug_mode,
            circular_buffer_size=args.dump_circular_buffer_size,
        )
    if args.check_numerics:
        nanscope.enable_check_numerics()

    model = MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate)
    rng = np.random.default_rng(args.seed)
    for step in range(args.max_steps):
        idx = torch.from_numpy(rng.choice(len(x_train), args.train_batch_size, replace=False))
        x, labels = x_train_t[idx], torch.nn.functional.one_hot(y_train_t[idx], 10).float()
        probs = model(x)
        loss = cross_entropy(probs, labels, fix=args.fix)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            accuracy = (model(x_test_t).argmax(1) == y_test_t).float().mean().item()
        print(f"Accuracy at step {step}: {accuracy:.3f}")
    if args.dump_dir:
        nanscope.disable_dump_debug_info()
    return 0


def cross_entropy(probs: Any, labels: Any, fix: bool) -> Any:
    import torch

    if fix:
        probs = torch.clamp(probs, 1e-6, 1.0)
    return torch.mean(-(labels * torch.log(probs)))  # -inf where a probability is 0


def MLP() -> Any:
    import torch

    class _MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = torch.nn.Linear(784, 500)
            self.logits = torch.nn.Linear(500, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.hidden(x))
            return torch.softmax(self.logits(h), dim=1)

    model = _MLP()
    model.__class__.__name__ = "MLP"
    # Like the tutorial (truncated normal weights, 0.1 biases), with a wider
    # spread so that the built-in digits saturate the softmax the way MNIST
    # does with the tutorial's learning rate of 0.025.
    with torch.no_grad():
        for layer in (model.hidden, model.logits):
            torch.nn.init.trunc_normal_(layer.weight, std=INIT_STD, a=-2 * INIT_STD, b=2 * INIT_STD)
            layer.bias.fill_(0.1)
    return model


if __name__ == "__main__":
    sys.exit(main())
