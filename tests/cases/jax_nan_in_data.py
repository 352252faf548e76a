"""NaN already in the input batch (a missing value) of a jitted layer: no op made it.

It entered through the jitted function's argument, the graph's Placeholder
``x``, fed by the call below; the matmul that reads it only passes it on.
"""
# EXPECT origin.op_type=Placeholder origin.op_name=x origin.counts.nan=1
# EXPECT origin_kind=entered origin.external_input=true
# EXPECT origin.explanation~="already in this argument when the function was called"

import jax
import jax.numpy as jnp
import numpy as np


@jax.jit
def dense(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.tanh(x @ w + b)


batch = np.array([[0.5, 1.0, 2.0], [1.5, np.nan, 0.0]], dtype=np.float32)
w = jnp.ones((3, 2))
b = jnp.zeros(2)
print(dense(batch, w, b))  # <- origin first_nan
