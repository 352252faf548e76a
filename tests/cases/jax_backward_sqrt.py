"""Born in backward: the gradient of a Euclidean norm at the zero vector.

sqrt(s) is 0 at s = 0, fine forward; its derivative 0.5/sqrt(0) is +inf
(JAX computes that coefficient while linearising, before the transpose), and
the chain rule multiplies it by d(x**2)/dx = 2x = 0, giving NaN.
"""
# EXPECT origin_kind=born origin.kind=graph_execution_trace origin.op_type=div
# EXPECT origin.counts.pos_inf=1 origin.explanation~="x/0"
# EXPECT first_nan.op_type=mul first_nan.explanation~="0 * inf" first_nan.phase=backward
# EXPECT origin.phase=backward
# XFAIL: sqrt's derivative 0.5/sqrt(s) runs in the linearised forward part of the grad's jaxpr (under jvp, before the transpose), so the backend does not flag it backward: its forward_source is null

import jax
import jax.numpy as jnp


def norm(x: jax.Array) -> jax.Array:
    s = jnp.sum(x**2)  # <- first_nan first_nan.forward
    return jnp.sqrt(s)  # <- origin forward first_inf


grad_norm = jax.jit(jax.grad(norm))
print(grad_norm(jnp.zeros(3)))
