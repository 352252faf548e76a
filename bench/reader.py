"""Benchmark: nanscope's dump writer and reader against TensorFlow's ``DebugDataReader``.

Writes a FULL_HEALTH dump of ``--traces`` graph execution traces and
``--executions`` executions with nanscope's writer (a few non-finite events
late in it), then, each in a fresh subprocess so that peak memory is per task,
reads it with nanscope and with TensorFlow's reader:

* ``open``: open the dump and build the index;
* ``first``: the first non-finite graph execution trace, decoded (nanscope uses
  its index; TensorFlow has none, so the equivalent is reading traces one by one
  until one has Inf/NaN counts);
* ``page``: 200 decoded traces at offset 900,000 (scaled with ``--traces``).

The read tasks are bench/dump_reads.py's (bench/scale.py times them too).
Every child reports its import time separately; the read times exclude it.
A ``cold`` time is open + query (what a user waits for after the imports).
The table at the end is also what bench/RESULTS.md records.

    .venv/bin/python bench/reader.py                  # 1,000,000 traces / 100,000 executions
    .venv/bin/python bench/reader.py --traces 100000 --executions 10000 --skip-tf
    .venv/bin/python bench/reader.py --keep /tmp/nsdump   # write once, reuse afterwards

The parent process stays small (no numpy, nanscope or TensorFlow imports) so
that it does not inflate the children's ``ru_maxrss``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dump_reads import PAGE, page_offset
from harness import (
    ChildFailed,
    fmt_mib,
    fmt_ratio,
    fmt_s,
    machine,
    median_of,
    run_timed,
    send_result,
    source_line,
    source_state,
    table_head,
    table_row,
    with_peak_memory,
)

HERE = Path(__file__).resolve()
OPS_PER_CALL = 200
DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"
# TensorFlow names graphs by uuid4 strings: use one of the same length.
GRAPH_ID = "6f1d3e2a-9b4c-4e7f-8a15-2c3d4e5f6a7b"
GRAPH_NAME = "__inference_train_step_123"
OP_TYPES = ("MatMul", "BiasAdd", "Relu", "Mul")
EAGER_TYPES = ("ReadVariableOp", "AssignAddVariableOp", "Mul", "AddV2", "Identity")


# -- the plan both writer and checks agree on -------------------------------------------------


def op_names() -> list[str]:
    return [
        f"model/block_{i // len(OP_TYPES):02d}/{OP_TYPES[i % len(OP_TYPES)]}"
        for i in range(OPS_PER_CALL)
    ]


def bad_traces(n: int) -> dict[int, tuple[int, int, int]]:
    """Trace index -> (neg_inf, pos_inf, nan) counts, all at ~95% of the run."""
    base = int(0.95 * n) + 123
    plan = {base: (2, 0, 0), base + 1: (0, 1, 3), base + 5000: (0, 0, 7), base + 20000: (1, 1, 1)}
    return {i: v for i, v in plan.items() if i < n}


def bad_executions(n: int) -> dict[int, tuple[int, int, int]]:
    base = int(0.95 * n) + 10
    plan = {base: (1, 0, 0), base + 1: (0, 0, 4)}
    return {i: v for i, v in plan.items() if i < n}


# -- child: write the dump ---------------------------------------------------------------------


def open_writer(dump: str, names: list[str]) -> tuple[Any, dict[str, float], int]:
    """A FULL_HEALTH writer with the bench graph created, and a counter of its waits.

    Returns ``(writer, blocked, stack)``; ``blocked`` counts and times the
    backpressure waits of the producing thread.
    """
    from nanscope.events import DumpWriter, Graph, GraphOp

    w = DumpWriter(dump, "FULL_HEALTH", circular_buffer_size=-1, framework="bench")
    blocked = {"count": 0, "seconds": 0.0}
    original = w._backpressure

    def counting_backpressure() -> None:
        t = time.perf_counter()
        original()
        blocked["count"] += 1
        blocked["seconds"] += time.perf_counter() - t

    w._backpressure = counting_backpressure  # type: ignore[method-assign]
    stack = w.capture_stack()
    w.register_device(DEVICE)
    w.write_graph(Graph(graph_id=GRAPH_ID, graph_name=GRAPH_NAME))
    for k, name in enumerate(names):
        w.write_graph_op(
            GraphOp(
                graph_id=GRAPH_ID,
                op_type=OP_TYPES[k % len(OP_TYPES)],
                op_name=name,
                graph_name=GRAPH_NAME,
                input_names=[f"{names[k - 1]}:0" if k else "x:0", "w:0"],
                num_outputs=1,
                output_tensor_ids=[1000 + k],
                device_name=DEVICE,
                stack=stack,
            )
        )
    return w, blocked, stack


def child_write(cfg: dict[str, Any]) -> dict[str, Any]:
    """Write the dump with ``write_traces`` batches (a child); returns the writer's figures."""
    dump, n_traces, n_execs = cfg["dump"], cfg["traces"], cfg["executions"]
    t0 = time.perf_counter()
    import numpy as np

    from nanscope.events import ExecutionEvent

    import_s = time.perf_counter() - t0
    names = op_names()
    slots = [0] * OPS_PER_CALL
    n_calls = math.ceil(n_traces / OPS_PER_CALL)
    bad_t = bad_traces(n_traces)
    bad_e = bad_executions(n_execs)

    w, blocked, stack = open_writer(dump, names)
    dev = w.register_device(DEVICE)  # already registered: returns its id

    # FULL_HEALTH rows: [tensor_id, device_id, dtype, rank, size, -inf, +inf, nan, -, 0, +].
    base = np.zeros((OPS_PER_CALL, 11), dtype=np.float64)
    base[:, 0] = 1000 + np.arange(OPS_PER_CALL)
    base[:, 1] = -1
    base[:, 2] = 1
    base[:, 3] = 2
    base[:, 4] = 128 * 64
    base[:, 8] = 4000
    base[:, 9] = 192
    base[:, 10] = 128 * 64 - 4192
    exec_summary = np.array([7, -1, 1, 1, 64, 0, 0, 0, 30, 4, 30], dtype=np.float64)

    t_traces = 0.0
    t_execs = 0.0
    max_queue_seen = 0
    exec_index = 0
    trace_index = 0
    perf = time.perf_counter
    loop_start = perf()
    for c in range(n_calls):
        n = min(OPS_PER_CALL, n_traces - trace_index)
        m = base[:n].copy()
        for i in range(trace_index, trace_index + n):
            if i in bad_t:
                ni, pi, nn = bad_t[i]
                row = m[i - trace_index]
                row[5:8] = (ni, pi, nn)
                row[10] -= ni + pi + nn
        e_here = (c + 1) * n_execs // n_calls - c * n_execs // n_calls
        for j in range(e_here):
            s = exec_summary
            if exec_index in bad_e:
                s = exec_summary.copy()
                s[5:8] = bad_e[exec_index]
            if j == e_here - 1:  # the graph call itself, last of this step
                ev = ExecutionEvent(
                    op_type=GRAPH_NAME,
                    graph_id=GRAPH_ID,
                    output_tensor_ids=[exec_index],
                    input_tensor_ids=[exec_index - 1, exec_index - 2],
                    output_device_ids=[dev],
                    summaries=[s],
                    stack=stack,
                    step=c,
                )
            else:
                ev = ExecutionEvent(
                    op_type=EAGER_TYPES[j % len(EAGER_TYPES)],
                    output_tensor_ids=[exec_index],
                    input_tensor_ids=[exec_index - 1],
                    output_device_ids=[dev],
                    summaries=[s],
                    stack=stack,
                    step=c,
                )
            t = perf()
            w.write_execution(ev)
            t_execs += perf() - t
            exec_index += 1
        t = perf()
        w.write_traces(GRAPH_ID, names[:n], slots[:n], m, device_name=DEVICE, step=c)
        t_traces += perf() - t
        trace_index += n
        q = len(w._queue)
        if q > max_queue_seen:
            max_queue_seen = q
    loop_s = perf() - loop_start
    # What the periodic flush (every flush_interval) had put on disk by now.
    on_disk = sum(
        os.path.getsize(str(w.file_set.path(s))) for s in ("graph_execution_traces", "execution")
    )
    processed = w.stats.traces
    t = perf()
    flushed = w.flush(timeout=None)
    flush_s = perf() - t
    t = perf()
    w.close()
    close_s = perf() - t
    return with_peak_memory(
        {
            "import_s": import_s,
            "traces": trace_index,
            "executions": exec_index,
            "calls": n_calls,
            "write_traces_s": t_traces,
            "write_execution_s": t_execs,
            "loop_s": loop_s,
            "flush_s": flush_s,
            "flushed": flushed,
            "close_s": close_s,
            "on_disk_before_flush": on_disk,
            "processed_before_flush": processed,
            "blocked_count": blocked["count"],
            "blocked_s": blocked["seconds"],
            "max_queue_seen": max_queue_seen,
            "max_queue": w.max_queue,
            "stats": vars(w.stats),
        }
    )


