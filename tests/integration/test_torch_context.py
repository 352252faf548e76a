"""What ran around each op: module paths, phases and steps (RunContext), with either recorder.

Module paths are the qualified names of ``named_modules()`` with the class beside
them (``h.1.ln_1 (LayerNorm)``), the outermost module by its class. Steps count
training iterations, one per weight update, for the loops people write: an
optimizer, a GradScaler that skips steps, weights updated by hand, gradient
accumulation. The work between ``backward()`` and the update (clipping, the
scaler's checks, a hand-written update) is in the optimizer phase.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

import nanscope
from nanscope.reader import TRACES, Execution

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
FORWARD, BACKWARD, OPTIMIZER = 1, 2, 3
ITERATIONS = 4


def record(logdir: Path, fn: Callable[[], Any]) -> list[Execution]:
    """Run ``fn`` while dumping everything into ``logdir``; the executions."""
    with nanscope.enable_dump_debug_info(logdir, "FULL_HEALTH", circular_buffer_size=-1):
        fn()
    with nanscope.open_dump(logdir) as dump:
        assert dump.problems == []
        return dump.executions()


# -- module paths ----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(4)
        self.mlp = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> Any:
        return x + self.mlp(self.ln_1(x))


class Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.h = nn.ModuleList([Block(), Block()])
        self.ln_f = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> Any:
        for block in self.h:
            x = block(x)
        return torch.relu(self.ln_f(x))


class LMHeadModel(nn.Module):
    """GPT-2's layout: blocks in a ModuleList under ``transformer``, heads in a ModuleDict."""

    def __init__(self) -> None:
        super().__init__()
        self.transformer = Transformer()
        self.heads = nn.ModuleDict({"lm": nn.Linear(4, 3)})

    def forward(self, x: torch.Tensor) -> Any:
        return self.heads["lm"](self.transformer(x))


