"""float16 overflow in a jitted layer: a half-precision matmul exceeds 65504."""
# EXPECT origin.op_type=dot_general origin_kind=born origin.counts.dtype=float16
# EXPECT origin.counts.pos_inf=32 origin.explanation~="overflow in matmul"
# EXPECT origin.explanation~="65504"

import jax
import jax.numpy as jnp


@jax.jit
def dense(x: jax.Array, w: jax.Array) -> jax.Array:
    return jax.nn.relu(x @ w)  # <- origin first_inf


x = jnp.full((4, 64), 40.0, dtype=jnp.float16)
w = jnp.full((64, 8), 30.0, dtype=jnp.float16)  # 64 * 40 * 30 = 76800 > 65504
print(dense(x, w)[0, 0])
