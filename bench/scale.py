"""Benchmark: nanscope's reader on large, realistic multi-rank dumps, against TensorFlow's.

**The generator** (bench/scale_dumps.py, or ``--generate DIR``) writes a FULL_HEALTH
dump the way a multi-worker training job would: one ``DumpWriter`` per rank,
each in its own child process (``--jobs`` at a time), all sharing one run id.
Each rank

* imports ``--files`` generated Python modules whose functions call each other
  (``BRANCHES`` call sites and one leaf line each, ``--frames`` frames in all)
  and captures one real Python stack per (function, branch) through them with
  ``DumpWriter.capture_stack``, so that the dump holds thousands of distinct
  frames and hundreds of recorded source files;
* creates three graphs (a ``train_step`` of about 1,000 traced tensors: a
  44-layer dense model's forward pass, loss, gradients and optimizer math; a
  ``cond`` branch nested in it; a ``test_step`` run every ``EVAL_EVERY`` steps)
  with per-rank graph ids, like TensorFlow's uuid4s, every op created with one
  of those stacks;
* runs steps: eager executions (each with a stack), then each graph call as one
  ``write_traces`` batch, then the call's own execution, until its share of
  ``--traces`` and ``--executions`` is written.

Late in the last rank (95% of its steps) a softmax underflows to zero and the
loss's ``Log`` makes -inf: a handful of traces (-inf, +inf, NaN downstream in
the same call, in the gradients and in the nested ``cond``) and the call's
execution (a NaN loss) are non-finite. Nothing else is.

**The benchmark** reads each dump, every task in a fresh subprocess (peak
memory per task, ``ru_maxrss``), with nanscope and TensorFlow's
``DebugDataReader``:

* ``open``: open the dump and build the index;
* ``first``: first alert, cold: open + ``first_nonfinite()`` + decoding that event
  (TensorFlow has no index: ``update()``, then read the traces one by one until
  one has Inf/NaN counts, as bench/reader.py does);
* ``page``: 200 decoded traces at 90% of the dump;
* ``analyze``: ``nanscope.analysis.analyze`` (the report's root cause; nanscope only).

**A dump written by TensorFlow itself** (``--tf-written on``, the default; ``only`` for this
alone): bench/scale_dumps.py's ``generate_tf`` runs a ``tf.function`` under
``enable_dump_debug_info`` (FULL_HEALTH) until ``--sizes`` traces are written, with -inf
born at 95% of the calls. nanscope's first open indexes the records and leaves a sidecar,
its second open reads it; both against ``DebugDataReader`` on the same dump.

TensorFlow's reader takes the first file set's graphs only, so it cannot read
the traces of other ranks (their graph ids are unknown to it); when it fails on
the multi-rank dump, the same number of traces is also written as a
single-rank dump and both readers are compared on that. A TensorFlow task is
killed after ``--tf-budget`` seconds, and not started at all when the previous
size's time, scaled by size, says it would not finish.

    .venv/bin/python bench/scale.py                                   # 1M traces, 4 ranks
    .venv/bin/python bench/scale.py --sizes 1e6,1e7 --keep /tmp/scale_dumps
    .venv/bin/python bench/scale.py --generate /tmp/scale_one --traces 2e6 --ranks 8
    .venv/bin/python bench/scale.py --tf-written only --sizes 1e6 --repeats 5

``--at-head`` measures ``src/`` of the commit at HEAD (a ``git archive`` copy on the
children's ``PYTHONPATH``) instead of the working tree, for a repository being edited while
the benchmark runs. Every child reports where it imported nanscope from.

The parent process imports neither numpy, nanscope nor TensorFlow, so that it
does not inflate the children's ``ru_maxrss``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import ChildFailed, log, run_timed, source_state, use_head_snapshot
from scale_dumps import dump_name, generate, generate_tf
from scale_report import Results, report


def run_read(impl: str, task: str, dump: str, timeout: float | None = None) -> dict[str, Any]:
    """One read task in a fresh child; ``{"error": ...}`` when it fails or runs out of time."""
    label = f"{impl} {task} {Path(dump).name}"
    cfg = {"impl": impl, "task": task, "dump": dump}
    try:
        res = run_timed("dump_reads", "read-ranks", cfg, label=label, timeout=timeout)
    except ChildFailed as exc:
        if exc.timed_out:
            log(f"  {label}: killed after {timeout:.0f}s")
            return {"error": exc.reason, "timeout": True}
        log(f"  {label}: FAILED after {exc.wall_s:.1f}s: {exc.message}")
        return {"error": exc.message, "wall_s": exc.wall_s}
    log(f"  {label}: {res['wall_s']:.1f}s, peak {res['peak_rss_mib']:,.0f} MiB")
    return res


def warm(dump: str) -> float:
    """Read every file of the dump once, so both readers find it in the page cache."""
    t = time.perf_counter()
    buf = bytearray(8 << 20)
    for p in sorted(Path(dump).iterdir()):
        with open(p, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass
    return time.perf_counter() - t


def parse_size(text: str) -> int:
    """A count given as ``1e6`` or ``1000000``."""
    return int(float(text))


def main(argv: list[str] | None = None) -> int:
    """The command line: ``--generate`` one dump, or the benchmark over ``--sizes``."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--sizes", help="trace counts to measure, e.g. 1e6,1e7 (default: --traces)")
    ap.add_argument("--traces", type=parse_size, default=1_000_000, help="traces in all ranks")
    ap.add_argument("--executions", type=parse_size, help="executions in all (default traces/10)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--files", type=int, default=200, help="generated source files")
    ap.add_argument("--frames", type=int, default=4000, help="distinct generated stack frames")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--jobs",
        type=int,
        default=min(4, os.cpu_count() or 1),
        help="ranks written at once (one process each)",
    )
    ap.add_argument("--keep", metavar="DIR", help="keep the dumps here (reused when present)")
    ap.add_argument("--generate", metavar="DIR", help="only write one dump (--traces) to DIR")
    ap.add_argument("--repeats", type=int, default=3, help="nanscope children per task (median)")
    ap.add_argument("--skip-tf", action="store_true", help="do not run TensorFlow's reader")
    ap.add_argument(
        "--tf-written",
        choices=("on", "off", "only"),
        default="on",
        help="also (or only) a dump written by TensorFlow itself: nanscope's first "
        "and second open against DebugDataReader",
    )
    ap.add_argument(
        "--tf-budget",
        type=float,
        default=300.0,
        help="seconds a TensorFlow task may take (killed after)",
    )
    ap.add_argument(
        "--at-head",
        action="store_true",
        help="measure src/ of the commit at HEAD (git archive), not the working tree",
    )
    args = ap.parse_args(argv)

    if args.generate:
        rec = generate(
            args.generate,
            traces=args.traces,
            executions=args.executions if args.executions is not None else args.traces // 10,
            ranks=args.ranks,
            files=args.files,
            frames=args.frames,
            seed=args.seed,
            jobs=args.jobs,
        )
        print(json.dumps({k: v for k, v in rec.items() if k != "plans"}, indent=1))
        return 0

    root = args.keep or tempfile.mkdtemp(prefix="scale_", dir="/tmp")
    Path(root).mkdir(parents=True, exist_ok=True)
    try:
        return run(args, Path(root))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def run(args: argparse.Namespace, root: Path) -> int:
    """The benchmark with its dumps under ``root``; the exit status (1 when a check failed)."""
    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else [args.traces]
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    start_state = source_state()
    if args.at_head:
        # Every child (writers and readers) imports this copy.
        start_state = use_head_snapshot(root)
    log(f"nanscope scale benchmark, {started}; dumps under {root}")
    src = root / "src"

    def make(size: int, ranks: int) -> dict[str, Any]:
        return generate(
            root / dump_name(size, ranks),
            traces=size,
            executions=args.executions if args.executions is not None else size // 10,
            ranks=ranks,
            files=args.files,
            frames=args.frames,
            seed=args.seed,
            jobs=args.jobs,
            src=src,
        )

    if args.tf_written == "only":
        print("\n".join(tf_written_section(args, root, sizes)))
        return 0
    tf_on: str | None = None  # "multi" or "single" once probed
    tf_multi_error = ""
    sections: list[dict[str, Any]] = []
    tf_prev: tuple[int, float] | None = None  # (size, slowest TF task wall) of the last size
    for size in sizes:
        multi = make(size, args.ranks)
        dumps: dict[str, dict[str, Any]] = {"multi": multi}
        if not args.skip_tf and tf_on is None:
            if args.ranks == 1:
                tf_on = "multi"
            else:
                log("probing TensorFlow's reader on the multi-rank dump")
                probe = run_read("tensorflow", "open", multi["dump"], timeout=args.tf_budget)
                if "error" in probe or probe.get("num_traces") != size:
                    tf_on = "single"
                    tf_multi_error = probe.get("error") or (
                        f"read {probe.get('num_traces'):,} of {size:,} traces"
                    )
                else:
                    tf_on = "multi"
        if tf_on == "single" and args.ranks > 1:
            dumps["single"] = make(size, 1)
        results: Results = {}
        warm_s = {key: warm(d["dump"]) for key, d in dumps.items()}
        log(f"page cache warmed: {', '.join(f'{k} {v:.1f}s' for k, v in warm_s.items())}")
        for rep in range(args.repeats):
            for task in ("open", "first", "page", "analyze"):
                for key, d in dumps.items():
                    log(f"round {rep + 1}: nanscope {task} ({key})")
                    res = run_read("nanscope", task, d["dump"])
                    results.setdefault(("nanscope", key, task), []).append(res)
        tf_note = ""
        if not args.skip_tf and tf_on is not None:
            estimate = None
            if tf_prev is not None:
                estimate = tf_prev[1] * size / tf_prev[0]
            if estimate is not None and estimate > args.tf_budget:
                tf_note = (
                    f"did not finish: not started, {tf_prev[1]:.0f} s at {tf_prev[0]:,} traces "  # type: ignore[index]
                    f"scales to ~{estimate:.0f} s > the {args.tf_budget:.0f} s budget"
                )
                log(f"TensorFlow skipped at {size:,}: {tf_note}")
            else:
                slowest = 0.0
                for task in ("first", "page"):
                    res = run_read("tensorflow", task, dumps[tf_on]["dump"], timeout=args.tf_budget)
                    results[("tensorflow", tf_on, task)] = [res]
                    slowest = max(slowest, res.get("wall_s", args.tf_budget))
                    if res.get("timeout"):
                        tf_note = f"did not finish within the {args.tf_budget:.0f} s budget"
                        break
                tf_prev = (size, slowest)
        sections.append({"size": size, "dumps": dumps, "results": results, "tf_note": tf_note})
        if not args.keep:
            for d in dumps.values():
                shutil.rmtree(d["dump"], ignore_errors=True)

    end_state = source_state() if not args.at_head else start_state
    text, problems = report(args, sections, tf_on, tf_multi_error, started, start_state, end_state)
    print(text)
    if args.tf_written == "on":
        print("\n".join(tf_written_section(args, root, sizes)))
    return 1 if problems else 0


