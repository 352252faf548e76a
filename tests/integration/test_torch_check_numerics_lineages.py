"""check_numerics follows Inf/NaN from their birth: intended and handled ones raise nothing.

Masks (-inf that softmax absorbs) and GradScaler's overflow (found by its inf check,
the step skipped) run on; a NaN, an Inf that reaches the loss, a gradient, a
parameter or optimizer state, or that nothing reads by the end, raise, naming the op
that noticed and the birth. Each test runs with the checks looked at at once (CPU)
and queued the way accelerator tensors are (``queue_cpu``), where the error comes at
the next look (``flush()``, ``backward()``, the end of a step, GradScaler's update).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch")
import torch
import torch.nn.functional as F
from torch import nn

import nanscope
from nanscope.backends.torch.check_numerics import TorchCheckNumerics

from ..helpers import marked_line

pytestmark = pytest.mark.torch

THIS_FILE = os.path.abspath(__file__)


def line_of(marker: str) -> int:
    return marked_line(THIS_FILE, f"# {marker}")


@pytest.fixture(params=["at once", "queued"])
def checking(request: pytest.FixtureRequest) -> Iterator[TorchCheckNumerics]:
    """A check_numerics session; ``queued`` looks at CPU tensors as at a device's."""
    session = TorchCheckNumerics(sync_every=8, queue_cpu=request.param == "queued")
    try:
        yield session
    finally:
        session.close()


# -- intended infinities ----------------------------------------------------------------------


class Attention(nn.Module):
    """One causal self-attention layer with the masks programs use."""

    def __init__(self, mask: str) -> None:
        super().__init__()
        self.mask = mask
        self.qkv = nn.Linear(8, 24)
        self.head = nn.Linear(8, 3)
        if mask == "buffer":  # made once, sliced on each forward
            self.register_buffer("neg", torch.full((8, 8), float("-inf")).triu(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        t = x.shape[1]
        if self.mask.startswith("sdpa"):
            if self.mask == "sdpa_bool_mask":
                keep = torch.ones(t, t, dtype=torch.bool).tril()
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
            else:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(8)
            if self.mask == "masked_fill":
                causal = torch.tril(torch.ones(t, t)) == 0
                scores = scores.masked_fill(causal, float("-inf"))
            elif self.mask == "log_tril":
                scores = scores + torch.log(torch.tril(torch.ones(t, t)))  # 0 or -inf
            elif self.mask == "float_mask":
                scores = scores + torch.full((t, t), float("-inf")).triu(1)
            elif self.mask == "buffer":
                neg: torch.Tensor = self.get_buffer("neg")
                scores = scores + neg[:t, :t]
            y = F.softmax(scores, dim=-1) @ v
        out: torch.Tensor = self.head(y.mean(dim=1))
        return out


@pytest.mark.parametrize(
    "mask", ["masked_fill", "log_tril", "float_mask", "buffer", "sdpa_bool_mask", "sdpa"]
)
def test_causal_mask_absorbed_by_softmax_trains_on(checking: TorchCheckNumerics, mask: str) -> None:
    torch.manual_seed(0)
    model = Attention(mask)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(4, 5, 8), torch.tensor([0, 1, 2, 0])
    losses = []
    for _ in range(4):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    checking.close()  # the end: every -inf was read (and absorbed)
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_transformer_encoder_with_padding_trains_and_evaluates(
    checking: TorchCheckNumerics,
) -> None:
    # Bool masks become -inf float masks (masked_fill_ on zeros); in eval, the fast path
    # packs the padded batch into a nested tensor, whose values are not looked at.
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True)
    opt = torch.optim.Adam(encoder.parameters(), lr=1e-3)
    x = torch.randn(3, 7, 16)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[0, 4:] = True
    causal = nn.Transformer.generate_square_subsequent_mask(7)
    for _ in range(2):
        padding = torch.zeros(3, 7).masked_fill(pad, -math.inf)
        loss = encoder(x, mask=causal, src_key_padding_mask=padding).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    encoder.eval()
    with torch.no_grad():
        assert encoder(x, src_key_padding_mask=pad).isfinite().all()
    checking.close()


def test_dead_end_infinity_raises_nothing(checking: TorchCheckNumerics) -> None:
    # clip_grad_norm_'s overflowed norm: 1/inf = 0, nothing non-finite goes on.
    big = torch.tensor([1e30, 1.0])
    norm = big.pow(2).sum()  # +inf
    coef = (1.0 / norm).clamp(max=1.0)  # 0
    assert (big * coef).tolist() == [0.0, 0.0]
    checking.close()


# -- what raises, naming the birth --------------------------------------------------------------


def test_fully_masked_row_makes_a_nan_born_at_the_softmax(checking: TorchCheckNumerics) -> None:
    """A row masked throughout (a sequence with no unmasked position): the softmax's 0/0 is
    the NaN's birth, not the mask, which every other row absorbs as intended."""
    scores = torch.randn(3, 3)
    drop = torch.tensor([[False, True, True], [True, True, True], [False, False, True]])
    masked = scores.masked_fill(drop, -math.inf)  # @full-mask
    with pytest.raises(nanscope.NonFiniteError) as info:
        torch.softmax(masked, dim=-1)  # @softmax-nan
        checking.flush()
    err = info.value
    assert err.op_type == "aten._softmax.default" and err.reason == "nan"
    assert err.counts == {"neg_inf": 0, "pos_inf": 0, "nan": 3, "size": 9}
    assert err.source is not None and err.source[1] == line_of("@softmax-nan")
    birth = err.birth
    assert birth is not None and birth.op_type == "aten._softmax.default"
    assert birth.source is not None and birth.source[1] == line_of("@softmax-nan")
    assert birth.counts == {"neg_inf": 0, "pos_inf": 0, "nan": 3, "size": 9}
    assert birth.phase == "forward" and birth.step == 0 and not birth.entered
    assert "born at aten.masked_fill" not in str(err)


class Overflowing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.full((4, 4), 1e20))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, self.w)  # @overflow-mm


