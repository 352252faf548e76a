"""The markdown bench/scale.py prints (and bench/RESULTS.md records), and its checks."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from dump_reads import PAGE, page_offset
from harness import (
    fmt_mib,
    fmt_ratio,
    fmt_s,
    machine,
    median_of,
    source_line,
    table_head,
    table_row,
)
from scale_program import LOG_OP

GENERATOR_COLUMNS = [
    "Dump",
    "traces",
    "executions",
    "steps per rank",
    "graph ops per rank",
    "source files per rank (generated)",
    "stack frames per rank",
    "stacks per rank (max depth)",
    "on disk (data + .nsidx)",
    "bytes/trace: data, + .nsidx",
    "written in (s)",
]
# (reader, dump key, task) -> the results of its children
Results = dict[tuple[str, str, str], list[dict[str, Any]]]
Add = Callable[[str], None]


def report(
    args: argparse.Namespace,
    sections: list[dict[str, Any]],
    tf_on: str | None,
    tf_multi_error: str,
    started: str,
    start_state: str,
    end_state: str,
) -> tuple[str, list[str]]:
    """The markdown that bench/RESULTS.md records, and the failed checks."""
    lines: list[str] = []
    add = lines.append
    problems: list[str] = []
    targets: list[str] = []
    add(f"Machine: {machine()}; started {started}")
    add(source_line(start_state, end_state))
    used = sorted(
        {
            r["nanscope"]
            for sec in sections
            for group in (*sec["results"].values(), *(d["ranks"] for d in sec["dumps"].values()))
            for r in group
            if r.get("nanscope")
        }
    )
    add(f"nanscope imported by the children from: {', '.join(used) or '?'}")
    if len(used) > 1:
        problems.append(f"the children imported nanscope from {len(used)} places: {used}")
    add(
        f"nanscope: median of {args.repeats} fresh subprocesses per task; TensorFlow: one per "
        "task. Times exclude imports; 'cold' = open + query; each dump read once before (page "
        "cache warm). Peak RSS = ru_maxrss of the child (includes the imports)."
    )
    if tf_on == "single" and args.ranks > 1:
        add(
            f"TensorFlow's DebugDataReader on the {args.ranks}-rank dump: {tf_multi_error} (it "
            "takes the graphs of the first file set only). Both readers are therefore also "
            "measured on a 1-rank dump of the same size; the ratios are from that dump."
        )
    add("")
    generator_table(args, sections, add)
    for sec in sections:
        size_table(args, sec, tf_on, add, targets, problems)
    if targets:
        add("Targets (10M-trace dump: first alert under 5 s, peak reader memory under 1 GiB):")
        lines.extend(targets)
    else:
        add("Targets (10M-trace dump: first alert < 5 s, peak reader memory < 1 GiB): not run.")
    if problems:
        add("")
        add("CHECK FAILURES:")
        lines.extend(f"- {p}" for p in problems)
    return "\n".join(lines), problems


def generator_table(args: argparse.Namespace, sections: list[dict[str, Any]], add: Add) -> None:
    """One row per dump: what the generator wrote, and how long it took."""
    for line in table_head(GENERATOR_COLUMNS):
        add(line)
    for sec in sections:
        for d in sec["dumps"].values():
            rs, p = d["ranks"], d["params"]
            steps = sorted({r["steps"] for r in rs})
            steps_s = f"{steps[0]:,}" if len(steps) == 1 else f"{steps[0]:,}-{steps[-1]:,}"
            files = max(r["files"] for r in rs)
            generated = max(r["generated_files"] for r in rs)
            stacks = max(r["stacks"] for r in rs)
            depth = max(r["max_stack_depth"] for r in rs)
            per_trace = d["trace_bytes"] / p["traces"]
            per_trace_idx = (d["trace_bytes"] + d["index_bytes"]) / p["traces"]
            how = f"{min(args.jobs, p['ranks'])} ranks at once" if p["ranks"] > 1 else "1 process"
            when = "an earlier run, reused" if d.get("reused") else how
            add(
                f"| {p['ranks']} rank{'s' if p['ranks'] > 1 else ''} "
                f"| {sum(r['traces'] for r in rs):,} | {sum(r['executions'] for r in rs):,} "
                f"| {steps_s} | {rs[0]['graph_ops']:,} | {files} ({generated}) "
                f"| {max(r['frames'] for r in rs):,} | {stacks:,} ({depth}) "
                f"| {d['bytes'] / 2**30:.2f} GiB | {per_trace:.0f}, {per_trace_idx:.0f} "
                f"| {d['wall_s']:.0f} ({when}) |"
            )
    add("")


def _median(results: Results, impl: str, key: str | None, task: str, field: str) -> float | None:
    """The median of ``field`` over the children of one reader, dump and task."""
    return median_of(results.get((impl, key or "", task), []), field)


def size_table(
    args: argparse.Namespace,
    sec: dict[str, Any],
    tf_on: str | None,
    add: Add,
    targets: list[str],
    problems: list[str],
) -> None:
    """One size's table (both readers side by side), its root cause, checks and targets."""
    size, dumps, results = sec["size"], sec["dumps"], sec["results"]
    keys = list(dumps)
    tf_key = tf_on if tf_on in dumps else None
    cols = [("nanscope", k) for k in keys] + ([("tensorflow", tf_key)] if tf_key else [])

    def label(impl: str, key: str) -> str:
        n = dumps[key]["params"]["ranks"]
        who = "nanscope" if impl == "nanscope" else "TensorFlow"
        return f"{who}, {n} rank{'s' if n > 1 else ''}"

    def tf_missing(task: str) -> str:
        rs = results.get(("tensorflow", tf_key or "", task), [])
        if any(r.get("timeout") for r in rs) or (not rs and sec["tf_note"]):
            return "did not finish"
        return "failed" if any("error" in r for r in rs) else "-"

    def row(
        name: str, task: str, field: str, mib: bool = False, tf_task: str = "", tf_field: str = ""
    ) -> None:
        """A row; TensorFlow's figure may come from another of its children."""
        tt, tfld = tf_task or task, tf_field or field
        vals: list[str] = []
        for impl, key in cols:
            v = _median(
                results,
                impl,
                key,
                tt if impl == "tensorflow" else task,
                tfld if impl == "tensorflow" else field,
            )
            if v is None and impl == "tensorflow":
                vals.append(tf_missing(tt))
            else:
                vals.append(fmt_mib(v) if mib else fmt_s(v))
        ratio = "-"
        if tf_key:
            ratio = fmt_ratio(
                _median(results, "tensorflow", tf_key, tt, tfld),
                _median(results, "nanscope", tf_key, task, field),
            )
        add(table_row([name, *vals, ratio]))

    add(f"### {size:,} traces")
    add("")
    head = [label(i, k or "") for i, k in cols]
    on = f" ({dumps[tf_key]['params']['ranks']}-rank dump)" if tf_key else ""
    for line in table_head(["Task", *head, f"TF / nanscope{on}"]):
        add(line)
    # TensorFlow has no open child of its own: its import, open (update()) and the
    # memory after it come from its first-alert child.
    row("import (s)", "first", "import_s")
    row("open + index (s)", "open", "open_s", tf_task="first")
    row("open + index: peak RSS (MiB)", "open", "peak_rss_mib", True, "first", "rss_after_open_mib")
    row("first alert: cold, open + first_nonfinite() + decode (s)", "first", "cold_s")
    row("first alert: query only (s)", "first", "query_s")
    row("first alert: peak RSS (MiB)", "first", "peak_rss_mib", True)
    row(f"page of {PAGE} at {page_offset(size):,}: cold (s)", "page", "cold_s")
    row(f"page of {PAGE}: query only (s)", "page", "query_s")
    row(f"page of {PAGE}: peak RSS (MiB)", "page", "peak_rss_mib", True)
    row("analyze(): cold, open + analyze (s)", "analyze", "cold_s")
    row("analyze() only (s)", "analyze", "query_s")
    row("analyze(): peak RSS (MiB)", "analyze", "peak_rss_mib", True)
    add("")
    if sec["tf_note"]:
        add(f"TensorFlow at {size:,} traces: {sec['tf_note']}.")
        add("")
    an = next(
        (r for r in results.get(("nanscope", keys[0], "analyze"), []) if "error" not in r), None
    )
    if an is not None:
        add(
            f"Root cause found by analyze() ({label('nanscope', keys[0])}): {an.get('headline')} "
            f"({an.get('origin_kind')}; {an.get('alerts')} alerts; chain of {an.get('chain')}; "
            f"source {an.get('source')} `{an.get('code')}`, {an.get('stack_depth')} frames)."
        )
        add("")
    check_size(size, dumps, results, tf_key, problems)
    if size < 10_000_000:
        return
    for key in keys:
        who = f"{size:,} traces, {label('nanscope', key)}"
        cold = _median(results, "nanscope", key, "first", "cold_s")
        imp = _median(results, "nanscope", key, "first", "import_s") or 0.0
        if cold is not None:
            verdict = "PASS" if cold < 5 else "FAIL"
            targets.append(
                f"- {who}: first alert < 5 s (cold, excl. import): {cold:.2f} s "
                f"({cold + imp:.2f} s with the import) -> {verdict}"
            )
        peaks = {
            t: v
            for t in ("open", "first", "page", "analyze")
            if (v := _median(results, "nanscope", key, t, "peak_rss_mib")) is not None
        }
        if peaks:
            worst = max(peaks, key=lambda t: peaks[t])
            first = peaks.get("first")
            first_s = (
                f"first alert {first:,.0f} MiB -> {'PASS' if first < 1024 else 'FAIL'}; "
                if first is not None
                else ""
            )
            targets.append(
                f"- {who}: peak reader memory < 1 GiB (1,024 MiB): {first_s}worst task "
                f"({worst}) {peaks[worst]:,.0f} MiB -> {'PASS' if peaks[worst] < 1024 else 'FAIL'}"
            )


