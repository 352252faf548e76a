"""A flax.linen digit classifier trained with optax that diverges late: a blank image, hundreds
of steps in.

``python jax_flax_late.py [--steps N] [--poison-step K] [--sentinel LOGDIR] [--on-nan stop|skip]``.
Each image is standardised inside the model, ``(x - mean) / std``, with no epsilon, as a
per-image standardisation written by hand often is. Training is healthy for hundreds of steps
(AdamW on a warmup-cosine schedule, a jitted step that returns the new parameters, the
optimizer state, the loss and the gradients); then batch K (300 by default) holds a blank image
(all zeros: a failed scan), whose std is 0: its pixels become 0/0 = NaN, and so do the loss,
the gradients and, through AdamW, every parameter. ``--poison-step -1``: no blank image, a
healthy run.

With ``--sentinel LOGDIR`` the loop runs each step through ``nanscope.sentinel.JaxSentinel``:
it stops at the bad step (``--on-nan stop``, and replays it recorded into
``LOGDIR/replay-step-K``) or skips it and trains on (``--on-nan skip``).

The tests import it for its pieces (``init``, ``batches``, ``train_step``, ``train``); run as a
program it trains and prints the losses every 50 steps.
"""

from __future__ import annotations

import argparse
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax  # type: ignore[import-untyped]

from nanscope.examples.data import synthetic_digits

SIDE = 14  # the digits, pooled from 28x28
POOL = 512  # distinct images, cycled through
BATCH = 16
POISON_STEP = 300


class Standardize(nn.Module):
    """Each image to zero mean and unit variance (no epsilon: a blank image is 0/0)."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        mean = x.mean(-1, keepdims=True)
        std = jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True))
        return (x - mean) / std  # <- late.div


class Classifier(nn.Module):
    hidden: int = 64

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = Standardize()(x)
        x = nn.relu(nn.Dense(self.hidden)(x))
        return nn.Dense(10)(x)


model = Classifier()
optimizer = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 3e-3, 50, 1000), weight_decay=1e-4)


def loss_fn(params: Any, images: jax.Array, labels: jax.Array) -> jax.Array:
    logits = model.apply({"params": params}, images)
    loss: jax.Array = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return loss


@jax.jit
def train_step(params: Any, opt_state: Any, images: jax.Array, labels: jax.Array) -> dict[str, Any]:
    loss, grads = jax.value_and_grad(loss_fn)(params, images, labels)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return {
        "params": optax.apply_updates(params, updates),
        "opt_state": opt_state,
        "loss": loss,
        "grads": grads,
    }


def _pool() -> tuple[np.ndarray, np.ndarray]:
    images, labels = synthetic_digits(POOL, seed=3)
    pooled = images.reshape(POOL, SIDE, 2, SIDE, 2).mean(axis=(2, 4)) / 255.0
    return pooled.reshape(POOL, SIDE * SIDE).astype(np.float32), labels.astype(np.int32)


def batches(steps: int, poison_step: int = POISON_STEP) -> list[tuple[jax.Array, jax.Array]]:
    """``steps`` batches of BATCH images, cycling through the pool; batch ``poison_step`` has a
    blank image (its image 5)."""
    images, labels = _pool()
    out = []
    for step in range(steps):
        at = (step * BATCH) % POOL
        x = images[at : at + BATCH].copy()
        if step == poison_step:
            x[5] = 0.0  # a failed scan: a blank image
        out.append((jnp.asarray(x), jnp.asarray(labels[at : at + BATCH])))
    return out


def init() -> tuple[Any, Any]:
    """The parameters and the optimizer state."""
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, SIDE * SIDE)))["params"]
    return params, optimizer.init(params)


def train(steps: int, poison_step: int = POISON_STEP) -> list[float]:
    """The plain loop (no nanscope): the loss of every step."""
    params, opt_state = init()
    losses = []
    for images, labels in batches(steps, poison_step):
        out = train_step(params, opt_state, images, labels)
        params, opt_state = out["params"], out["opt_state"]
        losses.append(float(out["loss"]))
    return losses


def train_with_sentinel(
    steps: int, logdir: str, on_nan: str = "stop", poison_step: int = POISON_STEP
) -> list[float]:
    """The same loop, each step through the sentinel."""
    from nanscope.sentinel._jax import JaxSentinel

    params, opt_state = init()
    losses = []
    with JaxSentinel(logdir, on_nan=on_nan) as sentinel:
        for images, labels in batches(steps, poison_step):
            out = sentinel.step(train_step, params, opt_state, images, labels)
            params, opt_state = out["params"], out["opt_state"]
            losses.append(float(out["loss"]))
    return losses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--poison-step", type=int, default=POISON_STEP)
    parser.add_argument("--sentinel", metavar="LOGDIR", default=None)
    parser.add_argument("--on-nan", choices=("stop", "skip"), default="stop")
    args = parser.parse_args()
    if args.sentinel:
        losses = train_with_sentinel(args.steps, args.sentinel, args.on_nan, args.poison_step)
    else:
        losses = train(args.steps, args.poison_step)
    for step in range(0, len(losses), 50):
        print(f"step {step}: loss {losses[step]:.4f}")
    print(f"last step {len(losses) - 1}: loss {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
