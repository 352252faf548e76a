"""The built-in demo: the seed tutorial's bug, reproduced with numpy and dumped.

A 784-500-10 MLP with a hand-written cross-entropy, ``-sum(labels *
log(softmax(logits)))``, trained with a learning rate high enough that a
probability underflows to exactly 0 and ``log`` returns ``-inf``. Every numpy
op of each step is recorded as an ``Execution`` with its FULL_HEALTH summary
and Python stack, through the same writer that the framework backends use.
Needs nothing beyond nanscope's own dependencies.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from nanscope.events import DumpWriter, ExecutionEvent, Phase
from nanscope.format.tensors import data_type_of


def full_health(array: np.ndarray, tensor_id: int = -1) -> np.ndarray:
    """The FULL_HEALTH summary of a float array, computed with numpy."""
    a = np.asarray(array, dtype=np.float64).reshape(-1)
    ni = np.count_nonzero(a == -np.inf)
    pi = np.count_nonzero(a == np.inf)
    nn = np.count_nonzero(np.isnan(a))
    neg = np.count_nonzero(a < 0) - ni
    zero = np.count_nonzero(a == 0)
    pos = np.count_nonzero(a > 0) - pi
    return np.array(
        [
            tensor_id,
            -1,
            int(data_type_of(np.asarray(array))),
            np.ndim(array),
            a.size,
            ni,
            pi,
            nn,
            neg,
            zero,
            pos,
        ],
        dtype=np.float64,
    )


class Recorder:
    """Runs numpy functions and records each call as an eager execution."""

    def __init__(self, writer: DumpWriter) -> None:
        self.writer = writer
        self.device = writer.register_device("/cpu:0")
        self._ids = itertools.count(1)
        self._tensor_ids: dict[int, int] = {}
        self.step = 0
        self.phase = Phase.FORWARD

    def _id(self, array: Any) -> int:
        key = id(array)
        tid = self._tensor_ids.get(key)
        if tid is None:
            tid = self._tensor_ids[key] = next(self._ids)
        return tid

    def __call__(self, op_type: str, fn: Callable[..., np.ndarray], *args: Any) -> np.ndarray:
        with np.errstate(all="ignore"):
            out = fn(*args)
        inputs = [a for a in args if isinstance(a, np.ndarray)]
        self.writer.write_execution(
            ExecutionEvent(
                op_type=op_type,
                input_tensor_ids=[self._id(a) for a in inputs],
                output_tensor_ids=[self._id(out)],
                output_device_ids=[self.device],
                summaries=[full_health(out)],
                input_summaries=[full_health(a) for a in inputs],
                stack=self.writer.capture_stack(sys._getframe(1)),
                phase=self.phase,
                step=self.step,
            )
        )
        return out


def synthetic_digits(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Digit-like 28x28 images: each class a fixed stroke pattern plus noise."""
    rng = np.random.default_rng(seed)
    templates = rng.random((10, 784)) < 0.15
    labels = rng.integers(0, 10, n)
    images = templates[labels] * rng.uniform(0.6, 1.0, (n, 784)) + rng.normal(0, 0.1, (n, 784))
    return np.clip(images, 0, 1).astype(np.float32), labels


def train(rec: Recorder, steps: int = 4, lr: float = 0.5, batch: int = 100) -> list[float]:
    """The seed's training loop in numpy; returns the loss of each step."""
    rng = np.random.default_rng(42)
    w1 = (rng.standard_normal((784, 500)) * 0.1).astype(np.float32)
    b1 = np.full(500, 0.1, np.float32)
    w2 = (rng.standard_normal((500, 10)) * 0.1).astype(np.float32)
    b2 = np.full(10, 0.1, np.float32)
    x_all, y_all = synthetic_digits(batch * steps)
    losses = []
    for step in range(steps):
        rec.step, rec.phase = step, Phase.FORWARD
        x = x_all[step * batch : (step + 1) * batch]
        labels = np.eye(10, dtype=np.float32)[y_all[step * batch : (step + 1) * batch]]
        h_pre = rec("matmul_add", lambda a, w, b: a @ w + b, x, w1, b1)
        h = rec("relu", lambda a: np.maximum(a, 0), h_pre)
        logits = rec("matmul_add", lambda a, w, b: a @ w + b, h, w2, b2)
        shifted = rec("sub", lambda a: a - a.max(axis=1, keepdims=True), logits)
        e = rec("exp", np.exp, shifted)
        probs = rec("div", lambda a: a / a.sum(axis=1, keepdims=True), e)
        log_probs = rec("log", np.log, probs)  # the seed's bug: log of a probability that is 0
        loss_terms = rec("mul", lambda y, lp: -(y * lp), labels, log_probs)
        loss = rec("mean", lambda t: np.asarray(t.sum(axis=1).mean(), np.float32), loss_terms)
        losses.append(float(loss))
        rec.phase = Phase.BACKWARD
        d_logits = rec("softmax_grad", lambda p, y: (p - y) / batch, probs, labels)
        d_w2 = rec("matmul", lambda a, b: a.T @ b, h, d_logits)
        d_h = rec("relu_grad", lambda a, b, act: (a @ b.T) * (act > 0), d_logits, w2, h)
        d_w1 = rec("matmul", lambda a, b: a.T @ b, x, d_h)
        rec.phase = Phase.OPTIMIZER
        # The gradient of -(y*log p) through log is -y/p: infinite where p == 0.
        scale = rec("grad_scale", lambda lp: np.where(np.isinf(lp), np.inf, 1.0).max(), log_probs)
        w2 = rec("sgd_update", lambda w, g, s: w - lr * g * s, w2, d_w2, scale)
        w1 = rec("sgd_update", lambda w, g, s: w - lr * g * s, w1, d_w1, scale)
        # Make the softmax saturate quickly, as the seed's high learning rate does.
        w2 = rec("scale", lambda w: w * 8.0, w2)
    return losses


def run_demo(logdir: Path, steps: int = 4) -> list[float]:
    """Train the demo model with nanscope recording into ``logdir``."""
    with DumpWriter(logdir, "FULL_HEALTH", -1, framework="numpy " + np.__version__) as writer:
        return train(Recorder(writer), steps=steps)
