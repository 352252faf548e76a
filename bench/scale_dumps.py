"""Making bench/scale.py's synthetic multi-rank FULL_HEALTH dumps.

:func:`generate` writes one dump the way a multi-worker training job would: one
``DumpWriter`` per rank, each in its own child process (``jobs`` at a time), all
sharing one run id; each rank records the program of bench/scale_program.py
with real Python stacks through its generated modules.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from harness import (
    Child,
    ChildFailed,
    log,
    nanscope_location,
    send_result,
    start_child,
    with_peak_memory,
)
from scale_program import (
    BAD_TRACES,
    BRANCHES,
    EAGER_TYPES,
    GENERATOR_VERSION,
    PACKAGE,
    execs_in_step,
    graph_ops,
    rank_plan,
    schedule,
    traced,
    write_modules,
)

HERE = Path(__file__).resolve()


def _summary_rows(np: Any, entries: list[tuple[str, int, str, int]]) -> Any:
    """FULL_HEALTH rows: [tensor_id, device_id, dtype, rank, size, -inf, +inf, nan, -, 0, +]."""
    m = np.zeros((len(entries), 11), dtype=np.float64)
    for i, (_, _slot, typ, size) in enumerate(entries):
        if typ in ("Softmax", "Reciprocal", "Sqrt", "L2Loss"):
            neg, zero = 0, 0
        elif typ == "Log":
            neg, zero = size, 0
        elif typ in ("Relu", "ReluGrad"):
            neg, zero = 0, size // 2
        else:
            neg, zero = (size * 9) // 20, size // 50
        m[i] = (i + 1, -1, 1, 0 if size == 1 else 2, size, 0, 0, 0, neg, zero, size - neg - zero)
    return m


def _graph_id(cfg: dict[str, Any], rank: int, key: str) -> str:
    """A uuid4-like graph id, fixed by the run, the rank and the graph."""
    h = hashlib.sha256(f"{cfg['run_id']}/{rank}/{key}".encode()).digest()
    return str(uuid.UUID(bytes=h[:16], version=4))


def child_write_rank(cfg: dict[str, Any]) -> dict[str, Any]:
    """Write rank ``cfg["rank"]`` of the dump (a child); returns what it wrote and how fast."""
    rank = cfg["rank"]
    perf = time.perf_counter
    t0 = perf()
    import numpy as np

    from nanscope.events import DumpWriter, ExecutionEvent, Graph, GraphOp

    import_s = perf() - t0
    sys.path.insert(0, cfg["src"])
    import importlib

    manifest = json.loads((Path(cfg["src"]) / "manifest.json").read_text())
    modules = [importlib.import_module(m) for m in manifest["modules"]]
    for mod in modules:
        for alias, name in mod._CALLEES.items():
            setattr(mod, alias, sys.modules[name])
    funcs = [getattr(modules[m], name) for m, name in manifest["functions"]]
    plan = rank_plan(cfg, rank)
    ops = graph_ops()
    entries = {k: traced(v) for k, v in ops.items()}
    calls = schedule(plan["traces"], {k: len(v) for k, v in entries.items()})

    w = DumpWriter(
        cfg["dump"],
        "FULL_HEALTH",
        circular_buffer_size=-1,
        framework="bench/scale.py (synthetic)",
        run_id=cfg["run_id"],
        rank=rank,
        world_size=cfg["ranks"],
    )
    t_stacks = perf()
    # One stack per (function, branch) and one per leaf: every frame of the
    # generated program, through real calls, with random tails.
    rng = random.Random(cfg["seed"] * 1000 + rank)
    stacks: list[int] = []
    for f in funcs:
        stacks.append(f((), w.capture_stack))
        for b in range(BRANCHES):
            tail = tuple(rng.randrange(BRANCHES) for _ in range(rng.randint(2, 10)))
            stacks.append(f((b, *tail), w.capture_stack))
    rng.shuffle(stacks)
    stacks_s = perf() - t_stacks
    loop_stack = w.capture_stack()

    device = f"/job:worker/replica:0/task:{rank}/device:GPU:0"
    dev = w.register_device(device)
    gids = {k: _graph_id(cfg, rank, k) for k in ops}
    names = {
        "train": f"__inference_train_step_{4100 + 17 * rank}",
        "cond": f"cond_true_{4300 + 17 * rank}",
        "eval": f"__inference_test_step_{5200 + 17 * rank}",
    }
    w.write_graph(Graph(gids["train"], names["train"]))
    w.write_graph(Graph(gids["cond"], names["cond"], outer_graph_id=gids["train"]))
    w.write_graph(Graph(gids["eval"], names["eval"]))
    k = 0
    n_ops = 0
    for key, specs in ops.items():
        for name, typ, inputs, n_out, _size in specs:
            w.write_graph_op(
                GraphOp(
                    graph_id=gids[key],
                    op_type=typ,
                    op_name=name,
                    graph_name=names[key],
                    input_names=list(inputs),
                    num_outputs=n_out,
                    output_tensor_ids=[1000 * k + s for s in range(n_out)],
                    device_name=device,
                    stack=stacks[k % len(stacks)],
                )
            )
            k += 1
            n_ops += 1

    # Summaries: one matrix per graph, shared by all calls but the bad ones.
    base = {key: _summary_rows(np, v) for key, v in entries.items()}
    op_names = {key: [e[0] for e in v] for key, v in entries.items()}
    slots = {key: [e[1] for e in v] for key, v in entries.items()}
    bad_step = plan["bad_step"]
    bad_rows: dict[str, Any] = {}
    if bad_step is not None:
        for key in base:
            m = base[key].copy()
            pos = {(e[0], e[1]): i for i, e in enumerate(entries[key])}
            for (g, name, slot), (ni, pi, nn, zeros) in BAD_TRACES.items():
                if g == key and (name, slot) in pos:
                    row = m[pos[(name, slot)]]
                    row[5:8] = (ni, pi, nn)
                    row[9] += zeros
                    big = 8 if row[8] > row[10] else 10  # taken from the larger finite count
                    row[big] -= ni + pi + nn + zeros
            bad_rows[key] = m
    exec_summary = np.array([0, -1, 1, 1, 256, 0, 0, 0, 120, 16, 120], dtype=np.float64)
    loss_summary = np.array([0, -1, 1, 0, 1, 0, 0, 0, 0, 0, 1], dtype=np.float64)
    bad_loss = loss_summary.copy()
    bad_loss[7], bad_loss[10] = 1, 0

    steps = plan["steps"]
    n_execs = plan["executions"]
    n_stacks = len(stacks)
    exec_index = 0
    traces_written = 0
    t_loop = perf()
    c = 0
    for step in range(steps):
        step_calls = []
        while c < len(calls) and calls[c][0] == step:
            step_calls.append(calls[c])
            c += 1
        e_here = execs_in_step(n_execs, steps, step)
        graph_execs = min(e_here, len({"train", "eval"} & {key for _, key, _ in step_calls}))
        for j in range(e_here - graph_execs):
            w.write_execution(
                ExecutionEvent(
                    op_type=EAGER_TYPES[j % len(EAGER_TYPES)],
                    output_tensor_ids=[exec_index + 1],
                    input_tensor_ids=[exec_index] if j else [],
                    output_device_ids=[dev],
                    summaries=[exec_summary],
                    stack=stacks[exec_index % n_stacks],
                    step=step,
                )
            )
            exec_index += 1
        for i, (_, key, n) in enumerate(step_calls):
            m = bad_rows[key] if step == bad_step else base[key]
            w.write_traces(
                gids[key],
                op_names[key][:n],
                slots[key][:n],
                m[:n],
                device_name=device,
                step=step,
            )
            traces_written += n
            following = step_calls[i + 1][1] if i + 1 < len(step_calls) else ""
            if key == "train" and following == "cond":
                continue  # the nested cond runs inside the call: its execution comes after
            call = "train" if key == "cond" else key
            if graph_execs:
                graph_execs -= 1
                bad = step == bad_step and call == "train"
                w.write_execution(
                    ExecutionEvent(
                        op_type=names[call],
                        graph_id=gids[call],
                        output_tensor_ids=[exec_index + 1],
                        input_tensor_ids=[exec_index],
                        output_device_ids=[dev],
                        summaries=[bad_loss if bad else loss_summary],
                        stack=loop_stack,
                        step=step,
                    )
                )
                exec_index += 1
    loop_s = perf() - t_loop
    t = perf()
    w.flush(timeout=None)
    w.close(timeout=None)
    flush_s = perf() - t
    frame_paths = {path for path, _, _ in w.stacks.frame_info.values()}
    generated = {p for p in frame_paths if f"{os.sep}{PACKAGE}{os.sep}" in p}
    return with_peak_memory(
        {
            "nanscope": nanscope_location(),
            "rank": rank,
            "import_s": import_s,
            "stacks_s": stacks_s,
            "loop_s": loop_s,
            "flush_s": flush_s,
            "traces": traces_written,
            "executions": exec_index,
            "steps": steps,
            "bad_step": bad_step,
            "frames": len(w.stacks.frame_info),
            "files": len(frame_paths),
            "generated_files": len(generated),
            "stacks": len(w.stacks.stacks),
            "graphs": len(ops),
            "graph_ops": n_ops,
            "max_stack_depth": max(len(s) for s in w.stacks.stacks),
            "writer_waits": w.stats.waits,
            "writer_errors": w.stats.errors,
        }
    )


def dump_name(traces: int, ranks: int) -> str:
    """The directory name of a dump under ``--keep``."""
    return f"traces{traces}_ranks{ranks}"


def _reuse(dump: Path, record_path: Path, params: dict[str, Any]) -> dict[str, Any] | None:
    """The generation record of ``dump`` if it was made with ``params``; otherwise
    ``None``, with the old dump and its record removed (so that it is made again)."""
    if record_path.exists() and dump.is_dir():
        record: dict[str, Any] = json.loads(record_path.read_text())
        if record.get("params") == params:
            record["reused"] = True
            return record
    if dump.exists():
        shutil.rmtree(dump)
    record_path.unlink(missing_ok=True)
    return None


def generate(
    dump: str | os.PathLike[str],
    *,
    traces: int,
    executions: int,
    ranks: int,
    files: int = 200,
    frames: int = 4000,
    seed: int = 0,
    jobs: int = 2,
    src: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Write a synthetic multi-rank FULL_HEALTH dump to ``dump`` (see the module docstring).

    The generated modules go to ``src`` (default: ``<dump>.src``). Ranks are
    written by child processes, ``jobs`` at a time. Returns the generation
    record (also stored in ``<dump>.json``); a dump whose record has the same
    parameters is reused.
    """
    dump = Path(dump)
    src = Path(src) if src is not None else dump.with_name(dump.name + ".src")
    params = {
        "traces": traces,
        "executions": executions,
        "ranks": ranks,
        "files": files,
        "frames": frames,
        "seed": seed,
        "version": GENERATOR_VERSION,
    }
    record_path = dump.with_name(dump.name + ".json")
    reused = _reuse(dump, record_path, params)
    if reused is not None:
        return reused
    write_modules(src, files, frames, seed)
    run_id = hashlib.sha1(json.dumps(params, sort_keys=True).encode()).hexdigest()[:8]
    cfg = {**params, "dump": str(dump), "src": str(src.resolve()), "run_id": run_id}
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    pending = list(range(ranks))
    running: list[tuple[int, Child]] = []
    label = f"generate {traces:,} traces, {ranks} rank(s)"
    log(f"{label}: {dump}")
    while pending or running:
        while pending and len(running) < max(1, jobs):
            r = pending.pop(0)
            cfg_r = {**cfg, "rank": r}
            child = start_child(
                "scale_dumps", "write-rank", cfg_r, label=f"write rank {r}", script=HERE
            )
            running.append((r, child))
        r, child = running.pop(0)
        try:
            res = child.wait()
        except ChildFailed as exc:
            exc.exit()
        res["wall_s"] = child.wall_s
        results.append(res)
        log(
            f"  rank {r}: {res['traces']:,} traces, {res['executions']:,} executions in {res['wall_s']:.1f}s"
        )
    wall = time.perf_counter() - started
    sizes = {p.name: p.stat().st_size for p in dump.iterdir()}
    record = {
        "params": params,
        "run_id": run_id,
        "dump": str(dump),
        "src": str(src),
        "wall_s": wall,
        "ranks": sorted(results, key=lambda x: x["rank"]),
        "bytes": sum(sizes.values()),
        "trace_bytes": sum(v for k, v in sizes.items() if k.endswith(".graph_execution_traces")),
        "index_bytes": sum(v for k, v in sizes.items() if k.endswith(".nsidx")),
        "plans": [rank_plan(cfg, r) for r in range(ranks)],
        "reused": False,
    }
    record_path.write_text(json.dumps(record))
    return record


