"""Which ``torch.distributed`` operation an op was: its group and its place in the group's order.

A NaN crosses ranks only through a collective or a point-to-point transfer, so
the report finds the rank where it was born by matching these operations across
ranks (docs/ROOT_CAUSE.md, "Many ranks"). Every member of a process group issues
the group's collectives in the same order (a program that does not deadlocks),
so numbering them per group as they are recorded gives the same number to the
same operation on every rank. PyTorch's own per-group sequence number is kept
too but not matched on: gloo also counts point-to-point operations in it, which
only two members take part in, so it drifts apart between ranks.

Sends and receives are numbered per (group, peer, direction): the k-th send from
rank A to rank B in a group is received by B's k-th receive from A (tags are
not told apart). A receive from any source names no peer and is not numbered.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from nanscope.events._model import CollectiveTag
from nanscope.format.collectives import is_distributed

# Their ops that are not an operation of a group: waiting, wrapping, any-source receive.
NOT_OPERATIONS = frozenset(
    {
        "_c10d_functional.wait_tensor",
        "_c10d_functional._wrap_tensor_autograd",
        "c10d.recv_any_source_",
    }
)
P2P = {"c10d.send": "send", "c10d.recv_": "recv"}
# The argument that names the peer of a send and a receive (a rank in the group).
_PEER_ARGS = ("dstRank", "srcRank", "dst", "src")


def is_operation(name: str) -> bool:
    """Whether an op (``c10d.allreduce_.default``) is a group's operation to be numbered."""
    packet = name.rsplit(".", 1)[0]
    return is_distributed(name) and packet not in NOT_OPERATIONS


def _process_group(value: Any) -> Any:
    """The ``ProcessGroup`` boxed in a ``c10d`` op's argument, or None."""
    if not isinstance(value, torch.ScriptObject):
        return None
    from torch.distributed import ProcessGroup

    try:
        return ProcessGroup.unbox(value)
    except RuntimeError:  # another class (a ReduceOp, a Work)
        return None


def _by_name(name: str) -> Any:
    from torch.distributed import distributed_c10d

    try:
        return distributed_c10d._resolve_process_group(name)  # type: ignore[attr-defined,arg-type]
    except (LookupError, RuntimeError, ValueError, AttributeError):
        return None


def _global_rank(group: Any, rank: int) -> int:
    import torch.distributed as dist

    try:
        return int(dist.get_global_rank(group, rank))
    except (RuntimeError, ValueError, KeyError, AttributeError):
        return rank  # a group the launcher made itself: its ranks as they are


class CollectiveCounter:
    """Numbers a process's ``torch.distributed`` operations per group, as they are recorded."""

    def __init__(self) -> None:
        self._counts: dict[tuple[Any, ...], int] = {}
        self._lock = threading.Lock()  # collectives may run on autograd's threads

    def tag(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None
    ) -> CollectiveTag | None:
        """The tag of one call of ``func`` (an op overload) with these arguments, or None when
        no group can be found among them."""
        name = str(func)
        packet = name.rsplit(".", 1)[0]
        schema = getattr(func, "_schema", None)
        names = [a.name for a in schema.arguments] if schema is not None else []
        values = dict(zip(names, args, strict=False))
        if kwargs:
            values.update(kwargs)
        group: Any = None
        group_name = ""
        for v in values.values():
            group = _process_group(v)
            if group is not None:
                break
        if group is None:
            named = values.get("group_name")
            group_name = named if isinstance(named, str) else ""
            if not group_name:
                return None
            group = _by_name(group_name)
        if group is not None:
            group_name = str(getattr(group, "group_name", "") or group_name)
        kind = P2P.get(packet, "collective")
        peer = -1
        if kind != "collective":
            local = next((values[k] for k in _PEER_ARGS if isinstance(values.get(k), int)), None)
            if local is None:
                return None
            peer = _global_rank(group, local) if group is not None else local
        key = (group_name, kind, peer)
        with self._lock:
            sequence = self._counts[key] = self._counts.get(key, 0) + 1
        size = 0
        desc = ""
        framework_sequence = 0
        if group is not None:
            try:
                size = int(group.size())
                desc = str(getattr(group, "group_desc", "") or "")
                framework_sequence = int(group._get_sequence_number_for_group())
            except (RuntimeError, AttributeError):
                pass
        return CollectiveTag(
            group=group_name,
            kind=kind,
            sequence=sequence,
            group_desc=desc,
            group_size=size,
            peer=peer,
            framework_sequence=framework_sequence,
        )


def wait_for_functional(out: Any) -> None:
    """Wait for a functional collective's CPU output (``_c10d_functional.all_reduce``), so that
    its summary holds the reduced values; the program's own ``wait_tensor`` then finds it done.
    """
    if not isinstance(out, torch.Tensor) or not out.is_cpu:
        return
    from nanscope.backends.torch.suspension import not_recorded

    with not_recorded():
        torch.ops._c10d_functional.wait_tensor(out)
