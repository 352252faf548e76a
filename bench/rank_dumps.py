"""Making bench/scale_ranks.py's synthetic many-rank PyTorch DDP dumps (FULL_HEALTH).

:func:`generate` writes one dump the way ``torchrun`` with nanscope's PyTorch
recorder would: one ``DumpWriter`` per rank (``circular_buffer_size=-1``), all
sharing one run id, each rank written by its own child process (``jobs`` at a
time). Every rank runs the same program (:func:`step_program`), step after step:

* forward (``Phase.FORWARD``): the batch's ``aten._to_copy``, ``LAYERS`` times
  ``aten.mm`` / ``aten.add.Tensor`` / ``aten.relu``, then ``aten._softmax``,
  ``aten.log`` and ``aten.nll_loss_forward`` (module paths ``model.layers.<i>``,
  ``model.head``, ``model.loss``);
* backward (``Phase.BACKWARD``): the loss's seed (``aten.ones_like``), the head's
  gradients, then per layer, last first, ``threshold_backward`` and the weight,
  bias and input gradients; DDP's two gradient buckets, each ``aten.cat`` into a
  flat bucket, ``c10d.allreduce_.default`` on it (in place) tagged
  ``CollectiveTag(group="0", kind="collective", sequence=k, group_desc="default_pg",
  group_size=ranks)`` with ``k`` counting up from 1 over the run, the same on every
  rank, then ``aten.div_`` and ``aten.split_with_sizes`` back into gradients;
* optimizer (``Phase.OPTIMIZER``): ``aten.mul.Tensor`` and ``aten.add_.Tensor``
  (in place) on every parameter.

Tensor ids link every consumer to its producer (parameters keep their ids across
steps; an in-place op writes its input's id again, a new tensor). Each output has
a FULL_HEALTH summary. Wall clocks: a common timeline (``STEP_S`` seconds a step,
the ops evenly spread, a few ms of straggling per rank and step, microseconds of
jitter), shifted per rank by a clock offset drawn in [-2 s, +1.9 s]; the metadata's
clock anchors are shifted the same way.

**The fault**: at step ``bad_step`` on rank ``bad_rank``, ``aten.log.default``
outputs -inf (the softmax underflowed to zero); the rank's later forward and
backward ops carry Inf/NaN (the loss is NaN). From the first allreduce of that
step on, every rank's allreduce output is NaN, and everything that depends on it
(the step's gradients, the optimizer's updates, then every later step's forward
and backward) carries NaN, as in real DDP. ``bad_rank``'s clock runs the latest
(+2 s), so the first alert by wall clock is another rank's allreduce, 2 s
"before" the birth: the case a clock-based origin gets wrong.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

from harness import Child, ChildFailed, log, nanscope_location, start_child, with_peak_memory

GENERATOR_VERSION = 2  # 2: collectives carry what each rank put in
LAYERS = 8
BATCH, HIDDEN, CLASSES = 32, 1024, 1000
STEP_S = 0.25  # seconds a step takes, on the common timeline
EPOCH = 1_796_000_000.0  # the run's start on the common timeline (Dec 2026)
LATE_OFFSET = 2.0  # the bad rank's clock offset (s): the latest of all
OFFSET_RANGE = (-2.0, 1.9)  # every other rank's
LOG_OP = "aten.log.default"
ALLREDUCE_OP = "c10d.allreduce_.default"
FORWARD, BACKWARD, OPTIMIZER = 1, 2, 3

# What an output holds, in the program: finite, the birth's -inf, the bad rank's
# mixed Inf/NaN before the allreduce, NaN everywhere (allreduced and after).
FINITE, BORN, MIXED, NAN = 0, 1, 2, 3


class Op:
    """One op of a step: what it is, where, its inputs and outputs (symbolic names)."""

    __slots__ = ("bucket", "inputs", "module", "outputs", "phase", "sizes", "source", "type")

    def __init__(
        self,
        type_: str,
        phase: int,
        module: str,
        inputs: list[str],
        outputs: list[str],
        sizes: list[int],
        bucket: int = -1,
        source: tuple[str, int, str] = ("", 0, ""),
    ) -> None:
        self.type, self.phase, self.module = type_, phase, module
        self.inputs, self.outputs, self.sizes = inputs, outputs, sizes
        self.bucket = bucket  # allreduce: which bucket (0, 1)
        self.source = source  # the innermost frame: (file, line, function)


def params() -> list[str]:
    """The parameters' names: ``W0``, ``b0``, ... (each keeps its tensor id over the run)."""
    return [f"{k}{i}" for i in range(LAYERS) for k in ("W", "b")]


