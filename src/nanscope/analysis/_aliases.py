"""Names of PyTorch ops by what they do to values, for following lineages in a dump.

The dump records op names, not schemas, so these sets name the ATen ops whose
outputs are *views* of their first input (they share its storage: a write into
one is a write into all), and the ops that bring values in from outside the
recorded computation (a load, ``torch.tensor(...)``) rather than compute them, and the
softmaxes that make NaN of a row masked throughout.
"""

from __future__ import annotations

from nanscope.analysis._explain import short_name

# Ops whose every output aliases the first input's storage (schema ``Tensor(a) -> Tensor(a)``).
VIEWS = frozenset(
    {
        "view", "view_as", "_unsafe_view", "_reshape_alias", "reshape", "alias", "detach",
        "slice", "select", "narrow", "t", "transpose", "permute", "expand", "expand_as",
        "unsqueeze", "squeeze", "as_strided", "diagonal", "unfold", "split", "split_with_sizes",
        "chunk", "unbind", "tensor_split", "view_as_real", "view_as_complex", "movedim",
        "swapaxes", "swapdims", "real", "imag", "flatten", "unflatten", "numpy_T", "mT", "mH",
        "lift_fresh",
    }
)  # fmt: skip

# Ops that put values into a tensor that the recorded ops did not compute: ``torch.load``
# and ``load_state_dict``'s storages (``set_``), ``torch.tensor(...)``'s data (``lift_fresh``).
LOADS = frozenset({"set_", "lift_fresh", "lift_fresh_copy", "_lift_fresh"})


# Normalisations over a row: ``exp(x - max)`` is 0/0 where the whole row is -inf.
ROW_SOFTMAX = frozenset(
    {
        "softmax", "_softmax", "log_softmax", "_log_softmax", "scaled_dot_product_attention",
        "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
    }
)  # fmt: skip


def is_row_softmax(op_type: str) -> bool:
    """``aten._softmax.default``, SDPA's kernels: a softmax over each row."""
    return short_name(op_type) in ROW_SOFTMAX


def is_view(op_type: str) -> bool:
    """``aten.slice.Tensor``, ``aten.t.default``: outputs that share the input's storage."""
    return short_name(op_type) in VIEWS


def is_load(op_type: str) -> bool:
    """``aten.set_.source_Storage_storage_offset``: values brought in, not computed."""
    return short_name(op_type) in LOADS
