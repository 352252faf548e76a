"""Benchmark: what nanscope's PyTorch recording costs per training step.

Step-time ratio (instrumented / plain) for every tensor debug mode, for
nanscope's ``enable_check_numerics`` and for ``torch.autograd.detect_anomaly()``,
on two models, side by side with TensorFlow's own Debugger V2 on the same MLP:

* **MLP**: the seed tutorial's 784-500-10 MLP, batch 100, with the hand-written
  cross-entropy ``-(labels * log(softmax(logits))).sum() / batch``, trained
  with SGD. The probabilities are clamped (``log(p.clamp_min(1e-6))``) so that
  no Inf/NaN appears: this measures the cost of recording, not of the rare
  non-finite path. Written once in PyTorch and once in TensorFlow (same sizes,
  same data and initial weights, eager ``GradientTape`` and a hand-written SGD
  update, every op eager), where TensorFlow's
  ``tf.debugging.experimental.enable_dump_debug_info`` and
  ``tf.debugging.enable_check_numerics`` are measured.
* **Transformer**: ``nn.TransformerEncoder`` (4 layers, d_model 256, nhead 4,
  dim_feedforward 1024, dropout 0.1), batch 64, sequence 128, with an
  embedding of 1000 tokens, a linear head to 1000 classes per token and
  ``F.cross_entropy``, SGD. FULL_TENSOR is not run on it (a 1000-event buffer
  of its activations is gigabytes).

Method (the machine is shared and noisy): every timing runs in its own child
process with one compute thread (``torch.set_num_threads(1)``; TensorFlow's
intra- and inter-op pools set to 1), so that both frameworks get the same
core and nanscope's writer thread may use another. Runs are interleaved: in
each round every variant, in a shuffled order, is switched on (a fresh
session with its own dump directory), warmed up, timed for K steps and
switched off (closing the session is outside the timed steps). A variant's
wall ratio is the median over rounds of (its median step time / plain's
median step time in the same round). The CPU-time ratio uses
``time.process_time`` (all threads, so nanscope's writer thread counts),
summed over all rounds: the writer rewrites its files once a second, which
only some rounds contain. Peak memory is the ``ru_maxrss`` of a separate
short child per variant (the parent imports nothing heavy, so it does not
inflate it). Dump sizes come from the MLP memory children (20 steps,
circular buffer 1000, which keeps all of them). Children start from a short
``python -c`` stub, so that the stack under each op is a short script's
(``--as-script`` runs them as this 1000-line file instead; see ``_STUB``).

    .venv/bin/python bench/overhead_torch.py                 # the full run (~10 min)
    .venv/bin/python bench/overhead_torch.py --quick         # smoke run (small Transformer)
    .venv/bin/python bench/overhead_torch.py --skip-tf --skip-transformer --rounds 5
    .venv/bin/python bench/overhead_torch.py --breakdown     # where nanscope's time goes (MLP)

``--breakdown`` times a ladder of partial recorders on the MLP (a no-op
dispatch mode; nanscope without stack capture and without the writer; with
stack capture; the whole NO_TENSOR; FULL_HEALTH without and with the writer)
and prints a cProfile of FULL_HEALTH steps grouped by nanscope file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
MODES = ["NO_TENSOR", "CURT_HEALTH", "CONCISE_HEALTH", "FULL_HEALTH", "SHAPE", "FULL_TENSOR"]
# "python:MODE": the same mode with the Python dispatch-mode recorder, the
# fallback where the native recorder cannot be built.
PYTHON_RECORDER = ["python:NO_TENSOR", "python:FULL_HEALTH"]
TORCH_VARIANTS = ["plain", *MODES, *PYTHON_RECORDER, "check_numerics", "detect_anomaly"]
TF_VARIANTS = ["plain", *MODES, "check_numerics"]
# Targets from the issue: (model, variant, limit) on the wall ratio.
TARGETS = [
    ("mlp", "NO_TENSOR", 1.3),
    ("mlp", "FULL_HEALTH", 2.0),
    ("transformer", "FULL_HEALTH", 1.5),
    ("transformer", "check_numerics", 1.3),
]

MLP = {"batch": 100, "n_in": 784, "hidden": 500, "classes": 10, "lr": 0.01}
TRANSFORMER = {
    "batch": 64,
    "seq": 128,
    "d_model": 256,
    "nhead": 4,
    "ff": 1024,
    "layers": 4,
    "vocab": 1000,
    "lr": 0.01,
}


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        TF_NUM_INTRAOP_THREADS="1",
        TF_NUM_INTEROP_THREADS="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONWARNINGS="ignore",
    )
    return env


def _peak_rss_mib() -> dict[str, float]:
    import resource

    out = {"ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                out["vmhwm"] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return out


def _count_records(path: Path) -> int:
    """Records in a TFRecord-framed file (u64 length, u32 crc, data, u32 crc)."""
    n = 0
    with open(path, "rb") as fh:
        data = fh.read()
    pos = 0
    while pos + 12 <= len(data):
        length = int.from_bytes(data[pos : pos + 8], "little")
        pos += 12 + length + 4
        n += 1
    return n


def _dump_facts(logdir: Path) -> dict[str, Any]:
    total = 0
    facts: dict[str, Any] = {"execution_bytes": 0, "execution_records": 0, "source_file_bytes": 0}
    for p in logdir.rglob("*"):
        if not p.is_file():
            continue
        size = p.stat().st_size
        total += size
        if p.name.endswith(".execution"):
            facts["execution_bytes"] += size
            facts["execution_records"] += _count_records(p)
        elif p.name.endswith(".source_files"):
            facts["source_file_bytes"] += size
    facts["total_bytes"] = total
    return facts


# --------------------------------------------------------------------------------------------
# PyTorch side (children)


def _torch_setup() -> Any:
    import torch

    torch.set_num_threads(1)
    with contextlib.suppress(RuntimeError):  # already set in this process
        torch.set_num_interop_threads(1)
    return torch


def _mlp_data() -> dict[str, Any]:
    """The MLP's data and initial weights, identical for PyTorch and TensorFlow."""
    import numpy as np

    rng = np.random.default_rng(0)
    b, n, h, c = MLP["batch"], MLP["n_in"], MLP["hidden"], MLP["classes"]
    x = rng.random((b, n), dtype=np.float32)  # like MNIST pixels in [0, 1)
    labels = np.eye(c, dtype=np.float32)[rng.integers(0, c, b)]
    w1 = (rng.standard_normal((n, h)) * np.sqrt(2.0 / n)).astype(np.float32)
    w2 = (rng.standard_normal((h, c)) * np.sqrt(1.0 / h)).astype(np.float32)
    return {
        "x": x,
        "labels": labels,
        "w1": w1,
        "b1": np.zeros(h, np.float32),
        "w2": w2,
        "b2": np.zeros(c, np.float32),
    }