def test_module_paths_name_each_instance_with_its_class(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = LMHeadModel()
    execs = record(tmp_path, lambda: model(torch.randn(2, 4)).sum().backward())
    forward = [e for e in execs if e.phase == FORWARD]
    layer_norms = [e.module_path for e in forward if e.op_type == "aten.native_layer_norm.default"]
    assert layer_norms == [
        "transformer.h.0.ln_1 (LayerNorm)",
        "transformer.h.1.ln_1 (LayerNorm)",
        "transformer.ln_f (LayerNorm)",
    ]
    addmms = [e.module_path for e in forward if e.op_type == "aten.addmm.default"]
    assert addmms == [
        "transformer.h.0.mlp (Linear)",
        "transformer.h.1.mlp (Linear)",
        "heads.lm (Linear)",
    ]
    # An op of a module's own forward, outside its submodules: the module's path.
    adds = [e.module_path for e in forward if e.op_type == "aten.add.Tensor"]
    assert adds == ["transformer.h.0 (Block)", "transformer.h.1 (Block)"]
    assert by_op(forward, "aten.relu.default").module_path == "transformer (Transformer)"
    # Backward ops take their forward op's path: the two blocks stay apart.
    backward = {e.module_path for e in execs if e.phase == BACKWARD and e.forward_sequence}
    assert {"transformer.h.0.ln_1 (LayerNorm)", "transformer.h.1.ln_1 (LayerNorm)"} <= backward


def test_compiled_graphs_name_modules_the_same_way(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = LMHeadModel()
    compiled = torch.compile(model)
    with nanscope.enable_dump_debug_info(tmp_path, circular_buffer_size=-1):
        compiled(torch.randn(2, 4)).sum().backward()
    with nanscope.open_dump(tmp_path) as dump:
        calls = [e for e in dump.executions() if e.graph_id]
        assert [c.op_type.rsplit(" ", 1)[-1] for c in calls] == ["forward", "backward"]
        assert calls[0].module_path == "LMHeadModel"  # the model, not its OptimizedModule
        graph = dump.graph(calls[0].graph_id)
        assert graph is not None
        ops = list(graph.ops.values())
        # LayerNorm is decomposed by now: one var_mean each.
        layer_norms = [op.module_path for op in ops if op.op_type == "aten.var_mean.correction"]
        assert layer_norms == [
            "transformer.h.0.ln_1 (LayerNorm)",
            "transformer.h.1.ln_1 (LayerNorm)",
            "transformer.ln_f (LayerNorm)",
        ]
        assert {op.module_path for op in ops if op.op_type == "aten.addmm.default"} == {
            "transformer.h.0.mlp (Linear)",
            "transformer.h.1.mlp (Linear)",
            "heads.lm (Linear)",
        }


def test_the_outermost_module_is_named_by_its_class(tmp_path: Path) -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> Any:
            return torch.tanh(self.fc(x))

    net = Net()

    def run() -> None:
        net(torch.ones(1, 2))
        net.fc(torch.ones(1, 2))  # on its own, it is the outermost module

    execs = record(tmp_path, run)
    # (The Python recorder sees the detach that saves tanh's output too: left out.)
    assert [
        (e.op_type, e.module_path)
        for e in execs
        if e.module_path and e.op_type != "aten.detach.default"
    ] == [
        ("aten.t.default", "fc (Linear)"),
        ("aten.addmm.default", "fc (Linear)"),
        ("aten.tanh.default", "Net"),
        ("aten.t.default", "Linear"),
        ("aten.addmm.default", "Linear"),
    ]


def test_module_paths_of_modules_added_shared_and_unregistered(tmp_path: Path) -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 2)
            self.alias = self.fc  # registered twice: named by the first name
            self.loose = [nn.Linear(2, 2)]  # not registered: named by its class, after its caller
            self.late: nn.Module | None = None

        def forward(self, x: torch.Tensor) -> Any:
            x = self.alias(x)
            x = self.loose[0](x)
            if self.late is not None:
                x = self.late(x)
            return x

    net = Net()

    def run() -> None:
        net(torch.ones(1, 2))
        net.late = nn.Linear(2, 2)  # added after the first forward
        net(torch.ones(1, 2))

    execs = record(tmp_path, run)
    paths = [e.module_path for e in execs if e.op_type == "aten.addmm.default"]
    assert paths == [
        "fc (Linear)",
        "<Linear> (Linear)",
        "fc (Linear)",
        "<Linear> (Linear)",
        "late (Linear)",
    ]


def test_a_module_that_its_caller_does_not_hold_names_its_own_modules(tmp_path: Path) -> None:
    teacher = nn.Sequential(nn.Linear(2, 2), nn.ReLU())

    class Student(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> Any:
            with torch.no_grad():
                target = teacher(x)  # another model, called from inside this one
            return self.body(x) - target

    student = Student()
    execs = record(tmp_path, lambda: student(torch.ones(1, 2)))
    assert [(e.op_type, e.module_path) for e in execs if e.module_path] == [
        ("aten.t.default", "<Sequential>.0 (Linear)"),
        ("aten.addmm.default", "<Sequential>.0 (Linear)"),
        ("aten.relu.default", "<Sequential>.1 (ReLU)"),
        ("aten.t.default", "body (Linear)"),
        ("aten.addmm.default", "body (Linear)"),
        ("aten.sub.Tensor", "Student"),
    ]


def test_module_hooks_are_left_out_of_module_calls_by_the_native_recorder(
    tmp_path: Path, recorder: str
) -> None:
    """The native recorder reads modules off the frames: no global hook sends every
    module call down nn.Module's slow path. The Python recorder keeps its hooks."""
    from torch.nn.modules import module as nn_module

    hooks: list[int] = []

    def run() -> None:
        hooks.append(
            len(nn_module._global_forward_pre_hooks) + len(nn_module._global_forward_hooks)
        )
        LMHeadModel()(torch.randn(2, 4))

    before = len(nn_module._global_forward_pre_hooks) + len(nn_module._global_forward_hooks)
    execs = record(tmp_path, run)
    assert hooks == [before + (0 if recorder == "native" else 2)]
    adds = [e.module_path for e in execs if e.op_type == "aten.add.Tensor"]
    assert adds == ["transformer.h.0 (Block)", "transformer.h.1 (Block)"]


def test_a_dead_modules_address_taken_by_another_module_names_the_new_one(
    tmp_path: Path, recorder: str
) -> None:
    """Modules made and dropped one after another: the allocator gives the next one the
    last one's address, and each op still names the module that ran it."""

    class Base(nn.Module):
        def __init__(self, scale: float) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.scale = scale

        def forward(self, x: torch.Tensor) -> Any:
            return self.lin(x) * self.scale

    classes = [type(f"Net{i}", (Base,), {}) for i in range(40)]
    addresses: set[int] = set()

    def run() -> None:
        for i, cls in enumerate(classes):
            model = cls(float(i + 1))
            addresses.add(id(model))
            model(torch.randn(2, 4))
            del model
            gc.collect()

    execs = record(tmp_path, run)
    assert len(addresses) < len(classes)  # an address was taken again: the case under test
    scaled = [e.module_path for e in execs if e.op_type == "aten.mul.Tensor"]
    assert scaled == [cls.__name__ for cls in classes]
    linears = [e.module_path for e in execs if e.op_type == "aten.addmm.default"]
    assert linears == ["lin (Linear)"] * len(classes)


def test_a_module_called_under_a_deep_stack_is_named(tmp_path: Path, recorder: str) -> None:
    """Deeper than the frames a stack keeps (128): the modules still name the op."""
    model = LMHeadModel()

    def nested(depth: int) -> Any:
        return model(torch.randn(2, 4)) if depth == 0 else nested(depth - 1)

    execs = record(tmp_path, lambda: nested(300))
    adds = [e.module_path for e in execs if e.op_type == "aten.add.Tensor"]
    assert adds == ["transformer.h.0 (Block)", "transformer.h.1 (Block)"]
    assert by_op(execs, "aten.relu.default").module_path == "transformer (Transformer)"


def test_a_forward_pass_begins_at_a_module_call_after_backward(
    tmp_path: Path, recorder: str
) -> None:
    """Updates by hand: a module's first op that autograd does not record (its input
    clamped) is already the next forward pass's, not the update's."""

    class Clamped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> Any:
            return torch.tanh(self.lin(x.clamp(-1, 1)))

    torch.manual_seed(0)
    model = Clamped()
    data = [torch.randn(4, 3) for _ in range(ITERATIONS)]

    def run() -> None:
        for x in data:
            model(x).sum().backward()
            with torch.no_grad():
                for p in model.parameters():
                    assert p.grad is not None
                    p.sub_(0.1 * p.grad)
                    p.grad = None

    gc.collect()
    execs = record(tmp_path, run)
    clamps = [(e.step, e.phase, e.module_path) for e in execs if e.op_type == "aten.clamp.default"]
    assert clamps == [(i, FORWARD, "Clamped") for i in range(ITERATIONS)]
    updates = [(e.step, e.phase) for e in execs if e.op_type == "aten.sub_.Tensor"]
    assert updates == [(i, OPTIMIZER) for i in range(ITERATIONS) for _ in range(2)]


def test_frames_name_modules_phases_and_steps_as_the_hooks_do_in_gpt2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers' GPT-2 from a tiny config with gradient checkpointing (its blocks
    called through GradientCheckpointingLayer.__call__ and run again in backward), two
    AdamW steps, under each recorder: every op type that both record as often has the
    same module path, phase and step at each occurrence in the native recorder (module
    frames) as in the Python one (global module hooks, the oracle)."""
    pytest.importorskip("transformers")
    import importlib.util

    from nanscope.backends.torch.native import native_library

    if native_library() is None:
        pytest.skip("the native recorder cannot be built here")
    path = ROOT / "tests" / "programs" / "real" / "gpt2_transformers.py"
    spec = importlib.util.spec_from_file_location("gpt2_transformers", path)
    assert spec is not None and spec.loader is not None
    program = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(program)
    seen: dict[str, dict[str, list[tuple[str, int, int]]]] = {}
    for recorder in ("python", "native"):
        monkeypatch.setenv("NANSCOPE_TORCH_RECORDER", recorder)
        logdir = tmp_path / recorder
        with nanscope.enable_dump_debug_info(logdir, "NO_TENSOR", circular_buffer_size=-1):
            program.main(["--steps", "2", "--gradient-checkpointing"])
        with nanscope.open_dump(logdir) as dump:
            by_type: dict[str, list[tuple[str, int, int]]] = {}
            for e in dump.executions():
                by_type.setdefault(e.op_type, []).append((e.module_path, e.phase, e.step))
            seen[recorder] = by_type
    hooks, frames = seen["python"], seen["native"]
    common = sorted(op for op in set(hooks) & set(frames) if len(hooks[op]) == len(frames[op]))
    assert len(common) >= 40
    for op in common:
        assert frames[op] == hooks[op], op
    paths = {p for op in common for p, _, _ in frames[op]}
    assert {
        "transformer.h.1.attn (GPT2Attention)",
        "transformer.h.0.mlp.act (NewGELUActivation)",
    } <= paths
    assert {(phase, step) for op in common for _, phase, step in frames[op]} >= {
        (phase, step) for phase in (FORWARD, BACKWARD, OPTIMIZER) for step in (0, 1)
    }


def by_op(execs: list[Execution], op_type: str) -> Execution:
    (e,) = [e for e in execs if e.op_type == op_type]
    return e


# -- steps and phases ------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> Any:
        return self.fc2(torch.relu(self.fc1(x)))


def optimizer_loop(model: MLP, data: list[torch.Tensor]) -> Callable[[], None]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def run() -> None:
        for x in data:
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

    return run


def gradscaler_loop(model: MLP, data: list[torch.Tensor]) -> Callable[[], None]:
    """autocast float16 + GradScaler: with a scale of 2**20 the scaled gradients overflow
    and the scaler skips the first two optimizer steps (as in
    tests/programs/real/amp_gradscaler.py)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20)

    def run() -> None:
        for x in data:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(x).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e3)
            scaler.step(opt)
            scaler.update()

    return run


