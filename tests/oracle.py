"""An independent oracle for the real programs: births, lineages, the first NaN and the cause.

It runs a program's ``main(argv)`` in this process under its own
``TorchDispatchMode`` and looks at every ATen op that runs: its name, the
Inf/NaN counts of what it wrote, whether all its floating inputs were finite,
which storages it read and wrote, and the line of the program file that was
running. It shares no code with nanscope and does not import it: it is the
yardstick the integration tests hold nanscope's report against.

Definitions (kept deliberately simple; this is a test oracle, not a product):

* A *value* lives in a storage. Storages get a fresh id whenever an op returns a
  tensor whose storage is not one of its inputs' (so a reused address is a new
  storage); views and in-place ops keep the id. Tensors first seen as inputs
  (parameters, data made before the mode) get an id when first seen.
* A *birth* is an op that wrote Inf/NaN (into a fresh output or in place) while
  every floating tensor it read was finite. Each birth starts a *lineage*.
* Lineages follow data edges: an op that reads a non-finite tensor carrying
  lineages L and writes non-finite values passes L on to what it wrote; if all
  it writes is finite (or it writes no floating tensor: a comparison, an index)
  it *absorbs* L there. Where several lineages meet, one that alone fills an input
  is passed on only if it made a difference: replaying the op with that input's
  Inf/NaN set to 1.0 changes where the output is non-finite (NaN attention scores
  plus a -inf mask are NaN either way, so the mask's lineage stops there). View
  ops (``view``, ``t``, ``detach``) pass values through and count for nothing;
  the garbage of ``aten.empty*`` outputs is ignored until an op writes them.
  A softmax that writes NaN while its non-finite inputs hold ``-inf`` alone (a row
  masked throughout: a sequence with no unmasked position) is a birth of that NaN;
  the mask's lineages are absorbed there, as in every other row.
* A lineage is

  - ``harmful`` if its values reach the loss (the tensor ``backward()`` is
    called on), a parameter or an optimizer state (checked after each
    ``optimizer.step()``), or are still non-finite and never read at the end
    (unless handled, below) when no op ever absorbed any of them and they were
    computed, not loaded (a mask that every reader absorbed and that is still held,
    or one ``torch.load`` brought in, is no harm: the program that stopped right
    after a birth is);
  - ``handled`` if, short of that, its values reached GradScaler's
    ``_amp_foreach_non_finite_check_and_unscale_``, which found the Inf/NaN, and
    the optimizer step of those iterations was skipped (no
    ``optimizer.step()`` ran before the next ``backward()``);
  - ``benign`` otherwise: every one of its non-finite values was read by an op
    that absorbed it (softmax of a masked score, ``where``, ``max``, a
    multiplication by zero...).

* A *recomputed* op is not a birth: under activation checkpointing
  (``torch.utils.checkpoint``, either ``use_reentrant``) the checkpointed function
  runs again inside ``backward()``, and an op there that writes Inf/NaN from finite
  inputs repeats a birth of the forward pass. It is recognised from the Python stack
  (the innermost frame of ``torch/utils/checkpoint.py`` is its recomputation:
  ``recompute_fn``, or ``CheckpointFunction.backward`` calling the function) and
  joins the lineage of the forward birth made by the same op, at the same lines, in
  the same checkpointed call (the function given to ``checkpoint``) of the previous
  ``backward()``'s iteration; the latest such birth first.
* The *first NaN* is the first op that wrote a NaN. The *cause* is the birth of
  the harmful lineage that carried the first NaN of any harmful lineage (if that
  op carried several, the earliest-born), else the earliest harmful birth, else
  none. The *origin* is the first birth of all.
* *Iterations* are ``backward()`` calls (but those made inside the backward pass); *optimizer steps* are completed
  ``optimizer.step()`` calls.

Use from Python (``run_oracle(path, argv)``) or as a script, which prints the
result as JSON (the program's own output goes to stderr)::

    python tests/oracle.py tests/programs/real/rnn_lm.py --steps 8
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

UNSCALE_OP = "aten._amp_foreach_non_finite_check_and_unscale_.default"


@dataclass
class Birth:
    """Where a lineage started."""

    index: int  # the op's position among all ops the oracle saw
    op: str  # e.g. "aten.addmm.default"
    line: int | None  # innermost line of the program file running at the time
    iteration: int  # backward() calls before this op
    neg_inf: int
    pos_inf: int
    nan: int
    entered: bool = False  # True: the op read a non-finite tensor that no seen op produced


@dataclass
class Lineage:
    """A birth and what became of its non-finite values."""

    birth: Birth
    kind: str = ""  # "harmful", "handled" or "benign"
    reasons: list[str] = field(default_factory=list)  # why harmful
    carried_by: int = 0  # ops (after the birth) that passed its values on
    absorbed_by: dict[str, int] = field(default_factory=dict)  # op -> times it absorbed them
    first_nan: int | None = None  # index of the first op in this lineage that wrote NaN
    unscaled: list[int] = field(default_factory=list)  # iterations whose unscale op saw it
    reached_loss: bool = False
    reached_state: list[str] = field(default_factory=list)  # "parameter", "optimizer state"
    unread_at_end: int = 0  # storages still non-finite that no op read after the write


@dataclass
class OpEvent:
    """The first NaN, or any op the result names."""

    index: int
    op: str
    line: int | None
    iteration: int
    neg_inf: int
    pos_inf: int
    nan: int


@dataclass
class Result:
    """What the oracle derived from one run."""

    program: str
    argv: list[str]
    num_ops: int = 0
    iterations: int = 0  # backward() calls
    optimizer_steps: int = 0  # completed optimizer.step() calls
    skipped_iterations: list[int] = field(default_factory=list)  # unscale found Inf/NaN, no step
    lineages: list[Lineage] = field(default_factory=list)
    first_nan: OpEvent | None = None
    cause: Birth | None = None
    untracked: list[str] = field(default_factory=list)  # non-finite state with no lineage

    @property
    def origin(self) -> Birth | None:
        return self.lineages[0].birth if self.lineages else None

    @property
    def found_harmful(self) -> bool:
        return any(lin.kind == "harmful" for lin in self.lineages)

    def kinds(self) -> dict[str, int]:
        """How many lineages of each kind."""
        out: dict[str, int] = {}
        for lin in self.lineages:
            out[lin.kind] = out.get(lin.kind, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["origin"] = asdict(self.origin) if self.origin else None
        data["found_harmful"] = self.found_harmful
        data["kinds"] = self.kinds()
        return data


# -- tensor helpers --------------------------------------------------------------------------


def _floating(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 0


def _finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


def _counts(t: torch.Tensor) -> tuple[int, int, int]:
    """(-inf, +inf, nan) counts of a floating tensor."""
    if _finite(t):
        return 0, 0, 0
    return int((t == -math.inf).sum()), int((t == math.inf).sum()), int(torch.isnan(t).sum())


def _storage_ptr(t: torch.Tensor) -> int | None:
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    return ptr or None


def _whole_storage(t: torch.Tensor) -> torch.Tensor:
    """All of ``t``'s storage as a flat tensor of ``t``'s dtype (to see past a view)."""
    storage = t.untyped_storage()
    n = storage.nbytes() // t.element_size()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, 0, (n,), (1,))


def _written_args(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors an op writes into according to its schema (``self`` of ``add_``, ``out=``)."""
    written: list[torch.Tensor] = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        written.extend(t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor))
    return written


