"""Benchmark: nanscope's reader on large, realistic multi-rank dumps, against TensorFlow's.

**The generator** (:func:`generate`, or ``--generate DIR``) writes a FULL_HEALTH
dump the way a multi-worker training job would: one ``DumpWriter`` per rank,
each in its own child process (``--jobs`` at a time), all sharing one run id.
Each rank

* imports ``--files`` generated Python modules whose functions call each other
  (``BRANCHES`` call sites and one leaf line each, ``--frames`` frames in all)
  and captures one real Python stack per (function, branch) through them with
  ``DumpWriter.capture_stack``, so that the dump holds thousands of distinct
  frames and hundreds of recorded source files;
* creates three graphs (a ``train_step`` of about 1,000 traced tensors: a
  44-layer dense model's forward pass, loss, gradients and optimizer math; a
  ``cond`` branch nested in it; a ``test_step`` run every ``EVAL_EVERY`` steps)
  with per-rank graph ids, like TensorFlow's uuid4s, every op created with one
  of those stacks;
* runs steps: eager executions (each with a stack), then each graph call as one
  ``write_traces`` batch, then the call's own execution, until its share of
  ``--traces`` and ``--executions`` is written.

Late in the last rank (95% of its steps) a softmax underflows to zero and the
loss's ``Log`` makes -inf: a handful of traces (-inf, +inf, NaN downstream in
the same call, in the gradients and in the nested ``cond``) and the call's
execution (a NaN loss) are non-finite. Nothing else is.

**The benchmark** reads each dump, every task in a fresh subprocess (peak
memory per task, ``ru_maxrss``), with nanscope and TensorFlow's
``DebugDataReader``:

* ``open``: open the dump and build the index;
* ``first``: first alert, cold: open + ``first_nonfinite()`` + decoding that event
  (TensorFlow has no index: ``update()``, then read the traces one by one until
  one has Inf/NaN counts, as bench/reader.py does);
* ``page``: 200 decoded traces at 90% of the dump;
* ``analyze``: ``nanscope.analysis.analyze`` (the report's root cause; nanscope only).

TensorFlow's reader takes the first file set's graphs only, so it cannot read
the traces of other ranks (their graph ids are unknown to it); when it fails on
the multi-rank dump, the same number of traces is also written as a
single-rank dump and both readers are compared on that. A TensorFlow task is
killed after ``--tf-budget`` seconds, and not started at all when the previous
size's time, scaled by size, says it would not finish.

    .venv/bin/python bench/scale.py                                   # 1M traces, 4 ranks
    .venv/bin/python bench/scale.py --sizes 1e6,1e7 --keep /tmp/scale_dumps
    .venv/bin/python bench/scale.py --generate /tmp/scale_one --traces 2e6 --ranks 8

``--at-head`` measures ``src/`` of the commit at HEAD (a ``git archive`` copy on the
children's ``PYTHONPATH``) instead of the working tree, for a repository being edited while
the benchmark runs. Every child reports where it imported nanscope from.

The parent process imports neither numpy, nanscope nor TensorFlow, so that it
does not inflate the children's ``ru_maxrss``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchlib import fmt_ratio, fmt_s, peak_rss_mib, source_state

RESULT_TAG = "SCALE-RESULT "
PAGE = 200
LAYERS = 44
EVAL_EVERY = 20
BRANCHES = 3  # call sites per generated function (plus one leaf line)
HIDDEN, BATCH, CLASSES = 512, 64, 1000
PACKAGE = "scalegen"
SUBPACKAGES = ("models", "layers", "attention", "data", "losses", "optim", "train", "utils")
WORDS = ("encoder", "decoder", "block", "proj", "norm", "embed", "mlp", "gate", "head", "pool",
         "conv", "rotary", "router", "expert", "scale", "mask", "cache", "shard")  # fmt: skip
VERBS = ("forward", "apply", "build", "call", "step", "update", "compute", "reduce", "project",
         "split", "merge", "route", "fuse", "wrap")  # fmt: skip
EAGER_TYPES = ("IteratorGetNext", "ReadVariableOp", "AssignAddVariableOp", "AddV2", "Cast",
               "Identity", "Mul", "RandomUniform")  # fmt: skip
GENERATOR_VERSION = 3

# The ops the non-finite plan touches: (graph, op name, slot) -> (-inf, +inf, nan, zeros)
LOG_OP = "model/head/loss/Log"
BAD_TRACES: dict[tuple[str, str, int], tuple[int, int, int, int]] = {
    ("train", "model/head/Softmax", 0): (0, 0, 0, 3),  # finite: 3 probabilities underflow to 0
    ("train", LOG_OP, 0): (3, 0, 0, 0),  # the origin: log(0) = -inf
    ("train", "model/head/loss/mul", 0): (1, 0, 2, 0),  # labels * log(p): 0 * -inf = NaN
    ("train", "model/head/loss/Sum", 0): (0, 0, 1, 0),
    ("train", "gradient_tape/model/head/loss/Log/Reciprocal", 0): (0, 3, 0, 0),
    ("train", "gradient_tape/model/head/Softmax/mul", 0): (0, 0, 3, 0),
    ("cond", "cond/true/clip_by_global_norm/global_norm", 0): (0, 0, 1, 0),
    ("train", "gradient_tape/model/head/MatMul/MatMul_1", 0): (0, 0, 7, 0),
}


# -- the synthetic program: graphs and their ops (pure Python, shared by parent and children) --

# (op name, op type, input names, number of outputs, elements per output)
OpSpec = tuple[str, str, tuple[str, ...], int, int]


def _dense(p: str, x: str, width: int) -> tuple[list[OpSpec], str]:
    act = BATCH * width
    ops: list[OpSpec] = [
        (f"{p}/dense/MatMul/ReadVariableOp", "ReadVariableOp",
         (f"{p}/dense/matmul/readvariableop/resource:0",), 1, HIDDEN * width),
        (f"{p}/dense/MatMul", "MatMul", (x, f"{p}/dense/MatMul/ReadVariableOp:0"), 1, act),
        (f"{p}/dense/BiasAdd/ReadVariableOp", "ReadVariableOp",
         (f"{p}/dense/biasadd/readvariableop/resource:0",), 1, width),
        (f"{p}/dense/BiasAdd", "BiasAdd",
         (f"{p}/dense/MatMul:0", f"{p}/dense/BiasAdd/ReadVariableOp:0"), 1, act),
    ]  # fmt: skip
    return ops, f"{p}/dense/BiasAdd:0"


def _layer_forward(p: str, x: str) -> tuple[list[OpSpec], str]:
    ops, y = _dense(p, x, HIDDEN)
    act = BATCH * HIDDEN
    ops += [
        (f"{p}/layer_norm/moments/mean", "Mean", (y,), 1, BATCH),
        (f"{p}/layer_norm/batchnorm/mul", "Mul", (y, f"{p}/layer_norm/moments/mean:0"), 1, act),
        (f"{p}/dense/Relu", "Relu", (f"{p}/layer_norm/batchnorm/mul:0",), 1, act),
        (f"{p}/dropout/Mul", "Mul", (f"{p}/dense/Relu:0",), 1, act),
    ]
    return ops, f"{p}/dropout/Mul:0"


def _head_forward(x: str) -> list[OpSpec]:
    ops, y = _dense("model/head", x, CLASSES)
    n = BATCH * CLASSES
    ops += [
        ("model/head/Softmax", "Softmax", (y,), 1, n),
        (LOG_OP, "Log", ("model/head/Softmax:0",), 1, n),
        ("model/head/loss/mul", "Mul", ("IteratorGetNext:1", f"{LOG_OP}:0"), 1, n),
        ("model/head/loss/Sum", "Sum", ("model/head/loss/mul:0",), 1, 1),
        ("model/head/loss/Neg", "Neg", ("model/head/loss/Sum:0",), 1, 1),
        ("model/head/loss/truediv", "RealDiv", ("model/head/loss/Neg:0",), 1, 1),
    ]
    return ops


def _forward() -> tuple[list[OpSpec], str]:
    ops: list[OpSpec] = [("IteratorGetNext", "IteratorGetNext", ("iterator:0",), 2, BATCH * HIDDEN)]
    x = "IteratorGetNext:0"
    for layer in range(LAYERS):
        more, x = _layer_forward(f"model/encoder/layer_{layer:02d}", x)
        ops += more
    return ops, x


def train_ops() -> list[OpSpec]:
    """``train_step``: forward, loss, gradients (last layer first), optimizer math."""
    ops, x = _forward()
    ops += _head_forward(x)
    g = "gradient_tape/model/head"
    n = BATCH * CLASSES
    ops += [
        (f"{g}/loss/truediv/RealDiv", "RealDiv", ("ones:0",), 1, 1),
        (f"{g}/loss/Neg/Neg", "Neg", (f"{g}/loss/truediv/RealDiv:0",), 1, 1),
        (f"{g}/loss/Sum/Tile", "Tile", (f"{g}/loss/Neg/Neg:0",), 1, n),
        (f"{g}/loss/mul/Mul", "Mul", (f"{g}/loss/Sum/Tile:0", "IteratorGetNext:1"), 1, n),
        (f"{g}/loss/Log/Reciprocal", "Reciprocal", ("model/head/Softmax:0",), 1, n),
        (f"{g}/loss/Log/mul", "Mul", (f"{g}/loss/mul/Mul:0", f"{g}/loss/Log/Reciprocal:0"), 1, n),
        (f"{g}/Softmax/mul", "Mul", (f"{g}/loss/Log/mul:0", "model/head/Softmax:0"), 1, n),
        (f"{g}/Softmax/Sum", "Sum", (f"{g}/Softmax/mul:0",), 1, BATCH),
        (f"{g}/Softmax/sub", "Sub", (f"{g}/loss/Log/mul:0", f"{g}/Softmax/Sum:0"), 1, n),
        (f"{g}/Softmax/mul_1", "Mul", (f"{g}/Softmax/sub:0", "model/head/Softmax:0"), 1, n),
        (f"{g}/BiasAdd/BiasAddGrad", "BiasAddGrad", (f"{g}/Softmax/mul_1:0",), 1, CLASSES),
        (f"{g}/MatMul/MatMul", "MatMul", (f"{g}/Softmax/mul_1:0",), 1, BATCH * HIDDEN),
        (f"{g}/MatMul/MatMul_1", "MatMul", (x, f"{g}/Softmax/mul_1:0"), 1, HIDDEN * CLASSES),
    ]
    dx = f"{g}/MatMul/MatMul:0"
    act, w = BATCH * HIDDEN, HIDDEN * HIDDEN
    grads: list[tuple[str, str, int]] = []  # (variable, gradient tensor, size)
    for layer in reversed(range(LAYERS)):
        p = f"model/encoder/layer_{layer:02d}"
        q = f"gradient_tape/{p}"
        ops += [
            (f"{q}/dropout/Mul/Mul", "Mul", (dx,), 1, act),
            (f"{q}/dense/Relu/ReluGrad", "ReluGrad", (f"{q}/dropout/Mul/Mul:0", f"{p}/dense/Relu:0"), 1, act),
            (f"{q}/layer_norm/batchnorm/mul/Mul", "Mul", (f"{q}/dense/Relu/ReluGrad:0",), 1, act),
            (f"{q}/layer_norm/batchnorm/mul/Mul_1", "Mul", (f"{q}/dense/Relu/ReluGrad:0",), 1, act),
            (f"{q}/layer_norm/moments/mean/truediv", "RealDiv", (f"{q}/layer_norm/batchnorm/mul/Mul_1:0",), 1, BATCH),
            (f"{q}/layer_norm/moments/mean/Tile", "Tile", (f"{q}/layer_norm/moments/mean/truediv:0",), 1, act),
            (f"{q}/AddN", "AddN", (f"{q}/layer_norm/batchnorm/mul/Mul:0", f"{q}/layer_norm/moments/mean/Tile:0"), 1, act),
            (f"{q}/dense/BiasAdd/BiasAddGrad", "BiasAddGrad", (f"{q}/AddN:0",), 1, HIDDEN),
            (f"{q}/dense/MatMul/MatMul", "MatMul", (f"{q}/AddN:0", f"{p}/dense/MatMul/ReadVariableOp:0"), 1, act),
            (f"{q}/dense/MatMul/MatMul_1", "MatMul", (f"{q}/AddN:0",), 1, w),
        ]  # fmt: skip
        dx = f"{q}/dense/MatMul/MatMul:0"
        grads += [(f"{p}/dense/kernel", f"{q}/dense/MatMul/MatMul_1:0", w),
                  (f"{p}/dense/bias", f"{q}/dense/BiasAdd/BiasAddGrad:0", HIDDEN)]  # fmt: skip
    for k, (_, grad, size) in enumerate(grads):
        u = f"Adam/Adam/update_{k}"
        ops += [(f"{u}/mul", "Mul", (grad,), 1, size),
                (f"{u}/sub", "Sub", (f"{u}/mul:0",), 1, size)]  # fmt: skip
    return ops


def cond_ops() -> list[OpSpec]:
    """A ``cond`` branch nested in ``train_step`` (gradient clipping)."""
    c = "cond/true/clip_by_global_norm"
    return [
        (f"{c}/global_norm/L2Loss", "L2Loss", ("cond/input_0:0",), 1, 1),
        (f"{c}/global_norm", "Sqrt", (f"{c}/global_norm/L2Loss:0",), 1, 1),
        (f"{c}/truediv", "RealDiv", (f"{c}/global_norm:0",), 1, 1),
        (f"{c}/mul", "Mul", (f"{c}/truediv:0",), 1, 1),
    ]


def eval_ops() -> list[OpSpec]:
    ops, x = _forward()
    return ops + _head_forward(x)


def graph_ops() -> dict[str, list[OpSpec]]:
    return {"train": train_ops(), "cond": cond_ops(), "eval": eval_ops()}


def traced(ops: list[OpSpec]) -> list[tuple[str, int, str, int]]:
    """(op name, output slot, op type, size): one trace per output of every op, in order."""
    return [(name, slot, typ, size) for name, typ, _, n, size in ops for slot in range(n)]


def share(total: int, parts: int, k: int) -> int:
    return total // parts + (1 if k < total % parts else 0)


def schedule(n_traces: int, per_call: dict[str, int]) -> list[tuple[int, str, int]]:
    """(step, graph, traces) of each graph call until ``n_traces`` are written."""
    calls: list[tuple[int, str, int]] = []
    left, step = n_traces, 0
    while left > 0:
        keys = ["train", "cond"] + (["eval"] if step % EVAL_EVERY == EVAL_EVERY - 1 else [])
        for key in keys:
            if left <= 0:
                break
            n = min(per_call[key], left)
            calls.append((step, key, n))
            left -= n
        step += 1
    return calls


def rank_plan(cfg: dict[str, Any], rank: int) -> dict[str, Any]:
    """What rank ``rank`` writes: its traces, executions, steps, and its bad step (or None)."""
    ops = graph_ops()
    per_call = {k: len(traced(v)) for k, v in ops.items()}
    n_traces = share(cfg["traces"], cfg["ranks"], rank)
    n_execs = share(cfg["executions"], cfg["ranks"], rank)
    calls = schedule(n_traces, per_call)
    steps = calls[-1][0] + 1 if calls else 0
    bad_step = None
    expected: list[list[Any]] = []  # (kind, graph, op name or op type, step)
    if rank == cfg["ranks"] - 1 and steps:
        full_train = [s for s, key, n in calls if key == "train" and n == per_call["train"]]
        if full_train:
            bad_step = min(int(0.95 * steps), full_train[-1])
            full_cond = {s for s, key, n in calls if key == "cond" and n == per_call["cond"]}
            for (g, name, _slot), (ni, pi, nn, _z) in BAD_TRACES.items():
                if ni + pi + nn and (g == "train" or bad_step in full_cond):
                    expected.append(["trace", g, name, bad_step])
            if execs_in_step(n_execs, steps, bad_step) >= 1:
                expected.append(["execution", "train", "call", bad_step])
    return {"traces": n_traces, "executions": n_execs, "steps": steps, "calls": len(calls),
            "bad_step": bad_step, "expected_nonfinite": expected}  # fmt: skip


def execs_in_step(n_execs: int, steps: int, step: int) -> int:
    return (step + 1) * n_execs // steps - step * n_execs // steps


# -- the synthetic program: Python source files for real stacks --------------------------------


def write_modules(src: Path, n_files: int, n_frames: int, seed: int) -> dict[str, Any]:
    """Write ``n_files`` modules of functions that call each other; returns their manifest.

    Each function has ``BRANCHES`` call sites and one leaf line (``return
    leaf()``), so ``n_frames`` frames need ``n_frames / (BRANCHES + 1)``
    functions, spread over the files. Reused when ``src`` holds the same.
    """
    params = {"files": n_files, "frames": n_frames, "seed": seed, "version": GENERATOR_VERSION}
    manifest_path = src / "manifest.json"
    if manifest_path.exists():
        manifest: dict[str, Any] = json.loads(manifest_path.read_text())
        if manifest.get("params") == params:
            return manifest
        shutil.rmtree(src / PACKAGE, ignore_errors=True)
    rng = random.Random(seed)
    n_funcs = max(n_files, math.ceil(n_frames / (BRANCHES + 1)))
    modules: list[str] = []
    for i in range(n_files):
        sub = SUBPACKAGES[i % len(SUBPACKAGES)]
        modules.append(f"{PACKAGE}.{sub}.{WORDS[(i * 7) % len(WORDS)]}_{i:03d}")
    functions: list[tuple[int, str]] = []  # (module index, function name)
    for k in range(n_funcs):
        m = k % n_files
        j = k // n_files
        functions.append((m, f"{VERBS[(k * 5 + j) % len(VERBS)]}_{WORDS[k % len(WORDS)]}_{j}"))
    # Each function calls BRANCHES functions of other modules.
    callees = [
        [rng.choice([g for g in rng.sample(range(n_funcs), 8) if functions[g][0] != functions[f][0]]
                    or [(f + 1) % n_funcs]) for _ in range(BRANCHES)]
        for f in range(n_funcs)
    ]  # fmt: skip
    per_module: dict[int, list[int]] = {}
    for f, (m, _) in enumerate(functions):
        per_module.setdefault(m, []).append(f)
    for sub in SUBPACKAGES:
        d = src / PACKAGE / sub
        d.mkdir(parents=True, exist_ok=True)
        (d / "__init__.py").write_text(f'"""Generated by bench/scale.py: {sub}."""\n')
    (src / PACKAGE / "__init__.py").write_text('"""Generated by bench/scale.py."""\n')
    for m, dotted in enumerate(modules):
        funcs = per_module.get(m, [])
        used = sorted({functions[c][0] for f in funcs for c in callees[f]})
        lines = [
            f'"""{dotted}: generated by bench/scale.py (seed {seed}); functions that call',
            'each other so that nanscope records real, varied stacks."""',
            "",
            "# The modules called from here, bound by the loader once all are imported (200",
            "# modules importing each other at the top would nest imports too deep).",
            "_CALLEES = {",
            *(f'    "_m{u}": "{modules[u]}",' for u in used),
            "}",
            *(f"_m{u} = None" for u in used),
            "",
        ]
        for f in funcs:
            name = functions[f][1]
            lines += [
                "",
                f"def {name}(route, leaf):",
                f'    """Step {f} of the synthetic model."""',
                "    if not route:",
                "        return leaf()",
                "    k, rest = route[0], route[1:]",
            ]
            for b, c in enumerate(callees[f]):
                target = f"_m{functions[c][0]}.{functions[c][1]}"
                if b < BRANCHES - 1:
                    lines += [f"    if k == {b}:", f"        return {target}(rest, leaf)"]
                else:
                    lines += [f"    return {target}(rest, leaf)"]
            lines.append("")
        path = src / Path(*dotted.split(".")).with_suffix(".py")
        path.write_text("\n".join(lines))
    manifest = {"params": params, "modules": modules, "functions": functions, "callees": callees}
    manifest_path.write_text(json.dumps(manifest))
    return manifest