def manual_loop(model: MLP, data: list[torch.Tensor]) -> Callable[[], None]:
    """No optimizer: ``p -= lr * p.grad``, in place."""

    def run() -> None:
        for x in data:
            model(x).pow(2).mean().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with torch.no_grad():
                for p in model.parameters():
                    assert p.grad is not None
                    p.sub_(0.01 * p.grad)
                    p.grad = None

    return run


def accumulation_loop(model: MLP, data: list[torch.Tensor]) -> Callable[[], None]:
    """Three micro-batches per update."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def run() -> None:
        for x in data:
            for micro in x.chunk(3):
                (model(micro).pow(2).mean() / 3).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()

    return run


def closure_loop(model: MLP, data: list[torch.Tensor]) -> Callable[[], None]:
    """``optimizer.step(closure)``, as Lightning runs every training step: the forward and
    backward passes run inside the optimizer's step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def run() -> None:
        for x in data:

            def closure(x: torch.Tensor = x) -> torch.Tensor:
                opt.zero_grad()
                loss: torch.Tensor = model(x).pow(2).mean()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                return loss

            opt.step(closure)

    return run


LOOPS = {
    "optimizer": optimizer_loop,
    "closure": closure_loop,
    "gradscaler": gradscaler_loop,
    "manual": manual_loop,
    "accumulation": accumulation_loop,
}
PASSES = {"optimizer": 1, "closure": 1, "gradscaler": 1, "manual": 1, "accumulation": 3}


