"""What a JAX training step returns, sorted into the sentinel's checks, and the one jitted
reduction that measures it once per step.

A step's outputs are a pytree. Each array leaf is put in one check (``loss``,
``gradients``, ``parameters``, ``optimizer_state``) or none:

1. by name: the first key or attribute on its path named ``loss``; ``grads``, ``grad``
   or ``gradients``; ``params`` or ``parameters``; ``opt_state`` or ``optimizer_state``
   (a dict ``{"params": ..., "loss": ...}``, a flax ``TrainState``, a metrics dict);
2. by type: leaves inside an optax state (``optax.ScaleByAdamState``...) are optimizer
   state;
3. in a tuple, list or dict of outputs whose items are not named (``params, opt_state,
   loss``): an item with the structure (tree, shapes, dtypes) of one of the step's
   arguments is its new parameters, and a lone floating scalar item is the loss.

Leaves in no check (metrics other than the loss, a mask handed back as it came in) are
not looked at: an intended ``-inf`` there trips nothing.

:func:`layout_of` works this out once per output structure; :meth:`Layout.measure`
runs one jitted program over the checked leaves (each leaf's largest ``|x|``, the
gradients' sum of squares) that returns one small float vector, and copies it to the
host: the one synchronisation of a step.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

LOSS = "loss"
GRADIENTS = "gradients"
PARAMETERS = "parameters"
OPTIMIZER_STATE = "optimizer_state"
GROUPS = (GRADIENTS, PARAMETERS, OPTIMIZER_STATE)

_NAMES = {
    "loss": LOSS,
    "grads": GRADIENTS,
    "grad": GRADIENTS,
    "gradients": GRADIENTS,
    "params": PARAMETERS,
    "parameters": PARAMETERS,
    "opt_state": OPTIMIZER_STATE,
    "optimizer_state": OPTIMIZER_STATE,
}

# The measured vector: these figures, one bad flag per check (as CHECKS), then one
# largest |x| per module.
_FIGURES = ("loss", "grad_norm", "grad_amax", "param_amax", "state_amax", "param_norm")
_BAD = (LOSS, GRADIENTS, PARAMETERS, OPTIMIZER_STATE)


@dataclass(frozen=True)
class Figures:
    """One step's figures (``None``: not measured) and which checks saw Inf/NaN."""

    loss: float | None
    grad_norm: float | None
    grad_amax: float | None
    param_amax: float | None
    state_amax: float | None
    param_norm: float | None
    module_amax: tuple[float | None, ...]
    bad: tuple[str, ...]


def _key_name(key: Any) -> str | None:
    if isinstance(key, jax.tree_util.DictKey):
        return key.key if isinstance(key.key, str) else None
    if isinstance(key, jax.tree_util.GetAttrKey):
        return str(key.name)
    return None


def _key_text(key: Any) -> str:
    if isinstance(key, jax.tree_util.DictKey):
        return str(key.key)
    if isinstance(key, jax.tree_util.GetAttrKey):
        return str(key.name)
    if isinstance(key, jax.tree_util.SequenceKey):
        return str(key.idx)
    return str(key)


def _is_optax_state(node: Any) -> bool:
    return isinstance(node, tuple) and type(node).__module__.split(".")[0] == "optax"


def _is_float_array(leaf: Any) -> bool:
    """A floating array with elements (or its abstract value, ``jax.ShapeDtypeStruct``)."""
    return (
        isinstance(leaf, (jax.Array, np.ndarray, jax.ShapeDtypeStruct))
        and jnp.issubdtype(leaf.dtype, jnp.floating)
        and math.prod(leaf.shape) > 0
    )


def _largest_abs(x: jax.Array, exact: bool) -> jax.Array:
    """The largest ``|x|`` as float32, never missing an Inf or NaN.

    XLA's max-reductions on the CPU do not keep NaN (the max of an all-NaN array comes
    out ``-inf``, of ``[1, nan]`` ``1``), so no NaN may reach one. The per-step check
    counts NaN as ``+inf`` (one float max-reduction: any Inf/NaN makes it ``inf``);
    ``exact`` (a bad step, measured again) tells NaN from Inf with an integer
    max-reduction over the bits of ``|x|`` (NaN's are above Inf's; slower on the CPU).
    """
    if not exact:
        return jnp.max(jnp.where(jnp.isnan(x), jnp.inf, jnp.abs(x))).astype(jnp.float32)
    wide = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    if wide == jnp.float64:
        ints, inf, magnitude = jnp.int64, 0x7FF0000000000000, 0x7FFFFFFFFFFFFFFF
    else:
        ints, inf, magnitude = jnp.int32, 0x7F800000, 0x7FFFFFFF
    bits = lax.bitcast_convert_type(x.astype(wide), ints) & jnp.array(magnitude, ints)
    top = jnp.max(bits)
    value = lax.bitcast_convert_type(top, wide).astype(jnp.float32)
    return jnp.where(top > inf, jnp.float32(jnp.nan), value)


