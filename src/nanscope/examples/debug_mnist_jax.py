"""The Debugger V2 tutorial's example in JAX: a jitted training step that collapses into NaN.

The same 784-500-10 MLP and hand-written cross-entropy as
:mod:`nanscope.examples.debug_mnist`, written the way JAX programs are: the
parameters are a pytree, the loss and its gradients come from one
``jax.jit(jax.value_and_grad(...))`` step that also applies Adam's update (the
update ``optax.adam`` makes, written out so that the example needs nothing
beyond ``jax``). With the tutorial's learning rate a softmax probability
underflows to exactly 0 inside the jitted step, ``jnp.log`` turns it into
-inf, ``0 * -inf`` makes the loss NaN, the gradients and weights follow, and
the accuracy collapses to chance. ``--fix`` computes the cross-entropy from
``jax.nn.log_softmax(logits)`` (as ``optax.softmax_cross_entropy`` does),
which never takes the log of 0, and the model trains properly.

    python -m nanscope.examples.debug_mnist_jax --dump_dir /tmp/jax_logdir
    nanscope report /tmp/jax_logdir
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from nanscope.examples import data
from nanscope.examples.debug_mnist import INIT_STD, parse_args

ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.999, 1e-8  # torch.optim.Adam's and optax.adam's defaults


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv, __doc__.split("\n\n")[0])
    import jax
    import jax.numpy as jnp
    import numpy as np

    import nanscope

    x_train, y_train, x_test, y_test = data.load(args.data, seed=args.seed)
    if args.dump_dir:
        nanscope.enable_dump_debug_info(
            args.dump_dir,
            tensor_debug_mode=args.dump_tensor_debug_mode,
            circular_buffer_size=args.dump_circular_buffer_size,
            framework="jax",
        )
    if args.check_numerics:
        nanscope.enable_check_numerics(framework="jax")

    params = init_params(jax.random.key(args.seed))
    opt_state = adam_init(params)

    def loss_fn(params: Any, x: Any, labels: Any) -> Any:
        return cross_entropy(mlp(params, x), labels, fix=args.fix)

    @jax.jit
    def train_step(params: Any, opt_state: Any, x: Any, labels: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, labels)
        params, opt_state = adam_update(params, grads, opt_state, args.learning_rate)
        return params, opt_state, loss

    @jax.jit
    def accuracy(params: Any, x: Any, y: Any) -> Any:
        return jnp.mean(jnp.argmax(mlp(params, x), axis=1) == y)

    rng = np.random.default_rng(args.seed)
    for step in range(args.max_steps):
        idx = rng.choice(len(x_train), args.train_batch_size, replace=False)
        labels = np.eye(10, dtype=np.float32)[y_train[idx]]  # one-hot, on the host
        params, opt_state, loss = train_step(params, opt_state, x_train[idx], labels)
        correct = float(accuracy(params, x_test, y_test))
        print(f"Accuracy at step {step}: {correct:.3f} (loss {float(loss):.4f})")
    if args.dump_dir:
        nanscope.disable_dump_debug_info()
    if args.check_numerics:
        nanscope.disable_check_numerics()
    return 0


def init_params(key: Any) -> dict[str, Any]:
    """The tutorial's initialisation: truncated normal weights, biases of 0.1 (see ``INIT_STD``)."""
    import jax
    import jax.numpy as jnp

    k1, k2 = jax.random.split(key)

    def weights(k: Any, shape: tuple[int, int]) -> Any:
        return INIT_STD * jax.random.truncated_normal(k, -2.0, 2.0, shape, jnp.float32)

    return {
        "hidden": {"w": weights(k1, (784, 500)), "b": jnp.full((500,), 0.1, jnp.float32)},
        "logits": {"w": weights(k2, (500, 10)), "b": jnp.full((10,), 0.1, jnp.float32)},
    }


def mlp(params: dict[str, Any], x: Any) -> Any:
    """The logits of the 784-500-10 MLP."""
    import jax

    h = jax.nn.relu(x @ params["hidden"]["w"] + params["hidden"]["b"])
    return h @ params["logits"]["w"] + params["logits"]["b"]


def cross_entropy(logits: Any, labels: Any, fix: bool) -> Any:
    import jax
    import jax.numpy as jnp

    if fix:
        return jnp.mean(-(labels * jax.nn.log_softmax(logits)))
    probs = jax.nn.softmax(logits)
    return jnp.mean(-(labels * jnp.log(probs)))  # -inf where a probability is 0


def adam_init(params: Any) -> tuple[Any, Any, Any]:
    """Adam's state: the step count and the first and second moments, zeros like ``params``."""
    import jax
    import jax.numpy as jnp

    zeros = jax.tree.map(jnp.zeros_like, params)
    return jnp.zeros((), jnp.int32), zeros, zeros


def adam_update(params: Any, grads: Any, state: Any, lr: float) -> tuple[Any, Any]:
    """One step of Adam with bias correction (``torch.optim.Adam``'s and ``optax.adam``'s)."""
    import jax
    import jax.numpy as jnp

    count, mu, nu = state
    count = count + 1
    mu = jax.tree.map(lambda m, g: ADAM_B1 * m + (1 - ADAM_B1) * g, mu, grads)
    nu = jax.tree.map(lambda v, g: ADAM_B2 * v + (1 - ADAM_B2) * g * g, nu, grads)
    t = count.astype(jnp.float32)
    mu_hat_scale, nu_hat_scale = 1 / (1 - ADAM_B1**t), 1 / (1 - ADAM_B2**t)
    params = jax.tree.map(
        lambda p, m, v: p - lr * (m * mu_hat_scale) / (jnp.sqrt(v * nu_hat_scale) + ADAM_EPS),
        params,
        mu,
        nu,
    )
    return params, (count, mu, nu)


if __name__ == "__main__":
    sys.exit(main())