def check_size(
    size: int,
    dumps: dict[str, dict[str, Any]],
    results: Results,
    tf_key: str | None,
    problems: list[str],
) -> None:
    """Both readers found what the generator planted, and agree with each other."""
    for key, d in dumps.items():
        plans = d["plans"]
        bad_rank = next((i for i, p in enumerate(plans) if p["bad_step"] is not None), None)
        bad_step = plans[bad_rank]["bad_step"] if bad_rank is not None else None
        planted = sum(len(p["expected_nonfinite"]) for p in plans)
        executions = sum(p["executions"] for p in plans)
        for task in ("open", "first", "page", "analyze"):
            for res in results.get(("nanscope", key, task), []):
                tag = f"{size:,} traces, {key} dump, nanscope {task}"
                if "error" in res:
                    problems.append(f"{tag}: {res['error']}")
                    continue
                if (res["num_traces"], res["num_executions"]) != (size, executions):
                    problems.append(
                        f"{tag}: {res['num_traces']:,} traces, {res['num_executions']:,} executions"
                    )
                if not res.get("sidecar_used"):
                    problems.append(f"{tag}: the index was not built from the .nsidx sidecars")
                found = (res.get("op_name"), res.get("rank"), res.get("step"))
                if task == "first" and found != (LOG_OP, bad_rank, bad_step):
                    problems.append(
                        f"{tag}: first alert {found}, planted {LOG_OP} {bad_rank} {bad_step}"
                    )
                if task == "page" and res["count"] != min(PAGE, size - page_offset(size)):
                    problems.append(f"{tag}: page of {res['count']}")
                if task == "analyze" and (
                    found != (LOG_OP, bad_rank, bad_step) or res.get("alerts") != planted
                ):
                    problems.append(
                        f"{tag}: origin {found}, {res.get('alerts')} alerts; planted {planted}"
                    )
    if not tf_key:
        return
    for task, fields in (("first", ("op_name", "value")), ("page", ("first_op", "checksum"))):
        a = next(iter(results.get(("nanscope", tf_key, task), [])), {})
        b = next(iter(results.get(("tensorflow", tf_key, task), [])), {})
        if (
            b
            and "error" not in b
            and tuple(a.get(f) for f in fields) != tuple(b.get(f) for f in fields)
        ):
            problems.append(
                f"{size:,} traces: {task} differs: nanscope {[a.get(f) for f in fields]} vs "
                f"TensorFlow {[b.get(f) for f in fields]}"
            )
