"""FULL_TENSOR PyTorch programs whose huge tensors overload the dump: never a false all-clear.

A ~1 GB ``expand()`` recorded in FULL_TENSOR mode used to make the dump lose the NaN
born after it: writing its record took the disk longer than the writer's ``io_timeout``,
the disk counted as hung, and at exit the events held in memory (the NaN among them)
were given up, so the dump read as a run without Inf/NaN. Here the same program runs on
a disk made slow on purpose (every write of the dump waits), with a smaller tensor: the
NaN must reach the dump, and the drop report must say that the writer closed and lost
no event holding Inf/NaN. Besides: a value past ``max_value_bytes`` leaves its record
with its shape and health only (the native recorder's path), and the native recorder's
own full buffer sheds around the first Inf/NaN, keeping its windows.

No timing is asserted: the slow disk only has to be slower than ``io_timeout`` (by far),
and the checks are what the dump holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import nanscope
from nanscope.format import files
from nanscope.reader import EXECUTIONS
from tests.helpers import torch_recorder

pytest.importorskip("torch")
import torch

pytestmark = pytest.mark.torch

# The program, scaled down: a 16 MiB expand() (then an op on it) instead of ~1 GB,
# and a disk that takes 64 KiB per write, 10 ms each (2.5 s for the two values), against
# an io_timeout of 0.5 s. Training goes on until the writer has noticed the slow disk.
PROGRAM = textwrap.dedent(
    """
    import json, sys, time
    import torch
    import nanscope
    from nanscope.events import _io

    real = _io.write
    _io.CHUNK = 64 << 10  # (the writer before this change wrote a value in one call)

    def slow(fd, data):
        time.sleep(0.01)
        return real(fd, data[: 64 << 10])

    _io.write = slow
    session = nanscope.enable_dump_debug_info(
        sys.argv[1], tensor_debug_mode="FULL_TENSOR", circular_buffer_size=-1,
        flush_interval=0.1, io_timeout=0.5,
    )
    big = torch.ones(1, 1024).expand(4096, 1024)  # 16 MiB of values from 4 KiB
    twice = big * 2
    bad = torch.log(torch.tensor(-1.0))  # <- the NaN
    model = torch.nn.Linear(16, 4)
    x = torch.randn(8, 16)
    for step in range(10_000):
        model(x).sum().backward()
        if session.writer.failing:
            break
        time.sleep(0.01)
    noticed = session.writer.failing
    nanscope.disable_dump_debug_info()
    st = session.writer.stats
    print(json.dumps({"noticed": noticed, "dropped": st.dropped}))
    """
)


def drops_report(logdir: Path) -> dict[str, Any]:
    (fs,) = files.discover(logdir)
    report: dict[str, Any] = json.loads(Path(fs.path(files.DROPS)).read_bytes())
    return report


def test_a_nan_after_a_huge_full_tensor_record_is_not_lost(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    logdir = tmp_path / "dump"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, str(program), str(logdir)], capture_output=True,
                         text=True, timeout=600, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["noticed"], "the disk was never slow enough to matter"
    with nanscope.open_dump(logdir) as r:
        rows = r.index(EXECUTIONS)
        nan = [r.execution(int(i)).op_type for i in np.flatnonzero(rows["nan"] > 0)]
        assert nan[:1] == ["aten.log.default"], nan
    report = drops_report(logdir)
    assert report["closed"] is True
    assert report["nonfinite_dropped"] == 0
    assert report["faults"][0]["reason"] == "disk too slow"


def test_a_value_past_the_bound_keeps_its_shape_and_health(tmp_path: Path) -> None:
    """``max_value_bytes`` 1 MiB: a 4 MiB output is written without its elements, as a view
    entry naming no record, with its health; its record stays small; a small output keeps
    its values. (The log's input, also 4 MiB, is left out of its record too.)"""
    with nanscope.enable_dump_debug_info(tmp_path, tensor_debug_mode="FULL_TENSOR",
                                         circular_buffer_size=-1, max_value_bytes=1 << 20):  # fmt: skip
        t = torch.full((1024, 1024), -1.0)
        y = torch.log(t)  # 1M NaN
        z = torch.arange(8.0) * 2
    assert torch.isnan(y).all()
    with nanscope.open_dump(tmp_path) as r:
        rows = r.index(EXECUTIONS)
        assert int(rows["length"].max()) < 1 << 20
        by_op = {r.execution(i).op_type: r.execution(i) for i in range(len(rows))}
        log = by_op["aten.log.default"]
        assert log.tensor_values is not None and log.tensor_values[0] is None
        h = log.output_health[0]
        assert h is not None and (h.size, h.nan) == (1 << 20, 1 << 20)
        full = by_op["aten.full.default"]
        h = full.output_health[0]
        assert h is not None and (h.size, h.neg, h.nan) == (1 << 20, 1 << 20, 0)
        mul = by_op["aten.mul.Tensor"]
        assert mul.tensor_values is not None
        np.testing.assert_array_equal(mul.tensor_values[0], z.numpy())


@pytest.mark.skipif(torch_recorder() != "native", reason="the native recorder is not in use")
def test_the_native_recorders_full_buffer_keeps_the_windows(tmp_path: Path) -> None:
    """The native recorder's own buffer, full (its drain held), sheds events but not the
    ``origin_window`` events before and after the first Inf/NaN; each one let go of is
    counted, none of them holding Inf/NaN."""
    x = torch.ones(4)
    with nanscope.enable_dump_debug_info(tmp_path, "FULL_HEALTH", circular_buffer_size=-1,
                                         origin_window=5) as s:  # fmt: skip
        eager: Any = s._session.eager  # type: ignore[attr-defined]
        eager.lib.set_capacity(20)
        # The drain thread stalls on the lock it takes to hand events over: the buffer
        # fills up, and each later op waits briefly, then is shed.
        with eager._write_lock:
            for _ in range(40):
                torch.add(x, 1)
            torch.log(x - 1)  # -inf, in an over-full buffer
            for _ in range(8):
                torch.mul(x, 2)
            dropped = eager.lib.dropped()
    # Adds 21 to 36 let go of; adds 37 to 40 and the subtraction came back as the log's
    # window before it, the five multiplications after it are its window after it, and
    # the last three, shed last, were taken when recording stopped.
    assert dropped == 16
    with nanscope.open_dump(tmp_path) as r:
        ops = [e.op_type for e in r.executions()]
        (drops,) = r.writer_drops().values()
        assert drops.executions == 16 and drops.nonfinite_dropped == 0
    at = ops.index("aten.log.default")
    assert (
        ops[at - 5 :]
        == ["aten.add.Tensor"] * 4
        + ["aten.sub.Tensor", "aten.log.default"]
        + ["aten.mul.Tensor"] * 8
    )
    assert ops.count("aten.add.Tensor") == 24