def signature(tree: Any) -> Hashable:
    """A pytree's structure, shapes and dtypes: equal for a step's state in and out."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    # A Python number reads as the array JAX makes of it: TrainState.create's step=0 comes
    # back from the first step as an int32 array.
    return treedef, tuple(
        (tuple(x.shape), str(x.dtype))
        if isinstance(x, jax.ShapeDtypeStruct)
        else (np.shape(x), str(jnp.result_type(x)))
        for x in leaves
    )


@dataclass
class Layout:
    """Where each check's leaves are in one output structure, and the program that
    measures them."""

    loss: int | None  # flat leaf index of the loss (None: none, or the user's selector)
    groups: dict[str, tuple[int, ...]]  # GRADIENTS/PARAMETERS/OPTIMIZER_STATE -> leaf indices
    modules: tuple[str, ...]  # top-level parameter subtrees
    module_of: tuple[int, ...]  # per parameter leaf (in groups[PARAMETERS] order)
    # Output items that are state the step took as an argument: (item key, argument key),
    # the item key an index or dict key (None: the whole output), the argument key an
    # index into args or a keyword's name.
    state_items: tuple[tuple[Any, int | str], ...]
    selected_loss: bool  # the loss comes from the user's selector

    @property
    def checks_anything(self) -> bool:
        return self.loss is not None or self.selected_loss or any(self.groups.values())

    def measure(
        self, leaves: Sequence[Any], loss: Any = None, amax: bool = True, norms: Any = None
    ) -> Figures:
        """Measure one step's output leaves (``loss``: the selector's value): one jitted
        program, one copy of its small result to the host. Without ``amax``, the norms
        and flags only (see :func:`_measure`), or ``norms``, what :meth:`norms` computed
        inside the step; a step they flag is measured again with the largest ``|x|``,
        exactly (see :func:`_largest_abs`), which decides."""
        picked = [leaves[i] for i in self.used]
        if self.loss is not None:
            loss = leaves[self.loss]
        shape = self._shape
        if norms is None or amax:
            norms = _measure(shape, loss, picked, amax, False)
        figures = self._read(np.asarray(norms), loss, amax)  # the step's one host sync
        if figures.bad:
            exact = np.asarray(_measure(shape, loss, picked, True, True))
            figures = self._read(exact, loss, True)
        return figures

    def norms(self, leaves: Sequence[Any], loss: Any = None) -> jax.Array:
        """The norms and flags of :meth:`measure` without ``amax``, as a traced value: to
        compute them inside the step's own program."""
        if self.loss is not None:
            loss = leaves[self.loss]
        norms: jax.Array = _measure(self._shape, loss, [leaves[i] for i in self.used], False, False)
        return norms

    @property
    def used(self) -> tuple[int, ...]:
        return tuple(i for g in GROUPS for i in self.groups[g])

    @functools.cached_property
    def _shape(self) -> _Shape:
        return _Shape(tuple(len(self.groups[g]) for g in GROUPS), self.module_of, len(self.modules))

    def _read(self, v: np.ndarray, loss: Any, amax: bool) -> Figures:
        has_loss = loss is not None
        figures = [float(x) for x in v[: len(_FIGURES)]]
        flags = v[len(_FIGURES) : len(_FIGURES) + len(_BAD)]
        present = {
            "loss": has_loss,
            "grad_norm": bool(self.groups[GRADIENTS]),
            "grad_amax": amax and bool(self.groups[GRADIENTS]),
            "param_amax": amax and bool(self.groups[PARAMETERS]),
            "state_amax": amax and bool(self.groups[OPTIMIZER_STATE]),
            "param_norm": bool(self.groups[PARAMETERS]),
        }
        kept = [x if present[name] else None for name, x in zip(_FIGURES, figures, strict=True)]
        modules = tuple(float(x) for x in v[len(_FIGURES) + len(_BAD) :])
        return Figures(
            loss=kept[0],
            grad_norm=kept[1],
            grad_amax=kept[2],
            param_amax=kept[3],
            state_amax=kept[4],
            param_norm=kept[5],
            module_amax=modules,
            bad=tuple(name for name, flag in zip(_BAD, flags, strict=True) if flag),
        )


@dataclass(frozen=True)
class _Shape:
    """What the measuring program's code depends on (with the leaves' shapes and dtypes,
    its compilation cache key)."""

    counts: tuple[int, ...]  # leaves per group, in GROUPS order
    module_of: tuple[int, ...]  # per parameter leaf: its module
    modules: int


# Leaves smaller than this are joined into one vector before they are reduced: on the CPU
# XLA runs each reduction as a loop of its own (about 15 us each however small), and a
# model's many biases and norm scales would cost more in launches than in reading.
JOIN_BELOW = 1 << 16