# -- child: write one rank ---------------------------------------------------------------------


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
    h = hashlib.sha256(f"{cfg['run_id']}/{rank}/{key}".encode()).digest()
    return str(uuid.UUID(bytes=h[:16], version=4))


def child_write_rank(cfg: dict[str, Any], rank: int) -> None:
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
    emit(
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


# -- the generator (parent side) ---------------------------------------------------------------


def dump_name(traces: int, ranks: int) -> str:
    return f"traces{traces}_ranks{ranks}"


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
    params = {"traces": traces, "executions": executions, "ranks": ranks, "files": files,
              "frames": frames, "seed": seed, "version": GENERATOR_VERSION}  # fmt: skip
    record_path = dump.with_name(dump.name + ".json")
    if record_path.exists() and dump.is_dir():
        record: dict[str, Any] = json.loads(record_path.read_text())
        if record.get("params") == params:
            record["reused"] = True
            return record
    if dump.exists():
        shutil.rmtree(dump)
    record_path.unlink(missing_ok=True)
    write_modules(src, files, frames, seed)
    run_id = hashlib.sha1(json.dumps(params, sort_keys=True).encode()).hexdigest()[:8]
    cfg = {**params, "dump": str(dump), "src": str(src.resolve()), "run_id": run_id}
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    pending = list(range(ranks))
    running: list[tuple[int, subprocess.Popen[str], float]] = []
    label = f"generate {traces:,} traces, {ranks} rank(s)"
    log(f"{label}: {dump}")
    while pending or running:
        while pending and len(running) < max(1, jobs):
            r = pending.pop(0)
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "write-rank",
                   json.dumps(cfg), str(r)]  # fmt: skip
            proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env()
            )
            running.append((r, proc, time.perf_counter()))
        r, proc, t = running.pop(0)
        out, err = proc.communicate()
        res = parse_result(out, err, proc.returncode, f"write rank {r}")
        res["wall_s"] = time.perf_counter() - t
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


