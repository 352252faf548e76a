"""``enable_check_numerics`` for PyTorch: raise at the first NaN or harmful Inf.

What an error says about the op that noticed the Inf/NaN. How lineages decide
whether an Inf is harmful (masks, GradScaler, births) is tested in
test_torch_check_numerics_lineages.py.
"""

from __future__ import annotations

import gc
import math
import os
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch")
import torch
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes

import nanscope

from ..helpers import marked_line

pytestmark = pytest.mark.torch

THIS_FILE = os.path.abspath(__file__)


@pytest.fixture
def checking() -> Iterator[None]:
    nanscope.enable_check_numerics()
    try:
        yield
    finally:
        nanscope.disable_check_numerics()


def line_of(marker: str) -> int:
    """The line of this file that ends with ``# <marker>``."""
    return marked_line(THIS_FILE, f"# {marker}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_log_of_zero_raises_at_the_log(checking: None, dtype: Any) -> None:
    x = torch.tensor([0.0, 1.0, 0.0, 2.0], dtype=dtype, requires_grad=True)
    y = x * 3  # finite: no error
    out = torch.log(y)  # @forward-log
    # An Inf is harmful once it reaches something that matters: here the loss.
    with pytest.raises(nanscope.NonFiniteError) as info:
        out.backward(torch.ones_like(out))
    err = info.value
    assert err.reason == "loss"
    assert err.birth is not None and err.birth.op_type == "aten.log.default"
    assert err.birth.source == err.source and err.birth.counts == err.counts
    assert isinstance(err, FloatingPointError)
    assert err.op_type == "aten.log.default"
    assert err.phase == "forward" and err.step == 0 and err.module_path == ""
    assert err.counts == {"neg_inf": 2, "pos_inf": 0, "nan": 0, "size": 4}
    assert err.source is not None
    path, line, func = err.source
    assert os.path.abspath(path) == THIS_FILE and line == line_of("@forward-log")
    assert func == "test_log_of_zero_raises_at_the_log"
    assert err.forward_op == "" and err.forward_source is None
    # The message names the op, the counts, the inputs and the line of code.
    msg = str(err)
    assert "aten.log.default produced -inf in output 0 (forward pass, step 0)" in msg
    assert "torch.log(y)  # @forward-log" in msg
    assert f"{THIS_FILE}:{line_of('@forward-log')}" in msg
    assert "input 0:" in msg and "2 zero, 2 positive" in msg


def test_nan_and_inf_counts(checking: None) -> None:
    a = torch.tensor([1.0, -1.0, 0.0, 2.0, math.inf])
    b = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0])
    with pytest.raises(nanscope.NonFiniteError) as info:
        torch.div(a, b)
    # 1/0 = +inf, -1/0 = -inf, 0/0 = nan, 2/1 = 2, inf/0 = inf
    assert info.value.op_type == "aten.div.Tensor"
    assert info.value.counts == {"neg_inf": 1, "pos_inf": 2, "nan": 1, "size": 5}
    assert "-inf and +inf and NaN" in str(info.value)
    # a's inf was made by no checked op (torch.tensor fills it behind the scenes).
    birth = info.value.birth
    assert birth is not None and birth.op_type == "aten.div.Tensor" and birth.entered


def test_module_path_and_step() -> None:
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x: Any) -> Any:
            return torch.sqrt(self.fc(x))  # @module-sqrt

    net = Net()  # built first: see test_uninitialised_memory_is_not_an_error
    nanscope.enable_check_numerics()
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    with torch.no_grad():
        net.fc.weight.copy_(torch.eye(3))
        net.fc.bias.zero_()
    x = torch.tensor([[1.0, 4.0, 9.0]])
    for _ in range(2):
        net(x).sum().backward()
        opt.step()
    with pytest.raises(nanscope.NonFiniteError) as info:
        net(-x)
    err = info.value
    assert err.op_type == "aten.sqrt.default" and err.module_path == "Net"
    assert err.step == 2 and err.phase == "forward"
    assert err.counts["nan"] == 3 and err.reason == "nan"
    assert err.source is not None and err.source[1] == line_of("@module-sqrt")
    assert err.source[2] == "forward"
    assert "module Net" in str(err)


def test_updates_by_hand_count_steps_and_name_a_nested_module() -> None:
    """No optimizer: a step ends where the next forward pass begins, at a module's first
    op (here one that autograd does not record: the input clamped), found by hooks or by
    the module frames; the error names the inner module."""
    torch.manual_seed(0)

    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x: Any) -> Any:
            return torch.log(self.fc(x))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Inner()

        def forward(self, x: Any) -> Any:
            return self.inner(x.clamp(-10, 10))

    net = Net()  # built first: see test_uninitialised_memory_is_not_an_error
    with torch.no_grad():
        net.inner.fc.weight.copy_(torch.eye(3))
        net.inner.fc.bias.zero_()
    x = torch.tensor([[1.0, 4.0, 9.0]])
    gc.collect()  # an optimizer left by another test would make the steps its updates
    nanscope.enable_check_numerics()
    try:
        for _ in range(3):
            net(x).sum().backward()
            with torch.no_grad():
                for p in net.parameters():
                    assert p.grad is not None
                    p.sub_(0.0 * p.grad)
                    p.grad = None
        with pytest.raises(nanscope.NonFiniteError) as info:
            net(-x)
    finally:
        nanscope.disable_check_numerics()
    err = info.value
    assert err.op_type == "aten.log.default" and err.module_path == "inner (Inner)"
    assert err.step == 3 and err.phase == "forward"