def settle(dump: str, seconds: float = 6.0) -> None:
    """Wait until no file of ``dump`` was modified in the last ``seconds``: the reader writes
    a sidecar only for settled files (a writer may still be appending to fresh ones)."""
    newest = max(p.stat().st_mtime for p in Path(dump).iterdir())
    time.sleep(max(0.0, newest + seconds - time.time()))


def tf_written_section(args: argparse.Namespace, root: Path, sizes: list[int]) -> list[str]:
    """A dump written by TensorFlow itself (no sidecar), read side by side.

    nanscope's *first* open indexes the records (bulk scan) and leaves a sidecar; its
    *second* open reads that sidecar. Before each first open the sidecars are deleted,
    so every repeat is a first read. TensorFlow's ``DebugDataReader`` has no index:
    ``open`` is its ``update()``, ``first`` reads the traces one by one (bench/dump_reads.py).
    The page cache is warm for both (``warm``): "cold" is a fresh process, not a cold disk.
    """
    lines = ["", "## A dump written by TensorFlow (no sidecar)", ""]
    lines.append(
        "| traces | reader | task | open s | open + first alert s | vs TF first alert "
        "| vs TF open | peak MiB | sidecar used |"
    )
    lines.append("|---:|---|---|---:|---:|---:|---:|---:|---|")
    for size in sizes:
        rec = generate_tf(root / f"tf_traces{size}", traces=size, seed=args.seed)
        dump = rec["dump"]
        traces = rec["ranks"][0]["traces"]
        for p in Path(dump).glob("*.nsidx"):
            p.unlink()
        settle(dump)
        warm(dump)
        runs: dict[str, list[dict[str, Any]]] = {"first open": [], "second open": []}
        for rep in range(args.repeats):
            for p in Path(dump).glob("*.nsidx"):
                p.unlink()
            log(f"round {rep + 1}: nanscope on the TensorFlow-written dump")
            runs["first open"].append(run_read("nanscope", "first", dump))
            runs["second open"].append(run_read("nanscope", "first", dump))
        tf: dict[str, dict[str, Any]] = {}
        if not args.skip_tf:
            for task in ("open", "first"):
                tf[task] = run_read("tensorflow", task, dump, timeout=args.tf_budget)
        tf_first = tf.get("first", {}).get("cold_s")
        tf_open = tf.get("open", {}).get("open_s")

        def ratio(base: float | None, ours: float) -> str:
            return f"{base / ours:.1f}x" if base and ours else "-"

        for task, results in runs.items():
            ok = [r for r in results if "error" not in r]
            if not ok:
                lines.append(f"| {traces:,} | nanscope | {task} | failed | | | | | |")
                continue
            med = sorted(ok, key=lambda r: r["cold_s"])[len(ok) // 2]
            lines.append(
                f"| {traces:,} | nanscope | {task} | {med['open_s']:.2f} | {med['cold_s']:.2f} "
                f"| {ratio(tf_first, med['cold_s'])} | {ratio(tf_open, med['cold_s'])} "
                f"| {med['peak_rss_mib']:,.0f} | {med.get('sidecar_used')} |"
            )
        for task, res in tf.items():
            if "error" in res:
                lines.append(
                    f"| {traces:,} | TensorFlow | {task} | {res['error'][:60]} | | | | | |"
                )
                continue
            first = f"{res['cold_s']:.2f}" if task == "first" else "-"
            lines.append(
                f"| {traces:,} | TensorFlow | {task} | {res['open_s']:.2f} | {first} | | "
                f"| {res['peak_rss_mib']:,.0f} | - |"
            )
        lines.append(
            f"\nnanscope: median of {args.repeats} fresh processes; TensorFlow: one. "
            f"Written by TensorFlow in {rec['wall_s']:.0f} s ({rec['trace_bytes'] / 2**20:,.0f} "
            "MiB of traces)."
        )
    return lines


if __name__ == "__main__":
    sys.exit(main())