# -- child: read -------------------------------------------------------------------------------


def nanscope_location() -> str:
    import nanscope

    return os.path.dirname(os.path.abspath(nanscope.__file__))


def emit(result: dict[str, Any]) -> None:
    result["peak_rss_mib"] = peak_rss_mib()
    print(RESULT_TAG + json.dumps(result), flush=True)


def page_offset(n: int) -> int:
    return max(0, min(int(0.9 * n), n - PAGE))


def child_read(impl: str, task: str, dump: str) -> None:
    perf = time.perf_counter
    t0 = perf()
    if impl == "nanscope":
        import nanscope
        from nanscope.analysis import analyze
        from nanscope.reader import TRACES
    else:
        from tensorflow.python.debug.lib.debug_events_reader import DebugDataReader
    out: dict[str, Any] = {"impl": impl, "task": task, "import_s": perf() - t0}
    if impl == "nanscope":
        out["nanscope"] = nanscope_location()
    out["rss_after_import_mib"] = peak_rss_mib()

    t = perf()
    if impl == "nanscope":
        r = nanscope.open_dump(dump)
        n = r.num_graph_execution_traces()
        out["num_executions"] = r.num_executions()
        out["processes"] = len(r.processes)
        out["sidecar_used"] = r.decoded_for_index() == 0
        out["source_files"] = [len(r.source_files(p)) for p in range(len(r.processes))]
    else:
        r = DebugDataReader(dump)
        r.update()
        n = r.num_graph_execution_traces()
        out["num_executions"] = r.num_executions()
    out["num_traces"] = n
    out["open_s"] = perf() - t
    out["rss_after_open_mib"] = peak_rss_mib()

    t = perf()
    if task == "first":
        if impl == "nanscope":
            ref = r.first_nonfinite()
            if ref is not None:
                ev = r.trace(ref.index) if ref.kind == TRACES else r.execution(ref.index)
                out["kind"] = ref.kind
                out["rank"] = r.processes[ref.process].rank
                out["step"] = ev.step
                out["op_name"] = ev.op_name if ref.kind == TRACES else ev.op_type
                values = ev.debug_tensor_value if ref.kind == TRACES else ev.debug_tensor_values[0]
                out["value"] = values.tolist()
        else:
            for i, digest in enumerate(r.graph_execution_traces(digest=True)):
                tr = r.read_graph_execution_trace(digest)
                v = tr.debug_tensor_value
                if v is not None and v[5] + v[6] + v[7] > 0:
                    out["kind"], out["index"] = "graph_execution_trace", i
                    out["op_name"], out["value"] = tr.op_name, [float(x) for x in v]
                    break
    elif task == "page":
        offset = page_offset(n)
        if impl == "nanscope":
            page = r.traces(offset, offset + PAGE)
            values = [p.debug_tensor_value.tolist() for p in page]
        else:
            page = r.graph_execution_traces(begin=offset, end=offset + PAGE)
            values = [list(p.debug_tensor_value) for p in page]
        out["offset"], out["count"] = offset, len(page)
        out["first_op"] = page[0].op_name if page else None
        out["checksum"] = float(sum(sum(v) for v in values))
    elif task == "analyze":
        a = analyze(r)
        o = a.origin
        out["alerts"] = a.alerts.total
        out["headline"] = a.headline
        out["origin_kind"] = a.origin_kind
        out["chain"] = len(a.chain)
        if o is not None:
            out["op_name"], out["rank"], out["step"] = o.op_name, o.rank, o.step
            out["explanation"] = o.explanation
            out["source"] = f"{o.source.file}:{o.source.line}" if o.source else None
            out["code"] = o.source.code if o.source else None
            out["stack_depth"] = len(o.stack)
    out["query_s"] = perf() - t
    out["cold_s"] = out["open_s"] + out["query_s"]
    emit(out)


