"""Benchmark: ``nanscope serve`` against TensorBoard's Debugger V2 plugin on one large dump.

Writes (or reuses, with ``--keep``) the FULL_HEALTH dump of ``bench/reader.py``
(1,000,000 graph execution traces and 100,000 executions by default, a few
non-finite events late in it), then, side by side in one run:

* **nanscope**: starts ``nanscope serve DUMP --port 0`` cold (a new process), and
  times the page's first requests (``/``, ``/api/runs``, ``/api/alerts``) from
  the process start: that is when the alerts can be painted. Then pages of 200
  traces and executions at random offsets, the timeline strip, one trace's
  detail and its graph neighbourhood, each over HTTP on loopback (so the times
  include HTTP and JSON, an upper bound on the handler's own time).
* **TensorBoard**: starts ``tensorboard --logdir DUMP`` the same way and times
  its Debugger V2 plugin until its ``alerts`` route reports every alert (the
  plugin reads the dump in the background: this is when its alerts can be
  painted), and a page of 200 graph execution digests at offset 900,000.
* **browser** (with ``--browser``, needs Debian's ``/usr/bin/chromium`` and
  Playwright): opens the page in headless Chromium, times navigation until the
  alert count shows, then scrolls the graph-execution list from top to bottom
  and reports the JS heap and the number of rendered rows along the way.

    .venv/bin/python bench/gui.py --keep /tmp/nsdump            # 1M traces
    .venv/bin/python bench/gui.py --keep /tmp/nsdump --browser  # and a real browser
    .venv/bin/python bench/gui.py --traces 100000 --executions 10000 --skip-tb
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from dump_reads import PAGE
from harness import BENCH, ChildFailed, child_env, fmt_ratio, run_child, table_head

TB_RUN = "__default_debugger_run__"


def bin_of(name: str) -> list[str]:
    """The command of one of the venv's scripts (``python -m NAME`` where it has none)."""
    script = Path(sys.executable).parent / name
    return [str(script)] if script.exists() else [sys.executable, "-m", name]


def ensure_dump(dump: Path, traces: int, executions: int) -> None:
    """Write bench/reader.py's dump to ``dump`` (in its writer child), unless it is there."""
    if any(dump.glob("*.metadata")):
        print(f"reusing {dump}", file=sys.stderr)
        return
    print(f"writing {traces:,} traces and {executions:,} executions to {dump} ...", file=sys.stderr)
    cfg = {"dump": str(dump), "traces": traces, "executions": executions}
    try:
        run_child(
            "reader",
            "write",
            cfg,
            label=f"reader write {dump}",
            capture_stderr=False,
            script=BENCH / "reader.py",
        )
    except ChildFailed as exc:
        exc.exit()


def get(url: str, timeout: float = 600.0) -> tuple[float, Any]:
    """GET ``url``: seconds taken, and the body (decoded when JSON)."""
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body = resp.read()
    elapsed = time.perf_counter() - t
    kind = resp.headers.get("Content-Type", "")
    return elapsed, json.loads(body) if kind.startswith("application/json") else body


