"""A LightningModule that diverges late, as a real run does: one row of its data is poisoned.

    python lightning_late.py             # the poisoned row is met late: log(0) = -inf, then NaN
    python lightning_late.py --clean     # the same run without it: trains to the end
    python lightning_late.py --clean --spike-at 120   # a learning-rate schedule that spikes

A small regressor on tabular data whose features span orders of magnitude, so the model
takes their log (the line marked ``# <- origin``). One row of the data set has a feature
of 0, the way a table writes a missing value: ``log`` makes ``-inf`` there, the loss is
``inf`` and the gradients NaN. The DataLoader shuffles (seeded), so the step that meets
the row is known only by running it: a couple of hundred tiny steps in. The model also
keeps a BatchNorm (running statistics: module buffers, which the step's replay must
start from) and Adam. :func:`make_trainer`, :func:`data` and :class:`LogFeatures` build
the run for the tests (tests/integration/test_sentinel_integrations.py).

``--spike-at K`` gives Adam a learning-rate schedule with a bug: at step K its factor
divides by zero (``1 / (K - step)`` in numpy's float64), so the learning rate is ``inf``. The
gradients are finite; Adam's update multiplies by that rate and writes ``inf`` (and ``NaN``
where the step direction is 0) into the weights: an Inf/NaN born in the optimizer step
itself.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl  # type: ignore[no-redef]

FEATURES = 6
BATCH = 8
ROWS = 1600  # 200 steps per epoch
POISONED = 979  # the index of the poisoned row (met at step 175 with seed 0)


class LogFeatures(pl.LightningModule):
    """log-features -> Linear -> BatchNorm -> ReLU -> Linear, trained with Adam on MSE."""

    def __init__(self, lr: float = 3e-3, spike_at: int | None = None) -> None:
        super().__init__()
        self.lr, self.spike_at = lr, spike_at
        self.net = nn.Sequential(
            nn.Linear(FEATURES, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = torch.log(x)  # <- origin
        out: torch.Tensor = self.net(features)
        return out

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.lr)
        if self.spike_at is None:
            return optimizer
        spike = self.spike_at

        def factor(step: int) -> float:
            if step != spike:
                return 1.0
            with np.errstate(divide="ignore"):  # numpy divides by 0 into inf, no error
                return float(np.float64(1.0) / np.float64(spike - step))

        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def data(*, poisoned: bool = True, seed: int = 0) -> DataLoader[Any]:
    """Positive features spanning 1e-3..1e3 and a target made of their logs, shuffled."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.exp(torch.empty(ROWS, FEATURES).uniform_(-7.0, 7.0, generator=gen))
    y = (x.log() * torch.linspace(-1, 1, FEATURES)).sum(1, keepdim=True) / 4
    if poisoned:
        x[POISONED, 2] = 0.0  # a missing value, written as 0
    loader_gen = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True, generator=loader_gen)


def make_trainer(callbacks: list[Any] | None = None, **options: Any) -> pl.Trainer:
    """A quiet CPU trainer for one epoch: no progress bar, logger or checkpoints unless asked."""
    settings: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        **options,
    }
    return pl.Trainer(callbacks=callbacks or [], **settings)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clean", action="store_true", help="no poisoned row")
    parser.add_argument("--spike-at", type=int, default=None, help="a learning-rate spike")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    model = LogFeatures(spike_at=args.spike_at)
    trainer = make_trainer()
    trainer.fit(model, data(poisoned=not args.clean, seed=args.seed))
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    print("trained", trainer.global_step, "steps; weights finite:", finite)


if __name__ == "__main__":
    main()
