"""Benchmark: what nanscope's JAX backend costs a jitted training step (issue 14).

Ratios to plain JAX, measured side by side in one run, for nanscope's tensor
debug modes (``enable_dump_debug_info(..., framework="jax")``), nanscope's
``enable_check_numerics(framework="jax")``, and JAX's own two checkers:
``jax.config.update("jax_debug_nans", True)`` and ``checkify.checkify(step,
errors=checkify.float_checks)`` (jitted, ``err.throw()`` after every step).

Programs (plain JAX + optax, data generated):

* **MLP**: the seed tutorial's 784-500-10 MLP (ReLU), batch 100, with the
  hand-written cross-entropy ``-(labels * log(softmax(logits))).sum() / batch``,
  the probabilities clamped at 1e-6 so that no Inf/NaN appears (this measures
  recording, not the rare non-finite path); the same data and initial weights
  as bench/overhead_torch.py's MLP. ``optax.adam``, one ``jax.jit`` train step
  (``value_and_grad`` and the optax update).
* **Transformer**: a causal language model in ``flax.linen`` (embedding and
  learned positions, 4 pre-LayerNorm blocks of d_model 256, 4 heads, MLP 1024,
  a final LayerNorm and a linear head to 1000 tokens), batch 64, sequence 128,
  next-token cross-entropy (``optax.softmax_cross_entropy_with_integer_labels``),
  ``optax.adam``, one jitted train step. No dropout.

Variants: ``plain``; ``jax_debug_nans``; ``checkify``; ``NO_TENSOR``,
``CURT_HEALTH``, ``CONCISE_HEALTH``, ``FULL_HEALTH``, ``SHAPE`` (a nanscope
dump, circular buffer 1000, ``disable_dump_debug_info()`` after the loop);
``check_numerics``. nanscope is switched on *before* the train step is
defined and jitted, the common order. ``--late`` adds ``MODE:late`` for every
nanscope variant measured: the step is jitted and run once (compiled, cached)
first, then nanscope is switched on, and the same jitted function goes on;
the backend must catch it. Its dump is compared with the enable-first one
(records per file kind, from the memory children, which run the same number
of steps after switching on). A variant whose switch raises (until the JAX
backend lands, ``NotImplementedError``) is reported as "n/a (reason)" and the
run carries on.

Targets (the table marks each met or missed):

* jitted MLP: ``FULL_HEALTH`` <= 1.3x, ``NO_TENSOR`` <= 1.1x,
  ``check_numerics`` <= 1.2x, each below both ``jax_debug_nans`` and
  ``checkify`` in the same run;
* Transformer: ``FULL_HEALTH`` <= 1.15x;
* compile time (the first call: tracing, XLA compilation and one execution)
  <= 2x plain's, and peak memory (``ru_maxrss``) <= 1.2x plain's, for every
  nanscope variant on both models.

Method (the machine is shared and noisy; no claim rests on an absolute time).
Every measurement is a fresh child process per variant (bench/harness.py): a
JAX process cannot switch a global checker or an instrumented ``jax.jit`` off
and on again as cleanly as a PyTorch dispatch mode, and a fresh process makes
each variant's first call a cold compile (the persistent compilation cache is
off). In each round every variant, in a shuffled order, runs in its own child:
build the program, switch the variant on, jit the step, time the first call,
run warm-up steps, time K steps (``jax.block_until_ready`` on the step's
outputs, so each step is the whole computation), switch off. A variant's step
ratio is the median over rounds of (its median step time / plain's median step
time in the same round); its compile ratio the median over rounds of (its
first call / plain's first call), also shown with each child's median step
taken off its first call (compilation alone, where a step is long); the
CPU-time ratio sums ``time.process_time`` (all threads, so nanscope's
background threads count) over rounds; page faults per step are the timed
steps' minor faults (``ru_minflt``): pages the allocator gave back and took
again (nanscope keeps glibc's freed memory while recording on the CPU:
src/nanscope/backends/jax/heap.py). Peak memory is the ``ru_maxrss`` of one
more, shorter child per variant.

The same step runs 10-40% faster or slower from one process to the next on
this machine (the CPU the VM gave it, where its memory landed), more than the
differences measured. So each timing child also measures a **paired ratio**:
after its timed steps it compiles plain's step ahead of time (``jax.jit(step)
.lower(...).compile()``: an executable nanscope does not instrument, called
through JAX's C++ path like a plain jitted function; the two time the same
when nothing is on) and alternates blocks of plain's steps and the variant's
(``--paired`` pairs, the timed steps split between them); its ratio is the
median over pairs, and the table's the median over rounds. The step targets
are judged on it where measured; "below jax_debug_nans/checkify" compares the
process-to-process ratios, since jax_debug_nans checks every executable of its
process (the plain one too) and so has no paired ratio.

JAX runs on the CPU (``JAX_PLATFORMS=cpu``) with one compute thread. On jax
0.10.2 ``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false`` alone still runs a
2048x2048 matmul on every core (CPU time = 2x wall on 2 cores), and
``intra_op_parallelism_threads=1`` is not an XLA flag (XLA stops on it). XLA
sizes its CPU thread pools by the CPUs the process may run on, so each child
restricts itself to one CPU while JAX creates its client, then lets every
thread run anywhere again: one compute thread (CPU time = wall on that
matmul), and nanscope's background threads may use the other core, as in
bench/overhead_torch.py.

Run time: on this project's 2-core machine a Transformer step at batch 64
takes about 7 s on one thread and its first call about 15 s (checkify's about
100 s), so the default Transformer run (3 rounds x 9 variants, then the memory
children) takes about half an hour on a quiet machine, the MLP's (7 rounds)
about 10 minutes. Other work on the machine moves single rounds by 2x or more:
the min-max spread per variant shows it, and more rounds narrow the median.

Usage (from the repository root)::

    PYTHONPATH=src .venv/bin/python bench/overhead_jax.py                 # both models
    PYTHONPATH=src .venv/bin/python bench/overhead_jax.py --quick         # smoke run
    PYTHONPATH=src .venv/bin/python bench/overhead_jax.py --model mlp --rounds 9 \\
        --variants jax_debug_nans,checkify,NO_TENSOR,FULL_HEALTH,check_numerics --late
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import (
    ONE_THREAD_ENV,
    ChildFailed,
    log,
    machine,
    peak_rss_mib,
    source_line,
    source_state,
    start_child,
    table_head,
    table_row,
)
from overhead_models import MLP, TRANSFORMER, mlp_data

MODES = ["NO_TENSOR", "CURT_HEALTH", "CONCISE_HEALTH", "FULL_HEALTH", "SHAPE"]
NANSCOPE = [*MODES, "check_numerics"]
VARIANTS = ["plain", "jax_debug_nans", "checkify", *NANSCOPE]
LATE = ":late"  # suffix: nanscope switched on after the step was jitted and first called
MODELS = ["mlp", "transformer"]
MODEL_TITLE = {
    "mlp": "Jitted MLP 784-500-10 (batch 100, optax.adam)",
    "transformer": "Jitted Transformer (flax.linen, 4 layers, d_model 256, 4 heads, MLP 1024, "
    f"vocab 1000, causal, sequence {TRANSFORMER['seq']}; optax.adam)",
}
# Step-ratio targets of issue 14: (model, variant, limit).
STEP_TARGETS = [
    ("mlp", "FULL_HEALTH", 1.3),
    ("mlp", "NO_TENSOR", 1.1),
    ("mlp", "check_numerics", 1.2),
    ("transformer", "FULL_HEALTH", 1.15),
]
# The MLP targets' variants must also beat JAX's own checkers in the same run.
BEAT = ["jax_debug_nans", "checkify"]
# Not measured paired with plain in its own process: jax_debug_nans checks every executable
# the process runs, the plain one compiled ahead of time too.
UNPAIRED = {"plain", "jax_debug_nans"}
COMPILE_LIMIT = 2.0  # first call, every nanscope variant
RSS_LIMIT = 1.2  # peak memory, every nanscope variant

# The children's environment: CPU only, no persistent compilation cache (every first call
# compiles), one thread for the libraries that read these (XLA's pools: see pin_jax_threads).
JAX_ENV = {
    **ONE_THREAD_ENV,
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false",
    "JAX_ENABLE_COMPILATION_CACHE": "false",
    "PYTHONUNBUFFERED": "1",
}


# -- the child's side ---------------------------------------------------------------------------


def pin_jax_threads() -> Any:
    """Import JAX with one XLA compute thread; returns the module.

    XLA sizes its CPU thread pools by the CPUs this process may use when the
    client is made: restricted to one CPU for that moment, then every thread
    (the pools' included) may run on all of them again.
    """
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    import jax

    jax.devices()  # makes the CPU client and its pools now
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that has just ended
            os.sched_setaffinity(int(tid), allowed)
    return jax


@dataclass
class Program:
    """A training program: its un-jitted train step, the state it carries and its batch.

    ``train_step(params, opt_state, *batch) -> (params, opt_state, loss)``.
    """

    train_step: Callable[..., Any]
    params: Any
    opt_state: Any
    batch: tuple[Any, ...]


def mlp_program(cfg: dict[str, Any]) -> Program:
    """The seed's MLP in plain JAX with optax.adam."""
    import jax
    import jax.numpy as jnp
    import optax

    d = mlp_data()
    params = {k: jnp.asarray(d[k]) for k in ("w1", "b1", "w2", "b2")}
    x, labels = jnp.asarray(d["x"]), jnp.asarray(d["labels"])
    opt = optax.adam(1e-3)

    def loss_fn(params: Any, x: Any, labels: Any) -> Any:
        hidden = jax.nn.relu(x @ params["w1"] + params["b1"])
        probs = jax.nn.softmax(hidden @ params["w2"] + params["b2"])
        # Clamped so that no Inf/NaN appears while timing.
        return -(labels * jnp.log(jnp.maximum(probs, 1e-6))).sum() / x.shape[0]

    def train_step(params: Any, opt_state: Any, x: Any, labels: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, labels)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return Program(train_step, params, opt.init(params), (x, labels))


def transformer_program(cfg: dict[str, Any]) -> Program:
    """A causal Transformer language model in flax.linen with optax.adam."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    c = TRANSFORMER
    d_model, vocab, seq = c["d_model"], c["vocab"], c["seq"]

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x: Any, mask: Any) -> Any:
            h = nn.LayerNorm()(x)
            x = x + nn.MultiHeadDotProductAttention(num_heads=c["nhead"])(h, h, mask=mask)
            h = nn.Dense(c["ff"])(nn.LayerNorm()(x))
            return x + nn.Dense(d_model)(nn.gelu(h))

    class LM(nn.Module):
        @nn.compact
        def __call__(self, tokens: Any) -> Any:
            pos = self.param("pos", nn.initializers.normal(0.02), (seq, d_model))
            x = nn.Embed(vocab, d_model)(tokens) + pos[: tokens.shape[1]]
            mask = nn.make_causal_mask(tokens)
            for _ in range(c["layers"]):
                x = Block()(x, mask)
            return nn.Dense(vocab)(nn.LayerNorm()(x))

    model = LM()
    rng = np.random.default_rng(1)
    data = jnp.asarray(rng.integers(0, vocab, (cfg["batch"], seq + 1)), dtype=jnp.int32)
    tokens, targets = data[:, :-1], data[:, 1:]
    params = model.init(jax.random.PRNGKey(0), tokens)
    opt = optax.adam(1e-3)

    def loss_fn(params: Any, tokens: Any, targets: Any) -> Any:
        logits = model.apply(params, tokens)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    def train_step(params: Any, opt_state: Any, tokens: Any, targets: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return Program(train_step, params, opt.init(params), (tokens, targets))


PROGRAMS: dict[str, Callable[[dict[str, Any]], Program]] = {
    "mlp": mlp_program,
    "transformer": transformer_program,
}


class Variant:
    """Switches one variant on (:meth:`on`), jits the step the variant's way, and off."""

    def __init__(self, name: str, logdir: Path) -> None:
        self.name = name.removesuffix(LATE)
        self.logdir = logdir
        self.active = False

    def on(self) -> None:
        """Switch the variant on; raises what its switch raises (NotImplementedError, ...)."""
        if self.name in MODES:
            import nanscope

            nanscope.enable_dump_debug_info(
                self.logdir,
                tensor_debug_mode=self.name,
                circular_buffer_size=1000,
                framework="jax",
            )
        elif self.name == "check_numerics":
            import nanscope

            nanscope.enable_check_numerics(framework="jax")
        elif self.name == "jax_debug_nans":
            import jax

            jax.config.update("jax_debug_nans", True)
        self.active = True

    def off(self) -> None:
        """Switch the variant off (closing a dump flushes it)."""
        if not self.active:
            return
        self.active = False
        if self.name in MODES:
            import nanscope

            nanscope.disable_dump_debug_info()
        elif self.name == "check_numerics":
            import nanscope

            nanscope.disable_check_numerics()
        elif self.name == "jax_debug_nans":
            import jax

            jax.config.update("jax_debug_nans", False)

    def jit(self, train_step: Callable[..., Any]) -> Callable[..., Any]:
        """The jitted step as the variant's user writes it; returns the step's outputs."""
        import jax

        if self.name != "checkify":
            return jax.jit(train_step)
        from jax.experimental import checkify

        checked = jax.jit(checkify.checkify(train_step, errors=checkify.float_checks))

        def step(*args: Any) -> Any:
            err, out = checked(*args)
            err.throw()
            return out

        return step


def _run(jax: Any, step: Callable[..., Any], state: list[Any], batch: tuple[Any, ...]) -> None:
    """One training step, waited for; ``state`` is ``[params, opt_state]``, updated in place."""
    params, opt_state, loss = step(state[0], state[1], *batch)
    jax.block_until_ready((params, opt_state, loss))
    state[0], state[1] = params, opt_state


# The tfdbg2 files of a dump, TFRecord-framed (nanscope's sidecar files are not).
RECORD_FILES = {
    "metadata",
    "source_files",
    "stack_frames",
    "graphs",
    "execution",
    "graph_execution_traces",
}


def dump_facts(logdir: Path) -> dict[str, Any]:
    """A dump's bytes, and per tfdbg2 file kind (suffix) its records and bytes."""
    kinds: dict[str, dict[str, int]] = {}
    total = 0
    for p in logdir.rglob("*"):
        if not p.is_file():
            continue
        data = p.read_bytes()
        total += len(data)
        kind = p.suffix.lstrip(".")
        if kind not in RECORD_FILES:
            continue
        k = kinds.setdefault(kind, {"records": 0, "bytes": 0})
        k["bytes"] += len(data)
        pos = 0
        while pos + 12 <= len(data):  # u64 length, u32 crc, data, u32 crc
            pos += 12 + int.from_bytes(data[pos : pos + 8], "little") + 4
            k["records"] += 1
    return {"total_bytes": total, "kinds": kinds}


def child_run(cfg: dict[str, Any]) -> dict[str, Any]:
    """One variant in this fresh process: first call, warm-up, ``cfg["steps"]`` timed steps.

    Returns ``{"na": reason}`` when the variant's switch raised, ``{"error": ...}``
    when a step did; else the first call's seconds, the timed steps' wall
    seconds, their CPU seconds, the peak RSS and (for a dump) the dump's facts.
    """
    jax = pin_jax_threads()
    program = PROGRAMS[cfg["model"]](cfg)
    late = cfg["variant"].endswith(LATE)
    logdir = Path(tempfile.mkdtemp(prefix="nanscope-bench-jax-"))
    variant = Variant(cfg["variant"], logdir / "dump")
    state = [program.params, program.opt_state]
    out: dict[str, Any] = {}
    try:
        if late:
            step = variant.jit(program.train_step)
            t0 = time.perf_counter()
            _run(jax, step, state, program.batch)  # compiled and cached before nanscope
            out["first_before_on_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        try:
            variant.on()
        except Exception as exc:
            return {"na": f"{type(exc).__name__}: {exc}"}
        out["on_s"] = time.perf_counter() - t0
        if not late:
            step = variant.jit(program.train_step)
        t0 = time.perf_counter()
        _run(jax, step, state, program.batch)
        out["first_s"] = time.perf_counter() - t0
        for _ in range(cfg["warmup"]):
            _run(jax, step, state, program.batch)
        walls = []
        c0 = time.process_time()
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(cfg["steps"]):
            t0 = time.perf_counter()
            _run(jax, step, state, program.batch)
            walls.append(time.perf_counter() - t0)
        out["cpu_s"] = (time.process_time() - c0) / max(1, cfg["steps"])
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        out["faults"] = faults / max(1, cfg["steps"])
        out["walls"] = walls
        if cfg.get("paired") and variant.name not in UNPAIRED:
            out["paired"] = _paired(jax, program, step, state, cfg["steps"], cfg["paired"])
        t0 = time.perf_counter()
        variant.off()
        out["off_s"] = time.perf_counter() - t0
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        with contextlib.suppress(Exception):
            variant.off()
        if (logdir / "dump").exists():
            out["dump"] = dump_facts(logdir / "dump")
        shutil.rmtree(logdir, ignore_errors=True)
    out["peak_rss_mib"] = peak_rss_mib()
    return out


def _paired(
    jax: Any, program: Program, step: Callable[..., Any], state: list[Any], steps: int, blocks: int
) -> list[float]:
    """Per block pair: the variant's mean step over plain's, both run in this process.

    Plain is the same train step compiled ahead of time (``jit(...).lower(...).compile()``,
    which nanscope does not instrument: the plain executable, called through JAX's C++
    path like a plain ``jax.jit`` function), compiled after the variant's first call so
    that it warms no cache of the variant's. Blocks of the two alternate, so that what
    slows this process (the CPU the VM gave it, the memory layout, a neighbour) slows both.
    """
    plain = jax.jit(program.train_step).lower(*state, *program.batch).compile()
    mine = [program.params, program.opt_state]
    _run(jax, plain, mine, program.batch)  # its buffers allocated once before timing
    return alternate(
        lambda: _run(jax, plain, mine, program.batch),
        lambda: _run(jax, step, state, program.batch),
        blocks,
        max(1, steps // blocks),
    )


def alternate(a: Callable[[], Any], b: Callable[[], Any], blocks: int, k: int) -> list[float]:
    """Per block pair (``k`` calls of ``a``, then ``k`` of ``b``): ``b``'s time over ``a``'s."""
    ratios = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(k):
            a()
        t1 = time.perf_counter()
        for _ in range(k):
            b()
        ratios.append((time.perf_counter() - t1) / (t1 - t0))
    return ratios


CHILDREN: dict[str, Callable[[dict[str, Any]], Any]] = {"run": child_run}


# -- the parent's side --------------------------------------------------------------------------


def run_child(cfg: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One child; a crash or a timeout comes back as ``{"error": reason}``."""
    try:
        child = start_child("overhead_jax", "run", cfg, env=JAX_ENV, label=f"{cfg}")
        result: dict[str, Any] = child.wait(timeout)
        return result
    except ChildFailed as exc:
        return {"error": f"child failed ({exc.reason}): {exc.message}"}


def why_not(result: dict[str, Any]) -> str | None:
    """Why a child measured nothing ("n/a (...)", "failed (...)"), or None."""
    if "na" in result:
        return f"n/a ({result['na']})"
    if "error" in result:
        return f"failed ({result['error']})"
    return None


def measure(model: str, variants: list[str], s: dict[str, Any]) -> dict[str, Any]:
    """Interleaved timing rounds and one memory child per variant, for one model."""
    per: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    skipped: dict[str, str] = {}
    na: set[str] = set()  # the variants whose switch raised
    base = {"model": model, "batch": s["batch"]}
    timeout = 300 if model == "mlp" else 1200
    for r in range(s["rounds"]):
        order = list(variants)
        random.Random(1000 + r).shuffle(order)
        if r == 0:
            # Each MODE:late after its MODE: where switching on raises anyway, the late
            # child's compile before switching on is spared.
            order.sort(key=lambda v: v.endswith(LATE))
        for v in order:
            early = v.removesuffix(LATE)
            if v != early and early in na and v not in skipped:
                skipped[v] = f"{skipped[early]}, as {early}"
                na.add(v)
            if v in skipped:
                continue
            res = run_child(
                {
                    **base,
                    "variant": v,
                    "steps": s["steps"],
                    "warmup": s["warmup"],
                    "paired": s["paired"],
                },
                timeout,
            )
            reason = why_not(res)
            if "na" in res:
                na.add(v)
            if reason:
                # A switch that raises, or a crash, would do so every round: measured once.
                skipped[v] = reason
                log(f"[{model}] round {r + 1}/{s['rounds']} {v}: {reason}")
                continue
            per[v].append({"round": r, **res})
            log(
                f"[{model}] round {r + 1}/{s['rounds']} {v}: "
                f"{statistics.median(res['walls']) * 1e3:.2f} ms/step, "
                f"first call {res['first_s']:.2f} s (load average {os.getloadavg()[0]:.1f})"
            )
        if "plain" in skipped:
            sys.exit(f"plain {model} cannot run: {skipped['plain']}")
    mem: dict[str, dict[str, Any]] = {}
    if s["mem_steps"]:
        for v in variants:
            if v in skipped:
                continue
            res = run_child({**base, "variant": v, "steps": s["mem_steps"], "warmup": 0}, timeout)
            mem[v] = res
            reason = why_not(res) or f"{res['peak_rss_mib']:.0f} MiB"
            log(f"[{model}] memory {v}: {reason}")
    return {"rounds": per, "skipped": skipped, "memory": mem, "settings": s}


def summarize(res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per variant: median step, step/compile ratios (median of per-round ratios), CPU and RSS."""
    per = res["rounds"]
    plain = {p["round"]: p for p in per["plain"]}
    plain_rss = res["memory"].get("plain", {}).get("peak_rss_mib")
    out: dict[str, dict[str, Any]] = {}
    for v, runs in per.items():
        if v in res["skipped"]:
            out[v] = {"reason": res["skipped"][v]}
            continue
        both = [(x, plain[x["round"]]) for x in runs if x["round"] in plain]
        steps = [statistics.median(x["walls"]) / statistics.median(p["walls"]) for x, p in both]
        firsts = [x["first_s"] / p["first_s"] for x, p in both]
        # The first call less one step: tracing and compiling without the execution in it.
        compiles = [_compile_s(x) / _compile_s(p) for x, p in both]
        rss = res["memory"].get(v, {}).get("peak_rss_mib")
        paired = [statistics.median(x["paired"]) for x in runs if x.get("paired")]
        out[v] = {
            "paired_ratio": statistics.median(paired) if paired else None,
            "paired_min": min(paired) if paired else None,
            "paired_max": max(paired) if paired else None,
            "step_ms": statistics.median(statistics.median(x["walls"]) for x in runs) * 1e3,
            "step_ratio": statistics.median(steps),
            "step_min": min(steps),
            "step_max": max(steps),
            "cpu_ratio": sum(x["cpu_s"] for x, _ in both) / sum(p["cpu_s"] for _, p in both),
            "first_s": statistics.median(x["first_s"] for x in runs),
            "compile_ratio": statistics.median(firsts),
            "compile_only_ratio": statistics.median(compiles),
            "rss_mib": rss,
            "rss_ratio": rss / plain_rss if rss and plain_rss else None,
            "faults": statistics.median(x.get("faults", 0.0) for x in runs),
            "rounds": len(steps),
        }
    return out


def _compile_s(run: dict[str, Any]) -> float:
    """A child's first call less its median step (at least a millisecond)."""
    return max(1e-3, float(run["first_s"] - statistics.median(run["walls"])))


def targets(
    model: str, v: str, summary: dict[str, dict[str, Any]]
) -> list[tuple[str, bool | None]]:
    """The targets that apply to ``v``: (what, met), met None when not measured.

    The targets are on the common order, nanscope switched on first; the ``:late``
    variants are a check that switching on after jitting works the same.
    """
    me = summary[v]
    out: list[tuple[str, bool | None]] = []
    for m, tv, limit in STEP_TARGETS:
        if m == model and tv == v:
            # The limit on the paired ratio where measured (plain in the same process).
            r = me.get("paired_ratio") or me.get("step_ratio")
            out.append((f"step <= {limit}x", None if r is None else r <= limit))
            if model == "mlp":
                # Against JAX's checkers, process against process: jax_debug_nans has no
                # paired ratio.
                mine = me.get("step_ratio")
                for other in BEAT:
                    o = summary.get(other, {}).get("step_ratio")
                    met = None if mine is None or o is None else mine < o
                    out.append((f"below {other}", met))
    if v in NANSCOPE:
        c = me.get("compile_ratio")
        out.append((f"compile <= {COMPILE_LIMIT:g}x", None if c is None else c <= COMPILE_LIMIT))
        rss = me.get("rss_ratio")
        out.append((f"memory <= {RSS_LIMIT:g}x", None if rss is None else rss <= RSS_LIMIT))
    return out


def _verdict(met: bool | None) -> str:
    return "not measured" if met is None else "met" if met else "MISSED"


def _x(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def model_table(model: str, res: dict[str, Any]) -> tuple[list[str], list[bool | None]]:
    """A model's table (markdown lines), and the verdicts of its targets."""
    s = res["settings"]
    summary = summarize(res)
    lines = [
        f"### {MODEL_TITLE[model]}" + (f", batch {s['batch']}" if model == "transformer" else ""),
        "",
        f"Rounds: {s['rounds']}, each variant in a fresh child per round: {s['warmup']} warm-up "
        f"steps, {s['steps']} timed steps. Peak memory: "
        + (
            f"one more child per variant, {s['mem_steps']} steps."
            if s["mem_steps"]
            else "not measured."
        )
        + " Paired ratio: in the same child, after the timed steps, blocks of the variant's"
        " steps alternate with blocks of plain's (the step compiled ahead of time, which"
        f" nanscope leaves alone), {s['paired']} pairs: the median over a child's pairs of"
        " the variant's time over plain's, then the median over rounds; the step targets are"
        " judged on it where measured (the noise between processes cancels)."
        + " Page faults/step: the minor page faults of a timed step (median over rounds):"
        " memory the allocator gave back to the kernel and took again."
        + " First-call ratio: the first call (tracing, XLA compilation, one execution) over "
        "plain's, the compile target's measure; less a step: the same with each child's median "
        "step taken off the first call.",
        "",
        *table_head(
            [
                "variant",
                "step ms (median)",
                "step ratio (min-max over rounds)",
                "paired ratio (min-max over rounds)",
                "CPU ratio",
                "page faults/step",
                "first call s (median)",
                "first-call ratio",
                "less a step",
                "peak RSS MiB",
                "RSS ratio",
                "targets",
            ],
            numeric=False,
        ),
    ]
    verdicts: list[bool | None] = []
    for v, m in summary.items():
        tg = targets(model, v, summary)
        verdicts.extend(met for _, met in tg)
        if tg and all(met is None for _, met in tg):
            marks = f"not measured: {', '.join(what for what, _ in tg)}"
        else:
            marks = "; ".join(f"{what}: {_verdict(met)}" for what, met in tg)
        if "reason" in m:
            lines.append(table_row([v, m["reason"], "", "", "", "", "", "", "", "", "", marks]))
            continue
        spread = "" if v == "plain" else f" ({m['step_min']:.2f}-{m['step_max']:.2f})"
        rss = "-" if m["rss_mib"] is None else f"{m['rss_mib']:.0f}"
        paired = "-"
        if m["paired_ratio"] is not None:
            paired = f"{m['paired_ratio']:.2f}x ({m['paired_min']:.2f}-{m['paired_max']:.2f})"
        lines.append(
            table_row(
                [
                    v,
                    f"{m['step_ms']:.2f}",
                    f"{m['step_ratio']:.2f}x{spread}",
                    paired,
                    _x(m["cpu_ratio"]),
                    f"{m['faults']:.0f}",
                    f"{m['first_s']:.2f}",
                    _x(m["compile_ratio"]),
                    _x(m["compile_only_ratio"]),
                    rss,
                    _x(m["rss_ratio"]),
                    marks,
                ]
            )
        )
    lines += order_table(res)
    return lines, verdicts


def order_table(res: dict[str, Any]) -> list[str]:
    """Enable-first vs enable-after-jit dumps: records per file kind, side by side."""
    mem = res["memory"]
    # check_numerics writes no dump: its late variant is only timed.
    pairs = [
        (v.removesuffix(LATE), v) for v in mem if v.endswith(LATE) and v[: -len(LATE)] in MODES
    ]
    pairs = [(a, b) for a, b in pairs if a in mem and "na" not in mem[a] and "na" not in mem[b]]
    if not pairs:
        return []

    def records(r: dict[str, Any]) -> str:
        if "error" in r:
            return f"failed ({r['error']})"
        kinds = r.get("dump", {}).get("kinds", {})
        return ", ".join(f"{k} {d['records']}" for k, d in sorted(kinds.items())) or "no dump"

    lines = [
        "",
        f"nanscope switched on before jitting vs after the step was jitted and first called "
        f"(dump records per file kind after {res['settings']['mem_steps']} steps):",
        "",
        *table_head(["variant", "enable first", "enable after jit", "same"], numeric=False),
    ]
    for a, b in pairs:
        ra, rb = records(mem[a]), records(mem[b])
        lines.append(table_row([a, ra, rb, "yes" if ra == rb else "NO"]))
    return lines


def main(argv: list[str] | None = None) -> None:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["mlp", "transformer", "both"], default="both")
    ap.add_argument("--rounds", type=int, help="timing rounds (default: MLP 7, Transformer 3)")
    ap.add_argument(
        "--steps", type=int, help="timed steps a child (default: MLP 100, Transformer 3)"
    )
    ap.add_argument(
        "--variants",
        help=f"only these variants, comma-separated (plain is always run); from {VARIANTS}, "
        f"and MODE{LATE} for a nanscope variant",
    )
    ap.add_argument("--late", action="store_true", help=f"add MODE{LATE} for each nanscope variant")
    ap.add_argument("--mem-steps", type=int, help="steps of the memory children (0: no memory)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: MLP 2 rounds of 20 steps; Transformer at batch 8, 1 round of 2 steps, "
        "no memory children; implies --late",
    )
    ap.add_argument(
        "--paired",
        type=int,
        help="block pairs of the variant and plain in each timing child (default: MLP 10, "
        "Transformer 3; 0: none)",
    )
    ap.add_argument("--json", help="also write the raw results here")
    args = ap.parse_args(argv)

    variants = list(VARIANTS)
    if args.variants:
        asked = [v for v in args.variants.split(",") if v and v != "plain"]
        known = VARIANTS + [v + LATE for v in NANSCOPE]
        unknown = sorted(set(asked) - set(known))
        if unknown:
            sys.exit(f"unknown variants {unknown}; choose from {known}")
        variants = ["plain", *dict.fromkeys(asked)]
    if args.late or args.quick:
        variants += [v + LATE for v in variants if v in NANSCOPE and v + LATE not in variants]
    models = MODELS if args.model == "both" else [args.model]

    started = time.time()
    src0 = source_state()
    load0 = os.getloadavg()
    results: dict[str, Any] = {}
    for model in models:
        mlp = model == "mlp"
        s = {
            "rounds": args.rounds or ((2 if mlp else 1) if args.quick else (7 if mlp else 3)),
            "steps": args.steps
            or ((20 if args.quick else 100) if mlp else (2 if args.quick else 3)),
            "warmup": (3 if args.quick else 10) if mlp else 1,
            "batch": MLP["batch"] if mlp else (8 if args.quick else TRANSFORMER["batch"]),
        }
        default_pairs = (2 if args.quick else 10) if mlp else (1 if args.quick else 3)
        s["paired"] = default_pairs if args.paired is None else args.paired
        # Quick: no memory children for the Transformer (checkify's alone compile ~100 s).
        default_mem = (5 if args.quick else 20) if mlp else (0 if args.quick else 2)
        s["mem_steps"] = default_mem if args.mem_steps is None else args.mem_steps
        log(f"{model}: {s}, variants {variants}")
        results[model] = measure(model, variants, s)

    jax_env = [(k, v) for k, v in JAX_ENV.items() if k.startswith(("JAX", "XLA"))]
    lines = [
        f"Command: {' '.join([Path(sys.executable).name, *sys.argv])}",
        f"{source_line(src0, source_state())}",
        f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {machine()}, load average "
        f"{load0[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end, {time.time() - started:.0f} s",
        f"Children: {', '.join(f'{k}={v}' for k, v in jax_env)}; one XLA compute thread "
        "(see the docstring)",
        "",
    ]
    verdicts: list[bool | None] = []
    for model in models:
        table, vs = model_table(model, results[model])
        lines += [*table, ""]
        verdicts += vs
    met = sum(1 for v in verdicts if v is True)
    missed = sum(1 for v in verdicts if v is False)
    unmeasured = sum(1 for v in verdicts if v is None)
    lines.append(f"Targets: {met} met, {missed} missed, {unmeasured} not measured.")
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
