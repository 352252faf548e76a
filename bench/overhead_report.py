"""The markdown bench/overhead_torch.py prints (and bench/RESULTS.md records)."""

from __future__ import annotations

from typing import Any

from harness import table_head, table_row
from overhead_variants import MODES, NO_RANGES, PYTHON_RECORDER

# Targets from the issue: (model, variant, limit) on the wall ratio.
TARGETS = [
    ("mlp", "NO_TENSOR", 1.3),
    ("mlp", "FULL_HEALTH", 1.2),  # with the headroom ranges (issue 17's target)
    ("transformer", "FULL_HEALTH", 1.5),
    ("transformer", "check_numerics", 1.3),
]
TIMING_HEAD = table_head(
    [
        "variant",
        "step ms (median)",
        "ratio (wall; min–max over rounds)",
        "ratio (CPU time)",
        "peak RSS MiB",
        "RSS ratio",
    ],
    numeric=False,
)


def _fmt(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    """A figure, or "–" when not measured."""
    return "–" if x is None else f"{x:{spec}}{suffix}"


def _label(v: str, framework: str) -> str:
    """A variant's name in the tables."""
    if framework == "tf":
        return f"TF {v}"
    if v in ("plain", "detect_anomaly"):
        return f"torch {v}"
    if v in PYTHON_RECORDER or v.startswith("python:"):
        return f"nanscope {v.split(':')[1]} (Python recorder)"
    if v == NO_RANGES:
        return "nanscope FULL_HEALTH without ranges (NANSCOPE_HEADROOM=0)"
    if v == "FULL_HEALTH":
        return "nanscope FULL_HEALTH (with ranges)"
    return f"nanscope {v}"


def table(timing: dict[str, Any], mem: dict[str, Any], framework: str = "torch") -> list[str]:
    """Timing rows, one per variant, with the peak RSS of its memory child."""
    lines = []
    plain_rss = mem.get("plain", {}).get("ru_maxrss")
    for v, t in timing.items():
        if v.startswith("_"):
            continue
        m = mem.get(v, {})
        rss = m.get("ru_maxrss")
        spread = "" if v == "plain" else f" ({t['ratio_wall_min']:.2f}–{t['ratio_wall_max']:.2f})"
        lines.append(
            f"| {_label(v, framework)} | {t['step_ms']:.2f} | {t['ratio_wall']:.2f}x{spread} "
            f"| {t['ratio_cpu']:.2f}x | {_fmt(rss, '.0f')} "
            f"| {_fmt(rss / plain_rss if rss and plain_rss else None, '.2f', 'x')} |"
        )
    return lines


def dump_table(torch_mem: dict[str, Any], tf_mem: dict[str, Any]) -> list[str]:
    """Dump sizes per mode, nanscope's and TensorFlow's side by side."""
    lines = table_head(
        [
            "mode",
            "nanscope ops/step",
            "nanscope B/op (.execution)",
            "nanscope dump B/step",
            "nanscope dump total",
            "TF ops/step",
            "TF B/op (.execution)",
            "TF dump B/step",
            "TF dump total (of which source snapshots)",
        ],
        numeric=False,
    )

    def facts(m: dict[str, Any]) -> tuple[str, str, str, str]:
        d = m.get("dump")
        if not d or not d.get("execution_records"):
            return ("–", "–", "–", "–")
        per_op = d["execution_bytes"] / d["execution_records"]
        ops = d["executions"] / d["steps"]
        return (
            f"{ops:.0f}",
            f"{per_op:,.0f}",
            f"{per_op * ops:,.0f}",
            f"{d['total_bytes'] / 2**20:.2f} MiB",
        )

    for mode in MODES:
        a = facts(torch_mem.get(mode, {}))
        tm = tf_mem.get(mode, {})
        b = facts(tm)
        src = tm.get("dump", {}).get("source_file_bytes")
        tail = f"{b[3]} ({src / 2**20:.2f} MiB)" if src else b[3]
        lines.append(table_row([mode, *a, *b[:3], tail]))
    return lines


def report(r: dict[str, Any]) -> list[str]:
    """The whole report of a run (its ``--json`` results)."""
    s = r["settings"]
    out = [
        f"{r['command']}  ({r['date']}; commit {r['git']}; {r['machine']}; {r['seconds']:.0f} s; "
        f"load average {r['loadavg_start'][0]:.2f} at start, {r['loadavg_end'][0]:.2f} at end)",
        "",
        f"### MLP 784-500-10, batch 100 ({s['mlp_rounds']} rounds x {s['mlp_steps']} steps "
        "after 3 warm-up steps; peak RSS over "
        f"{s['mem_steps']} steps)",
        "",
        *TIMING_HEAD,
        *table(r["mlp"], r["memory"]["mlp"]),
    ]
    if "tf_mlp" in r:
        out += table(r["tf_mlp"], r["memory"]["tf_mlp"], "tf")
    if "transformer" in r:
        out += [
            "",
            f"### Transformer (4 x d_model 256, batch {s['transformer_batch']}, sequence 128) "
            f"({s['transformer_rounds']} rounds x 1 step after 1 warm-up step; "
            "peak RSS over 2 steps; no FULL_TENSOR)",
            "",
            *TIMING_HEAD,
            *table(r["transformer"], r["memory"]["transformer"]),
        ]
    if "steady" in r:
        out += [
            "",
            f"### MLP, long runs ({s.get('steady_rounds', 3)} rounds x {s['steady_steps']} steps after 20 warm-up steps, "
            "one session each)",
            "",
            "Each round keeps one recording session on for all its steps (~2 s), so the writer's",
            "periodic flushes and the background threads' work fall inside the timed steps;",
            "the mean step is what a long training run's throughput sees.",
            "",
            *table_head(
                [
                    "variant",
                    "step ms (median)",
                    "step ms (mean)",
                    "ratio of medians",
                    "ratio of means",
                    "p99 step ms",
                    "ratio of p99s",
                    "max step ms",
                ],
                numeric=False,
            ),
        ]
        for v, t in r["steady"].items():
            out.append(
                f"| {_label(v, 'torch')} | {t['step_ms']:.2f} | {t['step_mean_ms']:.2f} "
                f"| {t['ratio_wall']:.2f}x | {t['ratio_mean']:.2f}x | {t['step_p99_ms']:.2f} "
                f"| {t['ratio_p99']:.2f}x | {t['step_max_ms']:.1f} |"
            )
    if r["memory"]["mlp"]:
        out += [
            "",
            f"### Dumps of the MLP ({s['mem_steps']} steps, circular buffer 1000)",
            "",
            *dump_table(r["memory"]["mlp"], r["memory"]["tf_mlp"]),
        ]
    out += ["", "### Targets (wall ratio)", ""]
    for model, v, limit in TARGETS:
        if model in r and v in r[model]:  # --variants may leave a target's variant out
            got = r[model][v]["ratio_wall"]
            verdict = "PASS" if got <= limit else "FAIL"
            out.append(f"- {model} {v} ≤ {limit}x: {got:.2f}x {verdict}")
    if "mlp" in r and {"FULL_HEALTH", "detect_anomaly"} <= set(r["mlp"]):
        fh = r["mlp"]["FULL_HEALTH"]["ratio_wall"]
        an = r["mlp"]["detect_anomaly"]["ratio_wall"]
        out.append(
            f"- mlp FULL_HEALTH below detect_anomaly ({an:.2f}x): {fh:.2f}x "
            f"{'PASS' if fh < an else 'FAIL'}"
        )
    if "tf_mlp" in r:
        for v in [m for m in [*MODES, "check_numerics"] if m in r["mlp"]]:
            ns, tf = r["mlp"][v]["ratio_wall"], r["tf_mlp"][v]["ratio_wall"]
            out.append(
                f"- mlp {v} below TensorFlow's ({tf:.2f}x): {ns:.2f}x "
                f"{'PASS' if ns < tf else 'FAIL'}"
            )
    return out
