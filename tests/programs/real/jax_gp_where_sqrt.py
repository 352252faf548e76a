"""Gaussian-process regression with a Matérn-3/2 kernel, hyperparameters fitted by gradient.

``python jax_gp_where_sqrt.py [--steps N]``. The kernel needs the distance between inputs,
``sqrt`` of the squared distance, guarded with ``jnp.where`` against the zeros on the
diagonal, as people write it. ``jnp.where`` guards the value but not the gradient: at a
zero distance, sqrt's derivative 0.5 / sqrt(0) is +inf, and the masked-out branch's
cotangent (0) times +inf is NaN. The negative log marginal likelihood's gradient comes out
of ``jax.jit(jax.grad(...))`` with NaN; the script then uses it eagerly (``squeeze``, the
update) and the hyperparameters turn NaN.

The tests import it for its pieces (``data``, ``nll``, ``train``) to evaluate the same
computation with an independent oracle; run as a program it only trains and prints.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

LR = 0.05


def data(n: int = 12) -> tuple[jax.Array, jax.Array]:
    rng = np.random.default_rng(0)
    x = np.sort(rng.uniform(-3.0, 3.0, size=(n, 1))).astype(np.float32)
    y = (np.sin(2.0 * x[:, 0]) + 0.1 * rng.normal(size=n)).astype(np.float32)
    return jnp.asarray(x), jnp.asarray(y)


def distance(a: jax.Array, b: jax.Array) -> jax.Array:
    d2 = jnp.sum((a[:, None, :] - b[None, :, :]) ** 2, axis=-1)
    return jnp.where(d2 > 0.0, jnp.sqrt(d2), 0.0)  # <- gp.sqrt


def matern32(params: dict[str, jax.Array], a: jax.Array, b: jax.Array) -> jax.Array:
    lengthscale = jnp.exp(params["log_lengthscale"])
    r = distance(a / lengthscale, b / lengthscale)
    s = np.sqrt(3.0) * r
    k: jax.Array = jnp.exp(2.0 * params["log_scale"]) * (1.0 + s) * jnp.exp(-s)
    return k


def nll(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    """The negative log marginal likelihood (up to a constant)."""
    k = matern32(params, x, x) + jnp.exp(2.0 * params["log_noise"]) * jnp.eye(x.shape[0])
    chol = jnp.linalg.cholesky(k)
    alpha = jax.scipy.linalg.cho_solve((chol, True), y)
    return 0.5 * y @ alpha + jnp.sum(jnp.log(jnp.diag(chol)))


grad_nll = jax.jit(jax.grad(nll))


def init() -> dict[str, jax.Array]:
    return {
        "log_lengthscale": jnp.zeros((1,)),
        "log_scale": jnp.zeros((1,)),
        "log_noise": jnp.full((1,), -1.0),
    }


def train(steps: int) -> tuple[dict[str, jax.Array], list[jax.Array]]:
    params = init()
    x, y = data()
    history = []
    for _ in range(steps):
        grads = grad_nll(params, x, y)
        # One number per hyperparameter: drop the length-1 axis, then plain gradient descent.
        step = {name: g.squeeze() for name, g in grads.items()}
        params = {name: params[name] - LR * step[name] for name in params}
        history.append(step["log_lengthscale"])
    return params, history


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    params, history = train(args.steps)
    print("d nll / d log_lengthscale:", " ".join(f"{float(g):.4f}" for g in history))
    print("lengthscale:", float(jnp.exp(params["log_lengthscale"])[0]))


if __name__ == "__main__":
    main()
