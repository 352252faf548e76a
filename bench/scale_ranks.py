"""Benchmark: finding where a NaN was born among many ranks (PyTorch DDP, FULL_HEALTH).

**The dumps** (bench/rank_dumps.py): ``RANKSxEVENTS`` (``--dumps``, e.g.
``256x100000``) is one run of RANKS processes of EVENTS executions each, one
``DumpWriter`` file set per rank, one run id. Every rank trains the same
8-layer model step after step (forward, backward with DDP's two bucket
allreduces tagged ``CollectiveTag(group "0", sequence k)``, optimizer). At 90%
of the steps (``--bad-at``) one rank's ``aten.log.default`` makes -inf (rank
``137 * RANKS // 256`` unless ``--bad-rank``); from that step's first allreduce on,
every rank carries NaN. The bad rank's clock runs 2 s late, every other rank's
offset is in [-2, +1.9] s: by wall clock, the first alert is another rank's
allreduce. The right answer is: rank R, ``aten.log.default``, step S.

**The tasks**, each in a fresh child process (peak memory by ``ru_maxrss``):

* ``open``: ``nanscope.open_dump`` (DumpReader and its index, from the sidecars);
* ``first``: open + ``first_nonfinite()`` + decoding that event;
* ``analyze``: open + ``nanscope.analysis.analyze(reader)``: what it names as the
  origin and the cause (rank, op, step) and the report's ``ranks`` (when the
  analysis has them);
* ``--profile``: once more, ``analyze`` under cProfile on the largest dump (top
  functions by cumulative time).

Targets: the cross-rank cause under 5 s and 2 GiB for 256x100000; under 5 s for
1024x10000.

Usage::

    python bench/scale_ranks.py --dumps 16x10000 --keep /tmp/scale_ranks
    python bench/scale_ranks.py --dumps 256x100000,1024x10000 --keep /tmp/scale_ranks --profile
    python bench/scale_ranks.py --generate /tmp/scale_ranks --dumps 256x100000   # only write

The parent imports neither numpy nor nanscope, so as not to inflate the children's
``ru_maxrss``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import (
    ChildFailed,
    fmt_mib,
    fmt_ratio,
    fmt_s,
    log,
    machine,
    nanscope_location,
    peak_rss_mib,
    run_timed,
    source_line,
    source_state,
    table_head,
    table_row,
    use_head_snapshot,
    with_peak_memory,
)
from rank_dumps import ALLREDUCE_OP, LOG_OP, dump_name, generate

TASKS = ("open", "first", "analyze")
TARGET_S = 5.0
TARGET_MIB = 2048.0
PROFILE_TOP = 25

# -- the children -------------------------------------------------------------------------------


def _view(v: Any) -> dict[str, Any] | None:
    """An EventView's rank, op, step, kind and index (what the tables show)."""
    if v is None:
        return None
    return {
        "rank": v.rank,
        "op": v.op_type,
        "step": v.step,
        "kind": v.kind,
        "index": v.index,
    }


def child_read(cfg: dict[str, Any]) -> dict[str, Any]:
    """One task (``cfg["task"]``) on ``cfg["dump"]``: its times, what it found, peak memory."""
    perf = time.perf_counter
    t0 = perf()
    import nanscope
    from nanscope.analysis import analyze
    from nanscope.report import headline, note_texts, report_json

    out: dict[str, Any] = {
        "task": cfg["task"],
        "import_s": perf() - t0,
        "nanscope": nanscope_location(),
    }
    out["rss_after_import_mib"] = peak_rss_mib()
    t = perf()
    if cfg["task"] == "profile-open":
        import cProfile

        prof = cProfile.Profile()
        r = prof.runcall(nanscope.open_dump, cfg["dump"])
        out["profile_cumulative"], out["profile_tottime"] = _listings(prof, cfg)
    else:
        r = nanscope.open_dump(cfg["dump"])
    out["processes"] = len(r.processes)
    out["executions"] = r.num_executions()
    out["sidecar_used"] = r.decoded_for_index() == 0
    out["open_s"] = perf() - t
    out["rss_after_open_mib"] = peak_rss_mib()
    t = perf()
    if cfg["task"] == "first":
        ref = r.first_nonfinite()
        if ref is not None:
            ex = r.execution(ref.index)
            out["found"] = {
                "rank": r.processes[ref.process].rank,
                "op": ex.op_type,
                "step": ex.step,
                "wall_time": ex.wall_time,
                "collective": ex.collective.to_json() if ex.collective else None,
            }
    elif cfg["task"] in ("analyze", "profile"):
        if cfg["task"] == "profile":
            import cProfile

            prof = cProfile.Profile()
            a = prof.runcall(analyze, r)
            out["profile_cumulative"], out["profile_tottime"] = _listings(prof, cfg)
        else:
            a = analyze(r)
        out["origin"] = _view(a.origin)
        out["origin_kind"] = a.origin_kind
        out["cause"] = _view(a.cause)
        out["headline"] = headline(a)
        out["alerts"] = a.alerts.total
        out["notes"] = note_texts(a)
        out["lineages"] = sum(g.count for g in a.lineages)
        report = report_json(a)
        out["ranks"] = report.get("ranks")  # the cross-rank analysis's answer, where present
    out["query_s"] = perf() - t
    out["cold_s"] = out["open_s"] + out["query_s"]
    return with_peak_memory(out)


