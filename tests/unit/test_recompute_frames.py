"""Which stacks are activation checkpointing's rerun (backends/torch/recompute.py), and which
graph ops only move values (analysis/_graph_inputs.py)."""

from __future__ import annotations

import pytest

from nanscope.analysis._graph_inputs import moves_values
from nanscope.backends.torch.recompute import FORWARD, RECOMPUTE, checkpoint_frame

TORCH = "/venv/lib/python3.11/site-packages/torch"
CKPT = f"{TORCH}/utils/checkpoint.py"
MODULE = f"{TORCH}/nn/modules/module.py"
USER = "/home/me/train.py"


@pytest.mark.parametrize(
    ("frames", "expected"),
    [
        # use_reentrant=False: the forward, and the rerun from the saved-tensor hook.
        ([(USER, "main"), (CKPT, "checkpoint"), (MODULE, "_call_impl"), (USER, "forward")],
         (FORWARD, 1)),
        ([(USER, "main"), (f"{TORCH}/autograd/graph.py", "_engine_run_backward"),
          (CKPT, "unpack_hook"), (CKPT, "recompute_fn"), (MODULE, "_call_impl"),
          (USER, "forward")], (RECOMPUTE, 3)),
        # use_reentrant=True: CheckpointFunction.forward, then its backward calling the function
        ([(USER, "main"), (CKPT, "checkpoint"), (f"{TORCH}/autograd/function.py", "apply"),
          (CKPT, "forward"), (USER, "block")], (FORWARD, 3)),
        ([(USER, "main"), (CKPT, "backward"), (USER, "block")], (RECOMPUTE, 1)),
        # ... and its backward's own backward() of the rerun's outputs: backward ops.
        ([(USER, "main"), (CKPT, "backward"), (f"{TORCH}/autograd/__init__.py", "backward")],
         None),
        # checkpoint's own work (detaching the inputs, the RNG state), and no checkpoint at all.
        ([(USER, "main"), (CKPT, "backward"), (CKPT, "detach_variable")], None),
        ([(USER, "main"), (CKPT, "checkpoint")], None),
        ([(USER, "main"), (MODULE, "_call_impl"), (USER, "forward")], None),
    ],
)  # fmt: skip
def test_checkpoint_frame(frames: list[tuple[str, str]], expected: object) -> None:
    assert checkpoint_frame(frames) == expected


def test_moves_values() -> None:
    for op in ("aten.view.default", "aten.permute.default", "aten.embedding.default",
               "aten.expand.default", "aten.cat.default", "aten.clone.default", "aten.neg.default"):  # fmt: skip
        assert moves_values(op), op
    for op in ("aten.mul.Tensor", "aten.bmm.default", "aten.exp.default",
               "aten._to_copy.default", "aten.full.default", "Placeholder"):  # fmt: skip
        assert not moves_values(op), op
