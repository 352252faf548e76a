"""A tiny causal attention classifier in flax.nnx, its mask built when the model is made.

``python jax_nnx_eager_mask.py [--steps N]``. nnx modules are built eagerly: the attention
block makes its additive causal mask (0 on and below the diagonal, -inf above) in
``__init__`` with ``jnp.where`` and keeps it as a non-trainable variable. ``nnx.jit`` passes
it into every training step, where the softmax turns the -inf into zeros; ``nnx.Optimizer``
updates the parameters only. A healthy program: no NaN, the loss goes down.

The tests import it for its pieces (``Classifier``, ``batches``, ``train``) to evaluate the
same computation with an independent oracle; run as a program it only trains and prints.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax  # type: ignore[import-untyped]
from flax import nnx

VOCAB, SEQ, DIM, CLASSES = 10, 6, 8, 2


class Mask(nnx.Variable):  # type: ignore[type-arg]
    """A constant of the model (not a parameter: the optimizer leaves it alone)."""


class CausalAttention(nnx.Module):
    def __init__(self, dim: int, seq: int, rngs: nnx.Rngs) -> None:
        self.qkv = nnx.Linear(dim, 3 * dim, use_bias=False, rngs=rngs)
        self.out = nnx.Linear(dim, dim, rngs=rngs)
        allowed = jnp.tril(jnp.ones((seq, seq), dtype=bool))
        self.mask = Mask(jnp.where(allowed, 0.0, -jnp.inf))  # <- nnx.mask

    def __call__(self, x: jax.Array) -> jax.Array:
        q, k, v = jnp.split(self.qkv(x), 3, axis=-1)
        scores = q @ k.swapaxes(-1, -2) / np.sqrt(x.shape[-1])
        weights = jax.nn.softmax(scores + self.mask[...], axis=-1)  # <- nnx.softmax
        return self.out(weights @ v)


class Classifier(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(VOCAB, DIM, rngs=rngs)
        self.attention = CausalAttention(DIM, SEQ, rngs)
        self.head = nnx.Linear(DIM, CLASSES, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        h = self.embed(tokens)
        h = h + self.attention(h)
        return self.head(h[:, -1])  # the last position has seen the whole sequence


def batches(steps: int, batch: int = 4) -> list[tuple[jax.Array, jax.Array]]:
    """Sequences labelled by whether their last token is larger than their first."""
    rng = np.random.default_rng(4)
    out = []
    for _ in range(steps):
        tokens = rng.integers(0, VOCAB, size=(batch, SEQ)).astype(np.int32)
        labels = (tokens[:, -1] > tokens[:, 0]).astype(np.int32)
        out.append((jnp.asarray(tokens), jnp.asarray(labels)))
    return out


def loss_fn(model: Classifier, tokens: jax.Array, labels: jax.Array) -> jax.Array:
    logits = model(tokens)
    loss: jax.Array = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return loss


@nnx.jit
def train_step(model: Classifier, optimizer: nnx.Optimizer[Classifier], tokens: jax.Array,
               labels: jax.Array) -> jax.Array:  # fmt: skip
    loss: jax.Array
    loss, grads = nnx.value_and_grad(loss_fn)(model, tokens, labels)
    optimizer.update(model, grads)
    return loss


def train(steps: int) -> tuple[Classifier, list[jax.Array]]:
    model = Classifier(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    losses = []
    for tokens, labels in batches(steps):
        losses.append(train_step(model, optimizer, tokens, labels))
    return model, losses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    _, losses = train(args.steps)
    print("losses:", " ".join(f"{float(v):.4f}" for v in losses))


if __name__ == "__main__":
    main()
