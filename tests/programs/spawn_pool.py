"""Workers of a spawn-start pool compute NaN; the parent only sums their floats.

``spawn_pool.py pool|executor N [METHOD]``: ``N`` tasks go to a ``multiprocessing`` pool
or a ``ProcessPoolExecutor`` of two workers, started by ``METHOD`` (default ``spawn``;
``forkserver``, ``fork``). Task ``i`` trains a
small model one step on the square root of ``i - 1.5`` (the line marked ``# <- origin``):
NaN for ``i`` 0 and 1, which reaches the loss and the model's weights. The parent imports PyTorch but computes nothing with it, so its own
recording holds no Inf/NaN: only the workers' does. No nanscope in it.

The oracle: where ``SPAWN_ORACLE_DIR`` is set (by the test only), each task writes
``task<i>.json`` there: the worker's pid, and whether ``torch.isnan`` saw NaN in the
sqrt's output (no nanscope involved).
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import sys
from concurrent.futures import ProcessPoolExecutor

import torch
from torch import nn


def task(i: int) -> float:
    """One SGD step of a small model on the input ``sqrt(i - 1.5)``; the loss."""
    torch.set_num_threads(1)
    torch.manual_seed(i)
    model = nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.sqrt(torch.tensor([[i - 1.5]]))  # <- origin
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    oracle = os.environ.get("SPAWN_ORACLE_DIR")
    if oracle:
        seen = {"task": i, "pid": os.getpid(), "made_nan": bool(torch.isnan(x).any())}
        with open(os.path.join(oracle, f"task{i}.json"), "w") as f:
            json.dump(seen, f)
    return float(loss)


if __name__ == "__main__":
    kind, n = sys.argv[1], int(sys.argv[2])
    ctx = mp.get_context(sys.argv[3] if len(sys.argv) > 3 else "spawn")
    if kind == "pool":
        with ctx.Pool(2) as pool:
            results = pool.map(task, range(n))
    else:
        with ProcessPoolExecutor(2, mp_context=ctx) as ex:
            results = list(ex.map(task, range(n)))
    print(f"{sum(1 for r in results if math.isnan(r))} of {n} results are NaN")
