"""Real JAX programs for the JAX backend's tests: two healthy models and a dozen known bugs.

Each program is written the way people write JAX: parameters in a pytree (or a flax.linen
model), synthetic data made from a seed (nothing is downloaded), a loss, an optax optimizer and
the usual training step (:func:`make_train_step`: the loss's value and gradients, then the
update). ``build`` makes a :class:`Training` (the step, the initial state, the batches) without
running anything; its ``run(jit=True)`` trains with ``jax.jit(train_step)``, ``run(jit=False)``
with ``train_step`` itself (op by op). A :class:`Run` keeps the arguments and results of every
call of the step, so that the oracle (``tests/jax_oracle.py``) can replay any call equation by
equation and compare.

The buggy programs' first Inf/NaN is born in their first training step, from a known cause,
which :class:`Expected` states: the primitive whose output first holds an Inf or NaN, the line
of this file it comes from, whether it is a backward (transposed) equation, and the iteration
when it is inside ``lax.scan`` or ``lax.while_loop``; and the first equation whose output holds
a NaN, which is often a different one. The lines are marked with a trailing comment
``# <- LABEL``; :func:`line_of` finds them by that text. The line is the one JAX records for the
equation (its ``source_info``): a backward equation has the line of the forward operation it
differentiates (but a custom_vjp's backward rule: the rule's own line, where nanscope and the
oracle both put it; JAX itself would give the line that called the function), and the
equations inside jnp functions have the line that called them.

``PROGRAMS`` lists them all by name::

    training = PROGRAMS["mlp_unscaled_pixels"].build(steps=3)
    jax.make_jaxpr(training.train_step)(*training.first_call())  # the first step's jaxpr
    run = training.run(jit=True)  # run.losses: [nan, nan, nan]
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax  # type: ignore[import-untyped]

from nanscope.examples import data as digits_data

FILE = str(Path(__file__).resolve())

Params = dict[str, jax.Array]
Kind = Literal["nan", "-inf", "+inf"]


# -- What a program is, and what its first Inf/NaN should be ---------------------------------


@functools.cache
def _labels() -> dict[str, int]:
    lines = Path(FILE).read_text().splitlines()
    found: dict[str, int] = {}
    for number, text in enumerate(lines, start=1):
        match = re.search(r"#\s*<-\s*([\w.]+)\s*$", text)
        if match:
            if match.group(1) in found:
                raise ValueError(f"label {match.group(1)!r} marks two lines")
            found[match.group(1)] = number
    return found


def line_of(label: str) -> int:
    """The line of this file that ends with ``# <- label``."""
    return _labels()[label]


@dataclass(frozen=True)
class Birth:
    """An equation output that holds Inf or NaN, as an independent oracle should find it."""

    primitive: str  # e.g. "log", "div", "dot_general"
    label: str  # the line: the one marked ``# <- label``
    kind: Kind  # what the output holds: "nan" if any NaN, else the sign of its infinities
    backward: bool = False  # a transposed equation (its name stack says "transpose")
    loop: str | None = None  # "scan" or "while" when inside a loop (the innermost)
    iteration: int | None = None  # that loop's iteration, counted from 0 in execution order

    @property
    def line(self) -> int:
        return line_of(self.label)


@dataclass(frozen=True)
class Expected:
    """Where a program's first non-finite values are born, in call ``step`` of its step."""

    first: Birth  # the first equation output holding Inf or NaN
    first_nan: Birth | None  # the first holding NaN (None: no NaN at all in that call)
    step: int = 0


@dataclass
class Run:
    """What a training run did: the step function it called (jitted or not), and the
    arguments, results and loss of every call."""

    step: Callable[..., Any]
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


@dataclass
class Training:
    """A training loop ready to run: the step, the initial state and the batches."""

    train_step: Callable[..., tuple[Any, optax.OptState, jax.Array]]
    params: Any
    opt_state: optax.OptState
    batches: Sequence[tuple[jax.Array, ...]]

    def first_call(self) -> tuple[Any, ...]:
        """The arguments of the first call of ``train_step``."""
        return (self.params, self.opt_state, *self.batches[0])

    def run(self, jit: bool = True) -> Run:
        """Train on every batch, with ``jax.jit(train_step)`` or ``train_step`` itself."""
        step = jax.jit(self.train_step) if jit else self.train_step
        run = Run(step)
        params, opt_state = self.params, self.opt_state
        for batch in self.batches:
            args = (params, opt_state, *batch)
            params, opt_state, loss = step(*args)
            run.calls.append(args)
            run.outputs.append((params, opt_state, loss))
            run.losses.append(float(loss))
        return run