def child_write_single(cfg: dict[str, Any]) -> dict[str, Any]:
    """``write_trace`` one event at a time (the slow path a per-op hook would use)."""
    dump, n_traces = cfg["dump"], cfg["traces"]
    import numpy as np

    from nanscope.events import TraceEvent

    names = op_names()
    w, blocked, _ = open_writer(dump, names)
    rows = []
    for k in range(OPS_PER_CALL):
        r = np.array([1000 + k, -1, 1, 2, 8192, 0, 0, 0, 4000, 192, 4000], dtype=np.float64)
        rows.append(r)
    perf = time.perf_counter
    max_queue_seen = 0
    start = perf()
    for i in range(n_traces):
        k = i % OPS_PER_CALL
        w.write_trace(
            TraceEvent(
                graph_id=GRAPH_ID,
                op_name=names[k],
                output_slot=0,
                summary=rows[k],
                device_name=DEVICE,
                step=i // OPS_PER_CALL,
            )
        )
        if k == 0:
            q = len(w._queue)
            if q > max_queue_seen:
                max_queue_seen = q
    loop_s = perf() - start
    t = perf()
    flushed = w.flush(timeout=None)
    flush_s = perf() - t
    w.close()
    return with_peak_memory(
        {
            "traces": n_traces,
            "loop_s": loop_s,
            "flush_s": flush_s,
            "flushed": flushed,
            "blocked_count": blocked["count"],
            "blocked_s": blocked["seconds"],
            "max_queue_seen": max_queue_seen,
            "max_queue": w.max_queue,
            "stats": vars(w.stats),
        }
    )


