"""What the two eager-op recorders share: the :class:`Recorder` protocol and common parts.

The session and the torch.compile recorder use a recorder only through
:class:`Recorder`; :class:`RecorderBase` holds the state and the behaviour
that the Python and the native recorder have in common.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from nanscope.backends.torch import summaries
from nanscope.backends.torch.collectives import CollectiveCounter, wait_for_functional
from nanscope.backends.torch.context import RunContext
from nanscope.backends.torch.device_buffer import DeviceBuffer
from nanscope.backends.torch.ops import OpInfo, tensors_of
from nanscope.backends.torch.summaries import summarize_device, summarize_host
from nanscope.backends.torch.suspension import not_recorded
from nanscope.events import DumpWriter
from nanscope.events._model import CollectiveTag
from nanscope.format.modes import TensorDebugMode

DtypeFilter = Callable[[torch.dtype], bool]


class TensorIdSource(Protocol):
    """Process-unique tensor ids, shared by a recorder and the torch.compile recorder."""

    def get(self, t: torch.Tensor) -> int:
        """The id of a tensor seen before, or a new one."""
        ...

    def new(self, t: torch.Tensor) -> int:
        """A fresh id for a tensor that now holds a new value."""
        ...


class Recorder(Protocol):
    """An eager-op recorder, as its session and the torch.compile recorder use it.

    It records from construction until :meth:`close`.
    """

    kind: str  # "python" or "native"

    @property
    def ids(self) -> TensorIdSource:
        """The tensor ids of this recorder's executions."""
        ...

    @property
    def cpu_device(self) -> int:
        """The writer's id of the CPU."""
        ...

    def device_id(self, t: torch.Tensor) -> int:
        """The writer's id of a tensor's device."""
        ...

    def failed(self, exc: Exception) -> None:
        """Report an op that could not be recorded (recording goes on)."""
        ...

    def sync(self) -> None:
        """Hand the executions recorded so far to the writer (before writing one directly)."""
        ...

    def flush(self) -> None:
        """Hand everything recorded so far to the writer, device summaries included."""
        ...

    def close(self) -> None:
        """Stop recording; what was recorded is handed to the writer."""
        ...


@dataclass(frozen=True)
class Setup:
    """What every recorder of a session is made with: where events go and what to record."""

    writer: DumpWriter
    context: RunContext
    op_regex: re.Pattern[str] | None
    dtype_filter: DtypeFilter | None
    # FULL_HEALTH summaries carry the statistics (nanscope.format.statistics).
    statistics: bool = False


class RecorderBase:
    """The state and the behaviour both recorders share."""

    def __init__(self, setup: Setup) -> None:
        self.writer = setup.writer
        self.mode = setup.writer.mode
        self.context = setup.context
        self.op_regex = setup.op_regex
        self.dtype_filter = setup.dtype_filter
        self.device_buffer = DeviceBuffer()
        self.collectives = CollectiveCounter()
        self.statistics = setup.statistics and self.mode == TensorDebugMode.FULL_HEALTH
        summaries.configure(self.statistics)
        self._warned = False
        self.pid = os.getpid()  # a process forked from this one inherits the recorder

    def inherited(self) -> bool:
        """Whether this process was forked from the one that made the recorder (a
        DataLoader worker): the parent's other threads did not come along, and a lock
        one of them held at the fork stays held here, so the recorder is only put away."""
        return os.getpid() != self.pid

    def failed(self, exc: Exception) -> None:
        """Say once that an op could not be recorded: never break the user's program."""
        if not self._warned:
            self._warned = True
            print(f"nanscope: could not record an op ({exc!r}); recording goes on", file=sys.stderr)

    def distributed_op(
        self, func: Any, info: OpInfo, args: tuple[Any, ...], out: Any, summarise: bool
    ) -> CollectiveTag | None:
        """A ``torch.distributed`` operation's tag; first waits for a collective on CPU
        tensors to finish when its outputs are to be ``summarise``d (see wait_for_collective)."""
        tag = self.collectives.tag(func, args, None)
        if summarise:
            if info.collective:
                wait_for_collective(out)
            elif info.name.startswith("_c10d_functional"):
                wait_for_functional(out)
        return tag

    def submit_device_summaries(self) -> None:
        """Start copying the device summaries collected so far to the host.

        Its own ops (stacking, copying) are not the user's: not recorded.
        """
        with not_recorded():
            self.device_buffer.submit()

    def summarize_off_host(self, t: torch.Tensor) -> Any:
        """The summary of a tensor that is not on the CPU: a reference into the
        device buffer, resolved on the writer thread; or an array, or ``None``."""
        if self.mode == TensorDebugMode.FULL_TENSOR:
            return summarize_host(t, self.mode)  # a full copy is a sync by nature
        d = summarize_device(t, self.mode)
        return None if d is None else self.device_buffer.add(d)

    def summarize_inputs(
        self, ins: Sequence[torch.Tensor], mutated: Sequence[bool], values: Sequence[float]
    ) -> list[np.ndarray | None]:
        """What went into an op that made Inf/NaN: its tensors, then its Python numbers.

        An input that the op mutated now holds its result: unknown, not that.
        The numbers (``x / 0.0``) follow the tensors as inputs with id 0
        (nanscope's convention).
        """
        mode = self.mode
        result = [
            summarize_host(t, mode) if t.is_cpu and not m else None
            for t, m in zip(ins, mutated, strict=True)
        ]
        for v in values:
            result.append(summarize_host(torch.tensor(float(v), dtype=torch.float64), mode))
        return result


def wait_for_collective(out: Any) -> None:
    """Wait until an asynchronous collective on CPU tensors is done, so its outputs are summarised.

    A ``c10d`` collective returns a ``Work`` at once; gloo writes the result
    later on its own threads. Summarised at once, the outputs would show this
    rank's values before the reduction (finite on a rank that is about to get
    another rank's NaN), or a mix. Waiting costs DDP its overlap of
    communication with the backward pass while recording. Accelerator outputs
    are not waited for (their summaries are computed on the device).
    """
    if not (type(out) is tuple and len(out) == 2 and isinstance(out[1], torch.ScriptObject)):
        return
    outs = tensors_of(out[0], [])
    if not outs or not all(t.is_cpu for t in outs):
        return
    from torch.distributed import Work

    work = Work.unbox(out[1])
    if not work.is_completed():
        work.wait()


def dtype_filter_from(tensor_dtypes: Any) -> DtypeFilter | None:
    """``tensor_dtypes`` as TensorFlow takes it: a list of dtypes (or names) or a predicate."""
    if tensor_dtypes is None:
        return None
    if callable(tensor_dtypes):
        return tensor_dtypes  # type: ignore[no-any-return]
    if isinstance(tensor_dtypes, (list, tuple, set, frozenset)):
        wanted = set()
        for d in tensor_dtypes:
            dt = getattr(torch, d, None) if isinstance(d, str) else d
            if not isinstance(dt, torch.dtype):
                raise ValueError(f"tensor_dtypes: {d!r} is not a torch dtype or dtype name")
            wanted.add(dt)
        return wanted.__contains__
    raise ValueError(
        "tensor_dtypes must be a list of dtypes (e.g. [torch.float32, 'bfloat16']) "
        f"or a predicate; got {type(tensor_dtypes).__name__}"
    )