def _torch_mlp(torch: Any) -> Any:
    nn = torch.nn
    d = _mlp_data()

    class SeedMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(MLP["n_in"], MLP["hidden"])
            self.fc2 = nn.Linear(MLP["hidden"], MLP["classes"])

        def forward(self, x: Any) -> Any:
            return self.fc2(torch.relu(self.fc1(x)))

    model = SeedMLP()
    with torch.no_grad():
        # nn.Linear keeps (out, in); TensorFlow's matmul takes (in, out).
        model.fc1.weight.copy_(torch.from_numpy(d["w1"]).t())
        model.fc1.bias.copy_(torch.from_numpy(d["b1"]))
        model.fc2.weight.copy_(torch.from_numpy(d["w2"]).t())
        model.fc2.bias.copy_(torch.from_numpy(d["b2"]))
    x = torch.from_numpy(d["x"])
    labels = torch.from_numpy(d["labels"])
    opt = torch.optim.SGD(model.parameters(), lr=MLP["lr"])
    n = MLP["batch"]

    def step() -> None:
        opt.zero_grad()
        probs = torch.softmax(model(x), dim=1)
        # Clamped so that no Inf/NaN appears while timing.
        loss = -(labels * torch.log(probs.clamp_min(1e-6))).sum() / n
        loss.backward()
        opt.step()

    return step


