"""Headroom on a real float16 run that diverges: the report warns long before the first Inf.

The program (``tests/programs/real/fp16_divergence.py``) trains a ``model.half()``
regressor with a learning rate a little too high; its outputs grow geometrically until
float16 overflows. The oracle runs the same program in this process under a dispatch
mode of the test's own: the step of the first op that made an Inf, and each step's
largest ``|x|`` of the head's forward output. nanscope runs it as a user would
(``nanscope run``, the default circular buffer), with both PyTorch recorders.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import nanscope
from nanscope.analysis import analyze, analyze_headroom
from tests.oracle import load_program

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "tests" / "programs" / "real" / "fp16_divergence.py"
ARGS = ("--steps", "600", "--lr-factor", "1.01")
LEAD = 50  # the promise: warned at least this many steps before the first Inf


class _Oracle(TorchDispatchMode):
    """Per step: whether an op made Inf, and the largest |x| of the head's forward output."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch's __init__ is unannotated
        self.step = 0
        self.first_inf_step: int | None = None
        self.head_max: dict[int, float] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if (
                self.first_inf_step is None
                and isinstance(t, torch.Tensor)
                and t.is_floating_point()
                and bool(torch.isinf(t).any())
            ):
                self.first_inf_step = self.step
        # The head's forward output: the only addmm with one output column.
        if func is torch.ops.aten.addmm.default and out.shape[-1] == 1:
            finite = out[torch.isfinite(out)]
            if finite.numel():
                self.head_max[self.step] = float(finite.abs().max())
        return out


@pytest.fixture(scope="module")
def oracle() -> _Oracle:
    program = load_program(PROGRAM)
    o = _Oracle()

    def stepped(*_: Any) -> None:
        o.step += 1

    hook = register_optimizer_step_post_hook(stepped)
    threads = torch.get_num_threads()
    try:
        with torch.random.fork_rng(devices=[]), o:
            program.main(list(ARGS))
    finally:
        hook.remove()
        torch.set_num_threads(threads)
    assert o.first_inf_step is not None and o.first_inf_step > 2 * LEAD  # the program diverges
    return o


def _record(tmp: Path, recorder: str, *args: str) -> Path:
    env = dict(os.environ, NANSCOPE_TORCH_RECORDER=recorder)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    dump = tmp / f"dump-{recorder}"
    run = subprocess.run(
        [sys.executable, "-m", "nanscope", "run", "--logdir", str(dump), str(PROGRAM), *args],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return dump


def _report(dump: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "nanscope", "report", str(dump), "--json"],
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    return json.loads(out.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("recorder", ["native", "python"])
def test_overflow_is_foreseen_long_before_the_first_inf(
    oracle: _Oracle, tmp_path: Path, recorder: str
) -> None:
    dump = _record(tmp_path, recorder, *ARGS)
    report = _report(dump)
    first_inf = oracle.first_inf_step
    assert first_inf is not None
    assert report["found_harmful"] is True
    h = report["headroom"]
    assert h is not None and h["before_step"] == first_inf
    head = [w for w in h["warnings"]
            if w["module"] == "head (Linear)" and w["phase"] == "forward"]  # fmt: skip
    assert len(head) == 1, [w["message"] for w in h["warnings"]]
    w = head[0]
    assert w["kind"] == "overflow" and w["format"] == "float16" and w["limit"] == 65504.0
    assert w["first_inf_step"] == first_inf and w["step"] == first_inf - 1
    assert w["since_step"] <= first_inf - LEAD, w["message"]
    # The value it names is the head's largest |x| at that step, as the program computed it.
    assert w["value"] == oracle.head_max[w["step"]]
    assert w["growth_per_100"] is not None and w["growth_per_100"] > 2
    assert "near overflow: `head (Linear)` reached" in w["message"]
    # The ranges table before the first Inf agrees with the oracle, step by step.
    rows = {r["step"]: r for r in h["before_inf"]
            if r["module"] == "head (Linear)" and r["phase"] == "forward"}  # fmt: skip
    assert set(rows) >= set(range(first_inf - 4, first_inf))
    for step in range(first_inf - 4, first_inf):
        assert rows[step]["max_abs"] == oracle.head_max[step]
    # Told from what was known then: a report made at the warning's first step warns already.
    with nanscope.open_dump(dump) as reader:
        early = analyze_headroom(reader, until_step=w["since_step"])
        assert early is not None
        assert any(e.module == "head (Linear)" and e.phase == "forward" and e.kind == "overflow"
                   for e in early.warnings)  # fmt: skip
        # And one made well before it does not: the warning is not there from the start.
        quiet = analyze_headroom(reader, until_step=w["since_step"] - LEAD)
        assert quiet is not None and not quiet.warnings


def test_a_stable_learning_rate_is_quiet(tmp_path: Path) -> None:
    """The same program at a stable learning rate: no Inf, and no headroom warning."""
    dump = _record(tmp_path, "native", "--steps", "300", "--lr-factor", "0.5")
    with nanscope.open_dump(dump) as reader:
        a = analyze(reader)
    assert not a.found
    assert a.headroom is not None and a.headroom.warnings == []
    assert a.headroom.before_inf == []
