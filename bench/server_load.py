"""Benchmark: ``nanscope serve`` under load, a baseline commit and the working tree side by side.

Each server runs as ``python -m nanscope serve`` in its own process (the source
of the commit measured first on its ``PYTHONPATH``); this process is the client
and imports neither numpy nor nanscope. Four scenarios:

* **detail**: ``--clients`` threads (in ``--client-processes`` processes) each send ``--requests`` event-detail requests
  (``/api/traces/<i>``, ``i`` uniformly random with a fixed seed, the same for every
  server) to a dump of ``--traces`` traces (bench/scale_dumps.py's generator; 1M
  traces in 4 ranks by default). One request per connection (the server speaks
  HTTP/1.0). Reported: latency p50/p99/max, requests per second, and the server's CPU time
  per request (user + system, from /proc: less sensitive than latency to other load).
* **mixed**: the same, while ``--page-clients`` (2) more clients read list pages of 1,000
  traces one after another (as the GUI's list does when scrolled). Reported: the details'
  latencies, and how many pages were read meanwhile.
* **idle**: the server runs with ``RLIMIT_NOFILE`` = ``--nofile`` (256); ``--idle``
  (500) connections are opened and send nothing (those the server does not accept
  wait in its backlog); then one normal request ``/api/runs`` is timed, up to
  ``--idle-timeout`` s. Reported: answered or not, and its latency.
* **tree**: a logdir of ``--dirs`` (28,000) empty directories (a 3-level tree) and one
  small run; ``/api/runs`` is requested ``--tree-requests`` times, one after another,
  with a pause longer than the run index's refresh interval between them (so that
  every request finds the index due). Reported: latency median and max.

    PYTHONPATH=src .venv/bin/python bench/server_load.py --baseline eee319e
    PYTHONPATH=src .venv/bin/python bench/server_load.py --only detail --clients 20 --requests 200

``--baseline REV`` extracts ``src/`` of REV (``git archive``) and measures it first; without
it only the working tree is measured. The dump is kept under ``--keep`` (default
``/tmp/nanscope-bench-server``) and reused.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import multiprocessing
import os
import random
import resource
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

from harness import ROOT, log, machine, source_state, table_head, table_row
from scale_dumps import dump_name, generate


def snapshot(rev: str, root: Path) -> Path:
    """``src/`` of ``rev``, extracted under ``root``; returns that ``src`` directory."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    dest = root / f"nanscope-{sha}"
    if not (dest / "src" / "nanscope" / "__init__.py").exists():
        shutil.rmtree(dest, ignore_errors=True)
        blob = subprocess.run(
            ["git", "archive", sha, "src"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            tar.extractall(dest, filter="data")
    return dest / "src"


class ServerProcess:
    """``nanscope serve LOGDIR --port 0`` with ``src`` first on its path; :attr:`port` once up."""

    def __init__(self, src: Path, logdir: Path, nofile: int | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": str(src), "PYTHONUNBUFFERED": "1"}

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nanscope", "serve", str(logdir), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            preexec_fn=limit,
        )
        assert self.proc.stdout is not None
        url = ""
        for _ in range(5):
            line = self.proc.stdout.readline()
            if "open " in line:
                url = line.split("open ", 1)[1].split()[0]
                break
        if not url:
            self.close()
            raise SystemExit(f"the server for {src} did not start")
        hostport = url.split("//", 1)[1].split("/", 1)[0]
        self.port = int(hostport.rsplit(":", 1)[1])
        # A token in the URL (a server bound beyond loopback) would go with every request.
        self.query = url.split("?", 1)[1] if "?" in url else ""

    def get(self, path: str, timeout: float = 60.0) -> tuple[int, bytes]:
        return get(self.port, path, timeout)

    def cpu_s(self) -> float:
        """The server's CPU time so far (user + system, all threads), from /proc."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def get(port: int, path: str, timeout: float = 60.0) -> tuple[int, bytes]:
    """One GET on a fresh connection (the server speaks HTTP/1.0)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def client_process(port: int, plans: list[list[int]], start: Any, out: Any) -> None:
    """One client process: a thread per plan, each requesting its traces one after another;
    puts ``(latencies, errors)`` on ``out``."""
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client(plan: list[int]) -> None:
        mine = []
        for i in plan:
            t0 = time.perf_counter()
            try:
                status, body = get(port, f"/api/traces/{i}")
                if status != 200:
                    errors.append(f"{status} {body[:100]!r}")
            except OSError as exc:
                errors.append(str(exc))
            mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(p,)) for p in plans]
    start.wait()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put((latencies, errors))