def child_write_tf(cfg: dict[str, Any]) -> dict[str, Any]:
    """Write a dump with TensorFlow's own ``enable_dump_debug_info`` (a child).

    A ``tf.function`` of ``LAYERS`` dense layers (MatMul, BiasAdd, Relu, with the
    constants and reads that TensorFlow traces too) runs until ``cfg["traces"]``
    graph execution traces are written, in FULL_HEALTH mode, without a circular
    buffer. At 95% of the steps its input holds a zero, and the ``Log`` at the
    top makes -inf that flows down the layers. The dump has no sidecar: it is
    TensorFlow's, byte for byte.
    """
    perf = time.perf_counter
    t0 = perf()
    import numpy as np
    import tensorflow as tf

    layers = 40
    rng = np.random.default_rng(cfg["seed"])
    weights = [tf.constant(rng.normal(size=(16, 16)) / 4, dtype=tf.float32) for _ in range(layers)]
    biases = [tf.constant(rng.normal(size=(16,)), dtype=tf.float32) for _ in range(layers)]

    @tf.function
    def train_step(x: Any) -> Any:
        h = tf.math.log(x)
        for w, b in zip(weights, biases, strict=True):
            h = tf.nn.relu(tf.nn.bias_add(tf.matmul(h, w), b))
        return tf.reduce_sum(h)

    good = np.ones((4, 16), dtype=np.float32)
    bad = good.copy()
    bad[0, 3] = 0.0
    writer = tf.debugging.experimental.enable_dump_debug_info(
        cfg["dump"], tensor_debug_mode="FULL_HEALTH", circular_buffer_size=-1
    )
    train_step(good)  # one call: how many traces a call writes
    writer.FlushExecutionFiles()
    writer.FlushNonExecutionFiles()
    per_call = _count_traces(cfg["dump"])
    steps = max(1, -(-cfg["traces"] // per_call))
    bad_step = int(0.95 * steps)
    for step in range(1, steps):
        train_step(bad if step == bad_step else good)
    writer.FlushExecutionFiles()
    writer.FlushNonExecutionFiles()
    tf.debugging.experimental.disable_dump_debug_info()
    return {
        "rank": 0,
        "traces": steps * per_call,
        "executions": steps,
        "per_call": per_call,
        "write_s": perf() - t0,
    }


def _count_traces(dump: str) -> int:
    """Graph execution traces in ``dump`` so far (TFRecord headers only)."""
    n = 0
    for p in Path(dump).glob("*.graph_execution_traces"):
        data = p.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            pos += 16 + int.from_bytes(data[pos : pos + 8], "little")
            n += pos <= len(data)
    return n


def generate_tf(dump: str | os.PathLike[str], *, traces: int, seed: int = 0) -> dict[str, Any]:
    """Write a dump with TensorFlow itself (see :func:`child_write_tf`); reused like
    :func:`generate`'s. TensorFlow writes about ``traces`` (whole calls, rounded up)."""
    dump = Path(dump)
    params = {"traces": traces, "seed": seed, "writer": "tensorflow", "version": 1}
    record_path = dump.with_name(dump.name + ".json")
    reused = _reuse(dump, record_path, params)
    if reused is not None:
        return reused
    log(f"generate {traces:,} traces with TensorFlow: {dump}")
    started = time.perf_counter()
    child = start_child(
        "scale_dumps",
        "write-tf",
        {**params, "dump": str(dump)},
        label="write with TensorFlow",
        script=HERE,
    )
    try:
        res = child.wait()
    except ChildFailed as exc:
        exc.exit()
    sizes = {p.name: p.stat().st_size for p in dump.iterdir()}
    record = {
        "params": params,
        "dump": str(dump),
        "wall_s": time.perf_counter() - started,
        "ranks": [res],
        "bytes": sum(sizes.values()),
        "trace_bytes": sum(v for k, v in sizes.items() if k.endswith(".graph_execution_traces")),
        "index_bytes": 0,
        "reused": False,
    }
    log(f"  {res['traces']:,} traces, {res['executions']:,} executions in {record['wall_s']:.1f}s")
    record_path.write_text(json.dumps(record))
    return record


CHILDREN = {"write-rank": child_write_rank, "write-tf": child_write_tf}


def main() -> None:
    """``python bench/scale_dumps.py --child write-rank CFG``: one rank's writer.

    Run as a script, so that the recorded stacks end in this file's
    ``<module>`` and ``main`` frames, like a training script's.
    """
    send_result(CHILDREN[sys.argv[2]](json.loads(sys.argv[3])))


if __name__ == "__main__":
    main()