def _allocates_uninitialised(name: str) -> bool:
    """``aten.empty_like.default`` and friends: their output holds whatever was in memory."""
    base = name.split(".")[1] if name.startswith("aten.") else ""
    return base.startswith(("empty", "new_empty"))


def _row_softmax(name: str) -> bool:
    """Softmax-like ops over a row (``aten._softmax``, SDPA's math and fused kernels)."""
    base = name.split(".")[1] if name.startswith("aten.") else ""
    return (
        "softmax" in base
        or base.startswith("_scaled_dot_product")
        or (base == "scaled_dot_product_attention")
    )


def _clone_args(args: Any, kwargs: Any) -> tuple[Any, Any]:
    cloned: tuple[Any, Any] = pytree.tree_map(
        lambda x: x.clone() if isinstance(x, torch.Tensor) else x, (args, kwargs)
    )
    return cloned


def _replayable(func: Any) -> bool:
    """Whether running ``func`` once more on copies changes nothing else (no random numbers)."""
    return torch.Tag.nondeterministic_seeded not in func.tags


def _replay_args(pristine: tuple[Any, Any], positions: set[int]) -> tuple[Any, Any]:
    """Fresh copies of the arguments, with the Inf/NaN of the leaves at ``positions`` set to 1."""
    leaves, spec = pytree.tree_flatten(pristine)
    new = []
    for i, x in enumerate(leaves):
        if isinstance(x, torch.Tensor):
            x = x.clone()
            if i in positions:
                x = torch.nan_to_num(x, nan=1.0, posinf=1.0, neginf=1.0)
        new.append(x)
    replayed: tuple[Any, Any] = pytree.tree_unflatten(new, spec)
    return replayed


