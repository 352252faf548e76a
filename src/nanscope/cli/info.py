"""Show what a dump holds: processes, mode, event counts, problems, the first Inf/NaN."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console

from nanscope.reader import EXECUTIONS, TRACES, DumpReader

HELP = "summarise a dump: processes, counts, the first Inf/NaN event"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("logdir", help="the dump root (the directory the program wrote to)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def facts(reader: DumpReader) -> dict[str, Any]:
    """The dump's facts as a JSON-ready dict."""
    first = reader.first_nonfinite()
    out: dict[str, Any] = {
        "logdir": str(reader.dump_root),
        "run_id": reader.run_id,
        "framework": reader.framework,
        "tensor_debug_mode": reader.tensor_debug_mode.name if reader.tensor_debug_mode else None,
        "processes": [
            {"name": p.name, "host": p.host, "rank": p.rank, "pid": p.pid, "framework": p.framework}
            for p in reader.processes
        ],
        "num_executions": reader.num_executions(),
        "num_graph_execution_traces": reader.num_graph_execution_traces(),
        "num_nonfinite_executions": int(reader.nonfinite(EXECUTIONS).size),
        "num_nonfinite_graph_execution_traces": int(reader.nonfinite(TRACES).size),
        "first_nonfinite": None,
        "problems": [{"severity": p.severity, "message": p.message} for p in reader.problems],
    }
    if first is not None:
        if first.kind == EXECUTIONS:
            ev = reader.execution(first.index)
            frames = reader.stack(ev)
            op, name = ev.op_type, ev.op_type
            h = ev.health
        else:
            tr = reader.trace(first.index)
            op_info = reader.graph_op(tr.graph_id, tr.op_name, tr.process)
            frames = reader.stack(op_info, tr.process) if op_info else []
            op, name, h = tr.op_type, tr.op_name, tr.health
        user = frames[-1] if frames else None
        out["first_nonfinite"] = {
            "kind": first.kind,
            "index": first.index,
            "process": first.process,
            "op_type": op,
            "op_name": name,
            "counts": {"neg_inf": h.neg_inf, "pos_inf": h.pos_inf, "nan": h.nan, "size": h.size},
            "source": (
                {"file": user.file_path, "line": user.lineno, "function": user.function}
                if user
                else None
            ),
        }
    return out


def render(data: dict[str, Any], console: Console) -> None:
    console.print(f"[bold]{data['logdir']}[/bold]  run {data['run_id'] or '?'}")
    console.print(
        f"framework: {data['framework'] or 'unknown'}   mode: {data['tensor_debug_mode'] or '?'}   "
        f"processes: {len(data['processes'])}"
    )
    console.print(
        f"executions: {data['num_executions']:,} ({data['num_nonfinite_executions']:,} with Inf/NaN)   "
        f"graph execution traces: {data['num_graph_execution_traces']:,} "
        f"({data['num_nonfinite_graph_execution_traces']:,} with Inf/NaN)"
    )
    first = data["first_nonfinite"]
    if first:
        c = first["counts"]
        src = first["source"]
        where = f" at {src['file']}:{src['line']} ({src['function']})" if src else ""
        console.print(
            f"[red]first Inf/NaN:[/red] {first['kind']} #{first['index']} "
            f"[bold]{first['op_type']}[/bold] (-inf {c['neg_inf']}, +inf {c['pos_inf']}, "
            f"nan {c['nan']}){where}"
        )
    else:
        console.print("[green]no Inf/NaN recorded[/green]")
    for p in data["problems"]:
        console.print(f"[yellow]{p['severity']}:[/yellow] {p['message']}", soft_wrap=True)


def run(args: argparse.Namespace) -> int:
    with DumpReader(args.logdir) as reader:
        data = facts(reader)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        render(data, Console())
    return 1 if data["first_nonfinite"] else 0
