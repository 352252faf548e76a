"""An MLP regressor whose encoder's gradient is clipped by a hand-written ``custom_vjp``.

``python jax_clip_grad_vjp.py [--steps N]``. ``clip_gradient`` is the identity going forward;
its backward rule rescales the incoming gradient to norm ``max_norm``, and forgets that the
gradient can be zero: ``max_norm / norm`` is +inf for a zero gradient, and zero times +inf is
NaN. The head is zero-initialised (a common choice for a last layer), so at the first step
the gradient reaching the encoder's output is exactly zero. The NaN is born in the backward
rule, inside ``jax.jit(jax.grad(loss))``.

The tests import it for its pieces (``data``, ``loss``, ``train``) to evaluate the same
computation with an independent oracle; run as a program it only trains and prints.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

LR = 0.1


@jax.custom_vjp
def clip_gradient(x: jax.Array, max_norm: float) -> jax.Array:
    return x


def _clip_fwd(x: jax.Array, max_norm: float) -> tuple[jax.Array, float]:
    return x, max_norm


def _clip_bwd(max_norm: float, g: jax.Array) -> tuple[jax.Array, None]:
    norm = jnp.sqrt(jnp.sum(g * g))
    return (g * (max_norm / norm), None)  # <- clip.bwd


clip_gradient.defvjp(_clip_fwd, _clip_bwd)


def data(n: int = 16) -> tuple[jax.Array, jax.Array]:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32)).astype(np.float32)
    return jnp.asarray(x), jnp.asarray(y)


def init() -> dict[str, jax.Array]:
    key = jax.random.PRNGKey(0)
    return {
        "w1": jax.random.normal(key, (3, 8)) * 0.5,
        "b1": jnp.zeros(8),
        "w2": jnp.zeros((8, 1)),  # zero-initialised head
        "b2": jnp.zeros(1),
    }


def loss(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    h = clip_gradient(h, 1.0)
    pred = h @ params["w2"] + params["b2"]
    return jnp.mean((pred - y) ** 2)


grad_fn = jax.jit(jax.grad(loss))


def train(steps: int) -> tuple[dict[str, jax.Array], list[jax.Array]]:
    params = init()
    x, y = data()
    norms = []
    for _ in range(steps):
        grads = grad_fn(params, x, y)
        params = jax.tree.map(lambda p, g: p - LR * g, params, grads)
        norms.append(jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads))))
    return params, norms


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    _, norms = train(args.steps)
    print("gradient norms:", " ".join(f"{float(n):.4f}" for n in norms))


if __name__ == "__main__":
    main()
