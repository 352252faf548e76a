"""Recomputation is not a new birth: activation checkpointing's rerun of the forward.

Under ``torch.utils.checkpoint`` (either ``use_reentrant``; transformers'
``gradient_checkpointing_enable()``) the backward pass runs each checkpointed
function again, and the recorders record its ops as backward ops: at the line of
``loss.backward()``, and credited to the module of the backward node that asked
for the rerun (the last module of the checkpointed call with a saved activation,
a ``Dropout`` say). An op of the rerun that makes Inf/NaN from finite inputs
repeats a birth of the forward pass. :class:`Recomputations` recognises the
rerun's ops by their recorded Python stack
(:func:`nanscope.backends.torch.recompute.checkpoint_frame`) and names, for a
rerun's birth, the forward birth it repeats (docs/ROOT_CAUSE.md, "Recomputation"):

* the same op type, the same step, and the same frames inside the checkpointed
  function (those below the innermost ``torch/utils/checkpoint.py`` frame, torch's
  own left out);
* of those, the last one before the forward op that the rerun's backward node
  was made by (the event's ``forward_sequence``: an op of the checkpointed call
  the rerun is for, which ran after every op the rerun repeats); without that
  link (a reentrant checkpoint's node links none), the last one not yet
  repeated: the backward reruns the checkpointed calls in the reverse order of
  the forward.

Its values then join that lineage, and the rerun's ops count as forward work:
reading them again in the backward pass is what the forward values were for
anyway (the recomputed causal mask that the recomputed softmax absorbs is no
gradient).
"""

from __future__ import annotations

from nanscope.backends.torch.recompute import FORWARD, RECOMPUTE, checkpoint_frame
from nanscope.reader import DumpReader, Execution

_Key = tuple[int, str, tuple[tuple[str, int, str], ...]]


class Recomputations:
    """The rerun ops of one process's executions, and the forward births they repeat."""

    def __init__(self, reader: DumpReader, process: int) -> None:
        self.reader = reader
        self.process = process
        self._where: dict[tuple[str, ...], tuple[str, tuple[tuple[str, int, str], ...]] | None] = {}
        # (step, op, frames) -> the forward births of a checkpointed call: (sequence, lineage)
        self._births: dict[_Key, list[tuple[int, int]]] = {}

    def _frames(self, ex: Execution) -> tuple[str, tuple[tuple[str, int, str], ...]] | None:
        """``(FORWARD or RECOMPUTE, the checkpointed function's frames)``, or ``None``."""
        ids = ex.stack_frame_ids
        if ids not in self._where:
            frames = self.reader.stack_frames(ids, self.process) if ids else []
            found = checkpoint_frame([(f.file_path, f.function) for f in frames])
            if found is None:
                self._where[ids] = None
            else:
                kind, i = found
                torch_dir = frames[i].file_path.replace("\\", "/")[: -len("utils/checkpoint.py")]
                inner = tuple(
                    (f.file_path, f.lineno, f.function)
                    for f in frames[i + 1 :]
                    if not f.file_path.replace("\\", "/").startswith(torch_dir)
                )
                self._where[ids] = (kind, inner)
        return self._where[ids]

    def recomputed(self, ex: Execution) -> bool:
        """Whether ``ex`` is an op of a checkpointed function's rerun in the backward pass."""
        where = self._frames(ex) if ex.stack_frame_ids else None
        return where is not None and where[0] == RECOMPUTE

    def born(self, ex: Execution, lineage: int) -> None:
        """``ex`` started ``lineage``: remember it when it ran in a checkpointed call's forward."""
        where = self._frames(ex) if ex.stack_frame_ids else None
        if where is not None and where[0] == FORWARD:
            key = (ex.step, ex.op_type, where[1])
            self._births.setdefault(key, []).append((ex.sequence, lineage))

    def repeats(self, ex: Execution) -> int | None:
        """The lineage of the forward birth that the rerun op ``ex`` repeats (no longer one
        that another rerun op repeats), or ``None``."""
        where = self._frames(ex) if ex.stack_frame_ids else None
        if where is None or where[0] != RECOMPUTE:
            return None
        births = self._births.get((ex.step, ex.op_type, where[1]))
        if not births:
            return None
        at = len(births) - 1
        if ex.forward_sequence:
            before = [k for k, (seq, _) in enumerate(births) if seq < ex.forward_sequence]
            if before:
                at = before[-1]
        return births.pop(at)[1]