def _nonfinite_masks(func: Any, args: Any, kwargs: Any, out: Any) -> list[tuple[torch.Tensor, ...]]:
    """Where each written or returned floating tensor holds NaN, +inf and -inf."""
    tensors = _written_args(func, args, kwargs)
    tensors += [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    return [(torch.isnan(t), torch.isposinf(t), torch.isneginf(t)) for t in tensors if _floating(t)]


def _same_masks(a: list[tuple[torch.Tensor, ...]], b: list[tuple[torch.Tensor, ...]]) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape and torch.equal(x, y)
        for p, q in zip(a, b, strict=True)
        for x, y in zip(p, q, strict=True)
    )


# -- the recording mode ----------------------------------------------------------------------


class _Oracle(TorchDispatchMode):
    """Watches every op; keeps, per storage, the lineages whose non-finite values it holds."""

    def __init__(self, program_file: str) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch's __init__ is unannotated
        self.program_file = str(Path(program_file).resolve())
        self.n = 0  # ops seen
        self.iteration = 0  # backward() calls so far
        self.optimizer_steps = 0
        self.stepped: set[int] = set()  # iterations in which an optimizer step ran
        self.unscale_found: dict[int, bool] = {}  # iteration -> the unscale op found Inf/NaN
        self.ptr_to_sid: dict[int, int] = {}  # storage address -> storage id
        self.next_sid = 0
        self.holds: dict[int, set[int]] = {}  # storage id -> lineages whose values it holds
        self.unread: set[int] = set()  # storage ids written non-finite and not read since
        self.uninitialised: set[int] = set()  # storage ids from aten.empty* not written yet
        self.lineages: dict[int, Lineage] = {}  # birth index -> lineage
        self.first_nan: OpEvent | None = None
        self.untracked: list[str] = []
        # (iteration, checkpointed function, op, lines) -> births in its forward, in order.
        self.checkpointed: dict[tuple[Any, ...], list[int]] = {}

    # Storage ids ----------------------------------------------------------------------------

    def _sid(self, t: torch.Tensor, fresh: bool = False) -> int | None:
        ptr = _storage_ptr(t)
        if ptr is None:
            return None
        if fresh or ptr not in self.ptr_to_sid:
            self.next_sid += 1
            self.ptr_to_sid[ptr] = self.next_sid
        return self.ptr_to_sid[ptr]

    def _uninitialised(self, t: torch.Tensor) -> bool:
        ptr = _storage_ptr(t)
        return ptr is not None and self.ptr_to_sid.get(ptr) in self.uninitialised

    def _line(self) -> int | None:
        """The innermost frame of the program file on the Python stack."""
        f: FrameType | None = sys._getframe(1)
        while f is not None:
            if f.f_code.co_filename == self.program_file:
                return f.f_lineno
            f = f.f_back
        return None

    # Every op --------------------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        index = self.n
        self.n += 1
        name = str(func)
        allocates = _allocates_uninitialised(name)

        # Before running (an in-place op overwrites its inputs): the non-finite tensors it
        # reads, and the lineages they hold.
        inputs = {
            id(t): t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
        }
        in_ptrs = {p for t in inputs.values() if (p := _storage_ptr(t)) is not None}
        nonfinite_in: list[tuple[torch.Tensor, int | None, frozenset[int]]] = []
        for t in inputs.values():
            if allocates or not _floating(t) or self._uninitialised(t) or _finite(t):
                continue
            sid = self._sid(t)
            held = self.holds.get(sid) if sid is not None else None
            if not held:
                # Non-finite values that no op we saw wrote: they entered from outside.
                held = {self._new_lineage(index, func, t, entered=True)}
                if sid is not None:
                    self.holds[sid] = held
            nonfinite_in.append((t, sid, frozenset(held)))
        flowing = set().union(*(held for *_, held in nonfinite_in))
        # Several lineages meet here: keep untouched copies of the arguments, to ask later
        # which of them made a difference.
        pristine = _clone_args(args, kwargs) if len(flowing) > 1 and _replayable(func) else None

        out = func(*args, **kwargs)

        # What it wrote: in-place/out= arguments, and returned tensors that are new storage.
        written = {id(t): (t, False) for t in _written_args(func, args, kwargs)}
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and id(t) not in written:
                ptr = _storage_ptr(t)
                if ptr is not None and ptr not in in_ptrs:
                    written[id(t)] = (t, True)  # fresh storage
                # else: a view of an input, or the input itself: nothing new was written
        if not written and any(isinstance(t, torch.Tensor) for t in pytree.tree_leaves(out)):
            return out  # a view op (view, t, detach...): values pass through untouched
        counts = []
        for t, fresh in written.values():
            sid = self._sid(t, fresh=fresh)  # a fresh storage gets a new id even at an old address
            if allocates:
                # Uninitialised memory: its garbage is nobody's Inf/NaN until an op writes it.
                if sid is not None:
                    self.uninitialised.add(sid)
                continue
            if sid is not None:
                self.uninitialised.discard(sid)
            c = _counts(t) if _floating(t) else (0, 0, 0)
            counts.append((t, fresh, sid, c))
        neg = sum(c[0] for *_, c in counts)
        pos = sum(c[1] for *_, c in counts)
        nan = sum(c[2] for *_, c in counts)
        wrote_nonfinite = neg + pos + nan > 0
        line = self._line() if (wrote_nonfinite or nonfinite_in) else None
        for _, sid, _ in nonfinite_in:
            if sid is not None:
                self.unread.discard(sid)  # its non-finite values were read

        # Which lineages this op carries on (into what it wrote), and which stop here.
        carried: set[int] = set()
        # A softmax whose non-finite inputs hold -inf alone made its NaN from a row that was
        # -inf throughout (a sequence with no unmasked position): the NaN is born here.
        masked_row = (
            bool(nan)
            and _row_softmax(name)
            and all(
                not bool(torch.isnan(t).any() or torch.isposinf(t).any()) for t, *_ in nonfinite_in
            )
        )
        if wrote_nonfinite and (not nonfinite_in or masked_row):
            carried = self._birth(index, func, (neg, pos, nan), line)
        elif wrote_nonfinite:
            carried = self._carried(func, args, kwargs, out, pristine, nonfinite_in, flowing)
        for b in flowing | carried:
            lin = self.lineages[b]
            if b in carried:
                lin.carried_by += 1
                if nan and lin.first_nan is None:
                    lin.first_nan = index
            else:
                lin.absorbed_by[name] = lin.absorbed_by.get(name, 0) + 1
        if nan and self.first_nan is None:
            self.first_nan = OpEvent(index, name, line, self.iteration, neg, pos, nan)

        # Update what each written storage holds.
        for t, fresh, sid, c in counts:
            if sid is None:
                continue
            nonfinite_here = sum(c) > 0
            whole = t.numel() * t.element_size() == t.untyped_storage().nbytes()
            if fresh or whole:
                self.holds[sid] = set(carried) if nonfinite_here else set()
            elif _floating(t) and not _finite(_whole_storage(t)):
                # Part of the storage was written; the rest still holds what it held.
                self.holds[sid] = self.holds.get(sid, set()) | (
                    carried if nonfinite_here else set()
                )
            else:
                self.holds[sid] = set()
            if self.holds[sid]:
                self.unread.add(sid)
            else:
                self.unread.discard(sid)

        if name == UNSCALE_OP:
            found_inf = args[1] if len(args) > 1 else kwargs["found_inf"]
            found = bool(found_inf.item() > 0)
            self.unscale_found[self.iteration] = (
                self.unscale_found.get(self.iteration, False) or found
            )
            if found:
                for b in flowing:
                    self.lineages[b].unscaled.append(self.iteration)
        return out

    def _carried(
        self,
        func: Any,
        args: Any,
        kwargs: Any,
        out: Any,
        pristine: tuple[Any, Any] | None,
        nonfinite_in: list[tuple[torch.Tensor, int | None, frozenset[int]]],
        flowing: set[int],
    ) -> set[int]:
        """The lineages among ``flowing`` that this op (which wrote Inf/NaN) passes on.

        With one lineage, that one. When several meet, a lineage that alone fills some
        input is carried only if it made a difference: replaying the op with that input's
        Inf/NaN replaced by 1.0 changes where the output is non-finite. (NaN scores plus a
        -inf mask give NaN either way: the mask's -inf stopped there.) A lineage that
        shares an input tensor with another cannot be told apart: it is carried. If none
        made a difference alone (each would have been enough), all are carried.
        """
        if len(flowing) == 1 or pristine is None:
            return set(flowing)
        actual = _nonfinite_masks(func, args, kwargs, out)
        carried: set[int] = set()
        for b in flowing:
            alone = [t for t, _, held in nonfinite_in if held == {b}]
            if len(alone) < sum(1 for *_, held in nonfinite_in if b in held):
                carried.add(b)  # some of its values share a tensor with another lineage
                continue
            ids = {id(t) for t in alone}
            positions = {
                i for i, x in enumerate(pytree.tree_leaves((args, kwargs))) if id(x) in ids
            }
            cargs, ckwargs = _replay_args(pristine, positions)
            cout = func(*cargs, **ckwargs)
            if not _same_masks(actual, _nonfinite_masks(func, cargs, ckwargs, cout)):
                carried.add(b)
        # None made a difference alone (each would have been enough): all of them carry on.
        return carried or set(flowing)

    def _birth(
        self, index: int, func: Any, counts: tuple[int, int, int], line: int | None
    ) -> set[int]:
        """A new lineage; for an op that activation checkpointing recomputes, the lineage of
        its forward occurrence (see the module's docstring)."""
        where = _checkpointed(sys._getframe(1), str(func))
        if where is not None and where[0] == "recompute":
            births = self.checkpointed.get((self.iteration - 1, *where[1:]))
            if births:
                return {births.pop()}
        b = self._new_lineage(index, func, None, counts=counts, line=line)
        if where is not None:
            self.checkpointed.setdefault((self.iteration, *where[1:]), []).append(b)
        return {b}

    def _new_lineage(
        self,
        index: int,
        func: Any,
        t: torch.Tensor | None,
        entered: bool = False,
        counts: tuple[int, int, int] | None = None,
        line: int | None = None,
    ) -> int:
        if counts is None:
            counts = _counts(t) if t is not None else (0, 0, 0)
        if line is None:
            line = self._line()
        birth = Birth(index, str(func), line, self.iteration, *counts, entered=entered)
        self.lineages[index] = Lineage(birth)
        return index

    # Hooks: backward() and optimizer.step() ---------------------------------------------------

    def on_backward(self, tensors: Any) -> None:
        """Called before each backward(): the loss is what it is called on."""
        self.iteration += 1
        for t in pytree.tree_leaves(tensors):
            if _floating(t) and not _finite(t):
                sid = self._sid(t)
                for b in self.holds.get(sid, set()) if sid is not None else set():
                    self.lineages[b].reached_loss = True
                if sid is None or not self.holds.get(sid):
                    self.untracked.append(f"loss of iteration {self.iteration}")

    def on_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Called after each optimizer.step(): which lineages reached parameters or state."""
        self.optimizer_steps += 1
        self.stepped.add(self.iteration)
        for group in optimizer.param_groups:
            for p in group["params"]:
                self._check_state(p, "parameter")
                for v in optimizer.state.get(p, {}).values():
                    self._check_state(v, "optimizer state")

    def _check_state(self, t: Any, what: str) -> None:
        if not _floating(t) or _finite(t):
            return
        sid = self._sid(t)
        held = self.holds.get(sid, set()) if sid is not None else set()
        for b in held:
            if what not in self.lineages[b].reached_state:
                self.lineages[b].reached_state.append(what)
        if not held:
            self.untracked.append(f"{what} {tuple(t.shape)} after step {self.optimizer_steps}")


def _checkpointed(frame: FrameType | None, op: str) -> tuple[str, Any, str, tuple[Any, ...]] | None:
    """For an op run inside a function that ``torch.utils.checkpoint`` runs: ``("forward" or
    "recompute", the function, op, the lines of the frames inside it outside torch)``."""
    inner: list[tuple[str, int]] = []
    callee: FrameType | None = None
    torch_dir = str(Path(torch.__file__).parent)
    while frame is not None:
        code = frame.f_code
        file = code.co_filename
        if file.replace("\\", "/").endswith("/utils/checkpoint.py") and file.startswith(torch_dir):
            loc, name = frame.f_locals, code.co_name
            key = (op, tuple(reversed(inner)))
            if name == "recompute_fn" and "fn" in loc:  # use_reentrant=False
                return ("recompute", loc["fn"], *key)
            if name == "checkpoint" and "function" in loc:
                return ("forward", loc["function"], *key)
            if name == "forward" and "run_function" in loc:  # use_reentrant=True
                return ("forward", loc["run_function"], *key)
            called = callee.f_code.co_filename if callee is not None else torch_dir
            if (
                name == "backward"
                and "ctx" in loc
                and not called.startswith(torch_dir + "/autograd")
            ):
                return ("recompute", getattr(loc["ctx"], "run_function", None), *key)
            return None
        if not file.startswith(torch_dir) and file != __file__:
            inner.append((file, frame.f_lineno))
        callee, frame = frame, frame.f_back
    return None


def _classify(o: _Oracle) -> list[Lineage]:
    """Kind of each lineage, in birth order."""
    for sid in o.unread:
        for b in o.holds.get(sid, set()):
            o.lineages[b].unread_at_end += 1
    out = []
    for b in sorted(o.lineages):
        lin = o.lineages[b]
        if lin.reached_loss:
            lin.reasons.append("reached the loss")
        lin.reasons += [f"reached a {what}" for what in lin.reached_state]
        handled = bool(lin.unscaled) and all(i not in o.stepped for i in lin.unscaled)
        if lin.reasons:
            lin.kind = "harmful"
        elif handled:
            lin.kind = "handled"
        elif lin.unread_at_end and not lin.absorbed_by and not _loaded(lin.birth.op):
            lin.kind = "harmful"
            lin.reasons.append(f"{lin.unread_at_end} non-finite tensor(s) never read again")
        else:
            lin.kind = "benign"
        out.append(lin)
    return out


def _loaded(op: str) -> bool:
    """Values a load put in (``torch.load``'s ``set_``, ``torch.tensor``'s ``lift_fresh``)."""
    base = op.split(".")[1] if op.startswith("aten.") else ""
    return base in ("set_", "lift_fresh", "lift_fresh_copy")


def _cause(lineages: list[Lineage]) -> Birth | None:
    harmful = [lin for lin in lineages if lin.kind == "harmful"]
    with_nan = [lin for lin in harmful if lin.first_nan is not None]
    if with_nan:
        first = min(lin.first_nan for lin in with_nan if lin.first_nan is not None)
        return min(
            (lin for lin in with_nan if lin.first_nan == first), key=lambda lin: lin.birth.index
        ).birth
    return harmful[0].birth if harmful else None


# -- running a program -----------------------------------------------------------------------


def load_program(path: str | Path) -> Any:
    """Import a program file as a module (its ``if __name__ == "__main__"`` part does not run)."""
    path = Path(path).resolve()
    spec = importlib.util.spec_from_file_location(f"_oracle_program_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look their module up there
    spec.loader.exec_module(module)
    return module


def run_oracle(path: str | Path, argv: list[str]) -> Result:
    """Run ``main(argv)`` of the program at ``path`` under the oracle."""
    path = Path(path).resolve()
    module = load_program(path)
    oracle = _Oracle(str(path))
    real_backward = torch.autograd.backward

    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        # A backward() inside the backward pass (a reentrant checkpoint's) is no iteration.
        if torch._C._current_autograd_node() is None:
            oracle.on_backward(tensors)
        return real_backward(tensors, *args, **kwargs)

    hook = register_optimizer_step_post_hook(lambda opt, args, kwargs: oracle.on_step(opt))
    torch.autograd.backward = backward  # Tensor.backward() calls torch.autograd.backward
    threads = torch.get_num_threads()
    try:
        # The program seeds and sets threads as it likes; the caller's state comes back after.
        with torch.random.fork_rng(devices=[]), oracle:
            module.main(list(argv))
    finally:
        torch.autograd.backward = real_backward
        hook.remove()
        torch.set_num_threads(threads)
    lineages = _classify(oracle)
    return Result(
        program=str(path),
        argv=list(argv),
        num_ops=oracle.n,
        iterations=oracle.iteration,
        optimizer_steps=oracle.optimizer_steps,
        skipped_iterations=sorted(
            i for i, f in oracle.unscale_found.items() if f and i not in oracle.stepped
        ),
        lineages=lineages,
        first_nan=oracle.first_nan,
        cause=_cause(lineages),
        untracked=oracle.untracked,
    )


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python tests/oracle.py PROGRAM.py [program args ...]")
    with contextlib.redirect_stdout(sys.stderr):
        result = run_oracle(sys.argv[1], sys.argv[2:])
    print(json.dumps(result.to_json(), indent=1))


if __name__ == "__main__":
    main()
