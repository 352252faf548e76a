"""Facts about ATen ops that the recorders need, computed once per overload."""

from __future__ import annotations

import contextlib
import re
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from nanscope.backends.torch import collectives

# Views whose elements are exactly those of their input: their summary is the
# input's (with its own rank), so they are never summarised again.
SAME_ELEMENT_VIEWS = frozenset(
    {
        "aten.t", "aten.transpose", "aten.permute", "aten.view", "aten._unsafe_view",
        "aten.reshape", "aten.alias", "aten.detach", "aten.squeeze", "aten.unsqueeze",
        "aten.flatten", "aten.unflatten", "aten._reshape_alias", "aten.lift_fresh", "aten.detach_",
        "aten.view_as", "aten.movedim", "aten.swapaxes", "aten.numpy_T", "aten.mT",
    }
)  # fmt: skip
# Bookkeeping that is not computation.
SKIPPED_NAMESPACES = frozenset({"profiler"})
# Allocations: their contents are whatever the memory held before, so they are
# recorded (they ran) but never summarised or checked.
UNINITIALISED = frozenset(
    {
        "aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty",
        "aten.new_empty_strided", "aten.empty_permuted",
    }
)  # fmt: skip

FILLED_BEHIND_THE_SCENES = frozenset({"aten.lift_fresh", "aten.lift"})

# Ops whose schema marks an argument as written although its values do not change.
NOT_WRITES = frozenset({"aten.record_stream", "aten.retain_grad"})

