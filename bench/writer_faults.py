"""Benchmark: a PyTorch training run whose dump's disk fails, side by side with a healthy one.

Runs tests/programs/writer_faults.py (a small MLP, about 42 recorded ops a
step) for ``--steps`` steps; before step ``--fault-step`` the disk fails for
good: ``full`` (a 64 MiB tmpfs filled up), ``deleted`` (the logdir removed),
``hung`` (every write of the dump blocks forever). Each fault runs with the
circular buffer of ``nanscope run`` (1000) and with ``-1`` (keep all). For
each run: the exit status, the peak RSS minus the RSS at the fault (the
growth the fault could cause), the same for the healthy run, events dropped,
and whether the drops were told on stderr and by the reader. ``--compare
DIR``: also run the ``full`` and ``deleted`` faults with the nanscope source
tree in DIR (e.g. the main branch's ``src``), the code before this change.

    sudo .venv/bin/python bench/writer_faults.py                  # needs root: mount
    sudo .venv/bin/python bench/writer_faults.py --compare /work/main/src
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tests" / "programs" / "writer_faults.py"


def run(src: Path, fault: str, buffer: int, steps: int, fault_step: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        mount = Path(tmp) / "fs"
        mount.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], check=True)
        try:
            logdir = mount / "dump"
            env = {**os.environ, "PYTHONPATH": str(src)}
            out = subprocess.run(
                [
                    sys.executable,
                    str(PROGRAM),
                    str(logdir),
                    fault,
                    str(steps),
                    str(fault_step),
                    str(buffer),
                ],
                capture_output=True,
                text=True,
                env=env,
                timeout=900,
            )
            result: dict[str, object] = {"exit": out.returncode}
            data: dict[str, int] = {}
            for line in out.stdout.splitlines():  # memory first, then (if it closed) the stats
                if line.startswith("{"):
                    data.update(json.loads(line))
            if data:
                result["growth_mib"] = (data["peak_kb"] - data["rss_at_fault_kb"]) / 1024
                result["dropped"] = data.get("dropped", "-")
            result["stderr"] = "events dropped:" in out.stderr
            result["reader"] = reader_reports(logdir, src)
            if out.returncode:
                result["error"] = out.stderr.strip().splitlines()[-1][:70]
            return result
        finally:
            subprocess.run(["umount", "-l", str(mount)], check=False)


def reader_reports(logdir: Path, src: Path) -> str:
    """What the reader says about drops: ``yes`` (a problem names them), ``no``, or ``-``
    (no dump left to read)."""
    if not logdir.is_dir():
        return "-"
    code = (
        "import sys, nanscope\n"
        "try:\n r = nanscope.open_dump(sys.argv[1])\nexcept Exception:\n print('-'); sys.exit()\n"
        "print('yes' if any('dropped' in p.message or 'writing failed' in p.message "
        "for p in r.problems) else 'no')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(logdir)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(src)},
        timeout=300,
    )
    return out.stdout.strip() or "-"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2400)
    ap.add_argument("--fault-step", type=int, default=200)
    ap.add_argument("--compare", type=Path, help="also run full/deleted with this nanscope src/")
    args = ap.parse_args(argv)
    rows = []
    for buffer in (1000, -1):
        for fault in ("none", "full", "deleted", "hung"):
            rows.append(
                (
                    "this",
                    fault,
                    buffer,
                    run(ROOT / "src", fault, buffer, args.steps, args.fault_step),
                )
            )
            if args.compare and fault in ("full", "deleted"):
                rows.append(
                    (
                        "before",
                        fault,
                        buffer,
                        run(args.compare, fault, buffer, args.steps, args.fault_step),
                    )
                )
            print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    healthy = {b: r.get("growth_mib") for code, f, b, r in rows if f == "none" and code == "this"}
    print(
        f"{args.steps} steps, fault before step {args.fault_step}; growth = peak RSS - RSS at "
        "the fault step (MiB)"
    )
    head = ("code", "fault", "buffer", "exit", "growth", "healthy", "dropped", "stderr", "reader")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for code, fault, buffer, r in rows:
        growth = r.get("growth_mib")
        cells = [
            code,
            fault,
            str(buffer),
            str(r["exit"]),
            f"{growth:.1f}" if isinstance(growth, float) else "-",
            f"{healthy[buffer]:.1f}" if isinstance(healthy.get(buffer), float) else "-",
            str(r.get("dropped", "-")),
            "yes" if r["stderr"] else "no",
            str(r["reader"]),
        ]
        print("| " + " | ".join(cells) + " |")
        if "error" in r:
            print(f"|   ↳ {r['error']} |")


if __name__ == "__main__":
    main()
