"""A Lightning DDP fit on 2 CPU processes (gloo) recorded by NanscopeCallback.

``lightning_ddp.py LOGDIR BAD_RANK BAD_STEP STEPS [stop]``: run as a script,
Lightning's subprocess launcher starts rank 1 as a copy of this command; ``stop``
turns ``stop_on_harmful`` on. At step ``BAD_STEP`` the batch of rank ``BAD_RANK``
holds a zero, and ``log`` makes -inf there (tests/programs/lightning_mlp.py);
DDP's gradient allreduce carries it to the other rank. Each rank prints one JSON
line: its rank, pid, world size, global step, where it stopped and its dump
directory; rank 0 adds the analysis's headline and cause.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from nanscope.integrations.lightning import NanscopeCallback


def load_models() -> Any:
    """tests/programs/lightning_mlp.py, the sibling module (this is a script, not a package)."""
    path = Path(__file__).with_name("lightning_mlp.py")
    spec = importlib.util.spec_from_file_location("lightning_mlp", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    logdir, bad_rank, bad_step, steps = sys.argv[1], *map(int, sys.argv[2:5])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    m = load_models()
    stop = sys.argv[5:] == ["stop"]
    callback = NanscopeCallback(logdir, circular_buffer_size=-1, stop_on_harmful=stop)
    fit = m.trainer([callback], devices=2, strategy="ddp", max_steps=steps)
    fit.fit(m.LogMLP(bad_step=bad_step, bad_rank=bad_rank), m.data())
    seen: dict[str, Any] = {
        "rank": fit.global_rank,
        "world": fit.world_size,
        "pid": os.getpid(),
        "global_step": fit.global_step,
        "stopped_at": callback.stopped_at,
        "dump_dir": str(callback.dump_dir),
    }
    if callback.analysis is not None:
        cause = callback.analysis.cause
        seen["headline"] = callback.headline
        seen["cause"] = cause.to_json() if cause is not None else None
    sys.stdout.write(json.dumps(seen) + "\n")  # one write: the ranks share stdout
    sys.stdout.flush()


if __name__ == "__main__":
    main()
