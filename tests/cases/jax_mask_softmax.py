"""A jitted attention with a -inf padding mask; one query has every key masked.

The -inf is the mask's value, given in the program (intended). The fully
masked row's softmax is NaN: jax.nn.softmax subtracts the row's max, and
-inf - (-inf) is NaN.
"""
# EXPECT origin_kind=born origin.explanation~="given as a value"
# EXPECT first_nan.op_type=sub first_nan.explanation~="inf - inf" cause.op_type=convert_element_type
# XFAIL: the -inf literal's convert_element_type is explained as "a cast to float32 overflowing, most likely" (its input, the literal -inf, is no recorded input), where the value was given in the program

import jax
import jax.numpy as jnp


@jax.jit
def attend(q: jax.Array, k: jax.Array, keep: jax.Array) -> jax.Array:
    scores = q @ k.T / 2.0
    scores = jnp.where(keep, scores, -jnp.inf)  # <- origin first_inf cause
    return jax.nn.softmax(scores, axis=-1)  # <- first_nan


q = jax.random.normal(jax.random.key(0), (3, 4))
k = jax.random.normal(jax.random.key(1), (3, 4))
keep = jnp.array([[True, True, False], [True, False, False], [False, False, False]])
print(attend(q, k, keep))