def test_forward_overflow_that_reaches_the_loss_names_the_matmul(
    checking: TorchCheckNumerics,
) -> None:
    net = Overflowing()
    h = net(torch.full((2, 4), 1e20))  # 4e40: +inf in float32, no error yet
    loss = (h - 1).mean()  # @loss
    with pytest.raises(nanscope.NonFiniteError) as info:
        loss.backward()  # @loss-backward
    err = info.value
    assert err.reason == "loss" and err.op_type == "aten.mean.default"
    assert err.source is not None and err.source[1] == line_of("@loss")
    assert err.counts == {"neg_inf": 0, "pos_inf": 1, "nan": 0, "size": 1}
    birth = err.birth
    assert birth is not None and birth.op_type == "aten.mm.default"
    assert birth.module_path == "Overflowing" and birth.phase == "forward"
    assert birth.source is not None and birth.source[1] == line_of("@overflow-mm")
    assert birth.counts == {"neg_inf": 0, "pos_inf": 8, "nan": 0, "size": 8}
    msg = str(err)
    assert f"backward() called at {THIS_FILE}:{line_of('@loss-backward')}" in msg
    assert (
        f"born at aten.mm.default (Overflowing) {THIS_FILE}:{line_of('@overflow-mm')} in step 0,"
        " forward pass: 8 +inf of 8 float32"
    ) in msg


def test_float16_adamw_eps_names_addcdiv_in_the_step(checking: TorchCheckNumerics) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(8, 8).half()
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-3, eps=1e-8)  # 1e-8 is 0 in float16
    loss = (layer(torch.randn(4, 8, dtype=torch.float16)) * 1e-4).sum()
    loss.backward()  # gradients so small that their squares underflow to 0
    with pytest.raises(nanscope.NonFiniteError) as info:
        opt.step()  # @adamw-step
    err = info.value
    assert err.op_type == "aten.addcdiv_.default" and err.phase == "optimizer"
    assert err.reason == "parameter" and err.step == 0
    assert err.source is not None and err.source[1] == line_of("@adamw-step")
    birth = err.birth
    assert birth is not None and birth.op_type == "aten.addcdiv_.default"
    assert birth.source == err.source and birth.phase == "optimizer"
    assert "it wrote them into a parameter" in str(err)


def test_foreach_write_into_parameters_is_checked(checking: TorchCheckNumerics) -> None:
    # _foreach_*_ ops (the optimizers' path on accelerators) return nothing: what they
    # wrote is looked at.
    params: list[torch.Tensor] = [nn.Parameter(torch.ones(2)), nn.Parameter(torch.zeros(2))]
    with torch.no_grad(), pytest.raises(nanscope.NonFiniteError) as info:
        torch._foreach_div_(params, 0.0)  # @foreach-div
        checking.flush()
    err = info.value
    assert err.op_type == "aten._foreach_div_.Scalar" and err.reason == "parameter"
    assert err.source is not None and err.source[1] == line_of("@foreach-div")
    assert err.birth is not None and err.birth.counts["pos_inf"] == 2