def test_backward_inf_names_the_forward_op(checking: None) -> None:
    x = torch.tensor([0.0, 4.0], requires_grad=True)
    y = torch.sqrt(x)  # @forward-sqrt
    loss = y.sum()
    with pytest.raises(nanscope.NonFiniteError) as info:
        loss.backward()  # @backward-call
    err = info.value
    # d sqrt(x)/dx = 1 / (2 sqrt(x)): +inf at 0.
    assert err.phase == "backward" and err.reason == "gradient"
    assert err.op_type == "aten.div.Tensor"
    assert err.counts == {"neg_inf": 0, "pos_inf": 1, "nan": 0, "size": 2}
    assert err.forward_op == "aten.sqrt.default"
    assert err.forward_source is not None and err.source is not None
    assert os.path.abspath(err.forward_source[0]) == THIS_FILE
    assert err.forward_source[1] == line_of("@forward-sqrt")
    assert err.source[1] == line_of("@backward-call")
    msg = str(err)
    assert "backward pass" in msg and "backward of aten.sqrt.default" in msg
    assert "y = torch.sqrt(x)  # @forward-sqrt" in msg
    assert "loss.backward()  # @backward-call" in msg


def _backward_error_in_module() -> Any:
    class Net(nn.Module):
        def forward(self, x: Any) -> Any:
            return torch.pow(x, 0.5) * 2  # @pow-forward

    x = torch.tensor([0.0, 1.0], requires_grad=True)
    out = Net()(x).sum()
    with pytest.raises(nanscope.NonFiniteError) as info:
        out.backward()
    return info.value


def test_backward_nan_inside_a_module(checking: None) -> None:
    err = _backward_error_in_module()
    assert err.phase == "backward" and err.op_type == "aten.pow.Tensor_Scalar"  # x ** -0.5
    assert err.counts["pos_inf"] == 1
    assert err.forward_op == "aten.pow.Tensor_Scalar"
    assert err.forward_source is not None and err.forward_source[1] == line_of("@pow-forward")
    assert err.forward_source[2] == "forward"


def test_backward_error_names_the_module_of_its_forward_op(checking: None) -> None:
    err = _backward_error_in_module()
    assert err.module_path == "Net"
    assert "module Net" in str(err)


def test_clean_model_raises_nothing() -> None:
    torch.manual_seed(0)
    # Built before checking starts: see test_uninitialised_memory_is_not_an_error.
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)
    )
    nanscope.enable_check_numerics()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    data, labels = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 0])
    losses = []
    for _ in range(3):
        loss = nn.functional.cross_entropy(model(data), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    # Integer and bool outputs are not checked, empty ones hold nothing.
    torch.arange(5).argmax()
    torch.zeros(0).log()
    # A -inf mask that softmax absorbs is no error.
    masked = torch.zeros(2).masked_fill(torch.tensor([True, False]), -math.inf)
    assert torch.softmax(masked, 0).tolist() == [0.0, 1.0]


def test_disable_stops_raising() -> None:
    nanscope.enable_check_numerics()
    nanscope.enable_check_numerics()  # idempotent
    with pytest.raises(nanscope.NonFiniteError):
        torch.sqrt(torch.tensor([-1.0]))
    nanscope.disable_check_numerics()
    assert torch.log(torch.zeros(1)).item() == -math.inf
    x = torch.tensor([0.0], requires_grad=True)
    torch.sqrt(x).sum().backward()
    assert x.grad is not None and x.grad.item() == math.inf
    nanscope.disable_check_numerics()  # nothing enabled: a no-op
    # And it can be turned on again.
    nanscope.enable_check_numerics()
    with pytest.raises(nanscope.NonFiniteError):
        torch.exp(torch.tensor([1000.0])) * 0  # inf * 0: NaN


def test_checking_goes_on_after_an_error(checking: None) -> None:
    with pytest.raises(nanscope.NonFiniteError):
        torch.zeros(2) / 0
    assert torch.ones(2).add(1).tolist() == [2.0, 2.0]
    with pytest.raises(nanscope.NonFiniteError) as info:
        torch.tensor([-1.0]).sqrt()
    assert info.value.op_type == "aten.sqrt.default" and info.value.counts["nan"] == 1


def test_inplace_op_is_checked(checking: None) -> None:
    x = nn.Parameter(torch.tensor([1.0, 0.0]))
    with torch.no_grad(), pytest.raises(nanscope.NonFiniteError) as info:
        x.log_()  # @inplace-log
    assert info.value.op_type == "aten.log_.default"
    assert info.value.source is not None and info.value.source[1] == line_of("@inplace-log")
    assert info.value.reason == "parameter"


def test_view_of_integers_as_floats_is_checked(checking: None) -> None:
    bits = torch.tensor([0x7FC00000, 0], dtype=torch.int32)  # a NaN and a zero, as float32
    with pytest.raises(nanscope.NonFiniteError) as info:
        bits.view(torch.float32)
    assert info.value.op_type == "aten.view.dtype" and info.value.counts["nan"] == 1


def test_uninitialised_memory_is_not_an_error() -> None:
    # Freed NaN-filled memory is usually handed straight back by the allocator.
    for _ in range(50):
        with _disable_current_modes():
            garbage = torch.full((4096,), math.nan)
        nanscope.enable_check_numerics()
        try:
            del garbage
            torch.empty(4096)
        finally:
            nanscope.disable_check_numerics()
