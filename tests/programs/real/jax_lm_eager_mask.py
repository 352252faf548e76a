"""A tiny causal Transformer LM in flax.linen, its attention mask built eagerly at init.

``python jax_lm_eager_mask.py [--steps N]``. The additive causal mask (0 where a token may
attend, -inf above the diagonal) is made once, outside ``jax.jit``, with ``jnp.where``, and
handed to the jitted training step with every batch; the softmax turns its -inf into zeros.
A healthy program: no NaN, the loss goes down.

The tests import it for its pieces (``init``, ``train``) to evaluate the same computation with
an independent oracle; run as a program it only trains and prints.
"""

from __future__ import annotations

import argparse
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax  # type: ignore[import-untyped]

VOCAB, SEQ, D_MODEL, HEADS = 12, 8, 16, 2


def causal_bias(length: int) -> jax.Array:
    """0 on and below the diagonal, -inf above: added to the attention scores."""
    allowed = jnp.tril(jnp.ones((length, length), dtype=bool))
    return jnp.where(allowed, 0.0, -jnp.inf)  # <- lm.mask


class SelfAttention(nn.Module):
    heads: int

    @nn.compact
    def __call__(self, x: jax.Array, bias: jax.Array) -> jax.Array:
        b, t, d = x.shape
        qkv = nn.Dense(3 * d, use_bias=False)(x).reshape(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d // self.heads)
        weights = jax.nn.softmax(scores + bias, axis=-1)  # <- lm.softmax
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
        return nn.Dense(d)(out)


class TinyLM(nn.Module):
    @nn.compact
    def __call__(self, tokens: jax.Array, bias: jax.Array) -> jax.Array:
        x = nn.Embed(VOCAB, D_MODEL)(tokens)
        x = x + SelfAttention(HEADS)(nn.LayerNorm()(x), bias)
        x = x + nn.Dense(D_MODEL)(nn.gelu(nn.Dense(2 * D_MODEL)(nn.LayerNorm()(x))))
        return nn.Dense(VOCAB)(nn.LayerNorm()(x))


model = TinyLM()
optimizer = optax.adamw(3e-3)


def batches(steps: int, batch: int = 4) -> np.ndarray:
    """Counting sequences (start, start + 1, ...) modulo VOCAB: (steps, batch, SEQ + 1)."""
    rng = np.random.default_rng(0)
    start = rng.integers(0, VOCAB, size=(steps, batch, 1))
    return ((start + np.arange(SEQ + 1)) % VOCAB).astype(np.int32)


def loss_fn(params: Any, tokens: jax.Array, bias: jax.Array) -> jax.Array:
    logits = model.apply({"params": params}, tokens[:, :-1], bias)
    loss: jax.Array = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
    return loss


@jax.jit
def train_step(
    params: Any, opt_state: Any, tokens: jax.Array, bias: jax.Array
) -> tuple[Any, Any, jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, bias)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def init() -> tuple[Any, Any, jax.Array]:
    """The parameters, the optimizer state and the mask, made eagerly (no jit)."""
    bias = causal_bias(SEQ)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, SEQ), jnp.int32), bias)["params"]
    return params, optimizer.init(params), bias


def train(steps: int) -> tuple[Any, list[jax.Array]]:
    params, opt_state, bias = init()
    losses = []
    for tokens in batches(steps):
        params, opt_state, loss = train_step(params, opt_state, jnp.asarray(tokens), bias)
        losses.append(loss)
    return params, losses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    _, losses = train(args.steps)
    print("losses:", " ".join(f"{float(v):.4f}" for v in losses))


if __name__ == "__main__":
    main()
