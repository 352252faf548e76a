"""A small training run under nanscope that turns NaN at step 3, then ends as argv[2] says.

    python crash_training.py LOGDIR {loop|raise|os_exit|oom} FLUSH_INTERVAL

``loop`` trains until killed; the others train 8 steps and then raise, call
``os._exit(7)``, or leak memory under a bounded address space until the
allocator fails. Each finished step prints ``step N``.
"""

from __future__ import annotations

import os
import resource
import sys
import time

import torch

import nanscope

logdir, how, interval = sys.argv[1], sys.argv[2], float(sys.argv[3])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 16)
y = torch.nn.functional.one_hot(torch.arange(8) % 4, 4).float()

nanscope.enable_dump_debug_info(logdir, circular_buffer_size=-1, flush_interval=interval)
step = 0
while True:
    scale = 1e4 if step == 3 else 1.0  # huge logits: softmax underflows to exact zeros
    probs = torch.softmax(model(x * scale), dim=1)
    loss = -(y * torch.log(probs)).mean()  # <- origin
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step}", flush=True)
    step += 1
    time.sleep(0.02)
    if how != "loop" and step > 8:
        break

if how == "raise":
    raise RuntimeError("training crashed")
if how == "os_exit":
    time.sleep(3 * interval)  # the periodic flush saves the events; os._exit skips atexit
    os._exit(7)
if how == "oom":
    # Bound the address space a little above what the process maps now, then leak.
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mapped + (256 << 20), resource.RLIM_INFINITY))
    leak = []
    while True:
        leak.append(torch.ones(16 << 20))  # 64 MiB each, until the allocator fails
