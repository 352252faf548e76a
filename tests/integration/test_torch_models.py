"""Real models dumped in FULL_HEALTH: every op's summary against numpy, module paths, links.

Each test stacks a small capturing dispatch mode on top of nanscope's: it sees the
same ops in the same order and keeps a copy of every output, so each recorded
summary can be checked against numpy on exactly the values the program computed.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

import nanscope
from nanscope.backends.torch.session import TorchDumpSession
from nanscope.backends.torch.suspension import not_recorded
from nanscope.reader import EXECUTIONS, DumpReader, Execution

from ..helpers import marked_line, summaries_of, summary_of, torch_recorder

pytestmark = pytest.mark.torch

THIS_FILE = os.path.abspath(__file__)
FLOATS = {torch.float16: 19, torch.bfloat16: 14, torch.float32: 1, torch.float64: 2}


# -- helpers ----------------------------------------------------------------------------------


def line_of(marker: str) -> int:
    """The line of this file that ends with ``# <marker>``."""
    return marked_line(THIS_FILE, f"# {marker}")


def flat_tensors(value: Any) -> list[Any]:
    out: list[Any] = []
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            out.extend(flat_tensors(v))
    return out


class Snapshot:
    """What numpy needs to know about one output."""

    def __init__(self, t: Any) -> None:
        self.dtype = t.dtype
        self.rank = t.dim()
        self.values = t.detach().to(torch.float64).numpy().copy() if t.dtype in FLOATS else None

    def full_health(self) -> np.ndarray | None:
        if self.values is None:
            return None
        v = self.values.reshape(-1)
        finite = np.isfinite(v)
        return np.array(
            [
                -1,
                -1,
                FLOATS[self.dtype],
                self.rank,
                v.size,
                np.count_nonzero(np.isneginf(v)),
                np.count_nonzero(np.isposinf(v)),
                np.count_nonzero(np.isnan(v)),
                np.count_nonzero(finite & (v < 0)),
                np.count_nonzero(v == 0),
                np.count_nonzero(finite & (v > 0)),
            ],
            dtype=np.float64,
        )


