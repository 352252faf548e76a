"""The Hugging Face ``Trainer`` recorded by ``nanscope.integrations.transformers``.

A GPT-2 built from a tiny config (2 layers, width 32, 64 tokens, sequences of 16;
nothing is downloaded) is trained by ``transformers.Trainer`` on the CPU, on
generated token sequences:

* healthy: the dump exists, its steps are the Trainer's global steps, and the report
  finds no harmful Inf/NaN (GPT-2's causal mask makes ``-inf`` that softmax absorbs);
  ``stop_on_harmful=True`` lets it run to the end;
* failing: a small gate head takes ``torch.log`` of a probability that the program
  itself sets to zero at a known step (the injection is the oracle). The report's
  cause is that ``aten.log`` at that step and line, and ``stop_on_harmful=True`` stops
  training in that step.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from torch import nn  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainingArguments,
)
from transformers.utils import logging as hf_logging  # noqa: E402

from nanscope.integrations.transformers import NanscopeCallback, attach  # noqa: E402
from nanscope.reader import EXECUTIONS, TRACES, open_dump  # noqa: E402
from nanscope.report import headline  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 16
POISON_STEP = 6  # the Trainer step (its global_step before it) whose log is of zero


class GatedGPT2(nn.Module):
    """GPT-2 plus a gate head whose log-probability joins the loss (a small auxiliary term).

    At training forward ``poison_at`` (with no gradient accumulation: the step whose
    ``global_step`` is that number) the gate's probability is set to zero, so that
    ``torch.log`` makes ``-inf``: the loss and then every gradient are not finite.
    """

    def __init__(self, config: GPT2Config, poison_at: int | None) -> None:
        super().__init__()
        self.gpt2 = GPT2LMHeadModel(config)
        self.gate = nn.Linear(config.n_embd, 1)
        self.poison_at = poison_at
        self.calls = 0

    def forward(self, input_ids: Any, labels: Any = None) -> dict[str, Any]:
        out = self.gpt2(input_ids=input_ids, labels=labels, output_hidden_states=True)
        p = torch.sigmoid(self.gate(out.hidden_states[-1])).mean()
        if self.training:
            if self.calls == self.poison_at:
                p = p * 0.0
            self.calls += 1
        loss = out.loss - 0.01 * torch.log(p)  # the injected log of zero
        return {"loss": loss, "logits": out.logits}


def poison_line() -> int:
    lines, start = inspect.getsourcelines(GatedGPT2.forward)
    return start + next(i for i, s in enumerate(lines) if "injected log of zero" in s)


def is_the_injection(cause: Any) -> bool:
    """Whether the report's cause is the injected ``torch.log`` of zero, at its step and line.

    Its ``-inf`` goes forward into the loss, and its backward (``grad / p``, a division by
    zero) makes the ``-inf`` whose lineage makes the first NaN: the analysis names the
    backward op, with the forward op and line that created it. Either is that op.
    """
    if cause is None or cause.step != POISON_STEP:
        return False
    line = poison_line()
    if cause.op_type == "aten.log.default":
        return cause.source is not None and cause.source.line == line
    return (
        cause.forward_op == "aten.log.default"
        and cause.forward_source is not None
        and Path(cause.forward_source.file).name == Path(__file__).name
        and cause.forward_source.line == line
    )


def token_data(n: int, seq_len: int = 16, vocab: int = 64) -> list[dict[str, Any]]:
    """Sequences that count upward with a random start and stride (mod vocab)."""
    gen = torch.Generator().manual_seed(0)
    start = torch.randint(0, vocab, (n, 1), generator=gen)
    stride = torch.randint(1, 4, (n, 1), generator=gen)
    ids = (start + stride * torch.arange(seq_len)) % vocab
    return [{"input_ids": row, "labels": row} for row in ids]


def make_trainer(
    out: Path,
    poison_at: int | None = None,
    steps: int = STEPS,
    save: bool = False,
    tied: bool = True,
) -> Trainer:
    """The Trainer of the gated GPT-2 on the CPU; ``save`` keeps a checkpoint at the end
    (of a model whose embeddings are not ``tied`` to its head: the Trainer saves a plain
    module's state dict with safetensors, which refuses shared tensors)."""
    torch.manual_seed(0)
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    config = GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32,
        bos_token_id=0, eos_token_id=0, tie_word_embeddings=tied,
    )  # fmt: skip
    args = TrainingArguments(
        output_dir=str(out / "trainer"),
        max_steps=steps,
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        logging_steps=5,
        save_strategy="steps" if save else "no",
        save_steps=steps,
        report_to="none",
        use_cpu=True,
        remove_unused_columns=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    return Trainer(
        model=GatedGPT2(config, poison_at),
        args=args,
        train_dataset=token_data(8 * STEPS),
    )


def dump_steps(logdir: Path) -> set[int]:
    reader = open_dump(logdir)
    return {int(s) for kind in (EXECUTIONS, TRACES) for s in reader.index(kind)["step"]}


def test_healthy_run_records_every_step_and_finds_nothing_harmful(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path)
    callback = attach(trainer, tmp_path / "dump", circular_buffer_size=-1, stop_on_harmful=True)
    trainer.train()

    assert trainer.state.global_step == STEPS  # stop_on_harmful let it run to the end
    assert callback.harmful_step is None
    # Step k is the Trainer's step that begins at global_step k; what the Trainer runs
    # after its last optimizer step (the final loss) is numbered STEPS, as nanscope
    # numbers what follows a step.
    assert set(range(STEPS)) <= dump_steps(tmp_path / "dump") <= set(range(STEPS + 1))
    analysis = callback.analysis
    assert analysis is not None
    assert analysis.found  # the causal mask's -inf
    assert not analysis.found_harmful
    assert analysis.cause is None
    assert callback.headline is not None and callback.headline.startswith("no harmful Inf/NaN")


def test_injected_nan_is_the_cause_and_stops_training(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, poison_at=POISON_STEP)
    callback = NanscopeCallback(tmp_path / "dump", stop_on_harmful=True)
    trainer.add_callback(callback)
    trainer.train()

    # The poisoned step completes (a callback cannot skip the optimizer step); none follows.
    assert callback.harmful_step == POISON_STEP
    assert trainer.state.global_step == POISON_STEP + 1
    analysis = callback.analysis
    assert analysis.found_harmful
    assert is_the_injection(analysis.cause), headline(analysis)
    assert callback.headline == headline(analysis)
    assert callback.headline is not None and f"at step {POISON_STEP}" in callback.headline


def test_injected_nan_without_stopping_is_found_at_its_step(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, poison_at=POISON_STEP)
    callback = attach(trainer, tmp_path / "dump")
    trainer.train()

    assert trainer.state.global_step == STEPS  # the NaN weights train on to the end
    assert is_the_injection(callback.analysis.cause), callback.headline


def test_resumed_run_goes_on_with_the_trainers_step_numbers(tmp_path: Path) -> None:
    make_trainer(tmp_path, steps=4, save=True, tied=False).train()  # leaves checkpoint-4
    trainer = make_trainer(tmp_path, steps=8, tied=False)
    attach(trainer, tmp_path / "dump", circular_buffer_size=-1)
    trainer.train(resume_from_checkpoint=True)

    assert trainer.state.global_step == 8
    assert set(range(4, 8)) <= dump_steps(tmp_path / "dump") <= set(range(4, 9))


def test_a_failing_callback_does_not_stop_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    trainer = make_trainer(tmp_path, steps=3)
    callback = attach(trainer, blocker / "dump")  # cannot be made under a file
    trainer.train()

    assert trainer.state.global_step == 3
    assert callback.analysis is None
    assert "nanscope:" in caplog.text  # said once, as a warning


def test_headline_goes_to_tensorboard_as_text(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")  # the Trainer's TensorBoardCallback needs it
    base = make_trainer(tmp_path, steps=3)
    base.args.report_to = ["tensorboard"]  # its writer goes under output_dir/runs
    trainer = Trainer(model=base.model, args=base.args, train_dataset=base.train_dataset)
    callback = attach(trainer, tmp_path / "dump")
    trainer.train()

    assert callback.tb_writer is not None and callback.headline is not None
    # The text summary's string is stored as it is in the event file's records.
    events = [p.read_bytes() for p in (tmp_path / "trainer").rglob("events.out.tfevents.*")]
    assert sum(callback.headline.encode() in e for e in events) == 1
    assert any(b"nanscope/headline" in e for e in events)


def test_importing_nanscope_does_not_import_transformers() -> None:
    code = "import nanscope, nanscope.integrations, sys; print('transformers' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "False", out.stderr


NO_ARGS: Any = None  # the hooks called directly do not read the TrainingArguments


def hooks_of(stop: bool = True) -> tuple[NanscopeCallback, Any, Any]:
    """A callback called directly (no Trainer, no recording), with a state and a control."""
    from transformers import TrainerControl, TrainerState

    return NanscopeCallback("unused", stop_on_harmful=stop), TrainerState(), TrainerControl()


def test_under_a_grad_scaler_only_non_finite_parameters_stop() -> None:
    callback, state, control = hooks_of()
    model = nn.Linear(3, 2)
    model.weight.grad = torch.full((2, 3), float("inf"))  # an overflow the scaler skips
    scaled = type("AcceleratedOptimizer", (), {"scaler": object()})()
    callback.on_pre_optimizer_step(NO_ARGS, state, control, model=model, optimizer=scaled)
    callback.on_optimizer_step(NO_ARGS, state, control, model=model, optimizer=scaled)
    assert not control.should_training_stop

    with torch.no_grad():
        model.bias[0] = float("nan")
    callback.on_optimizer_step(NO_ARGS, state, control, model=model, optimizer=scaled)
    assert control.should_training_stop and callback.harmful_step == 0


def test_without_a_scaler_a_non_finite_gradient_stops() -> None:
    callback, state, control = hooks_of()
    model = nn.Linear(3, 2)
    model.weight.grad = torch.zeros(2, 3)
    model.bias.grad = torch.tensor([0.0, float("-inf")])
    state.global_step = 7
    callback.on_pre_optimizer_step(NO_ARGS, state, control, model=model, optimizer=object())
    assert control.should_training_stop and callback.harmful_step == 7


def test_a_check_that_cannot_read_the_gradients_turns_itself_off() -> None:
    callback, state, control = hooks_of()
    model = nn.Embedding(5, 2, sparse=True)
    model(torch.tensor([1, 2])).sum().backward()  # a sparse gradient
    callback.on_pre_optimizer_step(NO_ARGS, state, control, model=model, optimizer=object())
    assert not control.should_training_stop
    assert not callback.stop_on_harmful  # the check is off, with a warning
    assert not callback._failed  # the callback itself goes on (recording included)
