"""A small PyTorch training run under nanscope whose disk fails part-way.

    python writer_faults.py LOGDIR FAULT STEPS FAULT_STEP BUFFER [RECOVER_STEP]

``FAULT`` happens before step ``FAULT_STEP``: ``none``; ``full`` (a filler file
takes all the space left on LOGDIR's file system; removed again before
``RECOVER_STEP`` when given); ``deleted`` (LOGDIR removed); ``readonly`` (a
read-only tmpfs mounted over LOGDIR: Linux refuses to remount a file system
read-only while files on it are open for writing, as the dump's are, so the
files already open stay writable underneath, and everything the writer
creates or replaces by name fails with EROFS; needs root); ``hung`` (every write of the dump blocks forever, as on a
stalled network mount: the one function through which the writer's bytes
reach the kernel is replaced by one that never returns). ``BUFFER`` is the
circular buffer size (-1: keep all). Three steps after the fault the loss
turns NaN (a log of a negative number) for one step: the origin the dump
should keep.

``WRITER_OPTIONS`` in the environment: more :class:`nanscope.DumpWriter`
options, as JSON. Prints one JSON line: memory (kB) at the fault and at the end, the writer's
counters, and the exit of ``disable_dump_debug_info``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

import nanscope

logdir, fault, steps, fault_step, buffer = (
    Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
)  # fmt: skip
recover_step = int(sys.argv[6]) if len(sys.argv) > 6 else -1
filler = logdir.parent / "filler"


def status(field: str) -> int:
    """A ``/proc/self/status`` figure in kB (VmRSS now, VmHWM the peak so far)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def inject() -> None:
    if fault == "full":
        with open(filler, "wb") as fh:
            try:
                while True:
                    fh.write(b"\0" * (1 << 20))
                    fh.flush()
            except OSError:
                pass  # ENOSPC: the file system is full
    elif fault == "deleted":
        shutil.rmtree(logdir)
    elif fault == "readonly":
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(logdir)], check=True
        )
    elif fault == "hung":
        from nanscope.events import _io

        never = threading.Event()

        def hang(fd: int, data: memoryview) -> int:
            never.wait()
            return 0

        _io.write = hang


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(16, 32)
y = torch.nn.functional.one_hot(torch.arange(16) % 8, 8).float()

# More DumpWriter options, as JSON (e.g. a small hold_limit), from the environment.
options = json.loads(os.environ.get("WRITER_OPTIONS", "{}"))
session = nanscope.enable_dump_debug_info(
    logdir, circular_buffer_size=buffer, flush_interval=0.2, **options
)
writer = session.writer
rss_at_fault = 0


def until_noticed() -> None:
    """Wait until the writer has met the fault (its flushes come every 0.2 s; on an idle
    machine a whole outage of training steps can take less)."""
    for _ in range(1200):
        if writer.failing:
            return
        time.sleep(0.05)
    raise SystemExit("the writer never noticed the fault")


for step in range(steps):
    if step == fault_step:
        session.flush()  # what came before the fault is on the disk
        rss_at_fault = status("VmRSS")
        inject()
    if step == fault_step + 5 and fault != "none":
        until_noticed()
    if step == recover_step and fault == "full":
        filler.unlink()
    probs = torch.softmax(model(x), dim=1)
    sign = -1.0 if step == fault_step + 3 else 1.0
    loss = -(y * torch.log(sign * probs)).mean()  # <- origin (NaN once)
    opt.zero_grad()
    loss.backward()
    opt.step()
# Memory first: the figures stand even where closing fails (code before the fix).
memory = {"rss_at_fault_kb": rss_at_fault, "peak_kb": status("VmHWM"), "pid": os.getpid()}
print(json.dumps(memory), flush=True)
nanscope.disable_dump_debug_info()  # must not raise, whatever the disk did
st = writer.stats
print(
    json.dumps(
        {**memory, "executions": st.executions, "dropped": st.dropped, "io_errors": st.io_errors}
    ),
    flush=True,
)
