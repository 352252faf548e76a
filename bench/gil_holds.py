"""How long nanscope's background threads hold on to the GIL, against the training steps.

Runs the seed's MLP for ``--steps`` steps in one recording session and times, on their
own threads, each call of the writer's periodic flush (the circular file's rewrite and
the sidecar), of its handling of a batch of encoded executions, and of the native
recorder's drain (``sync``). These are wall times of work done with the GIL held
(the C++ encoding inside ``sync`` runs without it since the writer rework, and is
timed separately as ``encode``; its CPU time there is spent without the GIL). Prints
each kind's count, CPU time (mean, largest, total: the work, without the waits) and
largest wall time, and the
steps' median, p99 and largest, so that a stall can be told from its cause.

    PYTHONPATH=src python bench/gil_holds.py --mode FULL_HEALTH --steps 600
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from overhead_models import torch_mlp


def _timed(owner: Any, name: str, kind: str, into: dict[str, list[tuple[float, float]]]) -> None:
    """Wrap ``owner.name`` so that each call's wall time and its thread's CPU time (the
    work itself, without waiting for the GIL or a core) go to ``into[kind]``."""
    original: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            into[kind].append((time.perf_counter() - t0, time.thread_time() - c0))

    setattr(owner, name, wrapper)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", default="FULL_HEALTH")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=20)
    args = ap.parse_args(argv)

    import torch

    import nanscope
    from nanscope.backends.torch.recorders import native
    from nanscope.events import _writer

    torch.set_num_threads(1)
    times: dict[str, list[tuple[float, float]]] = defaultdict(list)
    _timed(_writer.DumpWriter, "_flush", "writer flush", times)
    for method, kind in (
        ("_on_execution_batch", "writer: a batch of executions"),
        ("_on_encoded_executions", "writer: encoded executions (tuples)"),
        ("_on_execution", "writer: one execution (Python)"),
    ):
        if hasattr(_writer.DumpWriter, method):
            _timed(_writer.DumpWriter, method, kind, times)
    _timed(native.NativeRecorder, "sync", "drain: sync", times)
    for method in ("_encode_batch", "_encode_slice"):
        if hasattr(native.NativeRecorder, method):
            _timed(native.NativeRecorder, method, "drain: encode (C++)", times)

    step = torch_mlp(torch)
    with (
        tempfile.TemporaryDirectory() as logdir,
        nanscope.enable_dump_debug_info(logdir, args.mode, circular_buffer_size=1000),
    ):
        for _ in range(args.warmup):
            step()
        for v in times.values():
            v.clear()
        walls = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            step()
            walls.append(time.perf_counter() - t0)
        seen = {k: list(v) for k, v in times.items()}
    walls.sort()
    p99 = walls[min(len(walls) - 1, int(0.99 * len(walls)))]
    print(
        f"{args.mode}, {args.steps} steps: median {statistics.median(walls) * 1e3:.2f} ms, "
        f"p99 {p99 * 1e3:.2f} ms, max {walls[-1] * 1e3:.2f} ms"
    )
    print("| work | calls | mean ms (CPU) | max ms (CPU) | total ms (CPU) | max ms (wall) |")
    print("|---|---|---|---|---|---|")
    for kind, v in sorted(seen.items()):
        if v:
            cpu = [c for _, c in v]
            print(
                f"| {kind} | {len(v)} | {statistics.mean(cpu) * 1e3:.3f} | {max(cpu) * 1e3:.3f} | "
                f"{sum(cpu) * 1e3:.1f} | {max(w for w, _ in v) * 1e3:.3f} |"
            )


if __name__ == "__main__":
    main()