# torch.distributed collectives: they return a Work before their outputs hold
# the result, which the backend writes on its own threads. (Not send/recv: a
# rank waiting for those could wait for a peer that waits for it.)
COLLECTIVES = frozenset(
    {
        "c10d.allreduce_", "c10d.allreduce_coalesced_", "c10d.broadcast_", "c10d.reduce_",
        "c10d.allgather_", "c10d._allgather_base_", "c10d.allgather_coalesced_",
        "c10d.allgather_into_tensor_coalesced_", "c10d.reduce_scatter_",
        "c10d._reduce_scatter_base_", "c10d.reduce_scatter_tensor_coalesced_",
        "c10d.alltoall_", "c10d.alltoall_base_", "c10d.gather_", "c10d.scatter_",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class OpInfo:
    name: str  # "aten.log.default"
    skip: bool  # not an op of the user's computation (profiler bookkeeping)
    same_elements: bool  # a view with the same elements (and dtype) as its first input
    inplace: bool
    record_values: bool  # op_regex allows summarising its outputs, and they are initialised
    value_args: tuple[int, ...] = ()  # positions where a Python number is a value, not a dim
    collective: bool = False  # in COLLECTIVES
    uninitialised: bool = False  # an allocation (UNINITIALISED): its values are garbage
    view: bool = False  # its outputs alias its first input without writing to it
    # A torch.distributed operation, numbered in its group (collectives.py); one whose inputs
    # are what this rank sends (not a receive, whose input is the buffer it writes).
    distributed: bool = False
    sends: bool = False
    # The arguments its schema says it writes (position, name), where they are values:
    # ``self`` of ``add_``, the lists of ``_foreach_mul_`` and ``_fused_adamw_`` (which
    # return nothing), the running statistics of a batch norm, ``out=``.
    written: tuple[tuple[int, str], ...] = ()


# Schema types whose Python-number arguments are values (x / 0.0), unlike dims and sizes.
_VALUE_TYPES = frozenset({"Tensor", "Scalar", "float", "number"})


def describe(func: Any, op_regex: re.Pattern[str] | None) -> OpInfo:
    name = str(func)
    packet = name.rsplit(".", 1)[0]
    namespace = name.split(".", 1)[0]
    schema = getattr(func, "_schema", None)
    inplace = bool(
        schema is not None
        and any(
            a.is_out or (a.alias_info is not None and a.alias_info.is_write)
            for a in schema.arguments
        )
    )
    value_args: tuple[int, ...] = ()
    # lift_fresh marks the tensor torch.tensor() just filled (in C++, not by an
    # op a recorder sees): its input holds data, whatever allocated it.
    view = packet not in FILLED_BEHIND_THE_SCENES and bool(
        schema is not None
        and schema.returns
        and all(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
    )
    written: tuple[tuple[int, str], ...] = ()
    # A receive's buffer keeps its id: the ranks' analysis links a receive to the event
    # that reads what it wrote by that id (analysis/_ranks.py).
    if schema is not None and packet not in NOT_WRITES and not collectives.is_operation(name):
        written = tuple(
            (i, a.name) for i, a in enumerate(schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        )  # fmt: skip
    if schema is not None:
        value_args = tuple(
            i for i, a in enumerate(schema.arguments)
            if not a.kwarg_only and str(a.type).rstrip("?") in _VALUE_TYPES
        )  # fmt: skip
    return OpInfo(
        value_args=value_args,
        name=name,
        skip=namespace in SKIPPED_NAMESPACES,
        # view.dtype reinterprets the bytes: not the same elements at all.
        same_elements=packet in SAME_ELEMENT_VIEWS and name != "aten.view.dtype",
        inplace=inplace,
        written=written,
        collective=packet in COLLECTIVES,
        distributed=collectives.is_operation(name),
        sends=collectives.is_operation(name) and collectives.P2P.get(packet) != "recv",
        uninitialised=packet in UNINITIALISED,
        view=view,
        record_values=packet not in UNINITIALISED
        and (op_regex is None or op_regex.match(name) is not None),
    )


def written_tensors(
    info: OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any] | None, outs: list[torch.Tensor]
) -> list[torch.Tensor]:
    """The tensors an op wrote that it does not return (``_foreach_mul_``'s list, a batch
    norm's running statistics): the outputs an event adds after the returned ones."""
    found: list[torch.Tensor] = []
    for i, name in info.written:
        tensors_of(args[i] if i < len(args) else (kwargs or {}).get(name), found)
    return [t for t in found if not any(t is o for o in outs)]


class OpCache(dict[Any, OpInfo]):
    """``OpInfo`` per overload, computed on first use."""

    def __init__(self, op_regex: re.Pattern[str] | None) -> None:
        super().__init__()
        self.op_regex = op_regex

    def __missing__(self, func: Any) -> OpInfo:
        info = self[func] = describe(func, self.op_regex)
        return info


def tensors_of(value: Any, out: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors in an op's arguments or result (one level of lists and tuples)."""
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, torch.Tensor):
                out.append(v)
            elif isinstance(v, (list, tuple)):
                out.extend(x for x in v if isinstance(x, torch.Tensor))
    return out


class TensorIds:
    """Process-unique ids for tensor objects, linking producers to consumers.

    Keyed by ``id()`` and checked with a weak reference, so an address reused
    by a new tensor never inherits the id of a dead one, and nothing is added
    to the tensors themselves. Entries of dead tensors are swept out in bulk.
    """

    def __init__(self, sweep_every: int = 65536) -> None:
        self._next = 0
        self._ids: dict[int, tuple[int, weakref.ref[torch.Tensor]]] = {}
        self._sweep_every = sweep_every
        self._until_sweep = sweep_every

    def get(self, t: torch.Tensor) -> int:
        """The id of a tensor seen before, or a new one (a tensor from outside the mode)."""
        entry = self._ids.get(id(t))
        if entry is not None and entry[1]() is t:
            return entry[0]
        return self.new(t)

    def new(self, t: torch.Tensor) -> int:
        """A fresh id for a tensor that now holds a new value (an op's output)."""
        self._next += 1
        # A tensor type that refuses weak references just gets no stable id.
        with contextlib.suppress(TypeError):
            self._ids[id(t)] = (self._next, weakref.ref(t))
        self._until_sweep -= 1
        if self._until_sweep <= 0:
            self._sweep()
        return self._next

    def _sweep(self) -> None:
        self._ids = {k: v for k, v in self._ids.items() if v[1]() is not None}
        self._until_sweep = max(self._sweep_every, len(self._ids))
