"""0/0 in a jitted normalisation: an all-zero embedding row divided by its norm of 0."""
# EXPECT origin.kind=graph_execution_trace origin.op_type=div origin_kind=born
# EXPECT origin.explanation~="0/0" origin.counts.nan=3 first_inf=null

import jax
import jax.numpy as jnp


@jax.jit
def cosine_similarity(a: jax.Array, b: jax.Array) -> jax.Array:
    a = a / jnp.linalg.norm(a, axis=-1, keepdims=True)  # <- origin first_nan
    b = b / jnp.linalg.norm(b, axis=-1, keepdims=True)
    return a @ b.T


a = jnp.array([[1.0, 2.0, 2.0], [0.0, 0.0, 0.0]])  # the second row was never trained
b = jnp.array([[3.0, 4.0, 0.0]])
print(cosine_similarity(a, b))
