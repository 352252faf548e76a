"""NaN born in the fourth iteration (index 3) of a jitted lax.scan: sqrt of a negative carry.

The budget goes 2, 1, 0, -1 and back to 4 after a refund: only iteration 3
makes NaN, so the counts reported are that iteration's, not the last one's.
"""
# EXPECT origin.kind=graph_execution_trace origin.op_type=sqrt origin_kind=born
# EXPECT origin.explanation~="sqrt of a negative" origin.counts.nan=1
# EXPECT origin.inputs.0.counts.neg=1 first_inf=null

import jax
import jax.numpy as jnp


def step(budget: jax.Array, cost: jax.Array) -> tuple[jax.Array, jax.Array]:
    budget = budget - cost
    return budget, jnp.sqrt(budget)  # <- origin first_nan


@jax.jit
def spend(costs: jax.Array) -> tuple[jax.Array, jax.Array]:
    return jax.lax.scan(step, jnp.float32(3.0), costs)


final, roots = spend(jnp.array([1.0, 1.0, 1.0, 1.0, -5.0]))
print(final, roots)
