"""The seed's bug in eager (un-jitted) JAX: each jnp call runs as a program of its own."""
# EXPECT origin.kind=execution origin.op_type=log origin_kind=born
# EXPECT origin.explanation~="log of zero" origin.counts.neg_inf=2
# EXPECT cause.kind=execution cause.op_type=log first_nan.op_type=mul

import jax
import jax.numpy as jnp

logits = jnp.array([[200.0, 0.0, -5.0], [1.0, 2.0, 3.0]])
labels = jnp.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
probs = jax.nn.softmax(logits)
log_probs = jnp.log(probs)  # <- origin first_inf cause
loss = jnp.mean(-(labels * log_probs))  # <- first_nan
print(float(loss))
