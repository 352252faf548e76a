"""Benchmark: what ``nanscope run`` adds to the start-up of a trivial PyTorch program.

Runs ``python trivial.py`` and ``nanscope run trivial.py`` (the console
script beside this interpreter, else ``python -m nanscope``) alternately,
``--rounds`` times each, every run a fresh process, and prints the median
wall time of each and their difference. The trivial program imports PyTorch
and runs two ops, so the difference is nanscope's start-up: its own imports,
the recorder's, the writer's thread, and closing the dump. The CPU time
(user + system) is printed too: on a shared machine it moves less than the
wall time. The checkout's
``src/`` comes first on ``PYTHONPATH``, so this checkout is measured.

    .venv/bin/python bench/startup.py                 # 10 rounds
    .venv/bin/python bench/startup.py --rounds 20 --recorder python
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TRIVIAL = """\
import torch

x = torch.ones(3)
print((x * 2).sum().item())
"""


def launcher() -> list[str]:
    """How to start ``nanscope``: the console script beside this interpreter, else ``-m``."""
    script = Path(sys.executable).parent / "nanscope"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "nanscope"]


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall time and CPU time (user + system, all threads) of one run of ``cmd``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True, timeout=300)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="runs of each (default 10)")
    parser.add_argument(
        "--recorder", default="auto", help="NANSCOPE_TORCH_RECORDER for the runs (default auto)"
    )
    args = parser.parse_args(argv)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    env["NANSCOPE_TORCH_RECORDER"] = args.recorder
    # Bytecode cached, as an installed package has it (PyTorch's is): without, every run
    # would compile nanscope's sources again.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        (cwd / "trivial.py").write_text(TRIVIAL)
        variants = {
            "python trivial.py": [sys.executable, "trivial.py"],
            "nanscope run trivial.py": [
                *launcher(),
                "run",
                "--force",
                "--logdir",
                "dump",
                "trivial.py",
            ],
        }
        # Once each first: the native recorder's build, the bytecode cache, the page cache.
        for cmd in variants.values():
            timed(cmd, cwd, env)
        walls: dict[str, list[float]] = {name: [] for name in variants}
        cpus: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, cmd in variants.items():
                wall, cpu = timed(cmd, cwd, env)
                walls[name].append(wall)
                cpus[name].append(cpu)
    wall_med = {name: statistics.median(ts) for name, ts in walls.items()}
    cpu_med = {name: statistics.median(ts) for name, ts in cpus.items()}
    print(
        f"Machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; "
        f"{args.rounds} alternating rounds, medians of fresh processes; "
        f"recorder {args.recorder}; nanscope started as {' '.join(launcher())}"
    )
    print()
    print("| command | wall median (s) | wall min (s) | wall max (s) | CPU median (s) |")
    print("|---|---:|---:|---:|---:|")
    for name in variants:
        ts = walls[name]
        print(
            f"| `{name}` | {wall_med[name]:.3f} | {min(ts):.3f} | {max(ts):.3f} "
            f"| {cpu_med[name]:.3f} |"
        )
    plain, recorded = variants
    print(
        f"| difference | {wall_med[recorded] - wall_med[plain]:+.3f} | | "
        f"| {cpu_med[recorded] - cpu_med[plain]:+.3f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
