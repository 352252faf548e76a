"""The batching of device summaries, exercised with CPU tensors (no GPU here)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("torch")
import torch

from nanscope.backends.torch.device_buffer import DeviceBuffer, PendingSummaries


def test_rows_resolve_after_submit_in_order_and_width() -> None:
    buf = DeviceBuffer(capacity=3)
    refs = [buf.add(torch.arange(n, dtype=torch.float64) + 10 * n) for n in (2, 5, 3)]
    # The third add filled the batch: it was submitted without a call.
    pending = PendingSummaries([refs[0], None, refs[2], np.array([7.0])])
    values = pending.resolve()
    np.testing.assert_array_equal(values[0], [20.0, 21.0])
    assert values[1] is None
    np.testing.assert_array_equal(values[2], [30.0, 31.0, 32.0])
    np.testing.assert_array_equal(values[3], [7.0])
    np.testing.assert_array_equal(PendingSummaries([refs[1]]).resolve()[0], 50.0 + np.arange(5))


def test_resolve_waits_for_the_training_thread_to_submit() -> None:
    buf = DeviceBuffer(capacity=100)
    ref = buf.add(torch.tensor([1.0, 2.0], dtype=torch.float64))
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.extend(PendingSummaries([ref]).resolve()))
    reader.start()
    reader.join(0.2)
    assert reader.is_alive() and not got  # nothing on the host yet: the writer waits
    buf.submit()  # a step ended
    reader.join(10)
    np.testing.assert_array_equal(got[0], [1.0, 2.0])
