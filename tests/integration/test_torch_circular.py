"""A real PyTorch training run into a small circular buffer: every birth keeps its window.

A tiny causal self-attention trains for 60 steps with a ``masked_fill(-inf)``
mask in every forward (benign: softmax absorbs it); then its query and key
weights are set so large that ``q @ k^T`` overflows to +inf (a new op type
making Inf), and softmax turns that into the first NaN. With a buffer of 100
events the dump must still hold the mask's first -inf, the first +inf of the
matmul and the first NaN, each with its window, and say how many events it
evicted. Both recorders; the truth comes from the same run recorded whole.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
import torch

import nanscope
from nanscope.events._streams import MAX_ANCHORS
from nanscope.reader import EXECUTIONS, TRACES, DumpReader

from ..helpers import torch_recorder

pytestmark = pytest.mark.torch

CAPACITY, WINDOW = 100, 10
OVERFLOW_STEP, STEPS = 60, 64


class Attention(torch.nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.q = torch.nn.Linear(width, width)
        self.k = torch.nn.Linear(width, width)
        self.v = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = q @ k.transpose(-2, -1)
        t = x.shape[1]
        future = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        scores = scores.masked_fill(future, float("-inf"))  # benign -inf, every forward
        out: torch.Tensor = torch.softmax(scores, -1) @ v
        return out


def train(compiled: bool = False) -> None:
    torch.manual_seed(0)
    model = Attention()
    forward = torch.compile(model) if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.rand(2, 6, 8)  # positive: the overflow below is all +inf, no NaN yet
    for step in range(STEPS):
        if step == OVERFLOW_STEP:
            with torch.no_grad():
                for lin in (model.q, model.k):
                    lin.weight.fill_(1e19)  # q, k ~ 4e19: finite; q @ k^T ~ 1e39: +inf
                    lin.bias.zero_()
        opt.zero_grad()
        loss = forward(x).pow(2).mean()
        loss.backward()
        opt.step()


def record(logdir: Path, capacity: int) -> DumpReader:
    with nanscope.enable_dump_debug_info(
        logdir, "FULL_HEALTH", circular_buffer_size=capacity, origin_window=WINDOW
    ):
        train()
    r = nanscope.open_dump(logdir)
    assert r.problems == []
    return r


def anchors(r: DumpReader, kind: str = EXECUTIONS) -> list[int]:
    """The sequences of the events the documented rule anchors, from a whole dump: keyed
    by op type (a trace's: its graph op's) and whether there is NaN."""
    rows = r.index(kind)
    op_types = rows["name"] if kind == EXECUTIONS else r.trace_op_types()
    seen: set[tuple[int, bool]] = set()
    nan_seen = False
    result = []
    for i in r.nonfinite(kind).tolist():
        has_nan = bool(rows["nan"][i] > 0)
        key = (int(op_types[i]), has_nan)
        if key in seen or (len(seen) >= MAX_ANCHORS and (nan_seen or not has_nan)):
            continue
        seen.add(key)
        nan_seen |= has_nan
        result.append(int(rows["sequence"][i]))
    return result


@pytest.mark.parametrize("recorder", ["native", "python"])
def test_each_birth_keeps_its_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorder: str
) -> None:
    if recorder == "native" and torch_recorder() != "native":
        pytest.skip("the native recorder is not in use")
    monkeypatch.setenv("NANSCOPE_TORCH_RECORDER", recorder)
    whole = record(tmp_path / "whole", -1)
    small = record(tmp_path / "small", CAPACITY)

    total = whole.num(EXECUTIONS)
    assert [int(s) for s in whole.index(EXECUTIONS)["sequence"]] == list(range(1, total + 1))
    assert total > 40 * CAPACITY
    op_of = {int(s): whole.execution(i).op_type
             for i, s in enumerate(whole.index(EXECUTIONS)["sequence"].tolist())}  # fmt: skip

    # The story, from the whole dump: the mask's -inf first, then an overflow by
    # another op at OVERFLOW_STEP, then the first NaN.
    _, first_inf = whole.first_where("neg_inf", EXECUTIONS)
    _, first_pos = whole.first_where("pos_inf", EXECUTIONS)
    _, first_nan = whole.first_where("nan", EXECUTIONS)
    assert first_inf is not None and first_pos is not None and first_nan is not None
    births = [whole.execution(ref.index) for ref in (first_inf, first_pos, first_nan)]
    assert births[0].op_type == "aten.masked_fill.Scalar" and births[0].step == 0
    assert births[1].op_type != births[0].op_type and births[1].health.nan == 0
    assert births[1].sequence < births[2].sequence
    assert (births[2].health.nan or 0) > 0
    expected = anchors(whole)
    assert {b.sequence for b in births} <= set(expected)

    kept = [int(s) for s in small.index(EXECUTIONS)["sequence"]]
    assert kept == sorted(set(kept)) and kept[-1] == total
    for seq in expected:
        window = range(max(1, seq - WINDOW), min(total, seq + WINDOW) + 1)
        assert set(window) <= set(kept), (op_of[seq], seq)
    # The reader finds the same births in the small dump.
    for column, birth in zip(("neg_inf", "pos_inf", "nan"), births, strict=True):
        _, again = small.first_where(column, EXECUTIONS)
        assert again is not None
        kept_birth = small.execution(again.index)
        assert (kept_birth.sequence, kept_birth.op_type) == (birth.sequence, birth.op_type)
        assert kept_birth.health == birth.health
    assert len(kept) <= CAPACITY + (MAX_ANCHORS + 1) * (2 * WINDOW + 1)
    assert small.evicted(EXECUTIONS) == total - len(kept) > 0
    assert sum(m for _, _, m in small.gaps(EXECUTIONS)) == small.evicted(EXECUTIONS)


def test_compiled_graph_traces_keep_each_birth_window(tmp_path: Path) -> None:
    def record_compiled(logdir: Path, capacity: int) -> DumpReader:
        torch._dynamo.reset()
        with nanscope.enable_dump_debug_info(
            logdir, "FULL_HEALTH", circular_buffer_size=capacity, origin_window=WINDOW
        ):
            train(compiled=True)
        r = nanscope.open_dump(logdir)
        assert r.problems == []
        return r

    whole = record_compiled(tmp_path / "whole", -1)
    small = record_compiled(tmp_path / "small", CAPACITY)
    total = whole.num(TRACES)
    # Graph calls' traces are numbered in one run, with no gap, however they were batched.
    assert [int(s) for s in whole.index(TRACES)["sequence"]] == list(range(1, total + 1))
    assert total > 10 * CAPACITY
    expected = anchors(whole, TRACES)
    types = whole.trace_op_types(np.array(expected) - 1)
    assert len({whole.string(int(t)) for t in types}) >= 3, [whole.string(int(t)) for t in types]
    _, first_nan = whole.first_where("nan", TRACES)
    assert first_nan is not None and first_nan.index + 1 in expected
    kept = [int(s) for s in small.index(TRACES)["sequence"]]
    assert kept == sorted(set(kept)) and kept[-1] == total
    for seq in expected:
        assert set(range(max(1, seq - WINDOW), min(total, seq + WINDOW) + 1)) <= set(kept)
    assert small.evicted(TRACES) == total - len(kept) > 0
