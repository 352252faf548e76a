"""A healthy attention step: the causal mask's -inf is intended, and softmax absorbs it.

Every query sees at least itself, so no softmax row is entirely -inf: the
output and the gradients are finite. The report finds the -inf (a benign
lineage, absorbed) and nothing harmful, and exits 0.
"""
# EXPECT found_nonfinite=true found_harmful=false cause=null first_nan=null
# EXPECT lineages.0.kind=benign lineages.0.count=1 origin.op_type=convert_element_type

import jax
import jax.numpy as jnp


def attention_loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    n = q.shape[0]
    scores = q @ k.T / jnp.sqrt(q.shape[1])
    causal = jnp.tril(jnp.ones((n, n), dtype=bool))
    scores = jnp.where(causal, scores, -jnp.inf)  # <- origin first_inf
    weights = jax.nn.softmax(scores, axis=-1)
    return jnp.sum((weights @ v) ** 2)


kq, kk, kv = jax.random.split(jax.random.key(0), 3)
q, k, v = (jax.random.normal(key, (4, 8)) for key in (kq, kk, kv))
loss, grads = jax.jit(jax.value_and_grad(attention_loss, argnums=(0, 1, 2)))(q, k, v)
assert all(bool(jnp.isfinite(g).all()) for g in grads)
print(float(loss))
