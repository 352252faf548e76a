"""Benchmark: ``nanscope diff`` of two runs of a million events each (time and peak memory).

Writes two FULL_HEALTH dumps with nanscope's ``DumpWriter`` (synthetic, not a real
program: a 24-layer model's forward and backward ops, ``--events`` executions per
run, module paths, phases, tensor ids and ranges as the PyTorch recorder writes them).
Run B has what a real pair has: an extra cast in every layer (autocast), every value
off by 1e-7 relative (within tolerance), and one op at about 90% of the run scaled by
1% (the op the diff must name). Then, each in a fresh child so that peak memory is
its own:

* ``diff``: ``nanscope.analysis.diff(A, B)``, the whole of it (reading both runs,
  aligning, comparing, naming the parted op), and its parts;
* ``decode``: the reader's ``DumpReader.execution`` over a sample of run A's events,
  scaled to the run: what reading every event the ordinary way would cost.

    .venv/bin/python -m bench diff                      # 1,000,000 events per run
    .venv/bin/python -m bench diff --events 100000 --keep /tmp/nsdiff

The table at the end is what bench/RESULTS.md records.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import (
    fmt_mib,
    fmt_ratio,
    fmt_s,
    machine,
    run_timed,
    source_line,
    source_state,
    start_child,
    table_head,
    table_row,
    with_peak_memory,
)

LAYERS = 24
FORWARD = ("aten.mm.default", "aten.add.Tensor", "aten.gelu.default", "aten.t.default",
           "aten.native_layer_norm.default")  # fmt: skip
BACKWARD = ("aten.mm.default", "aten.gelu_backward.default", "aten.mm.default",
            "aten.native_layer_norm_backward.default", "aten.sum.dim_IntList")  # fmt: skip
DECODE_SAMPLE = 20_000


def _plan(events: int) -> tuple[int, int]:
    """Ops per step and steps, for about ``events`` executions per run."""
    per_step = LAYERS * (len(FORWARD) + len(BACKWARD))
    return per_step, max(1, events // per_step)


def child_write(cfg: dict[str, Any]) -> dict[str, Any]:
    """Write one run's dump (``cfg["variant"]``: ``a`` or ``b``)."""
    import numpy as np

    from nanscope.events import DumpWriter, ExecutionEvent
    from nanscope.events._model import Phase

    b = cfg["variant"] == "b"
    _, steps = _plan(cfg["events"])
    bad_step = int(steps * 0.9)
    # Never shed: every event must be in the dump, however slow the disk or the machine.
    w = DumpWriter(
        cfg["dump"], "FULL_HEALTH", circular_buffer_size=-1, framework="bench",
        backpressure_timeout=1e9,
    )  # fmt: skip
    stack = w.capture_stack()
    rng = np.random.default_rng(0)
    amax = rng.uniform(0.5, 2.0, size=(LAYERS, len(FORWARD) + len(BACKWARD)))
    summary = np.array([0, -1, 1, 2, 4096, 0, 0, 0, 2000, 96, 2000, 1.0, 1e-4])
    tid = 1
    t0 = time.perf_counter()
    written = 0
    for step in range(steps):
        drift = 1.0 + step * 1e-4
        for phase, ops in ((Phase.FORWARD, FORWARD), (Phase.BACKWARD, BACKWARD)):
            layers = range(LAYERS) if phase == Phase.FORWARD else range(LAYERS - 1, -1, -1)
            for layer in layers:
                module = f"model.layers.{layer}.mlp (MLP)"
                for k, op in enumerate(ops):
                    if b and phase == Phase.FORWARD and k == 0:
                        # Autocast's cast of the input: only run B has it.
                        s = summary.copy()
                        s[0] = tid
                        w.write_execution(ExecutionEvent(
                            op_type="aten._to_copy.default", output_tensor_ids=[tid],
                            input_tensor_ids=[tid - 1], summaries=[s], stack=stack,
                            module_path=module, phase=phase, step=step))  # fmt: skip
                        tid += 1
                        written += 1
                    col = k if phase == Phase.FORWARD else len(FORWARD) + k
                    s = summary.copy()
                    s[0] = tid
                    s[11] = amax[layer, col] * drift * ((1 + 1e-7) if b else 1.0)
                    if b and step == bad_step and layer == LAYERS // 2 and col == 2:
                        s[11] *= 1.01  # the op the diff must name
                    w.write_execution(ExecutionEvent(
                        op_type=op, output_tensor_ids=[tid], input_tensor_ids=[tid - 1],
                        summaries=[s], stack=stack, module_path=module, phase=phase,
                        step=step))  # fmt: skip
                    tid += 1
                    written += 1
    w.close()
    return with_peak_memory(
        {
            "events": written,
            "steps": steps,
            "bad_step": bad_step,
            "write_s": time.perf_counter() - t0,
        }
    )


