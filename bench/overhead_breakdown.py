"""``bench/overhead_torch.py --breakdown``: where nanscope's time goes on the MLP.

A child times a ladder of partial recorders (a no-op dispatch mode; nanscope
without stack capture and without the writer; with stack capture; the whole
NO_TENSOR; FULL_HEALTH without and with the writer; both with stacks keyed by
``id(code)``) and takes a cProfile of FULL_HEALTH steps; the parent prints the
per-op costs and the profile.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import pin_torch_threads, table_head
from overhead_models import torch_mlp
from overhead_timing import interleave

LADDER = [
    "plain",
    "floor",
    "NT-nostack-nowriter",
    "NT-nowriter",
    "NO_TENSOR",
    "FH-nowriter",
    "FULL_HEALTH",
    "NT-idkeys",
    "FH-idkeys",
]


def _capture_by_id(self: Any, frame: Any = None, limit: int = 64) -> int:
    """``StackInterner.capture`` with its dictionaries keyed by ``id(code)``, not the code object.

    Hashing a code object hashes its constants, nested code objects included:
    a script's ``<module>`` frame, at the bottom of every stack, costs
    microseconds per hash. The cache entry holds the code object, so its id
    cannot be reused while cached. Otherwise the same walk as nanscope's (keys
    by instruction offset, the same frames left out). ``--breakdown`` uses it
    to show the gain.
    """
    from nanscope.events import _stacks as stacks

    wrappers = getattr(stacks, "_WRAPPER_FILES", ())
    f = frame if frame is not None else sys._getframe(2)
    skip = self.__dict__.setdefault("_bench_skip", {})
    lines = self.__dict__.setdefault("_bench_lines", {})
    ids: list[str] = []
    while f is not None and len(ids) < limit:
        code = f.f_code
        key = id(code)
        entry = skip.get(key)
        if entry is None or entry[0] is not code:
            path = code.co_filename
            entry = skip[key] = (code, stacks.is_nanscope_file(path) or path.endswith(wrappers))
        if not entry[1]:
            line_key = (key, f.f_lasti)
            fid = lines.get(line_key)
            if fid is None:
                fid = lines[line_key] = self.frame_id(
                    os.path.abspath(code.co_filename), f.f_lineno, code.co_name
                )
            ids.append(fid)
        f = f.f_back
    ids.reverse()
    return int(self.intern(tuple(ids)))


def child_breakdown(cfg: dict[str, Any]) -> dict[str, Any]:
    """The ladder's interleaved rounds, and a cProfile of FULL_HEALTH steps."""
    import cProfile
    import io
    import itertools
    import pstats
    import types

    from torch.utils._python_dispatch import TorchDispatchMode

    import nanscope

    torch = pin_torch_threads()
    step = torch_mlp(torch)
    for _ in range(cfg["warmup"]):
        step()

    class NoopMode(TorchDispatchMode):
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            return func(*args, **(kwargs or {}))

    class Ladder:
        """``floor``: a no-op dispatch mode; the others are nanscope with parts cut off."""

        def __init__(self, name: str, logdir: Path) -> None:
            self.name = name
            self.logdir = logdir
            self.session: Any = None
            self.noop: Any = None
            self.executions = 0
            self.counter = itertools.count(1)

        def __enter__(self) -> Ladder:
            if self.name == "plain":
                return self
            if self.name == "floor":
                self.noop = NoopMode()
                self.noop.__enter__()
                return self
            full = self.name.startswith("FH") or self.name == "FULL_HEALTH"
            mode = "FULL_HEALTH" if full else "NO_TENSOR"
            self.session = nanscope.enable_dump_debug_info(
                self.logdir, tensor_debug_mode=mode, circular_buffer_size=1000
            )
            writer = self.session.writer
            if self.name in ("NT-nostack-nowriter", "NT-nowriter", "FH-nowriter"):
                writer.write_execution = lambda event: next(self.counter)
            if self.name == "NT-nostack-nowriter":
                writer.capture_stack = lambda frame=None, limit=64: 0
            if self.name.endswith("-idkeys"):
                writer.stacks.capture = types.MethodType(_capture_by_id, writer.stacks)
            return self

        def __exit__(self, *exc: object) -> None:
            if self.noop is not None:
                self.noop.__exit__(None, None, None)
            if self.session is not None:
                self.session.close()
                st = self.session.writer.stats
                self.executions = st.executions or (next(self.counter) - 1)

    result = interleave(
        LADDER, cfg["rounds"], cfg["steps"], cfg["warmup"], Ladder, step, "breakdown"
    )

    # cProfile of FULL_HEALTH steps (main thread only), grouped by nanscope file.
    logdir = Path(tempfile.mkdtemp(prefix="nanscope-bench-prof-"))
    session = nanscope.enable_dump_debug_info(
        logdir, tensor_debug_mode="FULL_HEALTH", circular_buffer_size=1000
    )
    for _ in range(cfg["warmup"]):
        step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(cfg["steps"]):
        step()
    prof.disable()
    session.close()
    stats = pstats.Stats(prof)
    by_file: dict[str, float] = {}
    rows = []
    for (path, line, func), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        key = path.split("/site-packages/")[-1].split("/src/")[-1]
        by_file[key] = by_file.get(key, 0.0) + tottime
        rows.append((tottime, ncalls, cumtime, f"{key}:{line}({func})"))
    rows.sort(reverse=True)
    buf = io.StringIO()
    total = sum(by_file.values())
    print(f"cProfile of {cfg['steps']} FULL_HEALTH steps: {total:.3f} s in total", file=buf)
    print("self time by file (top 15):", file=buf)
    for k, t in sorted(by_file.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {t * 1e3 / cfg['steps']:8.3f} ms/step  {100 * t / total:5.1f}%  {k}", file=buf)
    print("functions by self time (top 25):", file=buf)
    for tottime, ncalls, cumtime, name in rows[:25]:
        print(
            f"  {tottime * 1e3 / cfg['steps']:8.3f} ms/step self  "
            f"{cumtime * 1e3 / cfg['steps']:8.3f} cum  {ncalls // cfg['steps']:6d} calls/step  {name}",
            file=buf,
        )
    print("nanscope functions by cumulative time (top 15):", file=buf)
    ours = [row for row in rows if row[3].startswith("nanscope/")]
    ours.sort(key=lambda row: -row[2])
    for tottime, ncalls, cumtime, name in ours[:15]:
        print(
            f"  {cumtime * 1e3 / cfg['steps']:8.3f} ms/step cum  "
            f"{tottime * 1e3 / cfg['steps']:8.3f} self  {ncalls // cfg['steps']:6d} calls/step  {name}",
            file=buf,
        )
    shutil.rmtree(logdir, ignore_errors=True)
    return {"ladder": result, "profile": buf.getvalue()}


def print_breakdown(res: dict[str, Any]) -> None:
    """The ladder's table, the per-op costs it implies, and the profile."""
    lad = res["ladder"]
    ops = lad["NO_TENSOR"]["ops_per_step"] or lad["FULL_HEALTH"]["ops_per_step"]
    us = _print_ladder("MLP", "variant", lad, ops, wall_ratio=False)
    parts = [
        ("dispatch-mode floor (a no-op TorchDispatchMode)", us("floor", "plain")),
        (
            "nanscope bookkeeping (_record without stack, summaries, writer)",
            us("NT-nostack-nowriter", "floor"),
        ),
        ("stack capture", us("NT-nowriter", "NT-nostack-nowriter")),
        ("writer enqueue on the training thread", us("NO_TENSOR", "NT-nowriter")),
        ("FULL_HEALTH summaries", us("FH-nowriter", "NT-nowriter")),
    ]
    for v in ("NO_TENSOR", "FULL_HEALTH"):
        parts.append(
            (f"writer thread, {v} (other threads' CPU)", lad[v]["other_cpu_min_ms"] * 1e3 / ops)
        )
    parts.append(("stack capture keyed by id(code) instead: saves", us("NO_TENSOR", "NT-idkeys")))
    print(
        "\nWith stacks keyed by id(code): NO_TENSOR "
        f"{lad['NT-idkeys']['ratio_wall']:.2f}x (was {lad['NO_TENSOR']['ratio_wall']:.2f}x), "
        f"FULL_HEALTH {lad['FH-idkeys']['ratio_wall']:.2f}x (was {lad['FULL_HEALTH']['ratio_wall']:.2f}x) "
        "wall; CPU "
        f"{lad['NT-idkeys']['ratio_cpu']:.2f}x / {lad['FH-idkeys']['ratio_cpu']:.2f}x "
        f"(was {lad['NO_TENSOR']['ratio_cpu']:.2f}x / {lad['FULL_HEALTH']['ratio_cpu']:.2f}x)"
    )
    _print_parts(parts, digits=1)
    print()
    print(res["profile"])


def _print_ladder(
    model: str, first: str, lad: dict[str, Any], ops: float, wall_ratio: bool
) -> Callable[[str, str], float]:
    """The ladder's table; returns ``us(a, b)``: rung ``a``'s main-thread CPU time per op
    beyond rung ``b``'s, in µs."""
    print(
        f"{model}, {ops:.0f} recorded ops per step. Main-thread CPU time per step "
        "(time.thread_time; the least contended round, like timeit's min):"
    )
    cols = [
        first,
        "step ms (median)",
        *(["wall ratio"] if wall_ratio else []),
        "main-thread CPU ms/step (min)",
        "other threads ms/step (min)",
    ]
    print("\n".join(table_head(cols, numeric=False)))
    for v, t in lad.items():
        ratio = f" {t['ratio_wall']:.2f}x |" if wall_ratio else ""
        print(
            f"| {v} | {t['step_ms']:.2f} |{ratio} {t['main_cpu_min_ms']:.2f} "
            f"| {t['other_cpu_min_ms']:.2f} |"
        )

    def us(a: str, b: str) -> float:
        return float((lad[a]["main_cpu_min_ms"] - lad[b]["main_cpu_min_ms"]) * 1e3 / ops)

    return us


def _print_parts(parts: list[tuple[str, float]], digits: int) -> None:
    print()
    print("\n".join(table_head(["per op", "µs"], numeric=False)))
    for name, value in parts:
        print(f"| {name} | {value:.{digits}f} |")


# -- the native recorder's per-op cost ladder --------------------------------------------------

# Rungs: (name, mode or None for plain, the recorder's set_bench_cut bits). The bits leave a
# part of the recording out: 1 the whole callback (it returns at once), 2 the stack capture,
# 4 the count kernel, 8 the event push (the event is built, then dropped).
NATIVE_LADDER: list[tuple[str, str | None, int]] = [
    ("plain", None, 0),
    ("RecordFunction only", "NO_TENSOR", 1),
    ("NT no stack, no push", "NO_TENSOR", 2 | 8),
    ("NT no push", "NO_TENSOR", 8),
    ("NO_TENSOR", "NO_TENSOR", 0),
    ("FH no counts, no push", "FULL_HEALTH", 4 | 8),
    ("FH no push", "FULL_HEALTH", 8),
    ("FULL_HEALTH", "FULL_HEALTH", 0),
]


def micro_step(torch: Any, ops: int = 600) -> Any:
    """A step of ``ops`` small elementwise ops on [20, 200] floats (no autograd): per-op
    costs without a model's large kernels around them."""
    g = torch.Generator().manual_seed(0)
    a = torch.rand(20, 200, generator=g)
    b = torch.rand(20, 200, generator=g)

    def step() -> None:
        x = a
        with torch.no_grad():
            for _ in range(ops // 3):
                x = torch.tanh(x * b + a)

    return step


def child_native_breakdown(cfg: dict[str, Any]) -> dict[str, Any]:
    """The native recorder's ladder on ``cfg["model"]`` ("micro" or a bench model), interleaved."""
    from overhead_models import torch_model

    import nanscope
    from nanscope.backends.torch import native

    torch = pin_torch_threads()
    lib = native.load()
    assert lib is not None, native.failure()
    step = micro_step(torch) if cfg["model"] == "micro" else torch_model(torch, cfg)
    for _ in range(cfg["warmup"]):
        step()
    rungs = {name: (mode, cut) for name, mode, cut in NATIVE_LADDER}

    class Rung:
        def __init__(self, name: str, logdir: Path) -> None:
            self.mode, self.cut = rungs[name]
            self.logdir = logdir
            self.session: Any = None
            self.executions = 0

        def __enter__(self) -> Rung:
            if self.mode is not None:
                self.session = nanscope.enable_dump_debug_info(
                    self.logdir, tensor_debug_mode=self.mode, circular_buffer_size=1000
                )
                lib.set_bench_cut(self.cut)
            return self

        def __exit__(self, *exc: object) -> None:
            lib.set_bench_cut(0)
            if self.session is not None:
                self.session.close()
                self.executions = self.session.writer.stats.executions

    # Ops per step, counted once with everything on (the cut rungs write fewer events).
    logdir = Path(tempfile.mkdtemp(prefix="nanscope-bench-count-"))
    with Rung("NO_TENSOR", logdir) as r:
        for _ in range(3):
            step()
    shutil.rmtree(logdir, ignore_errors=True)
    ops = r.executions / 3
    names = [name for name, _, _ in NATIVE_LADDER]
    result = interleave(
        names, cfg["rounds"], cfg["steps"], cfg["warmup"], Rung, step, f"native-{cfg['model']}"
    )
    return {"ladder": result, "ops_per_step": ops, "model": cfg["model"]}


def print_native_breakdown(res: dict[str, Any]) -> None:
    """The native ladder's table and the per-op costs it implies."""
    lad = res["ladder"]
    ops = res["ops_per_step"]
    us = _print_ladder(res["model"], "rung", lad, ops, wall_ratio=True)
    parts = [
        (
            "RecordFunction with an empty callback (inputs and outputs kept)",
            us("RecordFunction only", "plain"),
        ),
        (
            "bookkeeping: op lookup, context, tensor ids, links, the event",
            us("NT no stack, no push", "RecordFunction only"),
        ),
        ("stack capture (walk and intern)", us("NT no push", "NT no stack, no push")),
        ("event push, NO_TENSOR", us("NO_TENSOR", "NT no push")),
        (
            "FULL_HEALTH rows without the counts (cache, views)",
            us("FH no counts, no push", "NT no push"),
        ),
        ("count kernel", us("FH no push", "FH no counts, no push")),
        ("event push, FULL_HEALTH", us("FULL_HEALTH", "FH no push")),
        ("the whole NO_TENSOR, training thread", us("NO_TENSOR", "plain")),
        ("the whole FULL_HEALTH, training thread", us("FULL_HEALTH", "plain")),
    ]
    for v in ("NO_TENSOR", "FULL_HEALTH"):
        other = lad[v]["other_cpu_min_ms"] - lad["plain"]["other_cpu_min_ms"]
        parts.append((f"drain and writer threads, {v} (other threads' CPU)", other * 1e3 / ops))
    _print_parts(parts, digits=2)
