"""A small JAX MLP whose cross-entropy takes the log of a zero: ``python jax_mlp.py LOGDIR``.

Two dense layers, ``jax.value_and_grad`` and a hand-written SGD update in one jitted
``train_step``, run for :data:`STEPS` steps, then a jitted ``predict`` and two eager ops (``jnp.log``, ``jnp.exp``).
One sample's inputs are a thousand times larger than the others': its softmax saturates,
some probabilities are exactly 0, ``jnp.log`` turns them into -inf, and the zeros of the
one-hot labels times -inf make NaN; the gradients are NaN too, and so are the parameters
after the first update. The eager ``jnp.log`` of the one-hot labels takes the log of zero again.

The tests import this module for its data and functions (to compute what the dump must
hold on their own); only running it as a program records.
"""

from __future__ import annotations

import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import nanscope

STEPS = 2
LR = 0.1
N, D, H, C = 8, 4, 5, 3  # samples, inputs, hidden units, classes
SATURATED = 2  # the sample whose logits are far apart


def init_params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "w1": rng.normal(size=(D, H)).astype(np.float32),
        "b1": np.zeros(H, np.float32),
        "w2": rng.normal(size=(H, C)).astype(np.float32),
        "b2": np.zeros(C, np.float32),
    }


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(N, D)).astype(np.float32)
    x[SATURATED] *= 1000.0
    y = np.eye(C, dtype=np.float32)[np.arange(N) % C]
    return x, y


def predict(params: dict[str, Any], x: Any) -> Any:
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def loss_fn(params: dict[str, Any], x: Any, y: Any) -> Any:
    p = jax.nn.softmax(predict(params, x))
    return -jnp.mean(jnp.sum(y * jnp.log(p), axis=-1))  # SITE:log


@jax.jit
def train_step(params: dict[str, Any], x: Any, y: Any) -> tuple[dict[str, Any], Any]:
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    params = jax.tree.map(lambda p, g: p - LR * g, params, grads)
    return params, loss


predict_jit = jax.jit(predict)


def main(logdir: str) -> None:
    nanscope.enable_dump_debug_info(logdir, framework="jax", circular_buffer_size=-1)
    params: dict[str, Any] = init_params()
    x, y = data()
    for _ in range(STEPS):
        params, loss = train_step(params, x, y)  # SITE:train_step
        print("loss", float(loss))
    logits = predict_jit(params, x)  # SITE:predict
    log_labels = jnp.log(y)  # SITE:eager_log
    labels = jnp.exp(log_labels)  # SITE:eager_exp
    jax.block_until_ready((logits, labels))
    nanscope.disable_dump_debug_info()


if __name__ == "__main__":
    main(sys.argv[1])
