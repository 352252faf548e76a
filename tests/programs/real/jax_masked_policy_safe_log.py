"""A masked policy trained with an entropy bonus, its log written as a ``custom_vjp``.

``python jax_masked_policy_safe_log.py [--steps N]``. The policy (a flax.linen MLP) scores
actions; illegal ones get -inf logits, so their probabilities are exactly 0. The entropy
uses ``safe_log``, a log with a hand-written gradient that clamps its input going forward,
but whose backward rule divides by the unclamped input: at an illegal action it is
0 / 0 = NaN. The NaN is born in the backward rule, inside the jitted training step
(``jax.value_and_grad``, optax's Adam); the -inf of the mask is absorbed by the softmax.

The tests import it for its pieces (``data``, ``loss_fn``, ``train``) to evaluate the same
computation with an independent oracle; run as a program it only trains and prints.
"""

from __future__ import annotations

import argparse
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax  # type: ignore[import-untyped]

ACTIONS = 5
EPS = 1e-12


@jax.custom_vjp
def safe_log(x: jax.Array) -> jax.Array:
    return jnp.log(jnp.maximum(x, EPS))


def _safe_log_fwd(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return safe_log(x), x


def _safe_log_bwd(x: jax.Array, g: jax.Array) -> tuple[jax.Array]:
    return (g / x,)  # <- safe_log.bwd


safe_log.defvjp(_safe_log_fwd, _safe_log_bwd)


class Policy(nn.Module):
    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        h = nn.relu(nn.Dense(16)(obs))
        return nn.Dense(ACTIONS)(h)


policy = Policy()
optimizer = optax.adam(1e-2)


def data(steps: int, batch: int = 8) -> list[tuple[jax.Array, ...]]:
    """Observations, the legal actions, the actions taken and their advantages."""
    rng = np.random.default_rng(3)
    out = []
    for _ in range(steps):
        obs = rng.normal(size=(batch, 4)).astype(np.float32)
        legal = rng.uniform(size=(batch, ACTIONS)) < 0.7
        legal[:, 0] = True  # action 0 is always legal
        actions = np.array([rng.choice(np.flatnonzero(row)) for row in legal], np.int32)
        advantages = rng.normal(size=batch).astype(np.float32)
        out.append(tuple(jnp.asarray(a) for a in (obs, legal, actions, advantages)))
    return out


def loss_fn(params: Any, obs: jax.Array, legal: jax.Array, actions: jax.Array,
            advantages: jax.Array) -> jax.Array:  # fmt: skip
    scores: jax.Array = policy.apply({"params": params}, obs)  # type: ignore[assignment]
    logits = jnp.where(legal, scores, -jnp.inf)  # <- policy.mask
    probs = jax.nn.softmax(logits)
    log_probs = safe_log(probs)
    taken = jnp.take_along_axis(log_probs, actions[:, None], axis=1)[:, 0]
    entropy = -jnp.sum(probs * log_probs, axis=-1)
    return -jnp.mean(taken * advantages) - 0.01 * jnp.mean(entropy)


@jax.jit
def train_step(params: Any, opt_state: Any, *batch: jax.Array) -> tuple[Any, Any, jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def init() -> tuple[Any, Any]:
    params = jax.jit(policy.init)(jax.random.PRNGKey(0), jnp.zeros((1, 4)))["params"]
    return params, optimizer.init(params)


def train(steps: int) -> tuple[Any, list[jax.Array]]:
    params, opt_state = init()
    losses = []
    for batch in data(steps):
        params, opt_state, loss = train_step(params, opt_state, *batch)
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
