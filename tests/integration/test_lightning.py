"""NanscopeCallback on real Lightning fits (nanscope.integrations.lightning).

The model is ``tests/programs/lightning_mlp.py``: an MLP on generated data whose
``log`` makes -inf at a step the program chooses (the oracle: the program's own
injection, at its line marked ``# <- origin``), or with an attention-style -inf
mask that softmax absorbs. Fits run in this process on one CPU, except DDP:
``tests/programs/lightning_ddp.py`` as a script, whose 2 CPU processes
Lightning's own launcher starts.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("lightning")

import torch

from nanscope import open_dump
from nanscope.cli import main
from nanscope.integrations.lightning import NanscopeCallback
from nanscope.report import headline

from ..helpers import marked_line
from .test_distributed import clean_env

PROGRAMS = Path(__file__).parents[1] / "programs"

spec = importlib.util.spec_from_file_location("lightning_mlp", PROGRAMS / "lightning_mlp.py")
assert spec is not None and spec.loader is not None
lightning_mlp: Any = importlib.util.module_from_spec(spec)  # a program, not a package's module
spec.loader.exec_module(lightning_mlp)


MODEL_FILE = str(PROGRAMS / "lightning_mlp.py")
ORIGIN_LINE = marked_line(MODEL_FILE, "# <- origin")
STEPS = 10
BAD_STEP = 4

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)


def fit(callback: NanscopeCallback, model: Any, **options: Any) -> Any:
    trainer = lightning_mlp.trainer([callback], **{"max_steps": STEPS, **options})
    trainer.fit(model, lightning_mlp.data())
    return trainer


def report_status(dump: Path, capsys: pytest.CaptureFixture[str]) -> int:
    status = main(["report", str(dump)])
    capsys.readouterr()
    return status


def test_healthy_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    callback = NanscopeCallback(tmp_path / "dumps")
    logger = TensorBoardLogger(tmp_path / "tb", name="", version=0)
    trainer = fit(callback, lightning_mlp.LogMLP(), logger=logger)
    assert trainer.global_step == STEPS
    assert callback.dump_dir == tmp_path / "dumps" / "fit-0"
    a = callback.analysis
    assert a is not None and not a.found and not a.found_harmful and callback.headline is None
    assert a.steps == [0, trainer.global_step - 1]  # the dump's steps are the trainer's
    with open_dump(callback.dump_dir) as reader:
        steps = {reader.execution(i).step for i in range(reader.num_executions())}
    assert set(range(STEPS)) <= steps <= set(range(STEPS + 1))  # + the last step's logging
    assert report_status(callback.dump_dir, capsys) == 0
    # The verdict went to TensorBoard as text.
    events = EventAccumulator(str(tmp_path / "tb" / "version_0"), size_guidance={"tensors": 0})
    (text,) = events.Reload().Tensors("nanscope/text_summary")
    assert "no Inf/NaN recorded" in text.tensor_proto.string_val[0].decode()


def test_harmful_fit_names_the_injected_op(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    callback = NanscopeCallback(tmp_path, circular_buffer_size=-1)
    trainer = fit(callback, lightning_mlp.LogMLP(bad_step=BAD_STEP))
    assert trainer.global_step == STEPS and callback.stopped_at is None  # not asked to stop
    a = callback.analysis
    assert a is not None and a.found_harmful and a.cause is not None
    c = a.cause
    assert (c.op_type, c.step, c.counts.neg_inf, c.counts.nan) == ("aten.log.default", 4, 1, 0)
    assert c.source is not None and (c.source.file, c.source.line) == (MODEL_FILE, ORIGIN_LINE)
    # Lightning runs the training step in optimizer.step(closure): still the forward phase.
    assert (c.phase, c.module_path) == ("forward", "LogMLP")
    assert callback.headline == headline(a)
    assert callback.headline is not None and "at step 4" in callback.headline
    assert report_status(tmp_path / "fit-0", capsys) == 1


def test_stop_on_harmful_stops_at_that_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    callback = NanscopeCallback(tmp_path, stop_on_harmful=True)
    model = lightning_mlp.LogMLP(bad_step=BAD_STEP)
    with caplog.at_level(logging.INFO):
        trainer = fit(callback, model)
    assert callback.stopped_at == BAD_STEP
    # The bad step is the last one run; its update was skipped: the weights stay finite.
    assert trainer.global_step == BAD_STEP + 1 and trainer.should_stop
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    stops = [r.getMessage() for r in caplog.records if "training stops" in r.getMessage()]
    assert stops == [
        f"nanscope: harmful Inf/NaN at step {BAD_STEP} (a non-finite loss or gradient): "
        "training stops"
    ]
    a = callback.analysis
    assert a is not None and a.cause is not None
    assert (a.cause.op_type, a.cause.step, a.cause.source and a.cause.source.line) == (
        "aten.log.default", BAD_STEP, ORIGIN_LINE,
    )  # fmt: skip


def test_benign_mask_does_not_stop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    callback = NanscopeCallback(tmp_path, stop_on_harmful=True)
    trainer = fit(callback, lightning_mlp.LogMLP(masked=True))
    assert trainer.global_step == STEPS and callback.stopped_at is None
    a = callback.analysis
    assert a is not None and a.found and not a.found_harmful
    assert {g.kind for g in a.lineages} == {"benign"}
    assert a.first_inf is not None and a.first_inf.source is not None
    assert a.first_inf.source.line == marked_line(MODEL_FILE, "# <- benign (in place)")
    assert callback.headline is not None and callback.headline.startswith("no harmful Inf/NaN")
    assert report_status(tmp_path / "fit-0", capsys) == 0


def test_resume_from_checkpoint_goes_on_numbering(tmp_path: Path) -> None:
    first = NanscopeCallback(tmp_path / "dumps")
    trainer = fit(first, lightning_mlp.LogMLP(), max_steps=6)
    trainer.save_checkpoint(tmp_path / "six.ckpt")
    # A fresh callback, as in a new process: the checkpoint carries the count of fits.
    second = NanscopeCallback(tmp_path / "dumps")
    trainer = lightning_mlp.trainer([second], max_steps=STEPS)
    trainer.fit(lightning_mlp.LogMLP(), lightning_mlp.data(), ckpt_path=tmp_path / "six.ckpt")
    assert trainer.global_step == STEPS
    assert (first.dump_dir, second.dump_dir) == (
        tmp_path / "dumps" / "fit-0",
        tmp_path / "dumps" / "fit-1",
    )
    assert second.fits == 2 and second.state_dict() == {
        "logdir": str(tmp_path / "dumps"),
        "fits": 2,
    }
    assert first.analysis is not None and second.analysis is not None
    assert first.analysis.steps == [0, 5] and second.analysis.steps == [6, STEPS - 1]
    assert first.analysis.run_id != second.analysis.run_id  # one run id per fit


def test_ddp_two_processes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Lightning's own launcher, 2 CPU processes, stop_on_harmful: the -inf born on rank 1
    reaches rank 0 through DDP's allreduce; both stop at that step."""
    bad_rank, bad_step, steps = 1, 2, 5
    cmd = [sys.executable, str(PROGRAMS / "lightning_ddp.py"), str(tmp_path), str(bad_rank),
           str(bad_step), str(steps), "stop"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), timeout=240)
    assert out.returncode == 0, out.stderr[-4000:]
    printed = sorted(
        (json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")),
        key=lambda p: p["rank"],
    )
    assert [(p["rank"], p["world"], p["global_step"], p["stopped_at"]) for p in printed] == [
        (r, 2, bad_step + 1, bad_step) for r in (0, 1)
    ]
    dump = tmp_path / "fit-0"
    assert {p["dump_dir"] for p in printed} == {str(dump)}
    # Both ranks' file sets, one run id.
    names = " ".join(p.name for p in dump.glob("*.metadata"))
    ranks = sorted(int(r) for r in re.findall(r"-rank(\d+)-pid\d+-[0-9a-f]+\.metadata", names))
    assert ranks == [0, 1]
    with open_dump(dump) as reader:
        assert reader.problems == []
        assert sorted((p.rank, p.world_size) for p in reader.processes) == [(0, 2), (1, 2)]
        assert len({p.run_id for p in reader.processes}) == 1
    # Rank 0 analysed both ranks: the cause is on the bad rank, at the injected step and line.
    cause = printed[0]["cause"]
    assert (cause["op_type"], cause["rank"], cause["step"]) == (
        "aten.log.default",
        bad_rank,
        bad_step,
    )
    assert (cause["source"]["file"], cause["source"]["line"]) == (MODEL_FILE, ORIGIN_LINE)
    assert cause["phase"] == "forward"
    assert f"rank {bad_rank}" in printed[0]["headline"] and "cause" not in printed[1]
    assert main(["report", str(dump), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert (data["cause"]["rank"], data["cause"]["step"]) == (bad_rank, bad_step)


def test_the_docs_example_runs_as_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = (Path(__file__).parents[2] / "docs" / "integrations" / "lightning.md").read_text()
    example = doc.split("## Example (runs as is)")[1].split("```python\n")[1].split("```")[0]
    script = tmp_path / "lightning_nan.py"
    script.write_text(example)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert "stopped at step 3\n" in out
    assert "aten.log.default produced -inf at step 3: log of zero" in out
    assert (tmp_path / "nanscope-dump" / "fit-0").is_dir()


def test_importing_nanscope_does_not_import_lightning() -> None:
    code = (
        "import sys, nanscope, nanscope.integrations, nanscope.analysis\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('lightning', 'pytorch_lightning', 'lightning_fabric')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_exception_closes_the_dump_and_reports(tmp_path: Path) -> None:
    class Crash(lightning_mlp.LogMLP):  # type: ignore[misc]
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if self.global_step == 3:
                raise RuntimeError("crash at step 3")
            return super().training_step(batch, batch_idx)

    callback = NanscopeCallback(tmp_path, stop_on_harmful=True)
    with pytest.raises(RuntimeError, match="crash at step 3"):
        fit(callback, Crash())
    a = callback.analysis  # the dump was closed and read
    assert a is not None and not a.found and a.steps == [0, 3]
    assert callback._session is None


def test_pytorch_lightning_trainer() -> None:
    """The older package's Trainer takes the callback as well (both are installed together)."""
    pl: Any = pytest.importorskip("pytorch_lightning")

    class Tiny(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.fc(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.rand(16, 4)), batch_size=4
    )
    with tempfile.TemporaryDirectory() as logdir:
        callback = NanscopeCallback(logdir)
        trainer = pl.Trainer(max_steps=3, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[callback])  # fmt: skip
        trainer.fit(Tiny(), data)
        assert callback.analysis is not None and callback.analysis.steps == [0, 2]
