"""Forks a worker at the worst moment for a recorder: while another thread of the
program holds every lock the recording uses (the writer's, the recorder's, the native
recorder's mutexes), as the writer or drain thread may at any instant. The worker logs
a zero and exits; the parent waits for it at most ``--wait`` seconds and prints its
exit code (``None``: it hung).

Meant for ``nanscope run`` (tests/integration/test_spawned_workers.py): the worker is
recorded into the same logdir, so its ``log`` is the cause.
"""

from __future__ import annotations

import argparse
import multiprocessing
import threading
import time
from typing import Any

import torch


def worker() -> None:
    print("worker log", float(torch.log(torch.zeros(3)).sum()), flush=True)  # -inf here


def hold_every_lock(held: threading.Event, seconds: float) -> None:
    import nanscope.api
    from nanscope.backends.torch.native import native_library

    session: Any = nanscope.api._active._session  # type: ignore[union-attr]
    writer = session.writer
    locks = [writer._seq_lock, writer.stacks._lock]
    if hasattr(session.eager, "_write_lock"):  # the native recorder's drain
        locks.append(session.eager._write_lock)
    for lock in locks:
        lock.acquire()
    held.set()
    lib = native_library()
    if lib is not None:
        lib.hold_locks(seconds)  # without the GIL: the fork happens meanwhile
    else:
        time.sleep(seconds)
    for lock in locks:
        lock.release()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--wait", type=float, default=60.0)
    args = parser.parse_args()
    x = torch.randn(16, 16)
    for _ in range(20):
        x = torch.tanh(x @ x)  # recorded in this process
    held = threading.Event()
    holder = threading.Thread(target=hold_every_lock, args=(held, 3.0))
    holder.start()
    held.wait()
    time.sleep(0.5)  # the native mutexes are taken too by now
    process = multiprocessing.get_context("fork").Process(target=worker)
    process.start()  # no op runs between the locks being held and the fork
    process.join(args.wait)
    print("worker exit code", process.exitcode, flush=True)
    if process.exitcode is None:
        process.kill()
    holder.join()


if __name__ == "__main__":
    main()