@pytest.mark.parametrize("loop", list(LOOPS))
def test_steps_count_training_iterations(tmp_path: Path, loop: str) -> None:
    torch.manual_seed(0)
    model = MLP()
    data = [torch.randn(6, 8) for _ in range(ITERATIONS)]
    run = LOOPS[loop](model, data)
    steps_taken: list[int] = []
    hook = register_optimizer_step_post_hook(lambda opt, args, kwargs: steps_taken.append(1))
    gc.collect()  # an optimizer left by an earlier test would make "manual" look accumulated
    try:
        execs = record(tmp_path, run)
    finally:
        hook.remove()
    if loop == "gradscaler":  # the scale is too high at first: two steps are skipped
        assert len(steps_taken) == ITERATIONS - 2
    # Every forward pass of iteration i (several with accumulation) is in step i ...
    first_layer = [
        e.step for e in execs if e.phase == FORWARD and e.op_type == "aten.addmm.default"
    ]
    first_layer = first_layer[::2]  # fc1 and fc2: one per pass
    assert first_layer == [i for i in range(ITERATIONS) for _ in range(PASSES[loop])]
    # ... and so are its backward ops and its update.
    for phase in (BACKWARD, OPTIMIZER):
        steps = [e.step for e in execs if e.phase == phase]
        assert steps == sorted(steps) and set(steps) == set(range(ITERATIONS)), phase
    for step in range(ITERATIONS):
        block = [e for e in execs if e.step == step]
        last_backward = max(i for i, e in enumerate(block) if e.phase == BACKWARD)
        # Between the last backward pass and the step's end: update work only.
        after = block[last_backward + 1 :]
        assert after and all(e.phase == OPTIMIZER for e in after), [
            (e.op_type, e.phase) for e in after
        ]
    # Gradient clipping is update work.
    norms = [e for e in execs if "norm" in e.op_type and "layer_norm" not in e.op_type]
    assert norms and {e.phase for e in norms} == {OPTIMIZER}