def child_diff(cfg: dict[str, Any]) -> dict[str, Any]:
    """Diff the two runs; the whole and its parts."""
    t0 = time.perf_counter()
    from nanscope.analysis import Tolerance, diff
    from nanscope.analysis import _diff as engine
    from nanscope.analysis._diff_table import Strings
    from nanscope.reader import DumpReader

    import_s = time.perf_counter() - t0
    t = time.perf_counter()
    result = diff(cfg["a"], cfg["b"])
    total_s = time.perf_counter() - t
    # The parts, again (a second pass: the files are in the page cache for both).
    ra, rb = DumpReader(cfg["a"]), DumpReader(cfg["b"])
    t = time.perf_counter()
    strings = Strings()
    a = engine._side("a", ra, 0, strings)
    b = engine._side("b", rb, 0, strings)
    read_s = time.perf_counter() - t
    t = time.perf_counter()
    engine._diff_sides(a, b, Tolerance(), [])
    rest_s = time.perf_counter() - t
    parted = result.parted
    return with_peak_memory(
        {
            "import_s": import_s,
            "total_s": total_s,
            "read_s": read_s,
            "align_compare_s": rest_s,
            "events_a": len(a.table),
            "events_b": len(b.table),
            "status": result.status,
            "parted_step": parted.step if parted else None,
            "parted_module": parted.a.module_path if parted else None,
            "parted_op": parted.a.op_type if parted else None,
            "pairs": result.alignment.pairs,
            "only_b": result.alignment.only_b,
        }
    )


def child_decode(cfg: dict[str, Any]) -> dict[str, Any]:
    """``DumpReader.execution`` over a sample of events, per event."""
    from nanscope.reader import DumpReader

    r = DumpReader(cfg["a"])
    n = min(DECODE_SAMPLE, r.num_executions())
    t = time.perf_counter()
    for i in range(n):
        r.execution(i)
    per_event = (time.perf_counter() - t) / max(n, 1)
    return with_peak_memory({"per_event_s": per_event, "events": r.num_executions()})


CHILDREN = {"write": child_write, "diff": child_diff, "decode": child_decode}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=1_000_000, help="executions per run")
    p.add_argument("--keep", type=Path, default=None, help="write the dumps here, reuse them")
    args = p.parse_args(argv)
    start = source_state()
    root = args.keep or Path(tempfile.mkdtemp(prefix="nsdiff-"))
    a, b = root / f"a-{args.events}", root / f"b-{args.events}"
    try:
        if not (a.exists() and b.exists()):
            for d in (a, b):
                shutil.rmtree(d, ignore_errors=True)
            children = [
                start_child("diff", "write", {"dump": str(d), "variant": v, "events": args.events})
                for d, v in ((a, "a"), (b, "b"))
            ]
            written = [c.wait(timeout=3600) for c in children]
            print(f"wrote {written[0]['events']:,} + {written[1]['events']:,} events "
                  f"({fmt_s(written[0]['write_s'])}, {fmt_s(written[1]['write_s'])})",
                  file=sys.stderr)  # fmt: skip
        d = run_timed("diff", "diff", {"a": str(a), "b": str(b)}, timeout=3600)
        dec = run_timed("diff", "decode", {"a": str(a)}, timeout=3600)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    if d["events_a"] < args.events * 0.99:
        raise SystemExit(f"run A holds {d['events_a']:,} events: the writer lost some")
    reader_s = dec["per_event_s"] * (d["events_a"] + d["events_b"])
    print(f"nanscope diff of two runs, {d['events_a']:,} and {d['events_b']:,} events")
    print(f"Machine: {machine()}")
    print(source_line(start, source_state()))
    print(f"Command: python -m bench diff --events {args.events}")
    print()
    for line in table_head(["what", "time", "per event", "peak memory", "vs reader"]):
        print(line)
    n = d["events_a"] + d["events_b"]
    print(table_row(["diff (whole)", fmt_s(d["total_s"]), f"{d['total_s'] / n * 1e6:.1f} µs",
                     fmt_mib(d["peak_rss_mib"]), fmt_ratio(d["total_s"], reader_s)]))  # fmt: skip
    print(table_row(["  reading both runs", fmt_s(d["read_s"]), f"{d['read_s'] / n * 1e6:.1f} µs",
                     "", ""]))  # fmt: skip
    print(table_row(["  aligning, comparing, naming", fmt_s(d["align_compare_s"]),
                     f"{d['align_compare_s'] / n * 1e6:.1f} µs", "", ""]))  # fmt: skip
    print(table_row(["DumpReader.execution, each event", fmt_s(reader_s),
                     f"{dec['per_event_s'] * 1e6:.1f} µs", fmt_mib(dec["peak_rss_mib"]),
                     "1.00x"]))  # fmt: skip
    print()
    print(f"Verdict: {d['status']} at step {d['parted_step']}, {d['parted_op']} in "
          f"{d['parted_module']}; {d['pairs']:,} pairs, {d['only_b']:,} ops only in B")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