# -- child: bytes per trace with TensorFlow's own names ---------------------------------------


def child_tf_bytes(cfg: dict[str, Any]) -> dict[str, Any]:
    """Bytes per trace of a small TensorFlow dump, and of the same traces written by nanscope."""
    workdir = cfg["workdir"]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.debug.lib.debug_events_reader import DebugDataReader

    from nanscope.events import DumpWriter, Graph, GraphOp, TraceEvent

    tf_dir = os.path.join(workdir, "tf_small")
    ns_dir = os.path.join(workdir, "ns_small")
    tf.debugging.experimental.enable_dump_debug_info(
        tf_dir, tensor_debug_mode="FULL_HEALTH", circular_buffer_size=-1
    )

    @tf.function
    def train_step(x, w):
        y = tf.matmul(x, w)
        y = tf.nn.relu(y + 1.0)
        return tf.reduce_sum(y * 2.0)

    x = tf.ones((4, 8))
    w = tf.ones((8, 3))
    for _ in range(10):
        train_step(x, w)
    tf.debugging.experimental.disable_dump_debug_info()

    reader = DebugDataReader(tf_dir)
    reader.update()
    traces = reader.graph_execution_traces()
    [tf_path] = [str(p) for p in Path(tf_dir).glob("*.graph_execution_traces")]
    tf_size = os.path.getsize(tf_path)

    # The same traces, names and values written by nanscope.
    wr = DumpWriter(ns_dir, "FULL_HEALTH", circular_buffer_size=-1, framework="bench")
    seen_graphs: set[str] = set()
    seen_ops: set[tuple[str, str]] = set()
    for tr in traces:
        if tr.graph_id not in seen_graphs:
            seen_graphs.add(tr.graph_id)
            wr.write_graph(Graph(graph_id=tr.graph_id))
        if (tr.graph_id, tr.op_name) not in seen_ops:
            seen_ops.add((tr.graph_id, tr.op_name))
            wr.write_graph_op(GraphOp(graph_id=tr.graph_id, op_type=tr.op_type, op_name=tr.op_name))
        wr.write_trace(
            TraceEvent(
                graph_id=tr.graph_id,
                op_name=tr.op_name,
                output_slot=tr.output_slot,
                summary=np.asarray(tr.debug_tensor_value, dtype=np.float64),
                device_name=tr.device_name or "",
            )
        )
    wr.close()
    [ns_path] = [str(p) for p in Path(ns_dir).glob("*.graph_execution_traces")]
    return with_peak_memory(
        {
            "records": len(traces),
            "tf_bytes": tf_size,
            "ns_bytes": os.path.getsize(ns_path),
            "ns_index_bytes": os.path.getsize(ns_path + ".nsidx"),
            "graph_ids": sorted({t.graph_id for t in traces}),
            "op_names": sorted({t.op_name for t in traces}),
            "device_names": sorted({t.device_name or "" for t in traces}),
            "tf_version": tf.__version__,
        }
    )


