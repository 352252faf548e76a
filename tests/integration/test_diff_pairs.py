"""``nanscope diff`` on real pairs of runs: a tiny transformers Llama, two training steps.

The runs are ``tests/programs/diff_pairs.py`` (one process each, or three DDP ranks
under torchrun), recorded in FULL_HEALTH. Each test checks the diff against an
independent fact:

- a bug injected in one layer: the diff names that layer's MLP and the injected line
  (``# <- injected``), where the program put it;
- float32 against bfloat16 autocast: an oracle runs the same model here under a
  ``TorchDispatchMode`` that takes every op's largest ``|x|`` (no nanscope), and the
  diff's first parted op is the oracle's first op whose error exceeds the tolerance;
- eager against ``torch.compile``: the honest result (within tolerance);
- three DDP ranks, one of which received a corrupted batch: the diff names that rank,
  the step, and the first op that read the batch;
- a flax Transformer (``tests/programs/diff_jax.py``) compiled under two XLA flags: every
  jaxpr equation pairs with its own, by name stack and primitive.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nanscope.analysis import DiffResult, diff, diff_ranks
from nanscope.cli import main

from ..helpers import marked_line

PROGRAM = Path(__file__).parents[1] / "programs" / "diff_pairs.py"
HAS_STACK = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
pytestmark = [
    pytest.mark.torch,
    pytest.mark.slow,
    pytest.mark.skipif(not HAS_STACK, reason="needs PyTorch and transformers"),
]
TIMEOUT_S = 600
BF16_ULP = 2.0**-8  # bfloat16's unit roundoff: the error of one rounding


def env() -> dict[str, str]:
    drop = ("NANSCOPE_RUN_ID", "NANSCOPE_RANK", "TORCHELASTIC_RUN_ID", "RANK", "LOCAL_RANK",
            "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # fmt: skip
    out = {k: v for k, v in os.environ.items() if k not in drop}
    return {**out, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def record(logdir: Path, *flags: str) -> Path:
    cmd = [sys.executable, str(PROGRAM), str(logdir), *flags]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-4000:]
    return logdir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Each run recorded once for the module: ``runs("--autocast-bf16")``."""
    root = tmp_path_factory.mktemp("diff_pairs")
    made: dict[tuple[str, ...], Path] = {}

    def get(*flags: str) -> Path:
        if flags not in made:
            made[flags] = record(root / (("-".join(flags) or "fp32").strip("-")), *flags)
        return made[flags]

    return get


def test_a_bug_injected_in_one_layer_is_named(runs: Callable[..., Path]) -> None:
    layer = 1
    r = diff(runs(), runs("--inject-bug", str(layer)))
    assert r.status == "parted" and r.exit_status == 1
    p = r.parted
    assert p is not None
    assert (p.step, p.phase) == (0, "forward")
    assert p.a.module_path.startswith(f"model.layers.{layer}.mlp")
    # The op that made its input is the injected one: only run B has it, at that line.
    injected = marked_line(str(PROGRAM), "# <- injected")
    only = p.only_in_one_run
    assert only is not None and only.run == "b"
    assert only.module_path.startswith(f"model.layers.{layer}.mlp")
    assert only.source is not None
    assert (Path(only.source.file).name, only.source.line) == (PROGRAM.name, injected)
    # Every earlier op agreed: its other input (up_proj's output) is among them.
    assert [c.status for c in p.inputs] == ["only_b", "agree"]
    # The injected mul and its backward, in each of the two steps.
    assert r.alignment.only_b == 4 and r.alignment.only_a == 0


