"""Activation checkpointing's recomputation: the forward pass run again inside the backward.

``torch.utils.checkpoint`` (either ``use_reentrant`` setting, and what builds on it:
``checkpoint_sequential``, transformers' ``gradient_checkpointing_enable()``) keeps
no activations of the function it is given: the backward pass runs the function
again to make them. Every op of that rerun repeats an op of the forward pass, with
the same inputs, so an Inf/NaN it makes is the forward op's, not a new one.

A rerun is recognised from the Python stack, the same way at record time (a
live stack, :func:`recomputing`) and in a dump (the recorded frames,
:func:`checkpoint_frame`): the innermost frame of ``torch/utils/checkpoint.py``
is

* ``recompute_fn`` (``use_reentrant=False``: the saved-tensor hook reruns the
  function when the backward first unpacks one of its activations), or
* ``CheckpointFunction.backward`` calling the function (``use_reentrant=True``;
  when it calls ``torch.autograd.backward`` on the rerun's outputs instead, the
  ops are backward ops);

and the forward occurrence's innermost frame of that file is ``checkpoint`` or
``CheckpointFunction.forward`` calling the function. The frames inside it (the
function's own) are the same in both.

Torch-free: the analysis uses it on recorded frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import FrameType

CHECKPOINT_FILE = "torch/utils/checkpoint.py"
FORWARD, RECOMPUTE = "forward", "recompute"


def checkpoint_frame(frames: Sequence[tuple[str, str]]) -> tuple[str, int] | None:
    """``(FORWARD or RECOMPUTE, i)`` where ``frames[i]`` (``(file, function)``, outermost
    first) is the checkpoint frame that called the checkpointed function (its frames are
    ``frames[i + 1:]``); ``None`` when the innermost frame of ``torch/utils/checkpoint.py``
    is not one of those (or there is none)."""
    for i in range(len(frames) - 1, -1, -1):
        file, function = frames[i]
        if not file.replace("\\", "/").endswith(CHECKPOINT_FILE):
            continue
        if i + 1 >= len(frames):
            return None  # checkpoint's own ops (saving the RNG state...)
        callee = frames[i + 1][0].replace("\\", "/")
        torch_dir = file.replace("\\", "/")[: -len("utils/checkpoint.py")]
        if function == "recompute_fn":
            return RECOMPUTE, i
        if function == "backward" and not callee.startswith(torch_dir + "autograd/"):
            return RECOMPUTE, i
        if function in ("checkpoint", "forward"):
            return FORWARD, i
        return None
    return None


def recomputing(frame: FrameType | None) -> bool:
    """Whether the live stack from ``frame`` outward is in a checkpointed function's rerun."""
    frames: list[tuple[str, str]] = []
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_code.co_name))
        frame = frame.f_back
    frames.reverse()
    found = checkpoint_frame(frames)
    return found is not None and found[0] == RECOMPUTE
