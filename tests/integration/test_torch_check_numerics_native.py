"""The native check_numerics: where its ops come from (threads, DataLoader workers, the
optimizer) and compiled graphs, which it checks as a whole.

The messages and the lineage rules are tested with both checkers by
test_torch_check_numerics.py and test_torch_check_numerics_lineages.py (``make test``
runs them again with ``NANSCOPE_TORCH_RECORDER=python``).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
import torch
import torch.nn.functional as F
from torch import nn

import nanscope
from nanscope.backends.torch.check_numerics import TorchCheckNumerics

from ..helpers import marked_line

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(
        os.environ.get("NANSCOPE_TORCH_RECORDER", "").strip().lower() == "python",
        reason="the native checker's own tests",
    ),
]

THIS_FILE = os.path.abspath(__file__)


def line_of(marker: str) -> int:
    return marked_line(THIS_FILE, f"# {marker}")


@pytest.fixture
def checking() -> Iterator[TorchCheckNumerics]:
    session = TorchCheckNumerics()
    assert session.native, "the native checker was not used"
    try:
        yield session
    finally:
        session.close()


def test_module_calls_run_without_hooks_and_errors_name_the_module(
    checking: TorchCheckNumerics,
) -> None:
    """The checker reads modules off the frames of nn.Module.__call__: no global hook
    sends module calls down their slow path, and an error still names each instance."""
    from torch.nn.modules import module as nn_module

    assert not nn_module._global_forward_pre_hooks and not nn_module._global_forward_hooks

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x: Any) -> Any:
            return torch.sqrt(self.fc(x))

    first, second = Block(), Block()
    blocks = nn.Sequential(first, second)
    with torch.no_grad():
        for block in (first, second):
            block.fc.weight.copy_(torch.eye(2))
            block.fc.bias.zero_()
        second.fc.bias.fill_(-10.0)
    with pytest.raises(nanscope.NonFiniteError) as info:
        blocks(torch.ones(1, 2))
    assert info.value.op_type == "aten.sqrt.default"
    assert info.value.module_path == "1 (Block)"


def test_a_thread_started_while_checking_is_checked(checking: TorchCheckNumerics) -> None:
    caught: list[BaseException] = []

    def train() -> None:
        w = torch.tensor([0.0, 4.0], requires_grad=True)
        try:
            loss = torch.sqrt(w).sum()  # @thread-sqrt
            loss.backward()
        except BaseException as exc:  # handed to the test's thread
            caught.append(exc)

    t = threading.Thread(target=train)
    t.start()
    t.join()
    assert len(caught) == 1 and isinstance(caught[0], nanscope.NonFiniteError)
    err = caught[0]
    # d sqrt(w)/dw = 1 / (2 sqrt(w)): +inf at w = 0, a gradient.
    assert err.phase == "backward" and err.reason == "gradient"
    assert err.counts == {"neg_inf": 0, "pos_inf": 1, "nan": 0, "size": 2}
    assert err.forward_op == "aten.sqrt.default"
    assert err.forward_source is not None and err.forward_source[1] == line_of("@thread-sqrt")


class _Samples(torch.utils.data.Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        x = torch.full((3,), float(i))
        # 0/0 = NaN for sample 2.
        return (x - 2.0) / (x - 2.0)  # @worker-div


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork start method")
def test_a_dataloader_worker_raises_for_its_nan(checking: TorchCheckNumerics) -> None:
    loader = torch.utils.data.DataLoader(
        _Samples(), batch_size=1, num_workers=1, multiprocessing_context="fork"
    )
    seen = []
    with pytest.raises(nanscope.NonFiniteError) as info:
        for batch in loader:
            seen.append(batch)
    assert len(seen) == 2  # samples 0 and 1 were finite
    text = str(info.value)
    assert "DataLoader worker" in text and "aten.div.Tensor produced NaN" in text
    assert f"{THIS_FILE}:{line_of('@worker-div')}" in text


def test_an_optimizer_step_that_overflows_a_parameter(checking: TorchCheckNumerics) -> None:
    # Seeded: the weight (updated first) must overflow, whatever ran before this test.
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e38)
    loss = model(torch.full((2, 3), 10.0)).pow(2).sum()
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(nanscope.NonFiniteError) as info:
        opt.step()
    err = info.value
    assert err.phase == "optimizer" and err.reason == "parameter"
    # The oracle: the update p - lr * grad, in float32, overflows exactly where |lr * grad|
    # exceeds float32's range.
    p, g = before[0], grads[0]
    expected = p - 1e38 * g.double()
    assert err.counts["pos_inf"] + err.counts["neg_inf"] == int(
        (expected.abs() > torch.finfo(torch.float32).max).sum()
    )


# -- compiled graphs ---------------------------------------------------------------------------


def _log_of_shift(x: torch.Tensor) -> torch.Tensor:
    h = torch.tanh(x) * 3
    return torch.log(h - h.max())  # @compiled-log


def test_nan_inside_a_compiled_graph_raises_at_its_call(checking: TorchCheckNumerics) -> None:
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    # The oracle: the same function in numpy.
    h = np.tanh(x.numpy()) * np.float32(3)
    with np.errstate(all="ignore"):
        expected = np.log(h - h.max())
    fn = torch.compile(_log_of_shift)
    with pytest.raises(nanscope.NonFiniteError) as info:
        fn(x)
    err = info.value
    assert err.op_type == "aten.log.default" and err.reason == "nan"
    assert err.counts == {
        "neg_inf": int((expected == -np.inf).sum()),
        "pos_inf": 0,
        "nan": int(np.isnan(expected).sum()),
        "size": 20,
    }
    assert err.source is not None and err.source[:2] == (THIS_FILE, line_of("@compiled-log"))
    assert "node log" in str(err) and "compiled graph" in str(err)


class _MaskedAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        t = x.shape[1]
        scores = q @ k.transpose(-2, -1) / math.sqrt(8)
        scores = scores.masked_fill(torch.ones(t, t).triu(1) > 0, float("-inf"))
        out: torch.Tensor = (F.softmax(scores, dim=-1) @ v).pow(2).mean()
        return out


def test_a_mask_absorbed_inside_a_compiled_graph_raises_nothing(
    checking: TorchCheckNumerics,
) -> None:
    torch.manual_seed(0)
    model = _MaskedAttention()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = torch.compile(model)
    for _ in range(3):
        opt.zero_grad()
        loss = step(torch.randn(2, 6, 8))
        loss.backward()
        opt.step()
    assert math.isfinite(float(loss))


def _root(w: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(w).sum()  # @compiled-sqrt


def test_an_infinite_gradient_from_a_compiled_backward(checking: TorchCheckNumerics) -> None:
    w = torch.tensor([0.0, 1.0, 4.0], requires_grad=True)
    loss = torch.compile(_root)(w)
    with pytest.raises(nanscope.NonFiniteError) as info:
        loss.backward()
    err = info.value
    assert err.phase == "backward" and err.reason == "gradient"
    assert err.counts["pos_inf"] == 1  # 1 / (2 sqrt(0))
    assert err.forward_source is not None
    assert err.forward_source[:2] == (THIS_FILE, line_of("@compiled-sqrt"))


def _overflow(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x * 100).sum()  # @compiled-exp


def test_an_infinite_compiled_output_is_followed_to_the_loss(
    checking: TorchCheckNumerics,
) -> None:
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    loss = torch.compile(_overflow)(x)  # +inf, which eager code goes on with
    with pytest.raises(nanscope.NonFiniteError) as info:
        (loss * 2).backward()
    err = info.value
    assert err.reason == "loss"
    assert err.birth is not None and "aten.exp.default" in err.birth.op_type
    assert err.birth.source is not None
    assert err.birth.source[:2] == (THIS_FILE, line_of("@compiled-exp"))


def test_checking_off_leaves_compiled_graphs_plain() -> None:
    from torch._inductor import compile_fx as cfx

    before = cfx.compile_fx
    nanscope.enable_check_numerics()
    try:
        assert cfx.compile_fx is not before
    finally:
        nanscope.disable_check_numerics()
    assert cfx.compile_fx is before
    out: Any = torch.compile(_log_of_shift)(torch.randn(3, 3))
    assert out.isnan().any()  # no error: checking is off


@pytest.mark.parametrize("first", ["recording", "checking"])
def test_recording_and_checking_a_compiled_graph_at_once(tmp_path: Any, first: str) -> None:
    """Both instrument the graph; the call that raises is in the dump, with its NaN."""
    from nanscope.reader import DumpReader

    def record() -> Any:
        return nanscope.enable_dump_debug_info(tmp_path, tensor_debug_mode="FULL_HEALTH")

    session = record() if first == "recording" else None
    nanscope.enable_check_numerics()
    if session is None:
        session = record()
    try:
        with pytest.raises(nanscope.NonFiniteError) as info:
            torch.compile(_log_of_shift)(torch.randn(4, 5))
    finally:
        nanscope.disable_check_numerics()
        session.close()
    assert info.value.op_type == "aten.log.default"
    with DumpReader(tmp_path) as reader:
        traces = reader.traces()
        logs = [t for t in traces if t.op_type == "aten.log.default"]
        assert len(logs) == 1
        summary = logs[0].debug_tensor_value
        assert summary is not None and summary[7] == info.value.counts["nan"]  # the NaN slot


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("bad", [None, math.inf, -math.inf, math.nan])
def test_the_kernel_tells_extreme_finite_values_from_inf_and_nan(
    checking: TorchCheckNumerics, dtype: torch.dtype, bad: float | None
) -> None:
    """Each dtype's largest, smallest normal and subnormal values are finite; Inf/NaN at any
    position of a dense or strided tensor are found (the oracle: numpy on the same values)."""
    fi = torch.finfo(dtype)
    edge = [fi.max, -fi.max, fi.tiny, fi.tiny * fi.eps, 0.0, -0.0, 1.0]
    for position in (0, 137, 279):
        values = edge * 40  # 280 elements: vector bodies and tails
        if bad is not None:
            values[position] = bad
        expect = not np.isfinite(np.array(values)).all()
        x = torch.tensor(values, dtype=dtype, requires_grad=True)  # made by no checked op
        for layout in (x, x.view(40, 7).t()):  # dense, then strided
            if not expect:
                layout.clone().mul(0).sum().backward()  # raises nothing
                continue
            with pytest.raises(nanscope.NonFiniteError) as info:
                layout.clone().mul(0).sum().backward()
            birth = info.value.birth
            assert birth is not None and birth.op_type == "aten.clone.default", info.value


def test_ops_registered_and_removed_are_named_as_themselves(
    checking: TorchCheckNumerics,
) -> None:
    """Ops are known by their registration's address, which an op registered after
    another was removed may take: each error names the op that made the NaN."""
    x = torch.ones(4)
    for i in range(40):
        lib = torch.library.Library(f"nscck{i}", "DEF")
        lib.define("op(Tensor x) -> Tensor")
        if i % 2:
            lib.impl("op", lambda t: t * float("nan"), "CPU")
            with pytest.raises(nanscope.NonFiniteError) as info:
                getattr(torch.ops, f"nscck{i}").op(x)
            assert f"nscck{i}.op.default produced NaN" in str(info.value)
        else:
            lib.impl("op", lambda t: t + 1, "CPU")
            getattr(torch.ops, f"nscck{i}").op(x)  # finite: nothing raised
        del lib