class Capture(TorchDispatchMode):
    """Keeps (op name, output snapshots) of every op it sees."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # TorchDispatchMode.__init__ is unannotated
        self.ops: list[tuple[str, list[Snapshot]]] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        with not_recorded():  # the snapshots are not part of the program
            self.ops.append((str(func), [Snapshot(t) for t in flat_tensors(out)]))
        return out


# Ops a dispatch mode sees that the native recorder does not: those autograd's
# own kernels run inside an op (saving an output for backward, making a
# gradient contiguous), which it sees inside the op that ran them, and
# ``lift_fresh`` (torch.tensor's no-op marker), which PyTorch does not show to
# RecordFunction observers.
INSIDE_AN_OP = frozenset({"aten.detach.default", "aten.clone.default", "aten.lift_fresh.default"})
# Ops the native recorder sees that a dispatch mode does not: what torch.tensor
# and some autograd formulas run with the Python dispatch keys excluded.
BELOW_PYTHON = frozenset({"aten.empty.memory_format", "aten.detach_.default"})


def seen_by_native_recorder(
    ops: list[tuple[str, list[Snapshot]]],
    recorded: list[str],
    raised: frozenset[str] = frozenset(),
) -> list[tuple[str, list[Snapshot]] | None]:
    """The dispatch mode's ops aligned with what the native recorder recorded.

    Entry ``i`` is the dispatch mode's view of ``recorded[i]`` (``None`` for an
    op only the native recorder sees). Ops missing on either side must be of
    the kinds above (or in ``raised``: an op whose call raised after computing,
    which a dispatch mode sees and the native recorder does not); anything
    else fails.
    """
    names = [n for n, _ in ops]
    aligned: list[tuple[str, list[Snapshot]] | None] = []
    matcher = difflib.SequenceMatcher(None, names, recorded, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            aligned.extend(ops[i1:i2])
            continue
        missing, extra = names[i1:i2], recorded[j1:j2]
        assert set(missing) <= INSIDE_AN_OP | raised, (j1, missing, extra)
        assert set(extra) <= BELOW_PYTHON, (j1, missing, extra)
        aligned.extend([None] * len(extra))
    return aligned


def record_checked(
    logdir: Path, fn: Callable[[], Any], raised: frozenset[str] = frozenset()
) -> tuple[DumpReader, list[Execution], Any, dict[str, int]]:
    """Run ``fn`` under nanscope (FULL_HEALTH, keep all) and check every recorded op.

    Returns the reader, the executions, fn's result and how many outputs of each
    op type were compared with numpy.
    """
    with (
        nanscope.enable_dump_debug_info(logdir, "FULL_HEALTH", circular_buffer_size=-1) as s,
        Capture() as cap,
    ):
        result = fn()
    r = nanscope.open_dump(logdir)
    assert r.problems == []
    execs = r.executions()
    # Every op the program ran was recorded, once, in order: nothing failed to record
    # (profiler bookkeeping, e.g. around optimizer.step(), is left out on purpose; a step
    # that ended says that an optimizer step ran).
    ops = [(name, snaps) for name, snaps in cap.ops if not name.startswith("profiler.")]
    assert len(ops) < len(cap.ops) or not any(e.step > 0 for e in execs)
    aligned: list[tuple[str, list[Snapshot]] | None] = list(ops)
    assert isinstance(s._session, TorchDumpSession)
    if s._session.recorder == "native":
        aligned = seen_by_native_recorder(ops, [e.op_type for e in execs], raised)
    assert [e.op_type for e in execs] == [
        a[0] if a is not None else e.op_type for e, a in zip(execs, aligned, strict=True)
    ]
    assert [e.sequence for e in execs] == list(range(1, len(execs) + 1))
    compared: dict[str, int] = {}
    for e, op in zip(execs, aligned, strict=True):
        if op is None:
            continue
        name, snaps = op
        assert len(e.output_tensor_ids) == len(snaps), name
        assert e.debug_tensor_values is not None and len(e.debug_tensor_values) == len(snaps)
        for got, snap in zip(e.debug_tensor_values, snaps, strict=True):
            want = snap.full_health()
            if want is None:
                assert got is None, (e.sequence, name, snap.dtype)
                continue
            assert got is not None, (e.sequence, name)
            np.testing.assert_array_equal(got, want, err_msg=f"#{e.sequence} {name}")
            compared[name] = compared.get(name, 0) + 1
    return r, execs, result, compared


def check_links(execs: list[Execution]) -> list[Execution]:
    """Backward links point at recorded forward ops; returns the linked backward ops."""
    by_seq = {e.sequence: e for e in execs}
    backward = [e for e in execs if e.phase == 2]
    assert backward
    linked = [e for e in backward if e.forward_sequence]
    for e in linked:
        fwd = by_seq.get(e.forward_sequence)
        assert fwd is not None, (e.op_type, e.forward_sequence)
        assert fwd.phase == 1 and fwd.sequence < e.sequence, (e.op_type, fwd.op_type)
        assert e.module_path == fwd.module_path, (e.op_type, fwd.op_type)
        assert e.forward_stack_frame_ids == fwd.stack_frame_ids
    for e in execs:
        if e.phase != 2:
            assert e.forward_sequence == 0 and e.forward_stack_frame_ids == ()
    return linked


def linked_pairs(execs: list[Execution]) -> set[tuple[str, str, str]]:
    """(backward op, forward op, module path) for every linked backward op."""
    by_seq = {e.sequence: e for e in execs}
    return {
        (e.op_type, by_seq[e.forward_sequence].op_type, e.module_path)
        for e in execs
        if e.phase == 2 and e.forward_sequence
    }


def train(
    model: nn.Module,
    batch: Callable[[], tuple[Any, ...]],
    loss_fn: Any,
    steps: int = 2,
    opt: Any = None,
) -> Callable[[], list[float]]:
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def run() -> list[float]:
        losses = []
        for _ in range(steps):
            inputs = batch()
            loss = loss_fn(model(inputs[0]), *inputs[1:])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        return losses

    return run


# -- models -----------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, hidden: int = 500) -> None:
        super().__init__()
        self.fc1 = nn.Linear(784, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x: Any) -> Any:
        return F.softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def cross_entropy(probs: Any, labels: Any) -> Any:
    """The seed's hand-written cross-entropy: log(0) when a probability underflows."""
    return -(labels * torch.log(probs)).sum() / probs.shape[0]  # @seed-log


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(6)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(6, 8, 3)
        self.fc = nn.Linear(8 * 2 * 2, 10)

    def forward(self, x: Any) -> Any:
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 30, d: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.enc = nn.TransformerEncoderLayer(d, 2, 32, dropout=0.0, batch_first=True)
        self.attn = HandAttention(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: Any) -> Any:
        return self.head(self.attn(self.enc(self.emb(idx))))