def _pieces(leaves: list[jax.Array]) -> list[jax.Array]:
    """``leaves`` as few flat vectors: the large ones each as they are, the small ones
    joined (float64 apart, the rest as float32)."""
    small = [x.ravel() for x in leaves if x.size < JOIN_BELOW]
    out = [x for x in leaves if x.size >= JOIN_BELOW]
    for wide in (False, True):
        same = [x for x in small if (x.dtype == jnp.float64) == wide]
        if same:
            out.append(jnp.concatenate([x if wide else x.astype(jnp.float32) for x in same]))
    return out


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _measure(shape: _Shape, loss: Any, picked: list[Any], amax: bool, exact: bool) -> jax.Array:
    """The traced reduction: every figure and flag in one float32 vector (compiled once for
    each shape, mode and the leaves' shapes and dtypes, shared by every sentinel).

    Without ``amax``, the sums of squares alone (one reduction per group), whose Inf/NaN
    flags the group: a sum keeps every NaN and Inf (no reduction order drops them), and
    also overflows on huge finite values, which the largest ``|x|``, measured then,
    tells apart. With ``amax``, the largest ``|x|`` of each group and module too.
    """
    f32 = jnp.float32
    nan = jnp.array(jnp.nan, f32)
    start = 0
    leaves: dict[str, list[jax.Array]] = {}
    for g, count in zip(GROUPS, shape.counts, strict=True):
        leaves[g] = picked[start : start + count]
        start += count

    def biggest(values: list[jax.Array]) -> jax.Array:
        # No NaN reaches a max (see _largest_abs): NaN is kept by hand.
        if not values:
            return nan
        stacked = jnp.stack(values)
        return jnp.where(jnp.isnan(stacked).any(), nan, jnp.max(stacked))

    def squares(pieces: list[jax.Array]) -> jax.Array:
        if not pieces:
            return nan
        return sum((jnp.sum(jnp.square(v.astype(f32))) for v in pieces), f32(0))

    if loss is None:
        loss_value, loss_bad = nan, jnp.array(False)
    else:
        loss_arr = jnp.asarray(loss).astype(f32)
        loss_value = jnp.mean(loss_arr)
        loss_bad = ~jnp.isfinite(loss_value) | ~jnp.isfinite(jnp.sum(loss_arr * 0))
    by_module = [
        _pieces([x for x, m in zip(leaves[PARAMETERS], shape.module_of, strict=True) if m == k])
        for k in range(shape.modules)
    ]
    sums = {
        GRADIENTS: squares(_pieces(leaves[GRADIENTS])),
        PARAMETERS: squares([v for pieces in by_module for v in pieces]),
        OPTIMIZER_STATE: squares(_pieces(leaves[OPTIMIZER_STATE])),
    }
    counts = dict(zip(GROUPS, shape.counts, strict=True))
    if amax:
        modules = [biggest([_largest_abs(v, exact) for v in pieces]) for pieces in by_module]
        group = {
            GRADIENTS: biggest([_largest_abs(v, exact) for v in _pieces(leaves[GRADIENTS])]),
            PARAMETERS: biggest(modules),
            OPTIMIZER_STATE: biggest(
                [_largest_abs(v, exact) for v in _pieces(leaves[OPTIMIZER_STATE])]
            ),
        }
        bad = {g: ~jnp.isfinite(group[g]) for g in GROUPS}
    else:
        modules = []
        group = {g: nan for g in GROUPS}
        bad = {g: ~jnp.isfinite(sums[g]) for g in GROUPS}
    flags = [loss_bad] + [bad[g] if counts[g] else jnp.array(False) for g in GROUPS]
    return jnp.stack(
        [
            loss_value,
            jnp.sqrt(sums[GRADIENTS]),
            group[GRADIENTS],
            group[PARAMETERS],
            group[OPTIMIZER_STATE],
            jnp.sqrt(sums[PARAMETERS]),
            *[f.astype(f32) for f in flags],
            *modules,
        ]
    )