class LogStateSGD(torch.optim.Optimizer):
    """Keeps log(|grad|) as new state each step (assigned, not written in place)."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, {"lr": 0.1})

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["log_grad"] = torch.log(p.grad.abs())  # @log-state
                p.sub_(group["lr"] * p.grad)


def test_inf_assigned_as_optimizer_state_is_found_after_the_step(
    checking: TorchCheckNumerics,
) -> None:
    w = nn.Parameter(torch.tensor([1.0, 0.0]))
    opt = LogStateSGD([w])
    (w * w).sum().backward()  # the gradient of the 0 is 0: its log is -inf
    with pytest.raises(nanscope.NonFiniteError) as info:
        opt.step()
    err = info.value
    assert err.reason == "optimizer state" and err.op_type == "aten.log.default"
    assert err.source is not None and err.source[1] == line_of("@log-state")


def test_inf_that_nothing_reads_is_reported_when_checking_ends() -> None:
    session = TorchCheckNumerics()
    try:
        kept = torch.log(torch.tensor([0.0, 1.0]))  # @unread-kept

        def forgotten() -> None:
            torch.exp(torch.tensor([1000.0]))  # @unread-freed

        forgotten()
    finally:
        with pytest.raises(nanscope.NonFiniteError) as info:
            session.close()
    err = info.value
    assert err.reason == "unread at the end" and err.op_type == "aten.log.default"
    assert err.source is not None and err.source[1] == line_of("@unread-kept")
    assert "no op read them before checking ended" in str(err)
    assert kept.isinf().any()


def test_checking_turned_off_while_an_exception_leaves_reports_nothing() -> None:
    session = TorchCheckNumerics()
    with pytest.raises(KeyError):
        try:
            torch.log(torch.tensor([0.0, 1.0]))  # unread, but the run failed anyway
            raise KeyError("the program's own error")
        finally:
            session.close()


# -- GradScaler ----------------------------------------------------------------------------------


def _amp_setup(init_scale: float) -> tuple[nn.Module, Any, Any, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    return model, opt, scaler, x, y


def test_gradscaler_overflow_is_handled(checking: TorchCheckNumerics) -> None:
    model, opt, scaler, x, y = _amp_setup(init_scale=2.0**24)
    scales, losses = [], []
    for _ in range(8):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()  # float16 gradients of 2**24 * loss overflow
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # inf * 0 = NaN: handled too
        scaler.step(opt)  # skipped while the gradients hold Inf/NaN
        scaler.update()  # and the scale halves
        scales.append(scaler.get_scale())
        losses.append(loss.item())
    checking.close()
    # Five steps skipped, then the gradients fit and training goes on.
    assert scales == [2.0**23, 2.0**22, 2.0**21, 2.0**20, 2.0**19, 2.0**19, 2.0**19, 2.0**19]
    assert losses[:6] == [losses[0]] * 6 and losses[7] < losses[6] < losses[5]
    assert all(p.isfinite().all() for p in model.parameters())


def test_overflow_without_gradscaler_is_a_gradient_error(checking: TorchCheckNumerics) -> None:
    model, _, _, x, y = _amp_setup(init_scale=1.0)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    with pytest.raises(nanscope.NonFiniteError) as info:
        (loss * 2.0**30).backward()  # @unscaled-backward
        checking.flush()
    err = info.value
    assert err.reason == "gradient" and err.phase == "backward"
    assert err.birth is not None and err.birth.phase == "backward"
    assert err.source is not None and err.source[1] == line_of("@unscaled-backward")


def test_scaled_overflow_applied_without_the_scalers_check_raises(
    checking: TorchCheckNumerics,
) -> None:
    model, opt, scaler, x, y = _amp_setup(init_scale=2.0**30)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()  # @scaled-backward
    with pytest.raises(nanscope.NonFiniteError) as info:
        opt.step()  # not scaler.step(opt): nothing skips it
    err = info.value
    assert err.reason == "parameter" and err.phase == "optimizer"
    birth = err.birth
    assert birth is not None and birth.phase == "backward"
    assert birth.source is not None and birth.source[1] == line_of("@scaled-backward")


def test_scaled_overflow_the_scalers_check_misses_raises_at_update(
    checking: TorchCheckNumerics,
) -> None:
    w = nn.Parameter(torch.ones(4))
    x = torch.ones(4, requires_grad=True)  # not a parameter of the optimizer
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20)
    loss = (w * 1e-3).sum() + (x.half() * 2).float().sum()
    scaler.scale(loss).backward()  # x's float16 gradient overflows; w's does not
    scaler.step(opt)  # its inf check looks at w only: the step runs
    with pytest.raises(nanscope.NonFiniteError) as info:
        scaler.update()
    err = info.value
    assert err.reason == "unchecked scaled gradient"
    assert err.birth is not None and err.birth.phase == "backward"
    assert "whose inf check found no Inf/NaN" in str(err)
