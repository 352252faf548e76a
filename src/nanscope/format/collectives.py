"""How dumps name ``torch.distributed`` operations (the executions with a ``collective`` field).

The recorders tag the ops of these namespaces; the analysis finds them in the index by their
op type alone, without decoding records.
"""

from __future__ import annotations

# c10d's process-group ops (dist.all_reduce, DDP, send and receive) and the functional
# collectives that torch.compile traces: "c10d.allreduce_.default", ...
OP_PREFIXES = ("c10d.", "_c10d_functional.", "_c10d_functional_autograd.")


def is_distributed(op_type: str) -> bool:
    """Whether an op type (``c10d.allreduce_.default``) is a ``torch.distributed`` op."""
    return op_type.startswith(OP_PREFIXES)