def stop(proc: subprocess.Popen[Any]) -> None:
    """Stop a server started in its own process group, and its children."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def start_nanscope(dump: Path) -> tuple[subprocess.Popen[str], str]:
    """``nanscope serve DUMP --port 0`` in a new process group, and its URL once printed."""
    proc = subprocess.Popen(
        [*bin_of("nanscope"), "serve", str(dump), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            stop(proc)
            raise SystemExit("nanscope serve exited before printing its URL")
        if " open " in line:
            return proc, line.split(" open ", 1)[1].split()[0]


def nanscope_round(dump: Path, rng: random.Random) -> dict[str, Any]:
    """One cold start of ``nanscope serve``: seconds to the alerts, then the other requests."""
    t0 = time.perf_counter()
    proc, url = start_nanscope(dump)
    try:
        ready = time.perf_counter() - t0
        get(url)  # the page itself
        _, runs = get(url + "api/runs")
        _, alerts = get(url + "api/alerts")
        first_alerts = time.perf_counter() - t0
        analysis_s, analysis = get(url + "api/analysis")
        n_tr = runs["runs"][0]["num_graph_execution_traces"]
        n_ex = runs["runs"][0]["num_executions"]
        trace_pages = [
            get(f"{url}api/traces?begin={b}&end={b + PAGE}")[0]
            for b in [rng.randrange(0, max(1, n_tr - PAGE)) for _ in range(20)]
        ]
        exec_pages = [
            get(f"{url}api/executions?begin={b}&end={b + PAGE}")[0]
            for b in [rng.randrange(0, max(1, n_ex - PAGE)) for _ in range(20)]
        ]
        timeline = [
            get(f"{url}api/timeline?kind=graph_execution_trace&buckets=2000")[0] for _ in range(5)
        ]
        _, bad_traces = get(f"{url}api/traces?nonfinite=1&end=1")
        bad = bad_traces["rows"][0]
        detail_s, detail = get(f"{url}api/traces/{bad['index']}")
        graph_s, _ = get(
            f"{url}api/graph_op?graph_id={detail['graph_id']}&op_name="
            f"{urllib.request.quote(detail['op_name'])}&near={bad['index']}"
        )
        return {
            "ready": ready,
            "first_alerts": first_alerts,
            "analysis": analysis_s,
            "trace_page_median": statistics.median(trace_pages),
            "trace_page_max": max(trace_pages),
            "exec_page_median": statistics.median(exec_pages),
            "exec_page_max": max(exec_pages),
            "timeline_median": statistics.median(timeline),
            "detail": detail_s,
            "graph_op": graph_s,
            "alerts_total": alerts["total"],
            "headline": analysis["headline"],
        }
    finally:
        stop(proc)


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tensorboard_round(dump: Path, expected_alerts: int, budget: float) -> dict[str, Any]:
    """One cold start of TensorBoard: seconds until its plugin reports every alert, and a page."""
    port = free_port()
    base = f"http://127.0.0.1:{port}/data/plugin/debugger-v2/"
    env = child_env({"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""})
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [
            *bin_of("tensorboard"),
            "--logdir",
            str(dump),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--load_fast",
            "false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    out: dict[str, Any] = {"first_alerts": None, "trace_page": None}
    try:
        while time.perf_counter() - t0 < budget:
            try:
                _, a = get(f"{base}alerts?run={TB_RUN}&begin=0&end=0", timeout=budget)
                if a.get("num_alerts", 0) >= expected_alerts:
                    out["first_alerts"] = time.perf_counter() - t0
                    break
            except (urllib.error.URLError, ConnectionError, OSError, ValueError):
                pass
            time.sleep(0.25)
        if out["first_alerts"] is not None:
            b = 900_000
            out["trace_page"] = get(
                f"{base}graph_execution/digests?run={TB_RUN}&begin={b}&end={b + PAGE}"
            )[0]
    finally:
        stop(proc)
    return out


def browser_round(dump: Path) -> dict[str, Any]:
    """First paint and a full scroll of the graph-execution list in headless Chromium."""
    from playwright.sync_api import sync_playwright

    proc, url = start_nanscope(dump)
    try:
        args = [
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-precise-memory-info",
        ]
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=args)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            t0 = time.perf_counter()
            page.goto(url)
            page.wait_for_selector('body[data-ready="1"]', timeout=60_000)
            paint = time.perf_counter() - t0
            page.click("#tab-traces")
            scroller = "#graph-execs .vl-viewport"
            page.wait_for_selector(scroller, timeout=30_000)
            heap, rows = [], []
            for k in range(51):
                page.eval_on_selector(
                    scroller,
                    "(el, f) => { el.scrollTop = f * (el.scrollHeight - el.clientHeight) }",
                    k / 50,
                )
                page.wait_for_timeout(150)
                page.wait_for_function(
                    "() => document.body.dataset.pending === '0'", timeout=30_000
                )
                heap.append(page.evaluate("performance.memory.usedJSHeapSize") / 2**20)
                rows.append(
                    page.eval_on_selector_all("#graph-execs [data-index]", "els => els.length")
                )
            last = page.eval_on_selector_all(
                "#graph-execs [data-index]", "els => Math.max(...els.map(e => +e.dataset.index))"
            )
            browser.close()
        return {
            "paint": paint,
            "heap_start": heap[0],
            "heap_peak": max(heap),
            "heap_end": heap[-1],
            "rows_max": max(rows),
            "last_index": last,
        }
    finally:
        stop(proc)


def fmt(x: float | None, unit: str = "s") -> str:
    """Seconds (or ``"ms"``) for the table, "did not finish" when missing."""
    if x is None:
        return "did not finish"
    return f"{x * 1000:.0f} ms" if unit == "ms" else f"{x:.2f} s"


def main(argv: list[str] | None = None) -> int:
    """The command line: the dump, the rounds, and the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=int, default=1_000_000)
    ap.add_argument("--executions", type=int, default=100_000)
    ap.add_argument("--keep", metavar="DIR", help="write the dump here (reuse it if present)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-tb", action="store_true", help="do not run TensorBoard")
    ap.add_argument("--tb-budget", type=float, default=300.0, help="give TensorBoard this long (s)")
    ap.add_argument("--browser", action="store_true", help="also measure in headless Chromium")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nanscope-gui-bench-") as tmp:
        dump = Path(args.keep or Path(tmp) / "dump")
        ensure_dump(dump, args.traces, args.executions)
        rng = random.Random(0)
        ns = [nanscope_round(dump, rng) for _ in range(args.repeats)]
        med = {k: statistics.median(r[k] for r in ns) for k in ns[0] if isinstance(ns[0][k], float)}
        tb = (
            None if args.skip_tb else tensorboard_round(dump, ns[0]["alerts_total"], args.tb_budget)
        )
        br = browser_round(dump) if args.browser else None
    print(
        f"\nnanscope serve vs TensorBoard Debugger V2, {dump} "
        f"(median of {args.repeats} cold starts for nanscope)\n"
    )
    print(f"headline: {ns[0]['headline']}\n")
    cols = ["measure", "nanscope", "TensorBoard", "TensorBoard / nanscope"]
    print("\n".join(table_head(cols, numeric=False)))
    tb_alerts = tb["first_alerts"] if tb else None
    ratio = fmt_ratio(tb_alerts or None, med["first_alerts"], ".1f")
    print(
        f"| process start to alerts answered | {fmt(med['first_alerts'])} | {fmt(tb_alerts)} | {ratio} |"
    )
    tb_page = tb["trace_page"] if tb else None
    ratio = fmt_ratio(tb_page or None, med["trace_page_median"], ".1f")
    print(
        f"| page of {PAGE} traces (median) | {fmt(med['trace_page_median'], 'ms')} | {fmt(tb_page, 'ms')} | {ratio} |"
    )
    for label, key in [
        ("page of 200 traces (worst of 20)", "trace_page_max"),
        ("page of 200 executions (median)", "exec_page_median"),
        ("page of 200 executions (worst of 20)", "exec_page_max"),
        ("timeline, 2000 buckets over all traces", "timeline_median"),
        ("one trace in full", "detail"),
        ("graph neighbourhood", "graph_op"),
        ("root-cause analysis", "analysis"),
        ("process start to URL printed", "ready"),
    ]:
        print(f"| {label} | {fmt(med[key], 'ms')} | - | - |")
    if br:
        print(f"| browser: navigation to alerts painted | {fmt(br['paint'])} | - | - |")
        print(
            f"| browser: JS heap, top / peak / bottom of the list | {br['heap_start']:.1f} / "
            f"{br['heap_peak']:.1f} / {br['heap_end']:.1f} MiB | - | - |"
        )
        print(
            f"| browser: rows in the DOM (max while scrolling), last index reached | "
            f"{br['rows_max']}, {br['last_index']:,} | - | - |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