def _listings(prof: Any, cfg: dict[str, Any]) -> tuple[str, str]:
    """A profile's top functions by cumulative time, and by own time."""
    import io
    import pstats

    out = []
    for key in ("cumulative", "tottime"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(cfg.get("top", PROFILE_TOP))
        out.append(buf.getvalue())
    return out[0], out[1]


CHILDREN = {"read": child_read}

# -- the parent ---------------------------------------------------------------------------------


def parse_dumps(text: str) -> list[tuple[int, int]]:
    """``256x100000,1024x1e4`` -> [(256, 100000), (1024, 10000)]."""
    out = []
    for part in text.split(","):
        ranks, events = part.lower().split("x")
        out.append((int(ranks), int(float(events))))
    return out


def run_read(task: str, dump: str, timeout: float | None) -> dict[str, Any]:
    """One task in a fresh child; ``{"error": ...}`` when it fails or runs out of time."""
    label = f"{task} {Path(dump).name}"
    try:
        res = run_timed(
            "scale_ranks", "read", {"task": task, "dump": dump}, label=label, timeout=timeout
        )
    except ChildFailed as exc:
        log(f"  {label}: FAILED ({exc.reason}): {exc.message}")
        return {"error": exc.message, "reason": exc.reason, "wall_s": exc.wall_s}
    log(
        f"  {label}: {res['wall_s']:.1f}s (open {res['open_s']:.2f}s, query "
        f"{res['query_s']:.2f}s), peak {res['peak_rss_mib']:,.0f} MiB"
    )
    return res


def warm(dump: str) -> float:
    """Read every file of the dump once, so that every task finds it in the page cache."""
    t = time.perf_counter()
    buf = bytearray(8 << 20)
    for p in sorted(Path(dump).iterdir()):
        with open(p, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass
    return time.perf_counter() - t


def median_run(results: list[dict[str, Any]], field: str) -> dict[str, Any] | None:
    """The result with the median ``field`` among the successful ones."""
    ok = sorted((r for r in results if "error" not in r), key=lambda r: r[field])
    return ok[len(ok) // 2] if ok else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--dumps", default="16x10000", help="RANKSxEVENTS (per rank), comma-separated")
    ap.add_argument(
        "--bad-rank", type=int, help="the rank where the -inf is born (default 137 * RANKS // 256)"
    )
    ap.add_argument(
        "--bad-at", type=float, default=0.9, help="the bad step, as a fraction of steps"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="ranks written at once (one process each)",
    )
    ap.add_argument("--keep", metavar="DIR", help="keep the dumps here (reused when present)")
    ap.add_argument("--generate", metavar="DIR", help="only write the --dumps to DIR")
    ap.add_argument("--repeats", type=int, default=3, help="children per task (median)")
    ap.add_argument("--analyze-repeats", type=int, help="children for analyze (default --repeats)")
    ap.add_argument("--budget", type=float, default=900.0, help="seconds a task may take")
    ap.add_argument(
        "--profile", action="store_true", help="also profile analyze (cProfile) on the largest dump"
    )
    ap.add_argument(
        "--at-head",
        action="store_true",
        help="measure src/ of the commit at HEAD (git archive), not the working tree",
    )
    args = ap.parse_args(argv)
    dumps = parse_dumps(args.dumps)
    if args.analyze_repeats is None:
        args.analyze_repeats = args.repeats
    if args.generate:
        for ranks, events in dumps:
            rec = make(args, Path(args.generate), ranks, events)
            print(json.dumps({k: v for k, v in rec.items() if k != "ranks"}, indent=1))
        return 0
    root = args.keep or tempfile.mkdtemp(prefix="scale_ranks_", dir="/tmp")
    Path(root).mkdir(parents=True, exist_ok=True)
    try:
        return run(args, Path(root), dumps)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def make(args: argparse.Namespace, root: Path, ranks: int, events: int) -> dict[str, Any]:
    bad = args.bad_rank if args.bad_rank is not None else 137 * ranks // 256
    return generate(
        root / dump_name(ranks, events),
        ranks=ranks,
        events=events,
        bad_rank=bad,
        bad_at=args.bad_at,
        seed=args.seed,
        jobs=args.jobs,
    )


def run(args: argparse.Namespace, root: Path, dumps: list[tuple[int, int]]) -> int:
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    start_state = use_head_snapshot(root) if args.at_head else source_state()
    log(f"nanscope many-rank benchmark, {started}; dumps under {root}")
    sections = []
    for ranks, events in dumps:
        rec = make(args, root, ranks, events)
        log(
            f"{Path(rec['dump']).name}: {rec['bytes'] / 2**30:.2f} GiB in {rec['files']:,} files, "
            f"page cache warmed in {warm(rec['dump']):.1f}s"
        )
        results: dict[str, list[dict[str, Any]]] = {t: [] for t in TASKS}
        for rep in range(args.repeats):
            for task in TASKS:
                if task == "analyze" and rep >= args.analyze_repeats:
                    continue
                log(f"round {rep + 1}: {task}")
                results[task].append(run_read(task, rec["dump"], args.budget))
        sections.append({"ranks": ranks, "events": events, "record": rec, "results": results})
    profile = None
    profile_open: dict[str, Any] | None = None
    if args.profile:
        big = max(sections, key=lambda s: s["ranks"] * s["events"])
        log(f"profiling analyze on {Path(big['record']['dump']).name}")
        profile = (big, run_read("profile", big["record"]["dump"], args.budget))
        log(f"profiling open on {Path(big['record']['dump']).name}")
        profile_open = run_read("profile-open", big["record"]["dump"], args.budget)
    end_state = source_state() if not args.at_head else start_state
    text, problems = report(args, sections, profile, profile_open, started, start_state, end_state)
    print(text)
    return 1 if problems else 0


# -- the report ---------------------------------------------------------------------------------


def _who(found: dict[str, Any] | None) -> str:
    if not found:
        return "-"
    return f"rank {found['rank']}, {found['op']}, step {found['step']}"


def report(
    args: argparse.Namespace,
    sections: list[dict[str, Any]],
    profile: tuple[dict[str, Any], dict[str, Any]] | None,
    profile_open: dict[str, Any] | None,
    started: str,
    start_state: str,
    end_state: str,
) -> tuple[str, list[str]]:
    """The markdown that bench/RESULTS.md records, and the failed checks."""
    lines: list[str] = []
    add = lines.append
    problems: list[str] = []
    add(f"Machine: {machine()}; started {started}")
    add(source_line(start_state, end_state))
    used = sorted(
        {
            r["nanscope"]
            for s in sections
            for rs in s["results"].values()
            for r in rs
            if r.get("nanscope")
        }
    )
    add(f"nanscope imported by the children from: {', '.join(used) or '?'}")
    add(
        f"Median of {args.repeats} fresh subprocesses per task ({args.analyze_repeats} for "
        "analyze); times exclude imports; 'cold' = "
        "open + query; page cache warm. Peak RSS = ru_maxrss of the child (imports included)."
    )
    add("")
    add("### The dumps")
    add("")
    lines.extend(
        table_head(
            [
                "Dump",
                "ranks",
                "events per rank",
                "events",
                "steps per rank",
                "allreduces per rank",
                "non-finite events",
                "files",
                "on disk (GiB)",
                "bytes/event: .execution, .nsidx",
                "written in (s)",
                "bad rank (clock offset), step",
            ]
        )
    )
    for s in sections:
        rec = s["record"]
        rs = rec["ranks"]
        n = sum(r["events"] for r in rs)
        plan = rec["plan"]
        gen = f"{rec['wall_s']:.0f}" + (" (reused)" if rec.get("reused") else "")
        add(
            table_row(
                [
                    dump_name(s["ranks"], s["events"]),
                    s["ranks"],
                    f"{rs[0]['events']:,}",
                    f"{n:,}",
                    f"{rs[0]['steps']:,}",
                    f"{rs[0]['allreduces']:,}",
                    f"{sum(r['nonfinite'] for r in rs):,}",
                    f"{rec['files']:,}",
                    f"{rec['bytes'] / 2**30:.2f}",
                    f"{rec['execution_bytes'] / n:.0f}, {rec['index_bytes'] / n:.0f}",
                    f"{gen} ({args.jobs} at once)",
                    f"{plan['bad_rank']} (+{plan['offset']:.1f} s), {plan['bad_step']}",
                ]
            )
        )
    add("")
    add("### Reading")
    add("")
    lines.extend(
        table_head(
            [
                "Dump",
                "open + index (s)",
                "open: peak MiB",
                "first alert, cold (s)",
                "analyze(), cold (s)",
                "analyze() only (s)",
                "analyze(): peak MiB",
                "open, us per event",
                "analyze() only, us per event",
            ]
        )
    )
    targets: list[str] = []
    for s in sections:
        res = s["results"]
        n = s["ranks"] * s["events"]
        op, fi, an = (median_run(res[t], "cold_s") for t in TASKS)

        def g(r: dict[str, Any] | None, f: str) -> float | None:
            return r.get(f) if r else None

        def per_event(x: float | None, n: int = n) -> str:
            return "-" if x is None else f"{x * 1e6 / n:.2f}"

        failed = [r for r in res["analyze"] if "error" in r]
        an_cold = fmt_s(g(an, "cold_s")) if an else f"failed: {failed[0]['reason']}"
        add(
            table_row(
                [
                    dump_name(s["ranks"], s["events"]),
                    fmt_s(g(op, "open_s")),
                    fmt_mib(g(op, "peak_rss_mib")),
                    fmt_s(g(fi, "cold_s")),
                    an_cold,
                    fmt_s(g(an, "query_s")),
                    fmt_mib(g(an, "peak_rss_mib")),
                    per_event(g(op, "open_s")),
                    per_event(g(an, "query_s")),
                ]
            )
        )
        plan = s["record"]["plan"]
        truth = {"rank": plan["bad_rank"], "op": LOG_OP, "step": plan["bad_step"]}
        s["truth"] = truth
        if (s["ranks"], s["events"]) in ((256, 100_000), (1024, 10_000)):
            cold = g(an, "cold_s")
            right = bool(an) and _matches(an.get("cause") or an.get("origin"), truth)
            line = (
                f"- {dump_name(s['ranks'], s['events'])}: cross-rank cause < {TARGET_S:.0f} s: "
                f"{fmt_s(cold)} s -> {'PASS' if cold is not None and cold < TARGET_S and right else 'FAIL'}"
            )
            if not right:
                line += " (the cause found is not the birth)"
            targets.append(line)
            if s["ranks"] == 256:
                peak = g(an, "peak_rss_mib")
                ok = peak is not None and peak < TARGET_MIB
                targets.append(
                    f"- {dump_name(s['ranks'], s['events'])}: peak < 2 GiB: "
                    f"{fmt_mib(peak)} MiB -> {'PASS' if ok else 'FAIL'}"
                )
    if len(sections) > 1:
        base = min(sections, key=lambda s: s["ranks"] * s["events"])
        add("")
        add(f"Against the smallest dump ({dump_name(base['ranks'], base['events'])}):")
        add("")
        lines.extend(
            table_head(
                ["Dump", "events", "open", "first alert", "analyze() only", "analyze(): peak MiB"]
            )
        )
        b_res = {t: median_run(base["results"][t], "cold_s") for t in TASKS}
        for s in sections:
            res = {t: median_run(s["results"][t], "cold_s") for t in TASKS}

            def ratio(t: str, f: str, res: dict[str, Any] = res) -> str:
                a, b = res[t], b_res[t]
                return fmt_ratio(a.get(f) if a else None, b.get(f) if b else None)

            add(
                table_row(
                    [
                        dump_name(s["ranks"], s["events"]),
                        fmt_ratio(s["ranks"] * s["events"], base["ranks"] * base["events"]),
                        ratio("open", "open_s"),
                        ratio("first", "cold_s"),
                        ratio("analyze", "query_s"),
                        ratio("analyze", "peak_rss_mib"),
                    ]
                )
            )
    add("")
    add("### What was found (the birth: the bad rank's aten.log.default at the bad step)")
    add("")
    lines.extend(
        table_head(
            [
                "Dump",
                "the birth",
                "first alert by wall clock",
                "analyze(): origin",
                "analyze(): cause",
                "right?",
                "report's ranks",
            ],
            numeric=False,
        )
    )
    for s in sections:
        fi = median_run(s["results"]["first"], "cold_s")
        an = median_run(s["results"]["analyze"], "cold_s")
        truth = s["truth"]
        first = fi.get("found") if fi else None
        if first and first["op"] == ALLREDUCE_OP and first.get("collective"):
            first_txt = f"{_who(first)} ({ALLREDUCE_OP} #{first['collective']['sequence']})"
        else:
            first_txt = _who(first)
        right = bool(an) and _matches(an.get("cause") or an.get("origin"), truth)
        if an and not right:
            problems.append(
                f"{dump_name(s['ranks'], s['events'])}: analyze() did not find the birth"
            )
        ranks = an.get("ranks") if an else None
        add(
            table_row(
                [
                    dump_name(s["ranks"], s["events"]),
                    _who(truth),
                    first_txt,
                    _who(an.get("origin")) if an else "failed",
                    _who(an.get("cause")) if an else "-",
                    "yes" if right else "no",
                    "-" if ranks is None else json.dumps(ranks)[:200],
                ]
            )
        )
    add("")
    add("Targets:")
    lines.extend(targets or ["- (neither target size was run)"])
    if profile is not None:
        sec, res = profile
        add("")
        add(
            f"### analyze() under cProfile, {dump_name(sec['ranks'], sec['events'])} "
            f"(top {PROFILE_TOP})"
        )
        add("")
        if "error" in res:
            add(f"failed: {res['error']}")
        else:
            add(
                f"analyze() took {res['query_s']:.1f} s under the profiler "
                f"(open {res['open_s']:.1f} s), peak {res['peak_rss_mib']:,.0f} MiB."
            )
            _add_listings(add, res)
    if profile is not None and profile_open is not None:
        sec = profile[0]
        add("")
        add(
            f"### open under cProfile, {dump_name(sec['ranks'], sec['events'])} (top {PROFILE_TOP})"
        )
        add("")
        if "error" in profile_open:
            add(f"failed: {profile_open['error']}")
        else:
            add(
                f"open took {profile_open['open_s']:.1f} s under the profiler, peak "
                f"{profile_open['peak_rss_mib']:,.0f} MiB."
            )
            _add_listings(add, profile_open)
    return "\n".join(lines), problems


def _add_listings(add: Callable[[str], None], res: dict[str, Any]) -> None:
    """A profile's two listings, by cumulative and by own time, as markdown code blocks."""
    for title, key in (("", "profile_cumulative"), ("By own time:", "profile_tottime")):
        if title:
            add("")
            add(title)
        add("")
        add("```")
        add(_trim(res[key]))
        add("```")


def _matches(found: dict[str, Any] | None, truth: dict[str, Any]) -> bool:
    return bool(found) and all(found.get(k) == v for k, v in truth.items())  # type: ignore[union-attr]


def _trim(text: str) -> str:
    """A pstats listing from its header row on, paths shortened to the package."""
    out = []
    keep = False
    for line in text.splitlines():
        keep = keep or line.lstrip().startswith("ncalls")
        if keep and line.strip():
            out.append(line.replace(str(Path(sys.prefix)), "<venv>"))
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