def detail(src: Path, dump: Path, args: argparse.Namespace, pages: int = 0) -> dict[str, Any]:
    """The detail clients; with ``pages``, that many more clients meanwhile read list pages of
    1,000 traces (as the GUI's list does when scrolled), one after another, until they end."""
    server = ServerProcess(src, dump)
    try:
        _, body = server.get("/api/runs", timeout=600)  # opens the reader
        total = json.loads(body)["runs"][0]["num_graph_execution_traces"]
        rng = random.Random(0)
        plans = [[rng.randrange(total) for _ in range(args.requests)] for _ in range(args.clients)]
        for i in plans[0][:5]:  # warm: first decodes, caches of the source files
            server.get(f"/api/traces/{i}")
        # Clients in a few processes, so that their own GIL adds little to the latencies.
        ctx = multiprocessing.get_context("fork")
        nproc = max(1, min(args.client_processes, args.clients))
        start, out = ctx.Barrier(nproc + 1), ctx.Queue()
        procs = [
            ctx.Process(target=client_process, args=(server.port, plans[k::nproc], start, out))
            for k in range(nproc)
        ]
        for p in procs:
            p.start()
        done = threading.Event()
        page_latencies: list[float] = []

        def page_client(k: int) -> None:
            prng = random.Random(k)
            while not done.is_set():
                begin = prng.randrange(max(1, total - 1000))
                t0 = time.perf_counter()
                server.get(f"/api/traces?begin={begin}&end={begin + 1000}")
                page_latencies.append(time.perf_counter() - t0)

        paging = [threading.Thread(target=page_client, args=(k,)) for k in range(pages)]
        cpu0 = server.cpu_s()
        start.wait()
        for t in paging:
            t.start()
        t0 = time.perf_counter()
        results = [out.get() for _ in procs]
        wall = time.perf_counter() - t0
        cpu = server.cpu_s() - cpu0
        done.set()
        for t in paging:
            t.join()
        for p in procs:
            p.join()
        latencies = [x for lat, _ in results for x in lat]
        errors = [e for _, errs in results for e in errs]
        return {
            "p50": percentile(latencies, 0.5),
            "p99": percentile(latencies, 0.99),
            "max": max(latencies),
            "rps": len(latencies) / wall,
            "errors": len(errors),
            "cpu_ms": cpu / len(latencies) * 1e3,
            "traces": total,
            "pages": len(page_latencies),
            "page_p50": percentile(page_latencies, 0.5) if page_latencies else None,
        }
    finally:
        server.close()


def idle(src: Path, dump: Path, args: argparse.Namespace) -> dict[str, Any]:
    server = ServerProcess(src, dump, nofile=args.nofile)
    socks: list[socket.socket] = []
    try:
        server.get("/api/runs", timeout=600)
        for _ in range(args.idle):
            s = socket.socket()
            s.settimeout(5)
            try:
                s.connect(("127.0.0.1", server.port))
            except OSError:
                s.close()
                break
            socks.append(s)
        time.sleep(0.5)  # the server accepts what it will
        t0 = time.perf_counter()
        try:
            status, _ = server.get("/api/runs", timeout=args.idle_timeout)
            answered = status == 200
        except OSError:
            answered = False
        return {"opened": len(socks), "answered": answered, "latency": time.perf_counter() - t0}
    finally:
        for s in socks:
            s.close()
        server.close()


def make_tree(root: Path, dirs: int) -> Path:
    """``dirs`` empty directories in 3 levels under ``root/logdir``, and one small run."""
    logdir = root / f"tree{dirs}"
    marker = logdir / ".complete"
    if marker.exists():
        return logdir
    shutil.rmtree(logdir, ignore_errors=True)
    fan = max(2, round(dirs ** (1 / 3)))
    made = 0
    for a in range(fan):
        for b in range(fan):
            for c in range(fan):
                if made >= dirs:
                    break
                (logdir / f"e{a}" / f"s{b}" / f"r{c}").mkdir(parents=True)
                made += 1
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    code = (
        "import sys; sys.path.insert(0, sys.argv[2]);"
        "from tests.helpers import write_small_dump; write_small_dump(__import__('pathlib').Path(sys.argv[1]))"
    )
    run = logdir / "e0" / "s0" / "run"
    run.mkdir(parents=True)
    subprocess.run([sys.executable, "-c", code, str(run), str(ROOT)], env=env, check=True)
    marker.touch()
    return logdir