def test_steps_of_updates_by_hand_without_modules(tmp_path: Path) -> None:
    """No module, no optimizer: a forward pass begins at the first op autograd records."""
    torch.manual_seed(0)
    w = torch.randn(3, 2, requires_grad=True)
    data = [torch.randn(4, 3) for _ in range(ITERATIONS)]

    def run() -> None:
        for x in data:
            torch.tanh(x @ w).sum().backward()
            with torch.no_grad():
                assert w.grad is not None
                w.sub_(0.1 * w.grad)
                w.grad.zero_()

    gc.collect()
    execs = record(tmp_path, run)
    tanh = [(e.step, e.phase) for e in execs if e.op_type == "aten.tanh.default"]
    assert tanh == [(i, FORWARD) for i in range(ITERATIONS)]
    updates = [(e.step, e.phase) for e in execs if e.op_type == "aten.sub_.Tensor"]
    assert updates == [(i, OPTIMIZER) for i in range(ITERATIONS)]


def test_a_backward_pass_alone_is_one_step(tmp_path: Path) -> None:
    """Inference after a backward pass (saliency, say): each forward after a backward begins
    a step; ops before any backward pass are in step 0."""
    torch.manual_seed(0)
    model = MLP()

    def run() -> None:
        with torch.no_grad():
            model(torch.randn(2, 8))
        x = torch.randn(2, 8, requires_grad=True)
        model(x).sum().backward()
        model(x).sum().backward()

    gc.collect()
    execs = record(tmp_path, run)
    relu = [(e.step, e.phase) for e in execs if e.op_type == "aten.relu.default"]
    assert relu == [(0, FORWARD), (0, FORWARD), (1, FORWARD)]


# -- start-up: Dynamo and inductor only for compiled code --------------------------------------

LAZY_PROGRAM = """
import json, sys
import torch

heavy = ("torch._dynamo", "torch._inductor")
at_import = {m for m in sys.modules if m.startswith(heavy)}
import nanscope

with nanscope.enable_dump_debug_info(sys.argv[1]):
    (torch.ones(3) * 2).sum()
eager = sorted(m for m in sys.modules if m.startswith(heavy) and m not in at_import)

# The first torch.compile while recording imports them, and is recorded.
with nanscope.enable_dump_debug_info(sys.argv[2]):
    torch.compile(lambda x: torch.log(x) * 2)(torch.ones(3))
print(json.dumps({"eager": eager, "compiled": "torch._inductor.compile_fx" in sys.modules}))
"""


def test_recording_eager_code_imports_neither_dynamo_nor_inductor(tmp_path: Path) -> None:
    program = tmp_path / "lazy.py"
    program.write_text(textwrap.dedent(LAZY_PROGRAM))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONFAULTHANDLER"] = "1"  # should it abort, every thread's Python stack
    out = subprocess.run(
        [sys.executable, str(program), str(tmp_path / "eager"), str(tmp_path / "compiled")],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"eager": [], "compiled": True}
    with nanscope.open_dump(tmp_path / "compiled") as dump:
        assert dump.num_graph_execution_traces() > 0
        assert {dump.trace(i).op_type for i in range(dump.num(TRACES))} >= {"aten.log.default"}


def test_set_step_numbers_steps_from_the_trainers_count(tmp_path: Path) -> None:
    """A trainer resumed at its global step 41 sets it; each optimizer step counts on."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nanscope.enable_dump_debug_info(str(tmp_path), "FULL_HEALTH", -1) as session:
        session.set_step(41)
        for _ in range(3):
            model(torch.ones(2, 3)).sum().backward()
            opt.step()
            opt.zero_grad()
    with nanscope.open_dump(tmp_path) as r:
        steps = [e.step for e in r.executions() if e.op_type.startswith("aten.addmm")]
    assert steps == [41, 42, 43]
