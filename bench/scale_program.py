"""The synthetic training program bench/scale.py's dumps record (stdlib only).

Three graphs (a ``train_step`` of about 1,000 traced tensors: a 44-layer dense
model's forward pass, loss, gradients and optimizer math; a ``cond`` branch
nested in it; a ``test_step`` run every ``EVAL_EVERY`` steps), each rank's share
of the traces and executions, the non-finite events planted late in the last
rank, and the generated Python modules whose functions give the ops real stacks.
"""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path
from typing import Any

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


# -- the graphs and their ops ------------------------------------------------------------------

# (op name, op type, input names, number of outputs, elements per output)
OpSpec = tuple[str, str, tuple[str, ...], int, int]


def _dense(p: str, x: str, width: int) -> tuple[list[OpSpec], str]:
    """A dense layer under ``p`` on ``x``: its ops and its output tensor."""
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
    """One encoder layer: dense, layer norm, relu, dropout."""
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
    """The head and the hand-written cross-entropy whose ``Log`` makes the -inf."""
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
    """The input and all encoder layers: their ops and the last output."""
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
    """``test_step``: the forward pass and the loss."""
    ops, x = _forward()
    return ops + _head_forward(x)


def graph_ops() -> dict[str, list[OpSpec]]:
    """The three graphs' ops, by key."""
    return {"train": train_ops(), "cond": cond_ops(), "eval": eval_ops()}


def traced(ops: list[OpSpec]) -> list[tuple[str, int, str, int]]:
    """(op name, output slot, op type, size): one trace per output of every op, in order."""
    return [(name, slot, typ, size) for name, typ, _, n, size in ops for slot in range(n)]


def share(total: int, parts: int, k: int) -> int:
    """Part ``k`` of ``total`` split as evenly as can be into ``parts``."""
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
    """The executions of ``step`` when ``n_execs`` are spread evenly over ``steps``."""
    return (step + 1) * n_execs // steps - step * n_execs // steps


# -- Python source files for real stacks -------------------------------------------------------


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