def step_program(layers: int = LAYERS) -> list[Op]:
    """The ops of one training step, in order (see the module docstring)."""
    act, w_size = BATCH * HIDDEN, HIDDEN * HIDDEN
    ops: list[Op] = []
    model, train = "/work/job/model.py", "/work/job/train.py"
    ops.append(Op("aten._to_copy.default", FORWARD, "", [], ["x"], [act], source=(train, 61, "train_step")))  # fmt: skip
    prev = "x"
    for i in range(layers):
        m = f"model.layers.{i}"
        ops.append(Op("aten.mm.default", FORWARD, m, [prev, f"W{i}"], [f"h{i}"], [act], source=(model, 30, "forward")))  # fmt: skip
        ops.append(Op("aten.add.Tensor", FORWARD, m, [f"h{i}", f"b{i}"], [f"z{i}"], [act], source=(model, 30, "forward")))  # fmt: skip
        ops.append(Op("aten.relu.default", FORWARD, m, [f"z{i}"], [f"a{i}"], [act], source=(model, 31, "forward")))  # fmt: skip
        prev = f"a{i}"
    head = BATCH * CLASSES
    ops.append(Op("aten._softmax.default", FORWARD, "model.head", [prev], ["p"], [head], source=(model, 44, "forward")))  # fmt: skip
    ops.append(Op(LOG_OP, FORWARD, "model.head", ["p"], ["lp"], [head], source=(model, 45, "forward")))  # fmt: skip
    ops.append(Op("aten.nll_loss_forward.default", FORWARD, "model.loss", ["lp"], ["loss", "tw"], [1, 1], source=(train, 64, "train_step")))  # fmt: skip
    # Backward: the seed, the head, then the layers last first; DDP's buckets on the way.
    ops.append(Op("aten.ones_like.default", BACKWARD, "", ["loss"], ["g_loss"], [1], source=(train, 65, "train_step")))  # fmt: skip
    ops.append(Op("aten.nll_loss_backward.default", BACKWARD, "model.loss", ["g_loss", "lp"], ["g_lp"], [head], source=(train, 65, "train_step")))  # fmt: skip
    ops.append(Op("aten.div.Tensor", BACKWARD, "model.head", ["g_lp", "p"], ["g_p"], [head], source=(train, 65, "train_step")))  # fmt: skip
    ops.append(Op("aten._softmax_backward_data.default", BACKWARD, "model.head", ["g_p", "p"], [f"g_a{layers - 1}"], [act], source=(train, 65, "train_step")))  # fmt: skip
    half = layers // 2
    buckets = [list(range(layers - 1, half - 1, -1)), list(range(half - 1, -1, -1))]
    for b, members in enumerate(buckets):
        for i in members:
            m = f"model.layers.{i}"
            src = (train, 65, "train_step")
            below = f"a{i - 1}" if i else "x"
            ops.append(Op("aten.threshold_backward.default", BACKWARD, m, [f"g_a{i}", f"a{i}"], [f"g_z{i}"], [act], source=src))  # fmt: skip
            ops.append(Op("aten.mm.default", BACKWARD, m, [below, f"g_z{i}"], [f"gW{i}"], [w_size], source=src))  # fmt: skip
            ops.append(Op("aten.sum.dim_IntList", BACKWARD, m, [f"g_z{i}"], [f"gb{i}"], [HIDDEN], source=src))  # fmt: skip
            if i:
                ops.append(Op("aten.mm.default", BACKWARD, m, [f"g_z{i}", f"W{i}"], [f"g_a{i - 1}"], [act], source=src))  # fmt: skip
        grads = [f"{k}{i}" for i in members for k in ("gW", "gb")]
        n = len(members) * (w_size + HIDDEN)
        ddp = ("/usr/lib/python3/torch/nn/parallel/distributed.py", 1400 + b, "_sync_buckets")
        flat = f"bucket{b}"
        ops.append(Op("aten.cat.default", BACKWARD, "", grads, [flat], [n], source=ddp))
        ops.append(Op(ALLREDUCE_OP, BACKWARD, "", [flat], [flat], [n], bucket=b, source=ddp))
        ops.append(Op("aten.div_.Scalar", BACKWARD, "", [flat], [flat], [n], source=ddp))
        sizes = [w_size if g.startswith("gW") else HIDDEN for g in grads]
        ops.append(
            Op(
                "aten.split_with_sizes.default",
                BACKWARD,
                "",
                [flat],
                [f"r{g}" for g in grads],
                sizes,
                source=ddp,
            )
        )
    # The optimizer: every parameter updated in place.
    opt = ("/usr/lib/python3/torch/optim/sgd.py", 300, "_single_tensor_sgd")
    for p in params():
        size = w_size if p.startswith("W") else HIDDEN
        ops.append(Op("aten.mul.Tensor", OPTIMIZER, "", [f"rg{p}"], [f"u{p}"], [size], source=opt))  # fmt: skip
        ops.append(Op("aten.add_.Tensor", OPTIMIZER, "", [p, f"u{p}"], [p], [size], source=opt))  # fmt: skip
    return ops


