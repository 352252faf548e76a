"""Benchmark: where a jitted JAX step's overhead under nanscope goes (issue 14's MLP targets).

bench/overhead_jax.py says how much slower a step is; this says why, in three
parts measured side by side in one process per variant, each against plain's
step compiled ahead of time (``jit(step).lower(...).compile()``: the plain
executable, called through JAX's C++ path, which nanscope leaves alone):

* **step**: the variant's whole step (``enable_dump_debug_info`` or
  ``enable_check_numerics``, then ``jax.jit``), in blocks alternating with
  plain's: the median of (variant block / plain block), as overhead_jax's
  paired ratio;
* **program alone**: the program nanscope runs in place of the step
  (the step's jaxpr instrumented as the variant does it: guarded, in the
  variant's mode; check_numerics counts CONCISE_HEALTH), compiled ahead of time
  and called like plain's, alternating with plain's compiled jaxpr: what
  counting inside XLA costs, with no Python around it;
* **JAX's Python path**: per call, the time JAX spends in Python between the
  call and nanscope's handler and after it returns. nanscope must see every
  call (to record it, or to raise at it), so it returns no executable to
  JAX's C++ dispatch, and each call takes JAX's Python path (argument
  flattening, the trace-cache lookup in ``_infer_params``); a plain jitted
  call does not. Given as a fraction of plain's step.

What is left (step - program alone - JAX's path) is nanscope's own work on the
host per call: its handler, the executable's launch, the record (a dump) or
the check of the counts (check_numerics), and, for a dump, the writer thread.

Run: ``PYTHONPATH=src python bench/jax_breakdown.py [--model mlp] [--rounds 3]``.
Children as in overhead_jax (one XLA compute thread, no compilation cache).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from harness import (
    ChildFailed,
    log,
    machine,
    source_line,
    source_state,
    start_child,
    table_head,
    table_row,
)
from overhead_jax import JAX_ENV, PROGRAMS, Variant, _run, alternate, pin_jax_threads
from overhead_models import MLP, TRANSFORMER

VARIANTS = ["NO_TENSOR", "FULL_HEALTH", "check_numerics"]


def child_breakdown(cfg: dict[str, Any]) -> dict[str, Any]:
    """One variant: the three parts (see the module), as medians over blocks."""
    jax = pin_jax_threads()
    from jax._src import core

    from nanscope.backends.jax.check_numerics import JaxCheckNumerics
    from nanscope.backends.jax.plan import Selection
    from nanscope.backends.jax.rewrite import instrument
    from nanscope.backends.jax.session import JaxDumpSession
    from nanscope.format.modes import TensorDebugMode

    program = PROGRAMS[cfg["model"]](cfg)
    name = cfg["variant"]
    marks: list[float] = []  # the handler's entries and exits, in order

    for cls in (JaxDumpSession, JaxCheckNumerics):
        inner = cls.call

        def call(self: Any, original: Any, args: Any, params: Any, _inner: Any = inner) -> Any:
            marks.append(time.perf_counter())
            try:
                return _inner(self, original, args, params)
            finally:
                marks.append(time.perf_counter())

        cls.call = call  # type: ignore[method-assign]

    variant = Variant(name, Path(cfg["logdir"]))
    variant.on()  # first: the heap is kept for plain's runs as for the variant's
    try:
        batch = program.batch
        args = (program.params, program.opt_state, *batch)
        plain = jax.jit(program.train_step).lower(*args).compile()
        step = variant.jit(program.train_step)
        mode = TensorDebugMode.CONCISE_HEALTH if name == "check_numerics" else TensorDebugMode[name]
        flat = jax.tree_util.tree_leaves(args)
        closed = jax.make_jaxpr(program.train_step)(*args)
        plan = instrument(closed, "step", mode, Selection(None, None), True)
        bare = jax.jit(core.jaxpr_as_fun(closed)).lower(*flat).compile()
        counted = jax.jit(core.jaxpr_as_fun(plan.closed)).lower(*flat).compile()

        plain_state = [program.params, program.opt_state]
        state = [program.params, program.opt_state]
        paths: list[float] = []

        def run_plain() -> None:
            _run(jax, plain, plain_state, batch)

        def run_variant() -> None:
            del marks[:]
            t0 = time.perf_counter()
            p, o, loss = step(state[0], state[1], *batch)
            t1 = time.perf_counter()
            jax.block_until_ready((p, o, loss))
            state[0], state[1] = p, o
            if marks:
                paths.append((marks[0] - t0) + (t1 - marks[-1]))

        for _ in range(cfg["warmup"]):
            run_plain()
            run_variant()
            jax.block_until_ready(bare(*flat))
            jax.block_until_ready(counted(*flat))
        k, blocks = cfg["steps"], cfg["blocks"]
        step_ratios = alternate(run_plain, run_variant, blocks, k)
        program_ratios = alternate(
            lambda: jax.block_until_ready(bare(*flat)),
            lambda: jax.block_until_ready(counted(*flat)),
            blocks,
            k,
        )
        plain_s = []
        for _ in range(blocks * k // 2):
            t0 = time.perf_counter()
            run_plain()
            plain_s.append(time.perf_counter() - t0)
    finally:
        variant.off()
    return {
        "step": float(np.median(step_ratios)),
        "program": float(np.median(program_ratios)),
        "jax_path_s": float(np.median(paths)),
        "plain_s": float(np.median(plain_s)),
        "guards": len(plan.kept) if plan.kept is not None else len(plan.rows),
        "values": len(plan.rows),
    }


CHILDREN = {"breakdown": child_breakdown}


def main(argv: list[str] | None = None) -> None:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["mlp", "transformer"], default="mlp")
    ap.add_argument("--rounds", type=int, default=3, help="children per variant (default 3)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"from {VARIANTS}")
    args = ap.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS) - {"CURT_HEALTH", "CONCISE_HEALTH"})
    if unknown:
        sys.exit(f"unknown variants {unknown}; choose from {VARIANTS}")
    mlp = args.model == "mlp"
    base = {
        "model": args.model,
        "batch": MLP["batch"] if mlp else TRANSFORMER["batch"],
        "warmup": 10 if mlp else 1,
        "steps": 20 if mlp else 1,
        "blocks": 15 if mlp else 3,
    }
    started, src0, load0 = time.time(), source_state(), os.getloadavg()
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(args.rounds):
        order = list(variants)
        random.shuffle(order)
        for v in order:
            logdir = Path(f"/tmp/nanscope-bench-jax-breakdown-{os.getpid()}-{r}-{v}")
            cfg = {**base, "variant": v, "logdir": str(logdir)}
            log(f"round {r + 1}/{args.rounds}: {v}")
            try:
                results[v].append(
                    start_child("jax_breakdown", "breakdown", cfg, env=JAX_ENV).wait(1800)
                )
            except ChildFailed as exc:
                log(f"{v} failed ({exc.reason}): {exc.message}")

    lines = [
        f"Command: {' '.join([Path(sys.executable).name, *sys.argv])}",
        source_line(src0, source_state()),
        f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {machine()}, load average "
        f"{load0[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end, {time.time() - started:.0f} s",
        "",
        f"{args.model}: medians over {args.rounds} children; ratios to plain's step compiled "
        "ahead of time, in the same process",
        "",
        *table_head(
            [
                "variant",
                "guards / values",
                "step",
                "program alone",
                "JAX's Python path",
                "the rest (nanscope's host work)",
            ]
        ),
    ]
    for v in variants:
        runs = results[v]
        if not runs:
            lines.append(table_row([v, "failed", "", "", "", ""]))
            continue
        med = {k: float(np.median([run[k] for run in runs])) for k in runs[0]}
        path = med["jax_path_s"] / med["plain_s"]
        rest = med["step"] - med["program"] - path
        lines.append(
            table_row(
                [
                    v,
                    f"{runs[0]['guards']} / {runs[0]['values']}",
                    f"{med['step']:.2f}x",
                    f"{med['program']:.2f}x",
                    f"{med['jax_path_s'] * 1e3:.2f} ms = +{path:.2f}x",
                    f"{rest:+.2f}x",
                ]
            )
        )
    plain_ms = np.median([run["plain_s"] for runs in results.values() for run in runs]) * 1e3
    lines += ["", f"Plain step (compiled ahead of time): {plain_ms:.2f} ms."]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
