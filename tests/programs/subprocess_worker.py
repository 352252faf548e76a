"""A script that runs a Python worker with ``subprocess``, the worker making NaN.

``subprocess_worker.py [--hide-nanscope DIR] [--healthy] [--parent-computes]``: runs this
same file as a worker, ``[sys.executable, __file__, "--worker"]``. The parent imports
PyTorch only with ``--parent-computes`` (then it adds two numbers with it). The worker
trains a small model one step on ``log`` of a negative number (the line marked
``# <- origin``): NaN, which reaches its weights; with ``--healthy``, of a positive one.
``--hide-nanscope DIR`` appends DIR to the worker's ``PYTHONPATH``, the way a program adds
a path for its child; the test puts a ``nanscope`` there that cannot be imported: an
interpreter without nanscope.

The oracle: where ``SPAWN_ORACLE_DIR`` is set (by the test only), the worker writes
``worker.json`` there: its pid and whether ``torch.isnan`` saw NaN in the log's output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def worker(healthy: bool) -> None:
    import torch

    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.log(torch.tensor([[2.0 if healthy else -2.0]]))  # <- origin
    model(x).pow(2).mean().backward()
    opt.step()
    oracle = os.environ.get("SPAWN_ORACLE_DIR")
    if oracle:
        seen = {"pid": os.getpid(), "made_nan": bool(torch.isnan(x).any())}
        with open(os.path.join(oracle, "worker.json"), "w") as f:
            json.dump(seen, f)


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--worker" in args:
        worker("--healthy" in args)
        sys.exit(0)
    if "--parent-computes" in args:
        import torch

        print(float(torch.tensor([1.0]) + 1.0))
    env = None
    if "--hide-nanscope" in args:
        extra = args[args.index("--hide-nanscope") + 1]
        path = os.environ.get("PYTHONPATH", "")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (path, extra) if p)}
    cmd = [sys.executable, __file__, "--worker"] + (["--healthy"] if "--healthy" in args else [])
    subprocess.run(cmd, env=env, check=True)