def rank_plan(cfg: dict[str, Any], rank: int) -> dict[str, Any]:
    """A rank's steps, the bad step and rank, and its clock offset (the same in every child)."""
    per_step = len(step_program(cfg["layers"]))
    steps = max(2, cfg["events"] // per_step)
    bad_step = min(steps - 1, int(cfg["bad_at"] * steps))
    rng = random.Random(f"{cfg['seed']}/{rank}")
    offset = LATE_OFFSET if rank == cfg["bad_rank"] else rng.uniform(*OFFSET_RANGE)
    return {
        "steps": steps,
        "per_step": per_step,
        "bad_step": bad_step,
        "bad_rank": cfg["bad_rank"],
        "offset": offset,
    }


def _summary(np: Any, size: int, state: int) -> Any:
    """A FULL_HEALTH row: [tensor_id, device_id, dtype, rank, size, -inf, +inf, nan, -, 0, +]."""
    ninf = pinf = nan = 0
    if state == BORN:
        ninf = 3
    elif state == MIXED:
        ninf, pinf, nan = size // 8, size // 8, size // 4
    elif state == NAN:
        nan = size
    finite = size - ninf - pinf - nan
    neg, zero = (finite * 9) // 20, finite // 50
    dims = 0 if size == 1 else 2
    return np.array(
        [0, 0, 1, dims, size, ninf, pinf, nan, neg, zero, finite - neg - zero], dtype=np.float64
    )


def child_write_ranks(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Write ranks ``cfg["write"]`` of the dump (a child): each in a process forked from
    this one once numpy and nanscope are imported (its own pid, no import to pay again)."""
    perf = time.perf_counter
    t0 = perf()
    import numpy  # noqa: F401

    import nanscope.events  # noqa: F401

    import_s = perf() - t0
    results = []
    for rank in cfg["write"]:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the rank's process
            os.close(read)
            code = 0
            try:
                res = _write_rank({**cfg, "rank": rank})
            except BaseException as exc:  # reported to the parent, which stops
                res, code = {"rank": rank, "error": repr(exc)}, 1
            os.write(write, json.dumps(res).encode())
            os._exit(code)
        os.close(write)
        with os.fdopen(read, "rb") as fh:
            res = json.loads(fh.read() or b'{"error": "no result"}')
        _, status = os.waitpid(pid, 0)
        if status or "error" in res:
            raise RuntimeError(f"rank {rank}: {res.get('error')} (status {status})")
        res["import_s"] = import_s
        results.append(res)
    return results


def _write_rank(cfg: dict[str, Any]) -> dict[str, Any]:
    """Write rank ``cfg["rank"]`` of the dump; returns what it wrote and how fast."""
    rank = cfg["rank"]
    perf = time.perf_counter
    t0 = perf()
    plan = rank_plan(cfg, rank)
    offset = plan["offset"]
    # This rank's clock: the writer's anchors and file names come from time.time().
    real_time = time.time
    started_real = real_time()
    time.time = lambda: EPOCH + offset + (real_time() - started_real)  # type: ignore[assignment]
    import numpy as np

    from nanscope.events import DumpWriter, ExecutionEvent, Phase
    from nanscope.events._model import CollectiveTag  # not exported by nanscope.events yet

    w = DumpWriter(
        cfg["dump"],
        "FULL_HEALTH",
        circular_buffer_size=-1,
        framework="torch 2.13.0 (bench/scale_ranks.py, synthetic)",
        run_id=cfg["run_id"],
        rank=rank,
        world_size=cfg["ranks"],
        host_name=f"node{rank // 8:04d}",
        flush_interval=5.0,
    )
    dev = w.register_device(f"cuda:{rank % 8}")
    program = step_program(cfg["layers"])
    frames_out = [("/work/job/train.py", 90, "<module>"), ("/work/job/train.py", 80, "main")]
    stacks = {op.source: w.stack_from_frames([*frames_out, op.source]) for op in program}
    phases = {FORWARD: Phase.FORWARD, BACKWARD: Phase.BACKWARD, OPTIMIZER: Phase.OPTIMIZER}
    sums: dict[tuple[int, int], Any] = {}

    def summary(size: int, state: int) -> Any:
        s = sums.get((size, state))
        if s is None:
            s = sums[(size, state)] = _summary(np, size, state)
        return s

    # Tensor ids: parameters first (kept over the run), then one new id per output.
    ids: dict[str, int] = {p: i + 1 for i, p in enumerate(params())}
    next_id = len(ids) + 1
    state: dict[str, int] = dict.fromkeys(ids, FINITE)
    steps, bad_step, bad_rank = plan["steps"], plan["bad_step"], plan["bad_rank"]
    per_step = len(program)
    rng = random.Random(f"{cfg['seed']}/{rank}/clock")
    dt = STEP_S / per_step
    sequence = 0
    nonfinite = 0
    events = 0
    t_loop = perf()
    for step in range(steps):
        # The step starts on the common timeline, plus this rank's straggling.
        t = EPOCH + offset + 1.0 + step * STEP_S + rng.uniform(0.0, 0.004)
        poisoned = False  # an allreduce of this step has carried NaN in
        for k, op in enumerate(program):
            ins = [state.get(n, FINITE) for n in op.inputs]
            worst = max(ins, default=FINITE)
            if op.type == ALLREDUCE_OP:
                sequence += 1
                out_state = NAN if (step >= bad_step or worst) else FINITE
                poisoned = poisoned or out_state == NAN
            elif op.type == "aten.ones_like.default" or not op.inputs:
                out_state = FINITE  # reads only the shape, or the batch
            elif op.type == LOG_OP and rank == bad_rank and step == bad_step:
                out_state = BORN
            elif worst == FINITE:
                out_state = FINITE
            elif worst == NAN or poisoned:
                out_state = NAN
            else:
                out_state = MIXED if op.type != "aten.nll_loss_forward.default" else NAN
            in_ids = [ids[n] for n in op.inputs if n in ids]
            out_ids = []
            for name in op.outputs:
                if name in op.inputs:  # in place: the input's id, written again
                    out_ids.append(ids[name])
                else:
                    ids[name] = next_id
                    out_ids.append(next_id)
                    next_id += 1
                state[name] = out_state
            tag = None
            sent: list[Any] = []
            if op.type == ALLREDUCE_OP:
                tag = CollectiveTag(
                    group="0",
                    kind="collective",
                    sequence=sequence,
                    group_desc="default_pg",
                    group_size=cfg["ranks"],
                )
                # What this rank put in, summarised before the reduction (as the recorders do).
                sent = [summary(s, worst) for s in op.sizes]
            w.write_execution(
                ExecutionEvent(
                    op_type=op.type,
                    output_tensor_ids=out_ids,
                    input_tensor_ids=in_ids,
                    output_device_ids=[dev] * len(out_ids),
                    summaries=[summary(s, out_state) for s in op.sizes],
                    stack=stacks[op.source],
                    module_path=op.module,
                    phase=phases[op.phase],
                    step=step,
                    wall_time=t + k * dt + rng.uniform(0.0, 2e-6),
                    collective=tag,
                    input_summaries=sent,
                ),
                encode_now=True,
            )
            events += 1
            nonfinite += out_state != FINITE
    loop_s = perf() - t_loop
    t = perf()
    w.flush(timeout=None)
    w.close(timeout=None)
    flush_s = perf() - t
    time.time = real_time  # type: ignore[assignment]
    return with_peak_memory(
        {
            "nanscope": nanscope_location(),
            "rank": rank,
            "wall_s": perf() - t0,
            "loop_s": loop_s,
            "flush_s": flush_s,
            "events": events,
            "nonfinite": nonfinite,
            "allreduces": sequence,
            "steps": steps,
            "bad_step": bad_step,
            "offset": offset,
            "writer_waits": w.stats.waits,
            "writer_errors": w.stats.errors,
            "dropped": w.stats.dropped,
        }
    )


def dump_name(ranks: int, events: int) -> str:
    """The directory name of a dump under ``--keep``."""
    return f"ranks{ranks}_events{events}"


def generate(
    dump: str | os.PathLike[str],
    *,
    ranks: int,
    events: int,
    bad_rank: int,
    bad_at: float = 0.9,
    layers: int = LAYERS,
    seed: int = 0,
    jobs: int = 2,
) -> dict[str, Any]:
    """Write a synthetic many-rank DDP dump to ``dump`` (see the module docstring).

    ``events`` per rank; ``bad_at``: where the bad step falls, as a fraction of the
    steps. Ranks are written by child processes, ``jobs`` at a time. Returns the
    generation record (also stored in ``<dump>.json``); a dump whose record has
    the same parameters is reused.
    """
    dump = Path(dump)
    params = {
        "ranks": ranks,
        "events": events,
        "bad_rank": bad_rank,
        "bad_at": bad_at,
        "layers": layers,
        "seed": seed,
        "version": GENERATOR_VERSION,
    }
    record_path = dump.with_name(dump.name + ".json")
    if record_path.exists() and dump.is_dir():
        record: dict[str, Any] = json.loads(record_path.read_text())
        if record.get("params") == params:
            record["reused"] = True
            return record
    if dump.exists():
        shutil.rmtree(dump)
    record_path.unlink(missing_ok=True)
    run_id = hashlib.sha1(json.dumps(params, sort_keys=True).encode()).hexdigest()[:8]
    cfg = {**params, "dump": str(dump), "run_id": run_id}
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    # Ranks in batches, one child each (``jobs`` at once), a forked process per rank.
    batch = max(1, min(64, ranks // max(1, 4 * jobs)))
    pending = [list(range(r, min(ranks, r + batch))) for r in range(0, ranks, batch)]
    running: list[tuple[list[int], Child]] = []
    log(f"generate {ranks} ranks x {events:,} events: {dump}")
    while pending or running:
        while pending and len(running) < max(1, jobs):
            todo = pending.pop(0)
            running.append(
                (
                    todo,
                    start_child(
                        "rank_dumps",
                        "write-ranks",
                        {**cfg, "write": todo},
                        label=f"write ranks {todo[0]}-{todo[-1]}",
                    ),
                )
            )
        todo, child = running.pop(0)
        try:
            done = child.wait()
        except ChildFailed as exc:
            exc.exit()
        results.extend(done)
        log(
            f"  ranks {todo[0]}-{todo[-1]}: {sum(r['events'] for r in done):,} events "
            f"({sum(r['nonfinite'] for r in done):,} non-finite) in {child.wall_s:.1f}s"
        )
    wall = time.perf_counter() - started
    sizes = [(p.name, p.stat().st_size) for p in dump.iterdir()]
    record = {
        "params": params,
        "run_id": run_id,
        "dump": str(dump),
        "wall_s": wall,
        "ranks": sorted(results, key=lambda x: x["rank"]),
        "files": len(sizes),
        "bytes": sum(s for _, s in sizes),
        "execution_bytes": sum(s for n, s in sizes if n.endswith(".execution")),
        "index_bytes": sum(s for n, s in sizes if n.endswith(".nsidx")),
        "plan": rank_plan(cfg, bad_rank),
        "reused": False,
    }
    record_path.write_text(json.dumps(record))
    return record


CHILDREN = {"write-ranks": child_write_ranks}