def make_train_step(
    loss_fn: Callable[..., jax.Array], optimizer: optax.GradientTransformation
) -> Callable[..., tuple[Any, optax.OptState, jax.Array]]:
    """The usual step: the loss and its gradients, then the optimizer's update."""

    def train_step(
        params: Any, opt_state: optax.OptState, *batch: jax.Array
    ) -> tuple[Any, optax.OptState, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def _training(
    loss_fn: Callable[..., jax.Array],
    optimizer: optax.GradientTransformation,
    params: Any,
    batches: Sequence[tuple[jax.Array, ...]],
) -> Training:
    return Training(make_train_step(loss_fn, optimizer), params, optimizer.init(params), batches)


@dataclass(frozen=True)
class Program:
    """A named program: how to build it, and what its first training step should do."""

    name: str
    summary: str
    build: Callable[..., Training]  # build(steps=..., **options)
    expected: Expected | None  # None: no Inf or NaN at all
    healthy: bool  # trains normally (intended infinities, such as masks, allowed)

    def run(self, jit: bool = True, **options: Any) -> Run:
        """Build the program and train it (``options`` go to ``build``: ``steps``...)."""
        return self.build(**options).run(jit)


# -- The seed's MLP: 784-500-10 on synthetic digits, hand-written cross-entropy, Adam ---------
#
# The Debugger V2 tutorial's model, in JAX. `mlp_unscaled_pixels` forgets to divide the pixels
# by 255: the logits are in the hundreds, the softmax underflows to exactly 0 and log(0) is
# -inf in the very first step; then 0 * -inf is NaN in the same line.
# `mlp_nan_input` has one NaN pixel in the first batch (a corrupt image): the first operation
# that reads the batch, the matmul, is the first to output NaN.


@functools.cache
def _digits(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    images, labels = digits_data.synthetic_digits(n, seed)
    return images.reshape(n, 784).astype(np.float32), labels


def mlp_init(key: jax.Array) -> Params:
    k1, k2 = jax.random.split(key)
    std = 0.05
    return {
        "w1": std * jax.random.truncated_normal(k1, -2.0, 2.0, (784, 500)),
        "b1": jnp.full(500, 0.1),
        "w2": std * jax.random.truncated_normal(k2, -2.0, 2.0, (500, 10)),
        "b2": jnp.full(10, 0.1),
    }


def mlp_logits(params: Params, x: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ params["w1"] + params["b1"])  # <- mlp.hidden
    return h @ params["w2"] + params["b2"]


def mlp_loss(params: Params, x: jax.Array, labels: jax.Array) -> jax.Array:
    probs = jax.nn.softmax(mlp_logits(params, x))
    return -(labels * jnp.log(probs)).sum() / x.shape[0]  # <- mlp.log


def mlp_predict(params: Params, x: jax.Array) -> jax.Array:
    """Class probabilities (a forward pass alone, as evaluation runs it)."""
    return jax.nn.softmax(mlp_logits(params, x))


def build_mlp(
    steps: int = 4,
    *,
    batch: int = 32,
    scale_pixels: bool = True,
    nan_pixel: bool = False,
    seed: int = 0,
) -> Training:
    """The MLP, Adam (learning rate 1e-3), ``steps`` batches of ``batch`` digits."""
    images, labels = _digits(batch * steps, seed)
    x = images / 255.0 if scale_pixels else images.copy()
    if nan_pixel:
        x[5, 400] = np.nan  # one corrupt pixel in image 5 of the first batch
    y = np.eye(10, dtype=np.float32)[labels]
    batches = [
        (jnp.asarray(x[i * batch : (i + 1) * batch]), jnp.asarray(y[i * batch : (i + 1) * batch]))
        for i in range(steps)
    ]
    return _training(mlp_loss, optax.adam(1e-3), mlp_init(jax.random.PRNGKey(seed)), batches)


# -- A small causal Transformer LM (flax.linen), AdamW ---------------------------------------
#
# Attention masks the future, and padding, with -inf (jnp.where(mask, scores, -inf)): a healthy
# run holds -inf by design, and the softmax turns it into exact zeros. `transformer_empty_sequence`
# has a batch with an empty sequence (all padding): every score of its rows is masked, the
# softmax subtracts the row's max, -inf - (-inf), and the result is NaN.

VOCAB = 16
PAD = 0
SEQ_LEN = 16


class CausalSelfAttention(nn.Module):
    n_heads: int

    @nn.compact
    def __call__(self, x: jax.Array, not_pad: jax.Array) -> jax.Array:
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = jnp.split(nn.Dense(3 * d)(x), 3, axis=-1)
        q, k, v = (a.reshape(b, t, h, d // h).transpose(0, 2, 1, 3) for a in (q, k, v))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // h)
        causal = nn.make_causal_mask(not_pad, dtype=jnp.bool_)  # (b, 1, t, t)
        mask = causal & not_pad[:, None, None, :]  # no attending to padding
        scores = jnp.where(mask, scores, -jnp.inf)  # <- transformer.mask
        weights = jax.nn.softmax(scores, axis=-1)  # <- transformer.softmax
        out = (weights @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
        return nn.Dense(d)(out)


class Block(nn.Module):
    n_heads: int

    @nn.compact
    def __call__(self, x: jax.Array, not_pad: jax.Array) -> jax.Array:
        d = x.shape[-1]
        x = x + CausalSelfAttention(self.n_heads)(nn.LayerNorm()(x), not_pad)
        return x + nn.Dense(d)(nn.gelu(nn.Dense(4 * d)(nn.LayerNorm()(x))))


class TransformerLM(nn.Module):
    vocab: int = VOCAB
    d_model: int = 32
    n_heads: int = 2
    n_layers: int = 2
    max_len: int = SEQ_LEN

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        not_pad = tokens != PAD
        embed = nn.Embed(self.vocab, self.d_model)
        pos = self.param("pos", nn.initializers.normal(0.02), (self.max_len, self.d_model))
        x = embed(tokens) + pos[: tokens.shape[1]]
        for _ in range(self.n_layers):
            x = Block(self.n_heads)(x, not_pad)
        return embed.attend(nn.LayerNorm()(x))  # weights tied with the embedding


_init_lm = jax.jit(TransformerLM().init)


def token_batches(n_batches: int, batch: int, seed: int) -> np.ndarray:
    """Sequences of a toy language: arithmetic progressions over the tokens 1..15, of random
    lengths 8..16, padded with 0 at the end. (n_batches, batch, SEQ_LEN) int32."""
    rng = np.random.default_rng(seed)
    n = n_batches * batch
    start = rng.integers(0, VOCAB - 1, n)[:, None]
    stride = rng.integers(1, 4, n)[:, None]
    tokens = 1 + (start + stride * np.arange(SEQ_LEN)) % (VOCAB - 1)
    lengths = rng.integers(8, SEQ_LEN + 1, n)
    tokens[np.arange(SEQ_LEN) >= lengths[:, None]] = PAD
    return tokens.reshape(n_batches, batch, SEQ_LEN).astype(np.int32)


def lm_loss(params: Any, tokens: jax.Array) -> jax.Array:
    logits = TransformerLM().apply({"params": params}, tokens[:, :-1])
    targets = tokens[:, 1:]
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    weights = (targets != PAD).astype(jnp.float32)  # no loss on padding
    loss: jax.Array = (losses * weights).sum() / jnp.maximum(weights.sum(), 1.0)
    return loss


def build_transformer(
    steps: int = 3, *, batch: int = 8, empty_sequence: bool = False, seed: int = 0
) -> Training:
    """The LM, AdamW (learning rate 3e-3), ``steps`` batches of ``batch`` sequences."""
    tokens = token_batches(steps, batch, seed)
    if empty_sequence:
        tokens[0, 3] = PAD  # sequence 3 of the first batch is empty
    variables = _init_lm(jax.random.PRNGKey(seed), tokens[0, :, :-1])
    batches = [(jnp.asarray(t),) for t in tokens]
    return _training(lm_loss, optax.adamw(3e-3, weight_decay=0.01), variables["params"], batches)


# -- 0/0 in a normalisation: per-image standardisation of a blank image ----------------------
#
# Each image is standardised inside the model, (x - mean) / std, with no epsilon. A blank
# image (all zeros: a failed scan) is constant, its std is 0 and every pixel becomes 0/0.
# (The std is written out: jnp.std would add a NaN of its own first, an intended one: jnp.var
# computes where(count > 0, variance, nan), and that NaN constant is an equation output.)


def standardized_loss(params: Params, x: jax.Array, labels: jax.Array) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    std = jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True))
    x = (x - mean) / std  # <- standardize.div
    logits = mlp_logits(params, x)
    loss: jax.Array = optax.softmax_cross_entropy(logits, labels).mean()
    return loss


def build_standardize(steps: int = 3, *, batch: int = 32, seed: int = 0) -> Training:
    """An MLP on standardised digits, SGD; image 7 of the first batch is blank."""
    images, labels = _digits(batch * steps, seed)
    x = images / 255.0
    x[7] = 0.0
    y = np.eye(10, dtype=np.float32)[labels]
    batches = [
        (jnp.asarray(x[i * batch : (i + 1) * batch]), jnp.asarray(y[i * batch : (i + 1) * batch]))
        for i in range(steps)
    ]
    return _training(standardized_loss, optax.sgd(0.1), mlp_init(jax.random.PRNGKey(seed)), batches)


# -- sqrt at zero, in the backward pass: pairwise distances in a metric-learning loss --------
#
# A contrastive loss on the Euclidean distances between all pairs of embeddings of a batch.
# The distance of each embedding to itself is sqrt(0) = 0: finite. sqrt's derivative there,
# 0.5 / sqrt(0), is +inf; JAX computes it with the forward pass (under `jvp`, not
# `transpose`), and the backward pass multiplies it by the zero gradient that reaches the
# diagonal: inf * 0 = NaN. The loss is finite; the gradients are NaN.


def contrastive_loss(params: Params, x: jax.Array, classes: jax.Array) -> jax.Array:
    e = jnp.tanh(x @ params["w"])
    dist = jnp.sqrt(jnp.sum((e[:, None, :] - e[None, :, :]) ** 2, axis=-1))  # <- distance.sqrt
    same = (classes[:, None] == classes[None, :]).astype(jnp.float32)
    margin = 1.0
    per_pair = same * dist**2 + (1.0 - same) * jax.nn.relu(margin - dist) ** 2
    return per_pair.mean()


def build_pairwise_distance(steps: int = 3, *, batch: int = 16, seed: int = 0) -> Training:
    """Embed digits with a linear layer and tanh; a contrastive loss, SGD."""
    images, labels = _digits(batch * steps, seed)
    x = images / 255.0
    classes = labels.astype(np.int32)
    batches = [
        (
            jnp.asarray(x[i * batch : (i + 1) * batch]),
            jnp.asarray(classes[i * batch : (i + 1) * batch]),
        )
        for i in range(steps)
    ]
    params = {"w": 0.05 * jax.random.normal(jax.random.PRNGKey(seed), (784, 16))}
    return _training(contrastive_loss, optax.sgd(0.05), params, batches)


# -- The jnp.where gradient trap: an entropy bonus on sparse (relu-normalised) weights ------
#
# A mixture whose weights are relu(scores) normalised: many weights are exactly 0. The entropy
# is written "safely", log_p = where(p > 0, log(p), 0): the forward result is finite, though
# log(0) = -inf is computed in the branch that `where` discards. Under grad the discarded
# branch still gets its derivative: the cotangent there is 0, log's derivative divides it by
# p = 0, and 0 / 0 is NaN in the backward pass.


def sparse_mixture_loss(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    r = jax.nn.relu(x @ params["gate"])
    p = r / (r.sum(-1, keepdims=True) + 1e-6)
    log_p = jnp.where(p > 0, jnp.log(p), 0.0)  # <- where.log
    entropy = -(p * log_p).sum(-1)
    pred = (p * (x @ params["experts"])).sum(-1)
    return ((pred - y) ** 2).mean() - 0.01 * entropy.mean()


def build_where_trap(steps: int = 3, *, batch: int = 32, seed: int = 0) -> Training:
    """A 4-expert sparse mixture on random regression data, SGD."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps, batch, 8)).astype(np.float32)
    y = (x.sum(-1) > 0).astype(np.float32)
    key1, key2 = jax.random.split(jax.random.PRNGKey(seed))
    params = {
        "gate": jax.random.normal(key1, (8, 4)),
        "experts": 0.1 * jax.random.normal(key2, (8, 4)),
    }
    batches = [(jnp.asarray(x[i]), jnp.asarray(y[i])) for i in range(steps)]
    return _training(sparse_mixture_loss, optax.sgd(0.05), params, batches)


# -- float16 overflow: a regression computed in half precision -------------------------------
#
# The parameters are kept in float32 and cast to float16 for the forward pass, by hand, for
# speed. The features are raw readings between 500 and 1000 and the targets near 0: the errors
# are near a thousand and their squares pass float16's largest value, 65504: +inf.


def fp16_loss(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    p16 = jax.tree.map(lambda a: a.astype(jnp.float16), params)
    h = jax.nn.relu(x.astype(jnp.float16) @ p16["w1"] + p16["b1"])
    pred = (h @ p16["w2"] + p16["b2"])[:, 0]
    return jnp.mean((pred - y.astype(jnp.float16)) ** 2)  # <- fp16.square


def build_fp16_overflow(steps: int = 3, *, batch: int = 32, seed: int = 0) -> Training:
    """A 16-64-1 regression in float16, SGD."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(500.0, 1000.0, size=(steps, batch, 16)).astype(np.float32)
    y = rng.normal(size=(steps, batch)).astype(np.float32)
    key1, key2 = jax.random.split(jax.random.PRNGKey(seed))
    params = {
        "w1": jax.random.normal(key1, (16, 64)) / 4.0,
        "b1": jnp.zeros(64),
        "w2": jax.random.normal(key2, (64, 1)) / 8.0,
        "b2": jnp.zeros(1),
    }
    batches = [(jnp.asarray(x[i]), jnp.asarray(y[i])) for i in range(steps)]
    return _training(fp16_loss, optax.sgd(1e-6), params, batches)


# -- NaN first appearing at iteration 3 of lax.scan: an RNN over normalised frames ----------
#
# An Elman RNN reads sequences of non-negative frames (spectra), each normalised to sum to 1
# inside the scanned step. Frame 3 of one sequence is all zeros (the sensor dropped out): at
# iteration 3 its normalisation is 0 / 0.


def rnn_loss(params: Params, xs: jax.Array, y: jax.Array) -> jax.Array:
    """``xs``: (time, batch, features), time-major as lax.scan wants it."""

    def cell(h: jax.Array, frame: jax.Array) -> tuple[jax.Array, None]:
        frame = frame / frame.sum(-1, keepdims=True)  # <- scan.div
        h = jnp.tanh(h @ params["w_h"] + frame @ params["w_x"] + params["b"])
        return h, None

    h0 = jnp.zeros((xs.shape[1], params["w_h"].shape[0]))
    h, _ = jax.lax.scan(cell, h0, xs)
    logits = h @ params["w_out"]
    loss: jax.Array = optax.sigmoid_binary_cross_entropy(logits[:, 0], y).mean()
    return loss


def build_scan_nan(steps: int = 3, *, batch: int = 8, seed: int = 0) -> Training:
    """The RNN on 6-frame sequences of 5-bin spectra, SGD. Frame 3 of sequence 2 is zeros."""
    rng = np.random.default_rng(seed)
    xs = rng.uniform(0.0, 1.0, size=(steps, 6, batch, 5)).astype(np.float32)
    xs[0, 3, 2] = 0.0  # time 3, sequence 2 of the first batch
    y = (xs[:, :, :, 0].mean(1) > 0.5).astype(np.float32)
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    params = {
        "w_h": 0.3 * jax.random.normal(keys[0], (12, 12)),
        "w_x": jax.random.normal(keys[1], (5, 12)),
        "b": jnp.zeros(12),
        "w_out": 0.3 * jax.random.normal(keys[2], (12, 1)),
    }
    batches = [(jnp.asarray(xs[i]), jnp.asarray(y[i])) for i in range(steps)]
    return _training(rnn_loss, optax.sgd(0.1), params, batches)


# -- NaN first appearing at iteration 3 of lax.while_loop: power iteration on a DAG ---------
#
# A graph network normalises its adjacency matrix by the spectral radius, estimated by power
# iteration until it converges. The graph is a directed acyclic one whose longest path has 3
# edges: A^4 = 0, so the iterate A^(i+1) v0 is zero at iteration 3, its norm is 0, and the
# normalisation v = w / |w| is 0 / 0.


def spectral_radius(adj: jax.Array, max_iters: int = 50, tol: float = 1e-4) -> jax.Array:
    def cond(state: tuple[jax.Array, jax.Array, jax.Array, jax.Array]) -> jax.Array:
        i, _, lam, lam_prev = state
        return (i < max_iters) & (jnp.abs(lam - lam_prev) > tol)

    def body(
        state: tuple[jax.Array, jax.Array, jax.Array, jax.Array],
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        i, v, lam, _ = state
        w = adj @ v
        norm = jnp.sqrt(jnp.sum(w * w))
        return i + 1, w / norm, norm, lam  # <- while.div

    n = adj.shape[0]
    v0 = jnp.ones(n) / np.sqrt(n)
    state = (jnp.asarray(0), v0, jnp.asarray(1.0), jnp.asarray(0.0))
    return jax.lax.while_loop(cond, body, state)[2]


def gnn_loss(params: Params, adj: jax.Array, feats: jax.Array, y: jax.Array) -> jax.Array:
    adj_hat = adj / spectral_radius(adj)
    h = jax.nn.relu(adj_hat @ feats @ params["w1"])
    h = jax.nn.relu(adj_hat @ h @ params["w2"])
    return ((h.sum(-1) - y) ** 2).mean()


def layered_dag() -> np.ndarray:
    """A 4-layer feed-forward graph of 10 nodes (2+3+3+2): every path has at most 3 edges."""
    layers = [[0, 1], [2, 3, 4], [5, 6, 7], [8, 9]]
    adj = np.zeros((10, 10), np.float32)
    for upper, lower in itertools.pairwise(layers):
        for a in upper:
            for b in lower:
                adj[b, a] = 1.0  # b reads from a
    return adj


def build_while_nan(steps: int = 3, *, seed: int = 0) -> Training:
    """A 2-layer graph network on the layered DAG, SGD (the same graph every step)."""
    rng = np.random.default_rng(seed)
    adj = jnp.asarray(layered_dag())
    feats = jnp.asarray(rng.normal(size=(10, 4)).astype(np.float32))
    y = jnp.asarray(rng.normal(size=10).astype(np.float32))
    key1, key2 = jax.random.split(jax.random.PRNGKey(seed))
    params = {"w1": jax.random.normal(key1, (4, 8)), "w2": 0.3 * jax.random.normal(key2, (8, 8))}
    return _training(gnn_loss, optax.sgd(0.01), params, [(adj, feats, y)] * steps)


# -- A NaN inside jax.vmap: cosine similarity of an empty document ---------------------------
#
# A retrieval model embeds bag-of-words vectors linearly and scores query/document pairs by
# cosine similarity, written for one pair and vmapped over the batch. One document is empty
# (no words): its embedding is the zero vector and its cosine similarity is 0 / 0.


def cosine(a: jax.Array, b: jax.Array) -> jax.Array:
    similarity: jax.Array = a @ b / (jnp.linalg.norm(a) * jnp.linalg.norm(b))  # <- vmap.div
    return similarity


def retrieval_loss(params: Params, queries: jax.Array, docs: jax.Array, y: jax.Array) -> jax.Array:
    q = queries @ params["w"]
    d = docs @ params["w"]
    sims = jax.vmap(cosine)(q, d)
    return ((sims - y) ** 2).mean()


def build_vmap_nan(steps: int = 3, *, batch: int = 16, seed: int = 0) -> Training:
    """The retrieval model on random word counts, SGD. Document 4 of the first batch is empty."""
    rng = np.random.default_rng(seed)
    queries = rng.poisson(0.5, size=(steps, batch, 30)).astype(np.float32)
    docs = rng.poisson(0.5, size=(steps, batch, 30)).astype(np.float32)
    docs[0, 4] = 0.0
    y = rng.choice([-1.0, 1.0], size=(steps, batch)).astype(np.float32)
    params = {"w": 0.1 * jax.random.normal(jax.random.PRNGKey(seed), (30, 8))}
    batches = [
        (jnp.asarray(queries[i]), jnp.asarray(docs[i]), jnp.asarray(y[i])) for i in range(steps)
    ]
    return _training(retrieval_loss, optax.sgd(0.1), params, batches)


# -- jax.custom_vjp: a backward rule that makes the NaN --------------------------------------
#
# A softplus with a hand-written gradient. The forward is the stable logaddexp(x, 0); the
# backward is the textbook sigmoid, exp(x) / (1 + exp(x)), which is inf / inf = NaN once
# x > 88. The rule's equations are reported at the rule's own line (JAX itself gives them
# the line that called the custom function).


@jax.custom_vjp
def softplus(x: jax.Array) -> jax.Array:
    return jnp.logaddexp(x, 0.0)


def _softplus_fwd(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return softplus(x), x


def _softplus_bwd(x: jax.Array, g: jax.Array) -> tuple[jax.Array]:
    return (g * jnp.exp(x) / (1.0 + jnp.exp(x)),)  # <- custom_vjp.bwd


softplus.defvjp(_softplus_fwd, _softplus_bwd)


def poisson_loss(params: Params, x: jax.Array, counts: jax.Array) -> jax.Array:
    rate = softplus(x @ params["w"] + params["b"])
    return (rate - counts * jnp.log(rate + 1e-6)).mean()


def build_custom_vjp_bwd(steps: int = 3, *, batch: int = 32, seed: int = 0) -> Training:
    """Poisson regression of counts on raw (unnormalised) features, SGD."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, 60.0, size=(steps, batch, 6)).astype(np.float32)
    counts = rng.poisson(3.0, size=(steps, batch)).astype(np.float32)
    params = {"w": jnp.asarray([0.9, 0.6, 0.5, 0.3, 0.2, 0.1]), "b": jnp.asarray(0.0)}
    batches = [(jnp.asarray(x[i]), jnp.asarray(counts[i])) for i in range(steps)]
    return _training(poisson_loss, optax.sgd(1e-4), params, batches)


# -- jax.custom_vjp: a forward rule that makes the NaN ---------------------------------------
#
# L2 normalisation with a hand-written gradient (it saves only the output and the norm). The
# primal function is the forward rule's output, as people write it. A zero row (a dead
# embedding) is 0 / 0 in the forward rule.


def _normalize_fwd(x: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    norm = jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))
    y = x / norm  # <- custom_vjp.fwd
    return y, (y, norm)


@jax.custom_vjp
def l2_normalize(x: jax.Array) -> jax.Array:
    return _normalize_fwd(x)[0]


def _normalize_bwd(res: tuple[jax.Array, jax.Array], g: jax.Array) -> tuple[jax.Array]:
    y, norm = res
    return ((g - y * jnp.sum(g * y, axis=-1, keepdims=True)) / norm,)


l2_normalize.defvjp(_normalize_fwd, _normalize_bwd)


def prototype_loss(params: Params, x: jax.Array, labels: jax.Array) -> jax.Array:
    e = l2_normalize(jax.nn.relu(x @ params["w"]))
    logits = 10.0 * e @ l2_normalize(params["prototypes"]).T
    loss: jax.Array = optax.softmax_cross_entropy(logits, labels).mean()
    return loss


def prototype_predict(params: Params, x: jax.Array) -> jax.Array:
    """The class scores alone (evaluation): the custom_vjp function is not differentiated."""
    e = l2_normalize(jax.nn.relu(x @ params["w"]))
    return e @ l2_normalize(params["prototypes"]).T


def build_custom_vjp_fwd(steps: int = 3, *, batch: int = 16, seed: int = 0) -> Training:
    """Prototype classification of 3 classes from 6 features, SGD. Input 9 of the first batch
    is all negative and the input weights are positive, so its relu features are all zero."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps, batch, 6)).astype(np.float32)
    x[0, 9] = -np.abs(x[0, 9]) - 0.1
    labels = np.eye(3, dtype=np.float32)[rng.integers(0, 3, size=(steps, batch))]
    key1, key2 = jax.random.split(jax.random.PRNGKey(seed))
    params = {
        "w": jnp.abs(jax.random.normal(key1, (6, 8))),
        "prototypes": jax.random.normal(key2, (3, 8)),
    }
    batches = [(jnp.asarray(x[i]), jnp.asarray(labels[i])) for i in range(steps)]
    return _training(prototype_loss, optax.sgd(0.1), params, batches)


# -- jax.checkpoint: log(0) in a rematerialised block -----------------------------------------
#
# Knowledge distillation with a sharpened teacher: inside a checkpointed block (its
# activations are recomputed in the backward pass instead of stored), the student's
# log-probabilities at temperature 0.01 are log(softmax(logits / 0.01)). The softmax
# underflows to exactly 0 and log(0) is -inf in the forward pass.


def _student_block(params: Params, x: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params["w1"])
    logits = h @ params["w2"]
    return jnp.log(jax.nn.softmax(logits / 0.01))  # <- remat.log


def distill_loss(params: Params, x: jax.Array, teacher: jax.Array) -> jax.Array:
    log_probs = jax.checkpoint(_student_block)(params, x)
    loss: jax.Array = -(teacher * log_probs).sum(-1).mean()
    return loss


def build_remat(steps: int = 3, *, batch: int = 16, seed: int = 0) -> Training:
    """A 10-32-5 student distilled from soft teacher probabilities, SGD."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps, batch, 10)).astype(np.float32)
    teacher_logits = rng.normal(size=(steps, batch, 5))
    teacher = np.exp(teacher_logits) / np.exp(teacher_logits).sum(-1, keepdims=True)
    key1, key2 = jax.random.split(jax.random.PRNGKey(seed))
    params = {"w1": jax.random.normal(key1, (10, 32)), "w2": jax.random.normal(key2, (32, 5))}
    batches = [(jnp.asarray(x[i]), jnp.asarray(teacher[i], jnp.float32)) for i in range(steps)]
    return _training(distill_loss, optax.sgd(0.01), params, batches)


# -- The registry ------------------------------------------------------------------------------


def _same(birth: Birth) -> Expected:
    """The first Inf/NaN is a NaN: it is also the first NaN."""
    return Expected(first=birth, first_nan=birth)


PROGRAMS: dict[str, Program] = {
    p.name: p
    for p in [
        Program(
            "mlp",
            "the seed's 784-500-10 MLP, hand-written cross-entropy, Adam: healthy",
            build_mlp,
            expected=None,
            healthy=True,
        ),
        Program(
            "transformer",
            "a 2-layer causal Transformer LM (flax.linen), AdamW: healthy, with -inf masks",
            build_transformer,
            # The mask's -inf enters as the literal of jnp.where, converted to float32 inside
            # jnp.where's own jit (that scalar is the first output holding -inf); the softmax
            # turns it into zeros. No NaN.
            Expected(Birth("convert_element_type", "transformer.mask", "-inf"), first_nan=None),
            healthy=True,
        ),
        Program(
            "mlp_unscaled_pixels",
            "the MLP on pixels in 0..255: the softmax underflows to 0 and log(0) is -inf",
            functools.partial(build_mlp, scale_pixels=False),
            # then labels * -inf is 0 * -inf = NaN where a label is 0, in the same line
            Expected(Birth("log", "mlp.log", "-inf"), first_nan=Birth("mul", "mlp.log", "nan")),
            healthy=False,
        ),
        Program(
            "mlp_nan_input",
            "the MLP with one NaN pixel in its first batch: the matmul reading it outputs NaN",
            functools.partial(build_mlp, nan_pixel=True),
            _same(Birth("dot_general", "mlp.hidden", "nan")),
            healthy=False,
        ),
        Program(
            "transformer_empty_sequence",
            "the LM with an empty (all-padding) sequence: fully masked rows, -inf - -inf = NaN",
            functools.partial(build_transformer, empty_sequence=True),
            # The softmax subtracts each row's max: -inf - (-inf). Under jit the loss of that
            # step can still come out finite: XLA rewrites losses * float(mask) as a select,
            # so NaN * 0 gives 0 there. The gradients are NaN either way.
            Expected(
                Birth("convert_element_type", "transformer.mask", "-inf"),
                first_nan=Birth("sub", "transformer.softmax", "nan"),
            ),
            healthy=False,
        ),
        Program(
            "standardize_blank_image",
            "(x - mean) / std of a blank image: 0 / 0",
            build_standardize,
            _same(Birth("div", "standardize.div", "nan")),
            healthy=False,
        ),
        Program(
            "pairwise_distance_sqrt",
            "sqrt of a zero distance: finite forward, +inf derivative, NaN gradients",
            build_pairwise_distance,
            # sqrt's derivative 0.5 / sqrt(0) = +inf is computed with the forward pass (jvp);
            # the backward pass multiplies it by a zero cotangent: NaN.
            Expected(
                Birth("div", "distance.sqrt", "+inf"),
                first_nan=Birth("mul", "distance.sqrt", "nan", backward=True),
            ),
            healthy=False,
        ),
        Program(
            "where_gradient_trap",
            "where(p > 0, log(p), 0) under grad: the discarded branch's derivative is 0 / 0",
            build_where_trap,
            # The forward's -inf (log of the zeros where discards) comes first; the NaN is
            # log's derivative, cotangent / p = 0 / 0, in the backward pass.
            Expected(
                Birth("log", "where.log", "-inf"),
                first_nan=Birth("div", "where.log", "nan", backward=True),
            ),
            healthy=False,
        ),
        Program(
            "fp16_overflow",
            "squared errors in the thousands, in float16: past 65504, +inf",
            build_fp16_overflow,
            # The loss is +inf; the gradients of this step are still finite or infinite (the
            # backward matmuls overflow too), NaN comes with the next step.
            Expected(Birth("integer_pow", "fp16.square", "+inf"), first_nan=None),
            healthy=False,
        ),
        Program(
            "scan_nan_at_3",
            "an RNN in lax.scan normalises each frame; frame 3 is zeros: 0 / 0 at iteration 3",
            build_scan_nan,
            _same(Birth("div", "scan.div", "nan", loop="scan", iteration=3)),
            healthy=False,
        ),
        Program(
            "while_nan_at_3",
            "power iteration in lax.while_loop on a DAG: the iterate dies, 0 / 0 at iteration 3",
            build_while_nan,
            _same(Birth("div", "while.div", "nan", loop="while", iteration=3)),
            healthy=False,
        ),
        Program(
            "vmap_empty_document",
            "cosine similarity, vmapped, of an empty document's zero embedding: 0 / 0",
            build_vmap_nan,
            # First jnp.linalg.norm's derivative coefficient, 0.5 / sqrt(0) = +inf (computed
            # with the forward pass, inside norm's own jit), then the similarity's 0 / 0.
            Expected(Birth("div", "vmap.div", "+inf"), first_nan=Birth("div", "vmap.div", "nan")),
            healthy=False,
        ),
        Program(
            "custom_vjp_bwd",
            "a custom_vjp softplus whose backward rule computes exp(x) / (1 + exp(x)) = inf / inf",
            build_custom_vjp_bwd,
            Expected(
                Birth("exp", "custom_vjp.bwd", "+inf", backward=True),
                first_nan=Birth("div", "custom_vjp.bwd", "nan", backward=True),
            ),
            healthy=False,
        ),
        Program(
            "custom_vjp_fwd",
            "a custom_vjp L2 normalisation whose forward rule divides a zero row by its norm",
            build_custom_vjp_fwd,
            _same(Birth("div", "custom_vjp.fwd", "nan")),
            healthy=False,
        ),
        Program(
            "remat_log_zero",
            "log(softmax(logits / 0.01)) inside jax.checkpoint: the softmax underflows, log(0)",
            build_remat,
            # The forward's log(0) = -inf comes first (the loss is +inf); the NaN is in the
            # backward pass, which recomputes the block.
            Expected(
                Birth("log", "remat.log", "-inf"),
                first_nan=Birth("mul", "remat.log", "nan", backward=True),
            ),
            healthy=False,
        ),
    ]
}
