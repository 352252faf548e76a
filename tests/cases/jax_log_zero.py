"""The seed's bug in a jitted JAX loss: softmax underflows to 0 and jnp.log(0) = -inf."""
# EXPECT origin.kind=graph_execution_trace origin.op_type=log origin_kind=born
# EXPECT origin.explanation~="log of zero" origin.counts.neg_inf=2
# EXPECT first_nan.op_type=mul first_nan.explanation~="0 * inf"

import jax
import jax.numpy as jnp


@jax.jit
def loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    probs = jax.nn.softmax(logits)
    log_probs = jnp.log(probs)  # <- origin first_inf
    return jnp.mean(-(labels * log_probs))  # <- first_nan


logits = jnp.array([[200.0, 0.0, -5.0], [1.0, 2.0, 3.0]])
labels = jnp.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
print(float(loss(logits, labels)))