def _torch_transformer(torch: Any, batch: int) -> Any:
    nn = torch.nn
    F = torch.nn.functional
    c = TRANSFORMER
    torch.manual_seed(0)

    class TinyTransformer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(c["vocab"], c["d_model"])
            layer = nn.TransformerEncoderLayer(
                c["d_model"], c["nhead"], c["ff"], dropout=0.1, batch_first=True
            )
            self.encoder = nn.TransformerEncoder(layer, c["layers"], enable_nested_tensor=False)
            self.head = nn.Linear(c["d_model"], c["vocab"])

        def forward(self, tokens: Any) -> Any:
            return self.head(self.encoder(self.embed(tokens)))

    model = TinyTransformer()
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, c["vocab"], (batch, c["seq"]), generator=g)
    targets = torch.randint(0, c["vocab"], (batch, c["seq"]), generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=c["lr"])

    def step() -> None:
        opt.zero_grad()
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, c["vocab"]), targets.reshape(-1))
        loss.backward()
        opt.step()

    return step


def _torch_model(torch: Any, cfg: dict[str, Any]) -> Any:
    if cfg["model"] == "mlp":
        return _torch_mlp(torch)
    return _torch_transformer(torch, cfg["batch"])


class _TorchVariant:
    """Switches one variant on and off (a fresh nanscope session each time)."""

    def __init__(self, torch: Any, name: str, logdir: Path) -> None:
        self.torch = torch
        self.name = name
        self.logdir = logdir
        self.session: Any = None
        self.anomaly: Any = None
        self.executions = 0

    def __enter__(self) -> _TorchVariant:
        import nanscope

        if self.name in MODES:
            self.session = nanscope.enable_dump_debug_info(
                self.logdir, tensor_debug_mode=self.name, circular_buffer_size=1000
            )
        elif self.name in PYTHON_RECORDER:
            os.environ["NANSCOPE_TORCH_RECORDER"] = "python"
            try:
                self.session = nanscope.enable_dump_debug_info(
                    self.logdir,
                    tensor_debug_mode=self.name.split(":")[1],
                    circular_buffer_size=1000,
                )
            finally:
                del os.environ["NANSCOPE_TORCH_RECORDER"]
        elif self.name == "check_numerics":
            nanscope.enable_check_numerics()
        elif self.name == "detect_anomaly":
            self.anomaly = self.torch.autograd.detect_anomaly()
            self.anomaly.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        import nanscope

        if self.session is not None:
            self.session.close()
            self.executions = self.session.writer.stats.executions
            self.session = None
        elif self.name == "check_numerics":
            nanscope.disable_check_numerics()
        elif self.anomaly is not None:
            self.anomaly.__exit__(None, None, None)
            self.anomaly = None


def _time_steps(step: Any, k: int) -> tuple[list[float], float, float]:
    """K steps: per-step wall seconds, process CPU and main-thread CPU seconds per step."""
    import gc

    gc.collect()
    walls = []
    c0 = time.process_time()
    m0 = time.thread_time()
    for _ in range(k):
        t0 = time.perf_counter()
        step()
        walls.append(time.perf_counter() - t0)
    return walls, (time.process_time() - c0) / k, (time.thread_time() - m0) / k