CHILDREN = {"write": child_write, "write_single": child_write_single, "tf_bytes": child_tf_bytes}


# -- the parent --------------------------------------------------------------------------------


def run_child(module: str, kind: str, cfg: dict[str, Any], label: str) -> dict[str, Any]:
    """One child, its progress on stderr; stops the benchmark if it fails.

    This file's own children (the writers) run as ``python bench/reader.py
    --child``, so that the stack the dump records is this script's.
    """
    print(f"  [{time.strftime('%H:%M:%S')}] {label} ...", end="", flush=True, file=sys.stderr)
    script = HERE if module == "reader" else None
    try:
        result = run_timed(module, kind, cfg, label=label, script=script)
    except ChildFailed as exc:
        print(" FAILED", file=sys.stderr)
        exc.exit()
    print(f" {result['wall_s']:.1f}s", file=sys.stderr, flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    """The command line: write the dump, read it with both readers, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=int, default=1_000_000)
    ap.add_argument("--executions", type=int, default=100_000)
    ap.add_argument(
        "--keep", metavar="DIR", help="write the dump here (reuse it if present), keep it"
    )
    ap.add_argument("--skip-tf", action="store_true", help="do not run TensorFlow's reader")
    ap.add_argument("--repeats", type=int, default=3, help="children per task (median is shown)")
    ap.add_argument(
        "--tf-budget",
        type=float,
        default=300.0,
        help="if one round of TensorFlow's tasks takes longer (s), run them only once",
    )
    ap.add_argument(
        "--single",
        type=int,
        default=None,
        help="events for the write_trace test (default --traces)",
    )
    ap.add_argument("--child", nargs=2, metavar=("KIND", "CFG"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        send_result(CHILDREN[args.child[0]](json.loads(args.child[1])))
        return 0
    tmp = tempfile.mkdtemp(prefix="nanscope-bench-", dir="/tmp")
    dump = args.keep or os.path.join(tmp, "dump")
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    try:
        return run(args, tmp, dump, started)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace, tmp: str, dump: str, started: str) -> int:
    """The benchmark in ``tmp``, on ``dump``; the exit status (1 when a check failed)."""
    n, e = args.traces, args.executions
    start_state = source_state()
    n_single = n if args.single is None else min(n, args.single)
    print(f"nanscope reader/writer benchmark, {started}", file=sys.stderr)
    print(f"dump: {dump}  ({n:,} traces, {e:,} executions)", file=sys.stderr)

    reused = args.keep is not None and any(Path(dump).glob("*.metadata"))
    write = None
    if reused:
        print("  reusing the existing dump (writer rows come from no run)", file=sys.stderr)
    else:
        write = run_child(
            "reader",
            "write",
            {"dump": dump, "traces": n, "executions": e},
            f"write {n:,} traces (write_traces)",
        )
    single = run_child(
        "reader",
        "write_single",
        {"dump": os.path.join(tmp, "single"), "traces": n_single},
        f"write {n_single:,} traces (write_trace)",
    )
    shutil.rmtree(os.path.join(tmp, "single"), ignore_errors=True)

    [trace_file] = list(Path(dump).glob("*.graph_execution_traces"))
    ns_trace_bytes = trace_file.stat().st_size
    ns_index_bytes = Path(str(trace_file) + ".nsidx").stat().st_size
    tf_bytes = (
        None
        if args.skip_tf
        else run_child("reader", "tf_bytes", {"workdir": tmp}, "TF small dump (bytes/trace)")
    )

    impls = ["nanscope"] if args.skip_tf else ["nanscope", "tensorflow"]
    tasks = ["import", "open", "first", "page"]
    results: dict[tuple[str, str], list[dict[str, Any]]] = {
        (i, t): [] for i in impls for t in tasks
    }
    tf_once = False
    for rep in range(args.repeats):
        round_tf = 0.0
        for task in tasks:
            for impl in impls:
                if impl == "tensorflow" and tf_once:
                    continue
                cfg = {"impl": impl, "task": task, "dump": dump, "traces": n}
                res = run_child("dump_reads", "read", cfg, f"round {rep + 1}: {impl} {task}")
                results[(impl, task)].append(res)
                if impl == "tensorflow":
                    round_tf += res["wall_s"]
        if "tensorflow" in impls and not tf_once and round_tf > args.tf_budget:
            tf_once = True
            print(
                f"  TensorFlow's round took {round_tf:.0f}s > {args.tf_budget:.0f}s: "
                "running it once only",
                file=sys.stderr,
            )

    # -- checks: both readers found the same things -------------------------------------------
    problems: list[str] = []
    expected_first = min(bad_traces(n)) if bad_traces(n) else None
    for impl in impls:
        for res in results[(impl, "open")]:
            if res["num_traces"] != n or res["num_executions"] != e:
                problems.append(
                    f"{impl} open: {res['num_traces']} traces / {res['num_executions']} executions"
                )
        for res in results[(impl, "first")]:
            if res["index"] != expected_first:
                problems.append(
                    f"{impl} first non-finite at {res['index']}, expected {expected_first}"
                )
        for res in results[(impl, "page")]:
            if res["count"] != min(PAGE, n - page_offset(n)):
                problems.append(f"{impl} page returned {res['count']} traces")
    if "tensorflow" in impls:
        a, b = results[("nanscope", "page")][0], results[("tensorflow", "page")][0]
        if (a["first_op"], a["checksum"]) != (b["first_op"], b["checksum"]):
            problems.append(
                f"page differs: nanscope {a['first_op']} {a['checksum']} vs TF {b['first_op']} {b['checksum']}"
            )
        a, b = results[("nanscope", "first")][0], results[("tensorflow", "first")][0]
        if a["value"] != b["value"]:
            problems.append(f"first non-finite differs: {a['value']} vs {b['value']}")

    # -- the table ----------------------------------------------------------------------------
    def cell(impl: str, task: str, key: str) -> float | None:
        return median_of(results.get((impl, task), []), key)

    def measured(impl: str, task: str, key: str) -> float:
        value = cell(impl, task, key)
        assert value is not None, f"{impl} {task}: no {key}"
        return value

    def reps(impl: str) -> str:
        rs = results.get((impl, "open"))
        return f"{len(rs)}" if rs else "0"

    has_tf = "tensorflow" in impls
    lines: list[str] = []
    add = lines.append
    add(
        f"Dump: {n:,} FULL_HEALTH graph execution traces ({math.ceil(n / OPS_PER_CALL):,} calls "
        f"of {OPS_PER_CALL} ops), {e:,} executions; first non-finite trace #{expected_first:,}"
        if expected_first is not None
        else f"Dump: {n:,} traces, {e:,} executions"
    )
    add(
        f"Machine: {machine()}; medians of {reps('nanscope')} (nanscope) / {reps('tensorflow') if has_tf else 0} (TF) "
        "fresh subprocesses per task; dump in the page cache (warm)"
    )
    add("Times exclude the import of the reader's package (own row); 'cold' = open + query.")
    add("Peak RSS = ru_maxrss of the child (includes the imports).")
    add(source_line(start_state, source_state()))
    used = {
        r.get("sidecar_used") for t in ("open", "first", "page") for r in results[("nanscope", t)]
    }
    add(
        f"nanscope index built from the .nsidx sidecar: {', '.join(str(u) for u in sorted(used, key=str))}"
    )
    add("")
    lines += table_head(["Task", "nanscope", "TensorFlow", "TF / nanscope"])

    def row(label: str, task: str, field: str, unit: str = "s") -> None:
        """A task's figure for both readers, side by side, and TensorFlow's over nanscope's."""
        fmt = fmt_s if unit == "s" else fmt_mib
        ns, tf = cell("nanscope", task, field), cell("tensorflow", task, field)
        add(table_row([label, fmt(ns), *([fmt(tf), fmt_ratio(tf, ns)] if has_tf else ["-", "-"])]))

    at = f"at {page_offset(n):,}"
    row("import (s)", "import", "import_s")
    row("RSS after import (MiB)", "import", "peak_rss_mib", "MiB")
    row("open + index (s)", "open", "open_s")
    row("open + index: peak RSS (MiB)", "open", "peak_rss_mib", "MiB")
    row("first non-finite: query (s)", "first", "query_s")
    row("first non-finite: cold, open + query (s)", "first", "cold_s")
    row("first non-finite: peak RSS (MiB)", "first", "peak_rss_mib", "MiB")
    row(f"page of {PAGE} {at}: query (s)", "page", "query_s")
    row(f"page of {PAGE} {at}: cold, open + query (s)", "page", "cold_s")
    row(f"page of {PAGE}: peak RSS (MiB)", "page", "peak_rss_mib", "MiB")

    bpt = ns_trace_bytes / n
    bpt_idx = (ns_trace_bytes + ns_index_bytes) / n
    add(f"| bytes/trace on disk, this dump: .graph_execution_traces | {bpt:.1f} | - | - |")
    add(f"| bytes/trace on disk, this dump: + .nsidx sidecar | {bpt_idx:.1f} | - | - |")
    if tf_bytes:
        k = tf_bytes["records"]
        tb, nb, ni = (
            tf_bytes["tf_bytes"] / k,
            tf_bytes["ns_bytes"] / k,
            tf_bytes["ns_index_bytes"] / k,
        )
        add(
            f"| bytes/trace, TF's own names ({k} traces): data file | {nb:.1f} | {tb:.1f} | {tb / nb:.2f}x |"
        )
        add(
            f"| bytes/trace, TF's own names: data + .nsidx | {nb + ni:.1f} | {tb:.1f} | {tb / (nb + ni):.2f}x |"
        )

    add("")
    add("| Writer (nanscope, FULL_HEALTH, one producing thread) | value |")
    add("|---|---:|")
    if write:
        wt = write["traces"]
        add(
            f"| write_traces: {wt:,} traces in {write['calls']:,} batches, time inside the calls (s) "
            f"| {write['write_traces_s']:.3f} |"
        )
        add(
            f"| write_traces: traces enqueued/s (time inside write_traces) | "
            f"{wt / write['write_traces_s']:,.0f} |"
        )
        add(
            f"| producer loop incl. {write['executions']:,} write_execution and building inputs (s) "
            f"| {write['loop_s']:.2f} |"
        )
        add(
            f"| write_execution: executions enqueued/s (time inside the calls) | "
            f"{write['executions'] / write['write_execution_s']:,.0f} |"
        )
        add(f"| flush() wait after the loop (s) | {write['flush_s']:.2f} |")
        add(
            f"| sustained traces/s (loop + flush; executions written too) | "
            f"{wt / (write['loop_s'] + write['flush_s']):,.0f} |"
        )
        add(
            f"| producer blocked (backpressure calls / s) | {write['blocked_count']} / "
            f"{write['blocked_s']:.2f} |"
        )
        add(f"| max queue length seen (items; a batch is one item) | {write['max_queue_seen']:,} |")
        add(
            "| traces processed by the writer thread when the loop ended / bytes on disk then | "
            f"{write['processed_before_flush']:,} / {write['on_disk_before_flush']:,} |"
        )
        add(f"| writer child peak RSS (MiB) | {write['peak_rss_mib']:,.0f} |")
    else:
        add("| (dump reused with --keep: writer not run) | - |")
    st = single["traces"]
    add(
        f"| write_trace one at a time: {st:,} traces enqueued/s (producer loop) | "
        f"{st / single['loop_s']:,.0f} |"
    )
    add(f"| write_trace: flush() wait after the loop (s) | {single['flush_s']:.2f} |")
    add(
        f"| write_trace: sustained traces/s (loop + flush) | "
        f"{st / (single['loop_s'] + single['flush_s']):,.0f} |"
    )
    add(
        f"| write_trace: producer blocked (calls / s), max queue seen | {single['blocked_count']} / "
        f"{single['blocked_s']:.2f}, {single['max_queue_seen']:,} |"
    )
    add(f"| write_trace child peak RSS (MiB) | {single['peak_rss_mib']:,.0f} |")

    # -- targets ------------------------------------------------------------------------------
    add("")
    add("Targets:")
    cold = measured("nanscope", "first", "cold_s")
    add(
        f"- nanscope first non-finite (cold, open + query, excl. import) < 2 s: "
        f"{cold:.3f} s -> {'PASS' if cold < 2 else 'FAIL'}"
    )
    if has_tf:
        tcold = measured("tensorflow", "first", "cold_s")
        add(
            f"- >= 10x faster than TF's reader (cold first non-finite): {tcold / cold:.1f}x -> "
            f"{'PASS' if tcold / cold >= 10 else 'FAIL'}"
        )
        nm = measured("nanscope", "first", "peak_rss_mib")
        tm = measured("tensorflow", "first", "peak_rss_mib")
        add(
            f"- less memory than TF's reader (peak RSS, first non-finite): {nm:,.0f} vs {tm:,.0f} MiB -> "
            f"{'PASS' if nm < tm else 'FAIL'}"
        )
    if write:
        rate = write["traces"] / write["write_traces_s"]
        add(
            f"- writer >= 200,000 FULL_HEALTH traces/s from one thread (write_traces) without "
            f"blocking: {rate:,.0f}/s, blocked {write['blocked_count']}x -> "
            f"{'PASS' if rate >= 200_000 and not write['blocked_count'] else 'FAIL'}"
        )
    rate1 = st / single["loop_s"]
    add(
        f"- same, write_trace one at a time: {rate1:,.0f}/s, blocked {single['blocked_count']}x "
        f"(queue peaked at {single['max_queue_seen']:,} of max_queue {single['max_queue']:,}) -> "
        f"{'PASS' if rate1 >= 200_000 and not single['blocked_count'] else 'FAIL'}"
    )
    if write:
        sus = write["traces"] / (write["loop_s"] + write["flush_s"])
        sus1 = st / (single["loop_s"] + single["flush_s"])
        add(
            f"- sustained (until flush() returns) >= 200,000 traces/s: write_traces {sus:,.0f}/s, "
            f"write_trace {sus1:,.0f}/s -> {'PASS' if min(sus, sus1) >= 200_000 else 'FAIL'} "
            "(a producer faster than this for longer than max_queue events waits, in write_trace "
            "and write_traces alike: memory stays bounded)"
        )
    if tf_bytes:
        add("")
        add(
            f"TF small dump (tensorflow {tf_bytes['tf_version']}, tf.function train_step: matmul, "
            f"add, relu, mul, reduce_sum; 10 calls): graph ids {tf_bytes['graph_ids']}, "
            f"op names {tf_bytes['op_names']}, devices {tf_bytes['device_names']}."
        )
    add(
        f"This dump's names: graph id {GRAPH_ID!r} ({len(GRAPH_ID)} chars), op names like "
        f"{op_names()[5]!r}, device {DEVICE!r}."
    )
    if problems:
        add("")
        add("CHECK FAILURES:")
        for p in problems:
            add(f"- {p}")

    print("\n".join(lines))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