def layout_of(
    outputs: Any, args: Sequence[Any], kwargs: Mapping[str, Any], selected_loss: bool
) -> Layout:
    """Sort a step's output leaves into the checks (see the module's docstring)."""
    with_paths, _ = jax.tree_util.tree_flatten_with_path(outputs)
    n = len(with_paths)
    check: list[str | None] = [None] * n
    module_depth: list[int] = [0] * n  # where a parameter leaf's module key is on its path
    for i, (path, _leaf) in enumerate(with_paths):
        for depth, key in enumerate(path):
            name = _key_name(key)
            if name in _NAMES:
                check[i] = _NAMES[name]
                module_depth[i] = depth + 1
                break
    # Optax states, wherever they are: their leaves are contiguous in the flattening order.
    at = 0
    for node in jax.tree_util.tree_leaves(outputs, is_leaf=_is_optax_state):
        if not _is_optax_state(node):
            at += 1
            continue
        count = len(jax.tree_util.tree_leaves(node))
        for i in range(at, at + count):
            if check[i] is None:
                check[i] = OPTIMIZER_STATE
        at += count

    state_items: list[tuple[Any, int | str]] = []
    arguments: list[tuple[int | str, Hashable]] = [
        (i, signature(a)) for i, a in enumerate(args) if jax.tree_util.tree_leaves(a)
    ] + [(k, signature(v)) for k, v in kwargs.items() if jax.tree_util.tree_leaves(v)]
    # The outputs are one item: not a container, or the state as it came in, whole
    # (``state = step(state, batch)``).
    items = _items(outputs)
    if any(s == signature(outputs) for _, s in arguments):
        items = [(None, outputs)]
    whole = bool(items) and items[0][0] is None
    taken: set[int | str] = set()
    loss_items: list[int] = []
    for key, value in items:
        leaf_indices = [
            i for i, (path, _) in enumerate(with_paths) if _item_key(outputs, path, whole) == key
        ]
        if not leaf_indices:
            continue
        sig = signature(value)
        match = next((a for a, s in arguments if s == sig and a not in taken), None)
        unnamed = all(check[i] is None for i in leaf_indices)
        if match is not None and (unnamed or any(check[i] in (PARAMETERS, OPTIMIZER_STATE)
                                                 for i in leaf_indices)):  # fmt: skip
            taken.add(match)
            state_items.append((key, match))
            if unnamed and PARAMETERS not in check:
                for i in leaf_indices:
                    check[i] = PARAMETERS
                    module_depth[i] = 0 if key is None else 1
        elif unnamed and len(leaf_indices) == 1:
            leaf = with_paths[leaf_indices[0]][1]
            if _is_float_array(leaf) and len(leaf.shape) == 0:
                loss_items.append(leaf_indices[0])

    loss: int | None = None
    if not selected_loss:
        named = [i for i in range(n) if check[i] == LOSS and _is_float_array(with_paths[i][1])]
        if named:
            loss = named[0]
        elif len(loss_items) == 1:
            loss = loss_items[0]
    groups = {
        g: tuple(i for i in range(n) if check[i] == g and _is_float_array(with_paths[i][1]))
        for g in GROUPS
    }
    modules: list[str] = []
    module_of: list[int] = []
    for i in groups[PARAMETERS]:
        path = with_paths[i][0]
        depth = module_depth[i]
        # A flax variables dict inside: {"params": {"Dense_0": ...}} -> "Dense_0".
        while depth < len(path) - 1 and _key_name(path[depth]) in ("params", "parameters"):
            depth += 1
        name = _key_text(path[depth]) if depth < len(path) else "params"
        if name not in modules:
            modules.append(name)
        module_of.append(modules.index(name))
    return Layout(
        loss=loss,
        groups=groups,
        modules=tuple(modules),
        module_of=tuple(module_of),
        state_items=tuple(state_items),
        selected_loss=selected_loss,
    )


def _items(outputs: Any) -> list[tuple[Any, Any]]:
    """The top-level items of a step's outputs: (key, value); one item keyed None when the
    outputs are not a tuple, list or dict."""
    if isinstance(outputs, (tuple, list)) and not _is_optax_state(outputs):
        return list(enumerate(outputs))
    if isinstance(outputs, dict):
        return list(outputs.items())
    return [(None, outputs)]


def _item_key(outputs: Any, path: Sequence[Any], whole: bool) -> Any:
    """Which item of :func:`_items` a leaf's path starts in."""
    if whole or not path:
        return None
    key = path[0]
    if isinstance(key, jax.tree_util.SequenceKey):
        return key.idx
    if isinstance(key, jax.tree_util.DictKey):
        return key.key
    if isinstance(key, jax.tree_util.GetAttrKey) and hasattr(outputs, "_fields"):
        return list(outputs._fields).index(key.name)  # a namedtuple's field
    return None


def roll_back(outputs: Any, layout: Layout, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """The step's outputs with each state item replaced by the argument it came from: the
    state the step began with."""

    def arg(key: int | str) -> Any:
        return args[key] if isinstance(key, int) else kwargs[key]

    swaps = dict(layout.state_items)
    if None in swaps:
        return arg(swaps[None])
    if isinstance(outputs, dict):
        out = dict(outputs)
        for k, a in swaps.items():
            out[k] = arg(a)
        return type(outputs)(out) if type(outputs) is not dict else out
    values = [arg(swaps[i]) if i in swaps else v for i, v in enumerate(outputs)]
    if hasattr(outputs, "_fields"):  # a namedtuple
        return type(outputs)(*values)
    return type(outputs)(values)