class HandAttention(nn.Module):
    """Single-head attention with a pre-LayerNorm, written out by hand."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x: Any) -> Any:
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))  # -inf on purpose: masked out
        return x + self.out(torch.softmax(scores, dim=-1) @ v)


class Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 16)
        self.c = nn.Linear(16, 2)

    def inner(self, x: Any) -> Any:
        return torch.tanh(self.b(torch.sigmoid(self.a(x))))

    def forward(self, x: Any, use_checkpoint: bool = True) -> Any:
        h = checkpoint(self.inner, x, use_reentrant=False) if use_checkpoint else self.inner(x)
        return self.c(h)


class SinhFn(torch.autograd.Function):
    """sinh with a hand-written backward that uses cosh (an op seen only in backward)."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        ctx.save_for_backward(x)
        return torch.sinh(x)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        (x,) = ctx.saved_tensors
        return grad * torch.cosh(x)  # @custom-backward


class CustomNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(5, 4)
        self.fc2 = nn.Linear(4, 1)

    def forward(self, x: Any) -> Any:
        return self.fc2(SinhFn.apply(self.fc1(x)))  # type: ignore[no-untyped-call]  # unannotated in torch


# -- tests ------------------------------------------------------------------------------------


def test_mlp(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MLP()
    data = torch.randn(32, 784)
    labels = F.one_hot(torch.randint(0, 10, (32,)), 10).float()
    run = train(model, lambda: (data, labels), cross_entropy)
    r, execs, losses, compared = record_checked(tmp_path, run)
    assert all(np.isfinite(losses))
    for op in (
        "aten.addmm.default",
        "aten.relu.default",
        "aten._softmax.default",
        "aten.log.default",
        "aten.threshold_backward.default",
        "aten.mm.default",
    ):
        assert compared.get(op), op
    paths = {e.module_path for e in execs}
    assert {"MLP", "fc1 (Linear)", "fc2 (Linear)", ""} <= paths
    assert {e.module_path for e in execs if e.op_type == "aten.addmm.default"} == {
        "fc1 (Linear)",
        "fc2 (Linear)",
    }
    check_links(execs)
    pairs = linked_pairs(execs)
    assert ("aten.threshold_backward.default", "aten.relu.default", "MLP") in pairs
    assert ("aten._softmax_backward_data.default", "aten._softmax.default", "MLP") in pairs
    assert ("aten.div.Tensor", "aten.log.default", "") in pairs
    assert {e.step for e in execs} == {0, 1, 2}
    assert r.first_nonfinite(EXECUTIONS) is None


def test_cnn(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = CNN()
    data, labels = torch.randn(4, 1, 12, 12), torch.randint(0, 10, (4,))
    run = train(model, lambda: (data, labels), F.cross_entropy)
    _, execs, _, compared = record_checked(tmp_path, run)
    ops = {e.op_type for e in execs}
    assert {"aten.convolution.default", "aten.max_pool2d_with_indices.default"} <= ops
    bn = [e for e in execs if "batch_norm" in e.op_type and e.phase == 1]
    assert bn and all(e.module_path == "bn1 (BatchNorm2d)" for e in bn)
    # max_pool2d returns values and int64 indices: only the values have a summary.
    pool = [e for e in execs if e.op_type == "aten.max_pool2d_with_indices.default"]
    assert {e.module_path for e in pool} == {"pool (MaxPool2d)", "CNN"}
    for e in pool:
        assert summaries_of(e)[0] is not None and summaries_of(e)[1] is None
    assert compared["aten.convolution.default"] == 4 and compared["aten.relu.default"] == 4
    paths = {e.module_path for e in execs}
    assert {
        "CNN",
        "conv1 (Conv2d)",
        "bn1 (BatchNorm2d)",
        "pool (MaxPool2d)",
        "conv2 (Conv2d)",
        "fc (Linear)",
    } <= paths
    check_links(execs)
    pairs = linked_pairs(execs)
    assert (
        "aten.convolution_backward.default",
        "aten.convolution.default",
        "conv1 (Conv2d)",
    ) in pairs
    assert (
        "aten.convolution_backward.default",
        "aten.convolution.default",
        "conv2 (Conv2d)",
    ) in pairs
    assert (
        "aten.max_pool2d_with_indices_backward.default",
        "aten.max_pool2d_with_indices.default",
        "pool (MaxPool2d)",
    ) in pairs
    assert any(
        b.startswith("aten.native_batch_norm_backward") and m == "bn1 (BatchNorm2d)"
        for b, _, m in pairs
    )


def test_transformer_block(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TinyTransformer()
    idx, target = torch.randint(0, 30, (2, 6)), torch.randint(0, 30, (12,))

    def loss_fn(logits: Any, target: Any) -> Any:
        return F.cross_entropy(logits.reshape(-1, 30), target)

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    run = train(model, lambda: (idx, target), loss_fn, opt=opt)
    r, execs, losses, compared = record_checked(tmp_path, run)
    assert all(np.isfinite(losses))
    paths = {e.module_path for e in execs}
    assert {
        "emb (Embedding)",
        "enc.self_attn (MultiheadAttention)",
        "enc.norm1 (LayerNorm)",
        "enc.linear1 (Linear)",
        "attn.norm (LayerNorm)",
        "attn.qkv (Linear)",
        "head (Linear)",
    } <= paths
    assert compared.get("aten.native_layer_norm.default", 0) >= 6
    # The causal mask puts -inf in the scores on purpose: recorded, and counted exactly.
    (mask, *_) = [e for e in execs if e.op_type == "aten.masked_fill.Scalar"]
    assert mask.module_path == "attn (HandAttention)" and mask.health.neg_inf == 2 * 15
    first = r.first_nonfinite(EXECUTIONS)
    assert first is not None and first.index == mask.index
    assert mask.input_debug_tensor_values[0] is not None  # the finite scores that went in
    assert mask.input_debug_tensor_values[0][5:8].tolist() == [0, 0, 0]
    # softmax of a row with -inf gives exact zeros and nothing non-finite.
    softmax = [
        e
        for e in execs
        if e.op_type == "aten._softmax.default" and e.module_path == mask.module_path
    ]
    assert softmax and all(
        not e.health.any_nonfinite and e.health.zero is not None and e.health.zero >= 30
        for e in softmax
    )
    # Integer tensors: the embedding's indices go in, nothing is summarised for them.
    emb = [e for e in execs if e.op_type == "aten.embedding.default"]
    assert len(emb) == 2 and all(e.module_path == "emb (Embedding)" for e in emb)
    check_links(execs)
    pairs = linked_pairs(execs)
    assert (
        "aten.embedding_dense_backward.default",
        "aten.embedding.default",
        "emb (Embedding)",
    ) in pairs
    assert any(m == "enc.self_attn (MultiheadAttention)" for _, _, m in pairs)
    assert any(
        b == "aten.native_layer_norm_backward.default" and m == "attn.norm (LayerNorm)"
        for b, _, m in pairs
    )
    assert {e.phase for e in execs} == {1, 2, 3}


def test_integer_tensors(tmp_path: Path) -> None:
    torch.manual_seed(0)
    emb = nn.Embedding(10, 4)
    idx = torch.tensor([[1, 2, 3], [0, 9, 9]])

    def run() -> Any:
        vecs = emb(idx)
        scores = vecs.sum(-1)
        pred = scores.argmax(dim=1)
        correct = (pred == torch.tensor([0, 1])).sum()
        positions = torch.arange(3).expand(2, 3) * idx
        return vecs, pred, correct, positions

    r, execs, (_, pred, correct, _), compared = record_checked(tmp_path, run)
    assert pred.dtype == torch.int64 and correct.dtype == torch.int64
    names = [e.op_type for e in execs]
    assert "aten.argmax.default" in names and "aten.eq.Tensor" in names
    (embedding,) = [e for e in execs if e.op_type == "aten.embedding.default"]
    assert embedding.module_path == "Embedding" and summary_of(embedding)[4] == 24
    for op in ("aten.argmax.default", "aten.eq.Tensor", "aten.arange.default"):
        (e,) = [e for e in execs if e.op_type == op]
        assert e.debug_tensor_values == (None,), op
    assert compared == {"aten.embedding.default": 1, "aten.sum.dim_IntList": 1}
    # Integer ops link like any other.
    (argmax,) = [e for e in execs if e.op_type == "aten.argmax.default"]
    (eq,) = [e for e in execs if e.op_type == "aten.eq.Tensor"]
    assert eq.input_tensor_ids[0] == argmax.output_tensor_ids[0]
    assert r.first_nonfinite(EXECUTIONS) is None


def test_checkpoint_non_reentrant(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Checkpointed()
    x = torch.randn(5, 8)

    def run() -> list[Any]:
        model.zero_grad()
        model(x).pow(2).sum().backward()
        grads = []
        for p in model.parameters():
            assert p.grad is not None
            grads.append(p.grad.clone())
        return grads

    # Recomputation stops by raising from the pack hook of the last op it
    # needs (tanh): its call raises after computing, and the native recorder
    # records no op whose call raised.
    native = torch_recorder() == "native"
    raised = frozenset({"aten.tanh.default"}) if native else frozenset()
    _, execs, grads, compared = record_checked(tmp_path, run, raised)
    model.zero_grad()
    model(x, use_checkpoint=False).pow(2).sum().backward()
    for g, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, rtol=0, atol=0)
    # The forward ops inside the checkpoint run again during backward.
    fwd_tanh = [e for e in execs if e.op_type == "aten.tanh.default" and e.phase == 1]
    again = [e for e in execs if e.op_type == "aten.tanh.default" and e.phase == 2]
    assert len(fwd_tanh) == 1 and len(again) == (0 if native else 1)
    recomputed = [e for e in execs if e.op_type == "aten.addmm.default" and e.phase == 2]
    assert recomputed  # the recomputed ops before tanh
    if not native:
        np.testing.assert_array_equal(summary_of(again[0]), summary_of(fwd_tanh[0]))
    assert compared["aten.sigmoid.default"] == 2
    assert {"Checkpointed", "a (Linear)", "b (Linear)", "c (Linear)"} <= {
        e.module_path for e in execs
    }
    check_links(execs)
    pairs = linked_pairs(execs)
    assert ("aten.tanh_backward.default", "aten.tanh.default", "Checkpointed") in pairs
    assert ("aten.sigmoid_backward.default", "aten.sigmoid.default", "Checkpointed") in pairs


def test_custom_autograd_function(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = CustomNet()
    data, target = torch.randn(6, 5), torch.randn(6, 1)
    run = train(model, lambda: (data, target), F.mse_loss)
    r, execs, losses, compared = record_checked(tmp_path, run)
    assert all(np.isfinite(losses))
    sinh = [e for e in execs if e.op_type == "aten.sinh.default"]
    cosh = [e for e in execs if e.op_type == "aten.cosh.default"]
    assert len(sinh) == 2 and len(cosh) == 2
    assert all(e.phase == 1 and e.module_path == "CustomNet" for e in sinh)
    # The hand-written backward runs on the autograd engine: phase 2, its own stack.
    assert all(e.phase == 2 for e in cosh)
    for e in cosh:
        lines = [f.lineno for f in r.stack(e) if f.file_path == THIS_FILE]
        assert line_of("@custom-backward") in lines
    assert compared["aten.cosh.default"] == 2
    linked = check_links(execs)
    # Ops of the built-in backward formulas around it are linked as usual; the custom
    # backward's own ops belong to no ATen forward op (the node is the Function's).
    assert any(e.module_path == "fc1 (Linear)" for e in linked)
    assert all(e.forward_sequence == 0 for e in cosh)
    assert [e.step for e in sinh] == [0, 1] and [e.step for e in cosh] == [0, 1]


def test_seed_bug_log_of_underflowed_softmax(tmp_path: Path) -> None:
    """The seed's bug: softmax underflows to exact 0, then log(0) = -inf and 0 * -inf = NaN."""
    torch.manual_seed(0)
    model = MLP(hidden=64)
    with torch.no_grad():
        model.fc2.weight.mul_(1e4)  # huge logits: softmax gives exact zeros
    data = torch.randn(8, 784)
    labels = F.one_hot(torch.randint(0, 10, (8,)), 10).float()
    run = train(model, lambda: (data, labels), cross_entropy, steps=1)
    with nanscope.enable_dump_debug_info(tmp_path, "FULL_HEALTH", circular_buffer_size=-1):
        losses = run()
    assert np.isnan(losses[0])
    r = nanscope.open_dump(tmp_path)
    ref = r.first_nonfinite(EXECUTIONS)
    assert ref is not None
    bad = r.execution(ref.index)
    assert bad.op_type == "aten.log.default"
    assert bad.phase == 1 and bad.step == 0 and bad.module_path == ""
    assert (
        bad.health.neg_inf is not None
        and bad.health.neg_inf > 0
        and bad.health.nan == 0
        and bad.health.pos_inf == 0
    )
    # What went in: the softmax output, with the zeros that log turned into -inf.
    (probs,) = bad.input_debug_tensor_values
    assert probs is not None and probs[9] == bad.health.neg_inf and probs[5:8].tolist() == [0, 0, 0]
    producer = {i: e for e in r.executions() for i in e.output_tensor_ids}
    softmax = producer[bad.input_tensor_ids[0]]
    assert softmax.op_type == "aten._softmax.default" and softmax.module_path == "MLP"
    assert not softmax.health.any_nonfinite and softmax.health.zero == probs[9]
    # Where: the torch.log line, the innermost frame of this file.
    frames = [f for f in r.stack(bad) if f.file_path == THIS_FILE]
    assert frames[-1].lineno == line_of("@seed-log") and frames[-1].function == "cross_entropy"
    assert "torch.log(probs)" in r.source_lines(frames[-1].file_index)[frames[-1].lineno - 1]
    # Then NaN spreads: the product with the labels, the loss, and the backward of log.
    nonfinite = [r.execution(i) for i in r.nonfinite(EXECUTIONS)]
    assert nonfinite[0].sequence == bad.sequence
    (mul,) = [e for e in nonfinite if e.input_tensor_ids[-1:] == bad.output_tensor_ids]
    assert mul.op_type == "aten.mul.Tensor" and mul.health.nan is not None and mul.health.nan > 0
    back = [e for e in nonfinite if e.phase == 2 and e.forward_sequence == bad.sequence]
    assert back and back[0].op_type == "aten.div.Tensor"
    # The NaN reaches the weights in the optimizer step.
    assert any(e.phase == 3 for e in nonfinite)
