"""The jnp.where gradient trap: the forward pass is fine, the gradient is NaN.

where(p > 0, log(p), 0) keeps log(0) = -inf out of the value, but the
gradient flows through both branches: the masked branch gets a cotangent of
0, and log's derivative, cotangent / p, is 0/0 = NaN at p = 0.
"""
# EXPECT origin.op_type=log origin.explanation~="log of zero" origin.counts.neg_inf=1
# EXPECT cause.op_type=div cause.explanation~="0/0" cause.counts.nan=1
# EXPECT first_nan.op_type=div cause.phase=backward lineages.0.kind=benign
# EXPECT lineages.0.birth.op_type=log
# EXPECT lineages.1.kind=harmful lineages.1.birth.op_type=div

import jax
import jax.numpy as jnp


def log_likelihood(p: jax.Array, counts: jax.Array) -> jax.Array:
    log_p = jnp.where(p > 0, jnp.log(p), 0.0)  # <- origin first_inf first_nan cause cause.forward
    return jnp.sum(counts * log_p)


p = jnp.array([0.5, 0.5, 0.0])  # a class that never occurs
counts = jnp.array([3.0, 1.0, 0.0])
value, grad = jax.jit(jax.value_and_grad(log_likelihood))(p, counts)
print(value, grad)