# -- the parent --------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def child_env() -> dict[str, str]:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")


def parse_result(out: str, err: str, rc: int, label: str) -> dict[str, Any]:
    lines = [ln for ln in out.splitlines() if ln.startswith(RESULT_TAG)]
    if rc != 0 or not lines:
        sys.stderr.write(out[-3000:] + err[-3000:])
        raise SystemExit(f"child {label} failed (exit {rc})")
    result: dict[str, Any] = json.loads(lines[-1][len(RESULT_TAG) :])
    return result


def run_read(impl: str, task: str, dump: str, timeout: float | None = None) -> dict[str, Any]:
    """One read task in a fresh child; ``{"error": ...}`` when it fails or runs out of time."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "read", impl, task, dump]
    label = f"{impl} {task} {Path(dump).name}"
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=timeout)
    except subprocess.TimeoutExpired:
        log(f"  {label}: killed after {timeout:.0f}s")
        return {"error": f"did not finish in {timeout:.0f} s", "timeout": True}
    wall = time.perf_counter() - t
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        msg = tail[-1] if tail else f"exit {proc.returncode}"
        log(f"  {label}: FAILED after {wall:.1f}s: {msg}")
        return {"error": msg, "wall_s": wall}
    res: dict[str, Any] = json.loads(lines[-1][len(RESULT_TAG) :])
    res["wall_s"] = wall
    log(f"  {label}: {wall:.1f}s, peak {res['peak_rss_mib']:,.0f} MiB")
    return res


def warm(dump: str) -> float:
    """Read every file of the dump once, so both readers find it in the page cache."""
    t = time.perf_counter()
    buf = bytearray(8 << 20)
    for p in sorted(Path(dump).iterdir()):
        with open(p, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass
    return time.perf_counter() - t


def snapshot_head(root: Path) -> tuple[str, Path]:
    """``src/`` of the commit at HEAD, extracted under ``root`` (``git archive``; the repository
    and its working tree are only read). Returns the short commit id and the ``src`` directory."""
    import io
    import tarfile

    repo = Path(__file__).resolve().parent.parent
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dest = root / f"nanscope-{sha}"
    if not (dest / "src" / "nanscope" / "__init__.py").exists():
        shutil.rmtree(dest, ignore_errors=True)
        blob = subprocess.run(
            ["git", "archive", "HEAD", "src"], cwd=repo, capture_output=True, check=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            tar.extractall(dest, filter="data")
    return sha, dest / "src"


def parse_size(text: str) -> int:
    return int(float(text))


def fmt_mib(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--sizes", help="trace counts to measure, e.g. 1e6,1e7 (default: --traces)")
    ap.add_argument("--traces", type=parse_size, default=1_000_000, help="traces in all ranks")
    ap.add_argument("--executions", type=parse_size, help="executions in all (default traces/10)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--files", type=int, default=200, help="generated source files")
    ap.add_argument("--frames", type=int, default=4000, help="distinct generated stack frames")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1),
                    help="ranks written at once (one process each)")  # fmt: skip
    ap.add_argument("--keep", metavar="DIR", help="keep the dumps here (reused when present)")
    ap.add_argument("--generate", metavar="DIR", help="only write one dump (--traces) to DIR")
    ap.add_argument("--repeats", type=int, default=3, help="nanscope children per task (median)")
    ap.add_argument("--skip-tf", action="store_true", help="do not run TensorFlow's reader")
    ap.add_argument("--tf-budget", type=float, default=300.0,
                    help="seconds a TensorFlow task may take (killed after)")  # fmt: skip
    ap.add_argument(
        "--at-head",
        action="store_true",
        help="measure src/ of the commit at HEAD (git archive), not the working tree",
    )
    ap.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        kind, rest = args.child[0], args.child[1:]
        if kind == "write-rank":
            child_write_rank(json.loads(rest[0]), int(rest[1]))
        elif kind == "read":
            child_read(rest[0], rest[1], rest[2])
        else:
            raise SystemExit(f"unknown child {kind}")
        return 0

    if args.generate:
        rec = generate(
            args.generate,
            traces=args.traces,
            executions=args.executions if args.executions is not None else args.traces // 10,
            ranks=args.ranks,
            files=args.files,
            frames=args.frames,
            seed=args.seed,
            jobs=args.jobs,
        )
        print(json.dumps({k: v for k, v in rec.items() if k != "plans"}, indent=1))
        return 0

    root = args.keep or tempfile.mkdtemp(prefix="scale_", dir="/tmp")
    Path(root).mkdir(parents=True, exist_ok=True)
    try:
        return run(args, Path(root))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def run(args: argparse.Namespace, root: Path) -> int:
    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else [args.traces]
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    start_state = source_state()
    if args.at_head:
        # Every child (writers and readers) imports this copy: edits to the working
        # tree during the run cannot leak into the figures.
        sha, snap = snapshot_head(root)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(snap), os.environ.get("PYTHONPATH", "")) if p
        )
        start_state = f"src/ of commit {sha} (git archive HEAD, extracted to {snap})"
    log(f"nanscope scale benchmark, {started}; dumps under {root}")
    src = root / "src"

    def make(size: int, ranks: int) -> dict[str, Any]:
        return generate(
            root / dump_name(size, ranks),
            traces=size,
            executions=args.executions if args.executions is not None else size // 10,
            ranks=ranks,
            files=args.files,
            frames=args.frames,
            seed=args.seed,
            jobs=args.jobs,
            src=src,
        )

    tf_on: str | None = None  # "multi" or "single" once probed
    tf_multi_error = ""
    sections: list[dict[str, Any]] = []
    tf_prev: tuple[int, float] | None = None  # (size, slowest TF task wall) of the last size
    for size in sizes:
        multi = make(size, args.ranks)
        dumps: dict[str, dict[str, Any]] = {"multi": multi}
        if not args.skip_tf and tf_on is None:
            if args.ranks == 1:
                tf_on = "multi"
            else:
                log("probing TensorFlow's reader on the multi-rank dump")
                probe = run_read("tensorflow", "open", multi["dump"], timeout=args.tf_budget)
                if "error" in probe or probe.get("num_traces") != size:
                    tf_on = "single"
                    tf_multi_error = probe.get("error") or (
                        f"read {probe.get('num_traces'):,} of {size:,} traces"
                    )
                else:
                    tf_on = "multi"
        if tf_on == "single" and args.ranks > 1:
            dumps["single"] = make(size, 1)
        results: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        warm_s = {key: warm(d["dump"]) for key, d in dumps.items()}
        log(f"page cache warmed: {', '.join(f'{k} {v:.1f}s' for k, v in warm_s.items())}")
        for rep in range(args.repeats):
            for task in ("open", "first", "page", "analyze"):
                for key, d in dumps.items():
                    log(f"round {rep + 1}: nanscope {task} ({key})")
                    res = run_read("nanscope", task, d["dump"])
                    results.setdefault(("nanscope", key, task), []).append(res)
        tf_note = ""
        if not args.skip_tf and tf_on is not None:
            estimate = None
            if tf_prev is not None:
                estimate = tf_prev[1] * size / tf_prev[0]
            if estimate is not None and estimate > args.tf_budget:
                tf_note = (
                    f"did not finish: not started, {tf_prev[1]:.0f} s at {tf_prev[0]:,} traces "  # type: ignore[index]
                    f"scales to ~{estimate:.0f} s > the {args.tf_budget:.0f} s budget"
                )
                log(f"TensorFlow skipped at {size:,}: {tf_note}")
            else:
                slowest = 0.0
                for task in ("first", "page"):
                    res = run_read("tensorflow", task, dumps[tf_on]["dump"], timeout=args.tf_budget)
                    results[("tensorflow", tf_on, task)] = [res]
                    slowest = max(slowest, res.get("wall_s", args.tf_budget))
                    if res.get("timeout"):
                        tf_note = f"did not finish within the {args.tf_budget:.0f} s budget"
                        break
                tf_prev = (size, slowest)
        sections.append({"size": size, "dumps": dumps, "results": results, "tf_note": tf_note})
        if not args.keep:
            for d in dumps.values():
                shutil.rmtree(d["dump"], ignore_errors=True)

    end_state = source_state() if not args.at_head else start_state
    text, problems = report(args, sections, tf_on, tf_multi_error, started, start_state, end_state)
    print(text)
    return 1 if problems else 0


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
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    add(f"Machine: {machine}; started {started}")
    changed = "" if end_state == start_state else f"; WARNING, at the end: {end_state}"
    add(f"Source: {start_state}{changed}")
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


def generator_table(args: argparse.Namespace, sections: list[dict[str, Any]], add: Any) -> None:
    add(
        "| Dump | traces | executions | steps per rank | graph ops per rank | source files "
        "per rank (generated) | stack frames per rank | stacks per rank (max depth) | on disk "
        "(data + .nsidx) | bytes/trace: data, + .nsidx | written in (s) |"
    )
    add("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
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


def _median(
    results: dict[tuple[str, str, str], list[dict[str, Any]]],
    impl: str,
    key: str | None,
    task: str,
    field: str,
) -> float | None:
    rs = [r for r in results.get((impl, key or "", task), []) if "error" not in r]
    vals = [r[field] for r in rs if r.get(field) is not None]
    return statistics.median(vals) if vals else None


def size_table(
    args: argparse.Namespace,
    sec: dict[str, Any],
    tf_on: str | None,
    add: Any,
    targets: list[str],
    problems: list[str],
) -> None:
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

    def row(name: str, task: str, field: str, mib: bool = False, tf_task: str = "",
            tf_field: str = "") -> None:  # fmt: skip
        """A row; TensorFlow's figure may come from another of its children."""
        tt, tfld = tf_task or task, tf_field or field
        vals: list[str] = []
        for impl, key in cols:
            v = _median(results, impl, key, tt if impl == "tensorflow" else task,
                        tfld if impl == "tensorflow" else field)  # fmt: skip
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
        add(f"| {name} | {' | '.join(vals)} | {ratio} |")

    add(f"### {size:,} traces")
    add("")
    head = " | ".join(label(i, k or "") for i, k in cols)
    on = f" ({dumps[tf_key]['params']['ranks']}-rank dump)" if tf_key else ""
    add(f"| Task | {head} | TF / nanscope{on} |")
    add("|---|" + "---:|" * (len(cols) + 1))
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
    results: dict[tuple[str, str, str], list[dict[str, Any]]],
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


if __name__ == "__main__":
    sys.exit(main())