def tree(src: Path, logdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    server = ServerProcess(src, logdir)
    try:
        server.get("/api/runs", timeout=600)
        lat = []
        for _ in range(args.tree_requests):
            time.sleep(1.1)  # past the refresh interval (1 s): the index is due
            t0 = time.perf_counter()
            status, _ = server.get("/api/runs")
            lat.append(time.perf_counter() - t0)
            assert status == 200
        return {"median": percentile(lat, 0.5), "max": max(lat)}
    finally:
        server.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--baseline", help="a commit to measure first, side by side (e.g. eee319e)")
    ap.add_argument("--only", choices=("detail", "mixed", "idle", "tree"), action="append")
    ap.add_argument("--keep", type=Path, default=Path("/tmp/nanscope-bench-server"))
    ap.add_argument("--traces", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--requests", type=int, default=200, help="per client")
    ap.add_argument("--client-processes", type=int, default=4, help="the clients' processes")
    ap.add_argument("--page-clients", type=int, default=2, help="list-page clients in mixed")
    ap.add_argument("--idle", type=int, default=500)
    ap.add_argument("--nofile", type=int, default=256)
    ap.add_argument("--idle-timeout", type=float, default=10.0)
    ap.add_argument("--dirs", type=int, default=28_000)
    ap.add_argument("--tree-requests", type=int, default=10)
    args = ap.parse_args(argv)
    only = set(args.only or ("detail", "mixed", "idle", "tree"))
    args.keep.mkdir(parents=True, exist_ok=True)
    state = source_state()
    impls: list[tuple[str, Path]] = []
    if args.baseline:
        impls.append((f"baseline {args.baseline}", snapshot(args.baseline, args.keep)))
    impls.append(("working tree", ROOT / "src"))
    dump = args.keep / dump_name(args.traces, args.ranks)
    if only & {"detail", "mixed", "idle"}:
        generate(dump, traces=args.traces, executions=args.traces // 10, ranks=args.ranks)
    out = [f"Machine: {machine()}. Source: {state}.", ""]
    if "detail" in only:
        head = [
            "server",
            "p50 ms",
            "p99 ms",
            "max ms",
            "requests/s",
            "server CPU ms/request",
            "errors",
        ]
        rows = []
        for label, src in impls:
            log(f"detail: {label}")
            r = detail(src, dump, args)
            rows.append(
                [
                    label,
                    f"{r['p50'] * 1e3:.0f}",
                    f"{r['p99'] * 1e3:.0f}",
                    f"{r['max'] * 1e3:.0f}",
                    f"{r['rps']:.0f}",
                    f"{r['cpu_ms']:.1f}",
                    r["errors"],
                ]
            )
        out += [
            f"Event detail (/api/traces/<i>), {args.clients} clients x {args.requests} "
            f"requests, {args.traces:,}-trace dump ({args.ranks} ranks):",
            "",
        ]
        out += table_head(head) + [table_row(r) for r in rows] + [""]
    if "mixed" in only:
        head = [
            "server",
            "detail p50 ms",
            "detail p99 ms",
            "detail max ms",
            "details/s",
            "pages read",
            "page p50 ms",
        ]
        rows = []
        for label, src in impls:
            log(f"mixed: {label}")
            r = detail(src, dump, args, pages=args.page_clients)
            rows.append(
                [
                    label,
                    f"{r['p50'] * 1e3:.0f}",
                    f"{r['p99'] * 1e3:.0f}",
                    f"{r['max'] * 1e3:.0f}",
                    f"{r['rps']:.0f}",
                    r["pages"],
                    f"{(r['page_p50'] or 0) * 1e3:.0f}",
                ]
            )
        out += [
            f"The same, while {args.page_clients} more clients read list pages of 1,000 "
            "traces (/api/traces?begin=&end=) one after another:",
            "",
        ]
        out += table_head(head) + [table_row(r) for r in rows] + [""]
    if "idle" in only:
        rows = []
        for label, src in impls:
            log(f"idle: {label}")
            r = idle(src, dump, args)
            rows.append(
                [label, r["opened"], "yes" if r["answered"] else "no", f"{r['latency']:.3f}"]
            )
        out += [
            f"{args.idle} idle connections, server limited to {args.nofile} descriptors; "
            f"one normal request (/api/runs), given up after {args.idle_timeout:g} s:",
            "",
        ]
        out += table_head(["server", "connections opened", "answered", "latency s"])
        out += [table_row(r) for r in rows] + [""]
    if "tree" in only:
        logdir = make_tree(args.keep, args.dirs)
        rows = []
        for label, src in impls:
            log(f"tree: {label}")
            r = tree(src, logdir, args)
            rows.append([label, f"{r['median'] * 1e3:.1f}", f"{r['max'] * 1e3:.1f}"])
        out += [
            f"/api/runs on a logdir of {args.dirs:,} directories, {args.tree_requests} "
            "requests each after the index's refresh interval:",
            "",
        ]
        out += table_head(["server", "median ms", "max ms"]) + [table_row(r) for r in rows]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