def dispatch_amax(flags: tuple[str, ...]) -> list[tuple[str, list[float]]]:
    """Every op of step 0's forward, in order, with each float output's largest |x|,
    taken by a TorchDispatchMode (no nanscope): views and casts left out."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    spec = importlib.util.spec_from_file_location("diff_pairs", PROGRAM)
    assert spec is not None and spec.loader is not None
    program: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(program)

    class Amax(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.ops: list[tuple[str, list[float]]] = []

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            out = func(*args, **(kwargs or {}))
            name = str(func)
            if func.is_view or name.split(".")[1] in ("_to_copy", "detach", "detach_"):
                return out
            outs = out if isinstance(out, (tuple, list)) else [out]
            amax = [
                float(t.detach().abs().float().nan_to_num(0.0, 0.0, 0.0).max())
                for t in outs
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()
            ]
            if amax:
                self.ops.append((name, amax))
            return out

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = program.build()
        ids = program.batch(0)
        mode = Amax()
        with (
            torch.autocast("cpu", dtype=torch.bfloat16, enabled="--autocast-bf16" in flags),
            mode,
        ):
            model(input_ids=ids, labels=ids)
    finally:
        torch.set_num_threads(threads)
    return mode.ops


def test_float32_against_bfloat16_parts_where_the_oracle_says(
    runs: Callable[..., Path],
) -> None:
    # At one bfloat16 rounding's error, the first op that exceeds it.
    r = diff(runs(), runs("--autocast-bf16"), rtol=BF16_ULP)
    p = r.parted
    assert p is not None and (p.step, p.phase) == (0, "forward")
    fp32, bf16 = dispatch_amax(()), dispatch_amax(("--autocast-bf16",))
    assert [n for n, _ in fp32] == [n for n, _ in bf16]  # the same ops, casts left out
    first = next(
        k
        for k, ((_, a), (_, b)) in enumerate(zip(fp32, bf16, strict=True))
        if any(
            abs(x - y) > r.tolerance.atol + BF16_ULP * max(x, y) for x, y in zip(a, b, strict=True)
        )
    )
    name, a = fp32[first]
    _, b = bf16[first]
    assert p.a.op_type == name
    out = next(o for o in p.outputs if o.parted)
    assert out.statistic == "amax" and out.compared_as == "bfloat16"
    assert out.value_a == pytest.approx(a[out.slot], rel=1e-6)
    assert out.value_b == pytest.approx(b[out.slot], rel=1e-6)
    assert out.relative_error > BF16_ULP
    # At bfloat16's default tolerance the whole run agrees, loss included (this tiny
    # model's largest error over two steps is about 1.4e-2; the default is 1.6e-2).
    default = diff(runs(), runs("--autocast-bf16"))
    assert default.status == "agree", default.parted


def test_eager_against_torch_compile(runs: Callable[..., Path]) -> None:
    r = diff(runs(), runs("--compile"))
    # The honest result: compiled graphs' ops are compared by counts only (FULL_HEALTH
    # traces carry no ranges), the eager ops around them by their largest |x|.
    assert r.status == "agree", r.parted
    assert r.alignment.compared > 0 and r.alignment.evidence["counts"] > 0
    assert r.loss is not None and r.loss.first_parted_step is None


def test_ranks_name_the_one_that_got_a_corrupted_batch(tmp_path: Path) -> None:
    logdir = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "3", str(PROGRAM), str(logdir), "--steps", "1", "--ddp-corrupt", "2",
           "--corrupt-step", "0"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-4000:]
    r: DiffResult = diff_ranks(logdir)
    assert r.ranks is not None and r.ranks.odd_ranks == (2,) and r.ranks.majority
    assert r.ranks.first_parted == {1: None, 2: 0}
    p = r.parted
    assert p is not None and p.b.rank == 2 and (p.step, p.phase) == (0, "forward")
    # The corrupted token ids are no float tensor nanscope records: the first op that read
    # them (the embedding lookup) is where the ranks part, its ids from no recorded op.
    assert p.a.op_type == "aten.embedding.default"
    assert "embed_tokens" in p.a.module_path
    assert p.inputs_agree is None and "not_recorded" in {c.status for c in p.inputs}
    assert r.loss is not None and r.loss.first_parted_step == 0
    # The command line says the same, exit 1; two ranks by number compare as two runs.
    assert main(["diff", str(logdir), "--ranks", "--json"]) == 1
    assert main(["diff", str(logdir), "--rank-a", "0", "--rank-b", "1"]) == 0


def test_diff_json_names_both_sides(
    runs: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = runs(), runs("--inject-bug", "1")
    assert main(["diff", str(a), str(b), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "parted" and doc["evidence"] == "ranges"
    assert doc["parted"]["a"]["run"] == "a" and doc["parted"]["b"]["run"] == "b"
    assert doc["parted"]["only_in_one_run"]["source"]["line"] == marked_line(
        str(PROGRAM), "# <- injected"
    )


JAX_PROGRAM = Path(__file__).parents[1] / "programs" / "diff_jax.py"


@pytest.mark.jax
@pytest.mark.skipif(importlib.util.find_spec("flax") is None, reason="needs flax")
def test_a_flax_model_under_two_xla_flags(tmp_path: Path) -> None:
    dumps = []
    for name, flags in (("default", ""), ("fast_min_max", "--xla_cpu_enable_fast_min_max=true")):
        logdir = tmp_path / name
        cmd = [sys.executable, str(JAX_PROGRAM), str(logdir)]
        out = subprocess.run(
            cmd, capture_output=True, text=True, env={**env(), "XLA_FLAGS": flags},
            timeout=TIMEOUT_S,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-4000:]
        dumps.append(logdir)
    r = diff(*dumps)
    # Each jaxpr equation of the one jitted step pairs with its own (name stack, primitive):
    # the same program, only compiled with another flag.
    assert r.alignment.steps == 2 and r.alignment.only_a == r.alignment.only_b == 0
    assert r.alignment.pairs > 500 and r.evidence == "counts"  # JAX dumps: counts only
    # No equation's Inf/NaN, sign or zero counts move beyond tolerance: the honest result.
    assert r.status == "agree", r.parted