def _interleave(
    variants: list[str],
    rounds: int,
    steps: int,
    warmup: int,
    switch: Any,
    step: Any,
    label: str,
) -> dict[str, Any]:
    """Rounds of all variants in a shuffled order; per-round medians and CPU totals."""
    import random
    import shutil

    per: dict[str, dict[str, list[float]]] = {
        v: {"wall": [], "mean": [], "cpu": [], "main_cpu": [], "ops_per_step": []} for v in variants
    }
    root = Path(tempfile.mkdtemp(prefix=f"nanscope-bench-{label}-"))
    try:
        for r in range(rounds):
            order = list(variants)
            random.Random(1000 + r).shuffle(order)
            for v in order:
                logdir = root / f"{v}-r{r}"
                with switch(v, logdir) as sw:
                    for _ in range(warmup):
                        step()
                    walls, cpu, main_cpu = _time_steps(step, steps)
                per[v]["wall"].append(statistics.median(walls))
                per[v]["mean"].append(statistics.mean(walls))
                per[v]["cpu"].append(cpu)
                per[v]["main_cpu"].append(main_cpu)
                executions = getattr(sw, "executions", 0)
                if executions:
                    per[v]["ops_per_step"].append(executions / (warmup + steps))
                shutil.rmtree(logdir, ignore_errors=True)
            line = "  ".join(f"{v}={per[v]['wall'][-1] * 1e3:.1f}" for v in variants)
            print(f"[{label}] round {r + 1}/{rounds} ms: {line}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return summarize(per)


def summarize(per: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    plain = per["plain"]
    out: dict[str, Any] = {}
    for v, d in per.items():
        ratios = [w / p for w, p in zip(d["wall"], plain["wall"], strict=True)]
        means = [w / p for w, p in zip(d["mean"], plain["mean"], strict=True)]
        out[v] = {
            # Mean step over mean plain step, median over rounds: what a long run's
            # throughput sees, periodic stalls (flushes, GIL waits) included.
            "ratio_mean": statistics.median(means),
            "step_mean_ms": statistics.median(d["mean"]) * 1e3,
            "step_ms": statistics.median(d["wall"]) * 1e3,
            "ratio_wall": statistics.median(ratios),
            "ratio_wall_min": min(ratios),
            "ratio_wall_max": max(ratios),
            "ratio_cpu": sum(d["cpu"]) / sum(plain["cpu"]),
            "ratio_main_cpu": sum(d["main_cpu"]) / sum(plain["main_cpu"]),
            "cpu_ms": statistics.mean(d["cpu"]) * 1e3,
            "main_cpu_ms": statistics.mean(d["main_cpu"]) * 1e3,
            "main_cpu_min_ms": min(d["main_cpu"]) * 1e3,
            "other_cpu_min_ms": min(c - m for c, m in zip(d["cpu"], d["main_cpu"], strict=True))
            * 1e3,
            "ops_per_step": statistics.mean(d["ops_per_step"]) if d["ops_per_step"] else None,
            "rounds_wall_ms": [w * 1e3 for w in d["wall"]],
        }
    return out


def child_torch_time(cfg: dict[str, Any]) -> dict[str, Any]:
    torch = _torch_setup()
    step = _torch_model(torch, cfg)
    for _ in range(cfg["warmup"]):
        step()  # first-call costs (allocator, kernels) before any round

    def switch(v: str, logdir: Path) -> _TorchVariant:
        return _TorchVariant(torch, v, logdir)

    return _interleave(
        cfg["variants"], cfg["rounds"], cfg["steps"], cfg["warmup"], switch, step, cfg["model"]
    )


def child_torch_mem(cfg: dict[str, Any]) -> dict[str, Any]:
    torch = _torch_setup()
    step = _torch_model(torch, cfg)
    logdir = Path(tempfile.mkdtemp(prefix="nanscope-bench-mem-"))
    try:
        with _TorchVariant(torch, cfg["variant"], logdir) as sw:
            for _ in range(cfg["steps"]):
                step()
        out: dict[str, Any] = _peak_rss_mib()
        if cfg["variant"] in MODES:
            out["dump"] = _dump_facts(logdir)
            out["dump"]["executions"] = sw.executions
            out["dump"]["steps"] = cfg["steps"]
        return out
    finally:
        import shutil

        shutil.rmtree(logdir, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# TensorFlow side (children)


def _tf_setup() -> Any:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    return tf


def _tf_mlp(tf: Any) -> Any:
    d = _mlp_data()
    x = tf.constant(d["x"])
    labels = tf.constant(d["labels"])
    w1, b1 = tf.Variable(d["w1"]), tf.Variable(d["b1"])
    w2, b2 = tf.Variable(d["w2"]), tf.Variable(d["b2"])
    params = [w1, b1, w2, b2]
    lr = MLP["lr"]
    n = float(MLP["batch"])

    def step() -> None:
        with tf.GradientTape() as tape:
            hidden = tf.nn.relu(tf.matmul(x, w1) + b1)
            probs = tf.nn.softmax(tf.matmul(hidden, w2) + b2)
            # Clamped like the PyTorch side.
            loss = -tf.reduce_sum(labels * tf.math.log(tf.maximum(probs, 1e-6))) / n
        grads = tape.gradient(loss, params)
        for p, g in zip(params, grads, strict=True):
            p.assign_sub(lr * g)

    return step


class _TFVariant:
    def __init__(self, tf: Any, name: str, logdir: Path) -> None:
        self.tf = tf
        self.name = name
        self.logdir = logdir

    def __enter__(self) -> _TFVariant:
        if self.name in MODES:
            self.tf.debugging.experimental.enable_dump_debug_info(
                str(self.logdir), tensor_debug_mode=self.name, circular_buffer_size=1000
            )
        elif self.name == "check_numerics":
            self.tf.debugging.enable_check_numerics()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.name in MODES:
            self.tf.debugging.experimental.disable_dump_debug_info()
        elif self.name == "check_numerics":
            self.tf.debugging.disable_check_numerics()


def child_tf_time(cfg: dict[str, Any]) -> dict[str, Any]:
    tf = _tf_setup()
    step = _tf_mlp(tf)
    for _ in range(cfg["warmup"]):
        step()

    def switch(v: str, logdir: Path) -> _TFVariant:
        return _TFVariant(tf, v, logdir)

    out = _interleave(
        cfg["variants"], cfg["rounds"], cfg["steps"], cfg["warmup"], switch, step, "tf-mlp"
    )
    out["_tf_version"] = tf.__version__
    return out


def child_tf_mem(cfg: dict[str, Any]) -> dict[str, Any]:
    import shutil

    tf = _tf_setup()
    step = _tf_mlp(tf)
    logdir = Path(tempfile.mkdtemp(prefix="nanscope-bench-tfmem-"))
    try:
        with _TFVariant(tf, cfg["variant"], logdir):
            for _ in range(cfg["steps"]):
                step()
        out: dict[str, Any] = _peak_rss_mib()
        if cfg["variant"] in MODES:
            out["dump"] = _dump_facts(logdir)
            out["dump"]["executions"] = out["dump"]["execution_records"]
            out["dump"]["steps"] = cfg["steps"]
        return out
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# Breakdown: where nanscope's time goes on the MLP


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
    import cProfile
    import io
    import itertools
    import pstats
    import types

    from torch.utils._python_dispatch import TorchDispatchMode

    import nanscope

    torch = _torch_setup()
    step = _torch_mlp(torch)
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

    ladder = [
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
    result = _interleave(
        ladder, cfg["rounds"], cfg["steps"], cfg["warmup"], Ladder, step, "breakdown"
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
    import shutil

    shutil.rmtree(logdir, ignore_errors=True)
    return {"ladder": result, "profile": buf.getvalue()}


# -- torch.compile (--compiled) ----------------------------------------------------------------
# The compiled Transformer: the same model as _torch_transformer (dropout 0 here, so that
# compiled and instrumented steps do the same work), compiled with torch.compile's default
# inductor backend. Every switch of a nanscope session resets Dynamo (see
# nanscope.backends.torch.compiled), so each variant recompiles in its warm-up steps (inductor's
# on-disk FX graph cache makes repeats cheap); compile time is never in the timed steps.
COMPILED_VARIANTS = ["plain", *MODES]
STEADY_VARIANTS = ["plain", "NO_TENSOR", "FULL_HEALTH", *PYTHON_RECORDER]


def _compiled_transformer(torch: Any, cfg: dict[str, Any]) -> Any:
    nn = torch.nn
    F = torch.nn.functional
    torch.manual_seed(0)
    d, vocab = cfg["d_model"], TRANSFORMER["vocab"]

    class TinyTransformer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            layer = nn.TransformerEncoderLayer(
                d, TRANSFORMER["nhead"], 4 * d, dropout=0.0, batch_first=True
            )
            self.encoder = nn.TransformerEncoder(layer, cfg["layers"], enable_nested_tensor=False)
            self.head = nn.Linear(d, vocab)

        def forward(self, tokens: Any) -> Any:
            return self.head(self.encoder(self.embed(tokens)))

    model = TinyTransformer()
    compiled = torch.compile(model)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (cfg["batch"], cfg["seq"]), generator=g)
    targets = torch.randint(0, vocab, (cfg["batch"], cfg["seq"]), generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=TRANSFORMER["lr"])

    def step() -> None:
        opt.zero_grad()
        logits = compiled(tokens)
        loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        opt.step()

    return step


def child_torch_compiled_time(cfg: dict[str, Any]) -> dict[str, Any]:
    torch = _torch_setup()
    step = _compiled_transformer(torch, cfg)
    for _ in range(cfg["warmup"]):
        step()

    def switch(v: str, logdir: Path) -> _TorchVariant:
        return _TorchVariant(torch, v, logdir)

    return _interleave(
        cfg["variants"], cfg["rounds"], cfg["steps"], cfg["warmup"], switch, step, "compiled"
    )


def run_compiled(args: Any) -> None:
    """``--compiled``: compiled Transformer, plain vs every mode, side by side."""
    cfg = {
        "layers": args.compiled_layers,
        "d_model": args.compiled_d_model,
        "batch": args.compiled_batch,
        "seq": args.compiled_seq,
        "variants": [v for v in COMPILED_VARIANTS if v in args.compiled_variants.split(",")],
        "rounds": args.rounds or 3,
        "steps": args.compiled_steps,
        "warmup": 2,
    }
    started = time.time()
    res = run_child("torch-compiled-time", cfg, timeout=3600)
    print(f"torch.compile Transformer: {cfg}  ({time.time() - started:.0f} s)")
    from benchlib import source_state  # parent only: children load this file from a stub

    print(f"{source_state()}  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print("| variant | step ms | wall ratio (min-max) | CPU ratio |")
    print("|---|---:|---:|---:|")
    for v in cfg["variants"]:
        r = res[v]
        print(
            f"| {v} | {r['step_ms']:.1f} | {r['ratio_wall']:.2f} "
            f"({r['ratio_wall_min']:.2f}-{r['ratio_wall_max']:.2f}) | {r['ratio_cpu']:.2f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"compiled": res, "cfg": cfg}, indent=1))


CHILDREN = {
    "torch-time": child_torch_time,
    "torch-mem": child_torch_mem,
    "tf-time": child_tf_time,
    "tf-mem": child_tf_mem,
    "breakdown": child_breakdown,
    "torch-compiled-time": child_torch_compiled_time,
}


# --------------------------------------------------------------------------------------------
# The parent: stdlib only


# Children start from a few-line ``-c`` stub that imports this file as a module, so that
# the Python stack under each op is a short script's (a stub, then functions), not this
# 1000-line file's ``<module>`` frame: nanscope interns stack frames in dictionaries
# keyed by code objects, and hashing a module's code object hashes all the code in it
# (about 11-17 us for this file, 1.3 us for the 123-line tutorial script), twice per op.
# ``--as-script`` runs the children as ``python bench/overhead_torch.py`` to show that.
_STUB = (
    "import importlib.util, json, sys\n"
    "spec = importlib.util.spec_from_file_location('overhead_torch', sys.argv[1])\n"
    "bench = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(bench)\n"
    "print(json.dumps(bench.CHILDREN[sys.argv[2]](json.loads(sys.argv[3]))))\n"
)
AS_SCRIPT = False


def run_child(kind: str, cfg: dict[str, Any], timeout: float = 900) -> Any:
    if AS_SCRIPT:
        cmd = [sys.executable, str(HERE), "--child", kind, json.dumps(cfg)]
    else:
        cmd = [sys.executable, "-c", _STUB, str(HERE), kind, json.dumps(cfg)]
    proc = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=None, text=True, env=_child_env(), timeout=timeout
    )
    if proc.returncode != 0:
        raise SystemExit(f"child {kind} {cfg} failed with exit status {proc.returncode}")
    last = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
    return json.loads(last)


def _fmt(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if x is None else f"{x:{spec}}{suffix}"


def _label(v: str, framework: str) -> str:
    if framework == "tf":
        return f"TF {v}"
    if v in ("plain", "detect_anomaly"):
        return f"torch {v}"
    if v in PYTHON_RECORDER:
        return f"nanscope {v.split(':')[1]} (Python recorder)"
    return f"nanscope {v}"


def table(timing: dict[str, Any], mem: dict[str, Any], framework: str = "torch") -> list[str]:
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
    lines = [
        "| mode | nanscope ops/step | nanscope B/op (.execution) | nanscope dump B/step "
        "| nanscope dump total | TF ops/step | TF B/op (.execution) | TF dump B/step "
        "| TF dump total (of which source snapshots) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

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
        lines.append(f"| {mode} | {' | '.join(a)} | {b[0]} | {b[1]} | {b[2]} | {tail} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few rounds and steps; small Transformer")
    ap.add_argument("--skip-tf", action="store_true")
    ap.add_argument("--skip-transformer", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--skip-steady", action="store_true", help="no long-run MLP section")
    ap.add_argument("--rounds", type=int, help="rounds for the MLP (both frameworks)")
    ap.add_argument("--transformer-rounds", type=int)
    ap.add_argument("--breakdown", action="store_true", help="only the MLP cost breakdown")
    ap.add_argument("--json", help="also write the raw results here")
    ap.add_argument(
        "--as-script",
        action="store_true",
        help="run the children as this script (its 1000-line <module> frame under every op)",
    )
    ap.add_argument("--compiled", action="store_true", help="only the torch.compile section")
    ap.add_argument("--compiled-layers", type=int, default=TRANSFORMER["layers"])
    ap.add_argument("--compiled-d-model", type=int, default=TRANSFORMER["d_model"])
    ap.add_argument("--compiled-batch", type=int, default=TRANSFORMER["batch"])
    ap.add_argument("--compiled-seq", type=int, default=TRANSFORMER["seq"])
    ap.add_argument("--compiled-steps", type=int, default=3)
    ap.add_argument("--compiled-variants", default=",".join(COMPILED_VARIANTS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("cfg", nargs="?", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        result = CHILDREN[args.child](json.loads(args.cfg))
        print(json.dumps(result))
        return
    global AS_SCRIPT
    AS_SCRIPT = args.as_script
    if args.compiled:
        run_compiled(args)
        return

    quick = args.quick
    mlp_rounds = args.rounds or (2 if quick else 7)
    mlp_steps = 10 if quick else 40
    tr_rounds = args.transformer_rounds or (1 if quick else 3)
    tr_batch = 8 if quick else TRANSFORMER["batch"]
    mem_steps = 5 if quick else 20
    started = time.time()
    load0 = os.getloadavg()

    if args.breakdown:
        res = run_child(
            "breakdown",
            {"rounds": args.rounds or (2 if quick else 11), "steps": mlp_steps, "warmup": 3},
            timeout=1800,
        )
        print_breakdown(res)
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=1))
        return

    from benchlib import source_state  # parent only: children load this file from a stub

    results: dict[str, Any] = {
        "git": source_state(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}",
        "settings": {
            "mlp_rounds": mlp_rounds,
            "mlp_steps": mlp_steps,
            "transformer_rounds": tr_rounds,
            "transformer_batch": tr_batch,
            "mem_steps": mem_steps,
            "as_script": args.as_script,
        },
    }

    def log(msg: str) -> None:
        print(f"[{time.time() - started:6.0f}s] {msg}", file=sys.stderr, flush=True)

    log("PyTorch MLP timing")
    results["mlp"] = run_child(
        "torch-time",
        {
            "model": "mlp",
            "variants": TORCH_VARIANTS,
            "rounds": mlp_rounds,
            "steps": mlp_steps,
            "warmup": 3,
        },
    )
    if not args.skip_tf:
        log("TensorFlow MLP timing")
        results["tf_mlp"] = run_child(
            "tf-time",
            {"variants": TF_VARIANTS, "rounds": mlp_rounds, "steps": mlp_steps, "warmup": 3},
        )
    if not args.skip_transformer:
        log("PyTorch Transformer timing")
        results["transformer"] = run_child(
            "torch-time",
            {
                "model": "transformer",
                "batch": tr_batch,
                "variants": [v for v in TORCH_VARIANTS if v != "FULL_TENSOR"],
                "rounds": tr_rounds,
                "steps": 1,
                "warmup": 1,
            },
            timeout=1800,
        )

    steady_steps = 150 if quick else 600
    results["settings"]["steady_steps"] = steady_steps
    if not args.skip_steady:
        log("PyTorch MLP, long runs")
        results["steady"] = run_child(
            "torch-time",
            {
                "model": "mlp",
                "variants": STEADY_VARIANTS,
                "rounds": 3,
                "steps": steady_steps,
                "warmup": 20,
            },
        )
    mem: dict[str, dict[str, Any]] = {"mlp": {}, "tf_mlp": {}, "transformer": {}}
    if not args.skip_memory:
        log("peak memory")
        for v in TORCH_VARIANTS:
            mem["mlp"][v] = run_child(
                "torch-mem", {"model": "mlp", "variant": v, "steps": mem_steps}
            )
        if not args.skip_tf:
            for v in TF_VARIANTS:
                mem["tf_mlp"][v] = run_child("tf-mem", {"variant": v, "steps": mem_steps})
        if not args.skip_transformer:
            for v in TORCH_VARIANTS:
                if v == "FULL_TENSOR":
                    continue
                mem["transformer"][v] = run_child(
                    "torch-mem",
                    {"model": "transformer", "batch": tr_batch, "variant": v, "steps": 2},
                )
    results["memory"] = mem
    results["loadavg_start"] = load0
    results["loadavg_end"] = os.getloadavg()
    results["seconds"] = time.time() - started
    log("done")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print("\n".join(report(results)))


def report(r: dict[str, Any]) -> list[str]:
    s = r["settings"]
    head = (
        "| variant | step ms (median) | ratio (wall; min–max over rounds) "
        "| ratio (CPU time) | peak RSS MiB | RSS ratio |"
    )
    sep = "|---|---|---|---|---|---|"
    out = [
        f"{r['command']}  ({r['date']}; commit {r['git']}; {r['machine']}; {r['seconds']:.0f} s; "
        f"load average {r['loadavg_start'][0]:.2f} at start, {r['loadavg_end'][0]:.2f} at end)",
        "",
        f"### MLP 784-500-10, batch 100 ({s['mlp_rounds']} rounds x {s['mlp_steps']} steps "
        "after 3 warm-up steps; peak RSS over "
        f"{s['mem_steps']} steps)",
        "",
        head,
        sep,
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
            head,
            sep,
            *table(r["transformer"], r["memory"]["transformer"]),
        ]
    if "steady" in r:
        out += [
            "",
            f"### MLP, long runs (3 rounds x {s['steady_steps']} steps after 20 warm-up steps, "
            "one session each)",
            "",
            "Each round keeps one recording session on for all its steps (~2 s), so the writer's",
            "periodic flushes and the background threads' work fall inside the timed steps;",
            "the mean step is what a long training run's throughput sees.",
            "",
            "| variant | step ms (median) | step ms (mean) | ratio of medians | ratio of means |",
            "|---|---|---|---|---|",
        ]
        for v, t in r["steady"].items():
            out.append(
                f"| {_label(v, 'torch')} | {t['step_ms']:.2f} | {t['step_mean_ms']:.2f} "
                f"| {t['ratio_wall']:.2f}x | {t['ratio_mean']:.2f}x |"
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
        if model in r:
            got = r[model][v]["ratio_wall"]
            verdict = "PASS" if got <= limit else "FAIL"
            out.append(f"- {model} {v} ≤ {limit}x: {got:.2f}x {verdict}")
    if "mlp" in r:
        fh = r["mlp"]["FULL_HEALTH"]["ratio_wall"]
        an = r["mlp"]["detect_anomaly"]["ratio_wall"]
        out.append(
            f"- mlp FULL_HEALTH below detect_anomaly ({an:.2f}x): {fh:.2f}x "
            f"{'PASS' if fh < an else 'FAIL'}"
        )
    if "tf_mlp" in r:
        for v in [*MODES, "check_numerics"]:
            ns, tf = r["mlp"][v]["ratio_wall"], r["tf_mlp"][v]["ratio_wall"]
            out.append(
                f"- mlp {v} below TensorFlow's ({tf:.2f}x): {ns:.2f}x "
                f"{'PASS' if ns < tf else 'FAIL'}"
            )
    return out


def print_breakdown(res: dict[str, Any]) -> None:
    lad = res["ladder"]
    ops = lad["NO_TENSOR"]["ops_per_step"] or lad["FULL_HEALTH"]["ops_per_step"]
    print(
        f"MLP, {ops:.0f} recorded ops per step. Main-thread CPU time per step "
        "(time.thread_time; the least contended round, like timeit's min):"
    )
    print("| variant | step ms (median) | main-thread CPU ms/step (min) | other threads ms/step |")
    print("|---|---|---|---|")
    for v, t in lad.items():
        print(
            f"| {v} | {t['step_ms']:.2f} | {t['main_cpu_min_ms']:.2f} "
            f"| {t['other_cpu_min_ms']:.2f} |"
        )

    def us(a: str, b: str) -> float:
        return float((lad[a]["main_cpu_min_ms"] - lad[b]["main_cpu_min_ms"]) * 1e3 / ops)

    parts = [
        ("dispatch-mode floor (a no-op TorchDispatchMode)", us("floor", "plain")),
        ("nanscope bookkeeping (_record without stack, summaries, writer)",
         us("NT-nostack-nowriter", "floor")),
        ("stack capture", us("NT-nowriter", "NT-nostack-nowriter")),
        ("writer enqueue on the training thread", us("NO_TENSOR", "NT-nowriter")),
        ("FULL_HEALTH summaries", us("FH-nowriter", "NT-nowriter")),
    ]  # fmt: skip
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
    print()
    print("| per op | µs |")
    print("|---|---|")
    for name, value in parts:
        print(f"| {name} | {value:.1f} |")
    print()
    print(res["profile"])


if __name__ == "__main__":
    main()
