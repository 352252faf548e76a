"""The measurements bench/overhead_torch.py runs in children (``CHILDREN``: kind -> function).

Each child imports its framework with one compute thread, builds its model,
and returns what it measured: the timing children the per-variant summaries
of interleaved rounds, the memory children their peak RSS and dump sizes.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import peak_rss_mib, pin_tf_threads, pin_torch_threads, vm_hwm_mib
from overhead_breakdown import child_breakdown, child_native_breakdown
from overhead_models import Step, compiled_transformer, tf_mlp, torch_model
from overhead_timing import Switch, interleave
from overhead_variants import MODES, TFVariant, TorchVariant


def _peak_memory() -> dict[str, Any]:
    """Peak RSS in MiB: ``ru_maxrss``, and ``vmhwm`` where /proc tells it."""
    out: dict[str, Any] = {"ru_maxrss": peak_rss_mib()}
    hwm = vm_hwm_mib()
    if hwm is not None:
        out["vmhwm"] = hwm
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
    """Sizes of a dump: all files, the .execution files (and their records), source files."""
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


def _time_variants(step: Step, switch: Switch, cfg: dict[str, Any], label: str) -> dict[str, Any]:
    """Warm-up steps, then interleaved rounds of ``cfg["variants"]``."""
    for _ in range(cfg["warmup"]):
        step()  # first-call costs (allocator, kernels) before any round
    return interleave(
        cfg["variants"], cfg["rounds"], cfg["steps"], cfg["warmup"], switch, step, label
    )


def _measure_memory(
    step: Step, switch: Switch, cfg: dict[str, Any], executions: Callable[[Any, Any], int]
) -> dict[str, Any]:
    """``cfg["steps"]`` steps with one variant on: peak RSS, and the dump's sizes.

    ``executions(switch, facts)`` is the number of executions the dump holds.
    """
    logdir = Path(tempfile.mkdtemp(prefix="nanscope-bench-mem-"))
    try:
        with switch(cfg["variant"], logdir) as sw:
            for _ in range(cfg["steps"]):
                step()
        out = _peak_memory()
        if cfg["variant"] in MODES:
            out["dump"] = _dump_facts(logdir)
            out["dump"]["executions"] = executions(sw, out["dump"])
            out["dump"]["steps"] = cfg["steps"]
        return out
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


def _torch_switch(torch: Any) -> Switch:
    def switch(v: str, logdir: Path) -> TorchVariant:
        return TorchVariant(torch, v, logdir)

    return switch


def _tf_switch(tf: Any) -> Switch:
    def switch(v: str, logdir: Path) -> TFVariant:
        return TFVariant(tf, v, logdir)

    return switch


def child_torch_time(cfg: dict[str, Any]) -> dict[str, Any]:
    """PyTorch timing rounds of ``cfg["model"]``."""
    torch = pin_torch_threads()
    return _time_variants(torch_model(torch, cfg), _torch_switch(torch), cfg, cfg["model"])


def child_torch_mem(cfg: dict[str, Any]) -> dict[str, Any]:
    """Peak memory (and dump sizes) of one PyTorch variant."""
    torch = pin_torch_threads()
    return _measure_memory(
        torch_model(torch, cfg), _torch_switch(torch), cfg, lambda sw, _facts: sw.executions
    )


def child_tf_time(cfg: dict[str, Any]) -> dict[str, Any]:
    """TensorFlow timing rounds of the MLP."""
    tf = pin_tf_threads()
    out = _time_variants(tf_mlp(tf), _tf_switch(tf), cfg, "tf-mlp")
    out["_tf_version"] = tf.__version__
    return out


def child_tf_mem(cfg: dict[str, Any]) -> dict[str, Any]:
    """Peak memory (and dump sizes) of one TensorFlow variant on the MLP."""
    tf = pin_tf_threads()
    return _measure_memory(
        tf_mlp(tf), _tf_switch(tf), cfg, lambda _sw, facts: facts["execution_records"]
    )


def child_torch_compiled_time(cfg: dict[str, Any]) -> dict[str, Any]:
    """Timing rounds of the Transformer under ``torch.compile``."""
    torch = pin_torch_threads()
    return _time_variants(compiled_transformer(torch, cfg), _torch_switch(torch), cfg, "compiled")


def child_torch_compile_cold(cfg: dict[str, Any]) -> dict[str, Any]:
    """One cold first compile of the compiled Transformer with ``cfg["variant"]`` on.

    Inductor's and AOTAutograd's on-disk caches go to a fresh directory (set
    before PyTorch is imported), so that nothing compiled by an earlier child is
    reused: the first step compiles the forward and backward graphs, the second
    only runs them. With ``cfg["profile"]``, a cProfile of the first step (the
    compile's functions by cumulative time) comes back too.
    """
    import os
    import time

    cache = tempfile.mkdtemp(prefix="nanscope-bench-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
    torch = pin_torch_threads()
    step = compiled_transformer(torch, cfg)
    logdir = Path(tempfile.mkdtemp(prefix="nanscope-bench-cold-"))
    out: dict[str, Any] = {}
    try:
        with TorchVariant(torch, cfg["variant"], logdir):
            prof = None
            if cfg.get("profile"):
                import cProfile

                prof = cProfile.Profile()
                prof.enable()
            t0 = time.perf_counter()
            step()
            first = time.perf_counter() - t0
            if prof is not None:
                prof.disable()
            t0 = time.perf_counter()
            step()
            second = time.perf_counter() - t0
        out = {"first_s": first, "second_s": second, "compile_s": first - second}
        if prof is not None:
            out["profile"] = _profile_text(prof)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    return out


def _profile_text(prof: Any, top: int = 40) -> str:
    """A profile's functions by cumulative time, then by self time."""
    import io
    import pstats

    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("cumulative").print_stats(top)
    st.sort_stats("tottime").print_stats(top)
    return buf.getvalue()


CHILDREN: dict[str, Callable[[dict[str, Any]], Any]] = {
    "torch-time": child_torch_time,
    "torch-mem": child_torch_mem,
    "tf-time": child_tf_time,
    "tf-mem": child_tf_mem,
    "breakdown": child_breakdown,
    "native-breakdown": child_native_breakdown,
    "torch-compiled-time": child_torch_compiled_time,
    "torch-compile-cold": child_torch_compile_cold,
}
