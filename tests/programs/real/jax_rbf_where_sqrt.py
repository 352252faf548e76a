"""An RBF-network regressor with learned centres, its gradients from a jitted function.

``python jax_rbf_where_sqrt.py [--steps N]``. Each hidden unit is a Laplacian bump
``exp(-|x - c| / width)`` around a learned centre ``c``; ``|x - c|`` is the square root of
the squared distance, guarded with ``jnp.where`` against the zero where an input sits
exactly on a centre (the centres start at training inputs, as is usual). The guard keeps the
value finite, not the gradient: sqrt's derivative there is 0.5 / sqrt(0) = +inf, and the
discarded branch's zero cotangent times +inf is NaN. ``jax.jit(jax.grad(loss))`` returns the
NaN gradients; the script reshapes them eagerly (``squeeze``) and applies optax's Adam
eagerly, so the centres turn NaN.

The tests import it for its pieces (``data``, ``loss``, ``train``) to evaluate the same
computation with an independent oracle; run as a program it only trains and prints.
"""

from __future__ import annotations

import argparse
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax  # type: ignore[import-untyped]

UNITS = 4


def data(n: int = 16) -> tuple[jax.Array, jax.Array]:
    rng = np.random.default_rng(1)
    x = rng.uniform(-2.0, 2.0, size=(n, 2)).astype(np.float32)
    y = np.tanh(x[:, :1] - x[:, 1:]).astype(np.float32)  # (n, 1)
    return jnp.asarray(x), jnp.asarray(y)


def pairwise_distance(x: jax.Array, centres: jax.Array) -> jax.Array:
    sq = jnp.sum((x[:, None, :] - centres[None, :, :]) ** 2, axis=-1)
    safe = sq > 0.0
    return jnp.where(safe, jnp.sqrt(sq), 0.0)  # <- rbf.sqrt


def predict(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    phi = jnp.exp(-pairwise_distance(x, params["centres"]) / jnp.exp(params["log_width"]))
    return phi @ params["weights"]  # (n, 1)


def loss(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((predict(params, x) - y) ** 2)


gradient = jax.jit(jax.grad(loss))
optimizer = optax.adam(1e-2)


def init(x: jax.Array) -> dict[str, jax.Array]:
    return {
        "centres": x[:UNITS],  # centres start on training inputs
        "log_width": jnp.zeros((1, 1)),
        "weights": jnp.zeros((UNITS, 1)),
    }


def train(steps: int) -> tuple[dict[str, Any], list[jax.Array]]:
    x, y = data()
    params = init(x)
    opt_state = optimizer.init(params)
    widths = []
    for _ in range(steps):
        grads = gradient(params, x, y)
        grads["log_width"] = grads["log_width"].squeeze(-1)[..., None]
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        widths.append(params["log_width"].squeeze())
    return params, widths


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    params, widths = train(args.steps)
    print("log width:", " ".join(f"{float(w):.4f}" for w in widths))
    print("centres finite:", bool(jnp.isfinite(params["centres"]).all()))


if __name__ == "__main__":
    main()
