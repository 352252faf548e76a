"""Ops that write their arguments and return nothing (``_foreach_mul_``, ``_fused_adamw_``)
are recorded with what they wrote, by both recorders, and check_numerics looks at it.

``clip_grad_norm_`` scales the gradients with ``_foreach_mul_``; PyTorch's fused and
foreach optimizers (the Hugging Face Trainer's default ``adamw_torch_fused``) update the
parameters and their moments with ``_fused_adamw_`` and ``_foreach_*_`` ops. Each returns
nothing: the tensors it wrote are its event's outputs (new tensor ids, their summaries),
so that a NaN written into the weights is seen there, and the next step's reads of those
weights carry on the same lineage (docs/ROOT_CAUSE.md, "In-place writes").
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch
from torch import nn

import nanscope
from nanscope.analysis import analyze
from nanscope.backends.torch.check_numerics import TorchCheckNumerics
from nanscope.backends.torch.native import native_library
from nanscope.reader import Execution
from nanscope.report import console_for, render_text

pytestmark = pytest.mark.torch

INF = float("inf")


def record(logdir: Path, fn: object) -> list[Execution]:
    with nanscope.enable_dump_debug_info(logdir, "FULL_HEALTH", circular_buffer_size=-1):
        fn()  # type: ignore[operator]
    reader = nanscope.open_dump(logdir)
    assert reader.problems == []
    return list(reader.executions())


def only(execs: list[Execution], prefix: str) -> Execution:
    (ex,) = [e for e in execs if e.op_type.startswith(prefix)]
    return ex


def test_foreach_mul_records_the_tensors_it_wrote(tmp_path: Path, recorder: str) -> None:
    grads = [torch.tensor([1.0, -INF, 2.0]), torch.tensor([3.0, 4.0])]
    coef = torch.tensor(0.0)

    def run() -> None:
        torch._foreach_mul_(grads, coef)  # clip_grad_norm_'s scale: inf * 0
        torch.add(grads[0], 1.0)

    execs = record(tmp_path, run)
    mul = only(execs, "aten._foreach_mul_.Tensor")
    assert len(mul.output_tensor_ids) == 2  # the two tensors of the list, nothing returned
    # New versions of the written tensors: ids of their own, not the inputs'.
    assert not set(mul.output_tensor_ids) & set(mul.input_tensor_ids)
    first, second = mul.output_health
    assert first is not None and (first.nan, first.zero, first.size) == (1, 2, 3)
    assert second is not None and (second.nan, second.zero) == (0, 2)
    assert mul.health.nan == 1
    # A later read of the written tensor reads that version.
    add = only(execs, "aten.add.Tensor")
    assert add.input_tensor_ids[0] == mul.output_tensor_ids[0]


def test_an_op_that_returns_self_gets_no_second_output(tmp_path: Path, recorder: str) -> None:
    x = torch.ones(3)
    execs = record(tmp_path, lambda: x.mul_(2.0))
    assert len(only(execs, "aten.mul_.").output_tensor_ids) == 1


def _adamw_step(fused: bool) -> tuple[list[nn.Parameter], torch.optim.Optimizer]:
    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(4, 3)), nn.Parameter(torch.randn(3))]
    kind = {"fused": True} if fused else {"foreach": True}
    opt = torch.optim.AdamW(params, lr=1e-3, **kind)  # type: ignore[arg-type]
    return params, opt


def test_fused_adamw_records_nan_written_into_the_weights(tmp_path: Path, recorder: str) -> None:
    params, opt = _adamw_step(fused=True)
    x = torch.randn(2, 3)

    def run() -> None:
        loss = (x @ params[0].t() + params[0].sum() * params[1].sum()).sum()
        loss.backward()
        assert params[1].grad is not None
        params[1].grad[0] = INF  # a gradient that overflowed
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        (x @ params[0].t() + params[1].sum()).sum()  # the next step reads the weights

    execs = record(tmp_path, run)
    adamw = only(execs, "aten._fused_adamw_")
    # params, grads, exp_avgs, exp_avg_sqs: four lists of two, in the schema's order.
    assert len(adamw.output_tensor_ids) == 8
    assert not set(adamw.output_tensor_ids) & set(adamw.input_tensor_ids)
    weight, bias = adamw.output_health[:2]
    assert weight is not None and weight.nan == 0  # its gradient was clipped to 0
    assert bias is not None and bias.nan == 1  # inf * 0 = NaN, then NaN everywhere after
    assert adamw.health.nan == 4  # the parameter, its gradient and its two moments
    # The next step reads the NaN weights: that version, so the same lineage.
    later = [e for e in execs if e.index > adamw.index and e.op_type == "aten.sum.default"]
    assert later and later[0].input_tensor_ids[0] == adamw.output_tensor_ids[1]
    a = analyze(nanscope.open_dump(tmp_path))
    assert a.found_harmful
    assert a.first_nan is not None and a.first_nan.op_type == "aten._foreach_mul_.Tensor"
    assert a.state_nonfinite is not None
    assert a.state_nonfinite.op_type.startswith("aten._fused_adamw_")
    assert a.state_nonfinite.step == 0
    text = io.StringIO()
    render_text(a, console_for(text))
    assert "parameters or optimizer state non-finite from step 0: aten._fused_adamw_" in (
        " ".join(text.getvalue().split())
    )
    # One birth: the overflowing gradient; the reads of the NaN weights are not births.
    assert [g.count for g in a.lineages] == [1]
    assert a.lineages[0].kind == "harmful"
    assert not a.lineages[0].birth.op_type.startswith(("aten.sum", "aten.add", "aten.t"))


def test_foreach_adamw_records_its_updates(tmp_path: Path, recorder: str) -> None:
    params, opt = _adamw_step(fused=False)
    for p in params:
        p.grad = torch.full_like(p, INF)
    execs = record(tmp_path, opt.step)
    updates = [e for e in execs if e.op_type.startswith("aten._foreach_addcdiv_")]
    assert updates, [e.op_type for e in execs]
    last = updates[-1]
    assert len(last.output_tensor_ids) == 2
    assert last.health.nan == 15  # inf / inf in every parameter
    # The recording ends with the step: no later step read the weights back, so the
    # step's last in-place write stands for when they became non-finite.
    a = analyze(nanscope.open_dump(tmp_path))
    assert a.state_nonfinite is not None and a.state_nonfinite.index == last.index


# -- check_numerics ---------------------------------------------------------------------------


@pytest.fixture(params=["python", "native"])
def checking(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if request.param == "native" and native_library() is None:
        pytest.skip("the native checker cannot be built here")
    monkeypatch.setenv("NANSCOPE_TORCH_RECORDER", request.param)
    yield


def test_check_numerics_raises_when_fused_adamw_writes_nan_into_a_parameter(
    checking: None,
) -> None:
    params, opt = _adamw_step(fused=True)
    grads = [torch.randn_like(p) for p in params]
    grads[0][1, 1] = INF  # made before checking: no checked op wrote it
    for p, g in zip(params, grads, strict=True):
        p.grad = g
    session = TorchCheckNumerics()
    try:
        with pytest.raises(nanscope.NonFiniteError) as info:
            opt.step()
            session.flush()
    finally:
        session.close()
    err = info.value
    assert err.op_type.startswith("aten._fused_adamw_") and err.reason == "parameter"
    assert err.counts["nan"] >= 1


def test_check_numerics_raises_at_the_clip_that_makes_nan(checking: None) -> None:
    params = [nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(2))]
    params[0].grad = torch.tensor([1.0, INF, 1.0])
    params[1].grad = torch.ones(2)
    session = TorchCheckNumerics()
    try:
        with pytest.raises(nanscope.NonFiniteError) as info:
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            session.flush()
    finally:
        session.close()
    err = info.value
    assert err.op_type == "aten._foreach_mul_.Tensor" and err.counts["nan"] == 1


def test_check_numerics_runs_a_healthy_fused_adamw_run_to_the_end(checking: None) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    session = TorchCheckNumerics()
    try:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    finally:
        session.close()
    assert all(torch.isfinite(p).all() for p in model.parameters())


# -- the real programs ------------------------------------------------------------------------

PROGRAMS = Path(__file__).resolve().parents[1] / "programs" / "real"


def test_the_clip_program_does_what_its_case_says() -> None:
    # tests/oracle.py (no nanscope code) follows the writes of ops that return nothing.
    from tests.oracle import run_oracle

    with contextlib.redirect_stdout(io.StringIO()):
        r = run_oracle(PROGRAMS / "clip_fused_adamw.py", ["--steps", "3"])
    (lin,) = r.lineages  # the NaN weights read in steps 1 and 2 are no births of their own
    assert lin.kind == "harmful" and lin.birth.op == "aten.div.Tensor"
    assert "reached a parameter" in lin.reasons
    assert r.first_nan is not None and r.first_nan.op == "aten._foreach_mul_.Tensor"


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        ["clip_fused_adamw.py", "--init-var", "0.1"],
        ["clip_fused_adamw.py", "--init-var", "0.1", "--foreach"],
        ["gpt2_hf_trainer.py", "--lr", "1e-3"],
    ],
    ids=["fused", "foreach", "hf_trainer"],
)
def test_check_numerics_runs_the_healthy_programs_to_the_end(
    tmp_path: Path, argv: list[str]
) -> None:
    if argv[0].startswith("gpt2"):
        pytest.importorskip("transformers")
        pytest.importorskip("accelerate")
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = subprocess.run(
        [sys.executable, "-m", "nanscope", "run", "--check-numerics", str(PROGRAMS / argv[0]),
         *argv[1:]],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert len([ln for ln in out.stdout.splitlines() if " loss " in ln]) == 3
