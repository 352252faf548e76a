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
(``--as-script`` runs them as this script instead; see ``Runner``).

    .venv/bin/python bench/overhead_torch.py                 # the full run (~10 min)
    .venv/bin/python bench/overhead_torch.py --quick         # smoke run (small Transformer)
    .venv/bin/python bench/overhead_torch.py --skip-tf --skip-transformer --rounds 5
    .venv/bin/python bench/overhead_torch.py --breakdown     # where nanscope's time goes (MLP)
    .venv/bin/python bench/overhead_torch.py --rnn           # the word-level language models
    .venv/bin/python bench/overhead_torch.py --breakdown --breakdown-model rnn_relu

``--breakdown`` times a ladder of partial recorders on the MLP (a no-op
dispatch mode; nanscope without stack capture and without the writer; with
stack capture; the whole NO_TENSOR; FULL_HEALTH without and with the writer)
and prints a cProfile of FULL_HEALTH steps grouped by nanscope file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from harness import ONE_THREAD_ENV, ChildFailed, run_child, send_result, source_state, table_head
from overhead_breakdown import print_breakdown, print_native_breakdown
from overhead_models import RNN_LM, RNN_MODELS, TRANSFORMER
from overhead_report import report
from overhead_variants import (
    COMPILED_VARIANTS,
    ON_REQUEST,
    RNN_VARIANTS,
    STEADY_VARIANTS,
    TF_VARIANTS,
    TORCH_VARIANTS,
)

HERE = Path(__file__).resolve()


class Runner:
    """Runs one measurement of bench/overhead_children.py in a child with one compute thread.

    Children start from the harness's few-line ``-c`` stub, so that the Python stack
    under each op is a short script's (a stub, then functions), not a long file's
    ``<module>`` frame: nanscope interns stack frames in dictionaries keyed by code
    objects, and hashing a module's code object hashes all the code in it (about
    11-17 us for the 1000-line file this bench once was, 1.3 us for the 123-line
    tutorial script), twice per op. ``--as-script`` runs the children as
    ``python bench/overhead_torch.py --child ...`` to show that.
    """

    def __init__(self, as_script: bool) -> None:
        self.script = HERE if as_script else None

    def __call__(self, kind: str, cfg: dict[str, Any], timeout: float = 900) -> Any:
        try:
            return run_child(
                "overhead_children",
                kind,
                cfg,
                timeout=timeout,
                env=ONE_THREAD_ENV,
                label=f"{kind} {cfg}",
                capture_stderr=False,
                script=self.script,
            )
        except ChildFailed as exc:
            exc.exit()


def main(argv: list[str] | None = None) -> None:
    """The command line: the full run, ``--breakdown``, ``--compiled`` or one ``--child``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few rounds and steps; small Transformer")
    ap.add_argument("--skip-tf", action="store_true")
    ap.add_argument("--skip-transformer", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--skip-steady", action="store_true", help="no long-run MLP section")
    ap.add_argument(
        "--steady-rounds", type=int, default=3, help="rounds of the long runs (one session each)"
    )
    ap.add_argument(
        "--steady-variants",
        help="only these variants in the long runs, comma-separated (plain is always run)",
    )
    ap.add_argument("--rounds", type=int, help="rounds for the MLP (both frameworks)")
    ap.add_argument(
        "--variants",
        help="only these PyTorch variants, comma-separated (plain is always run), e.g. "
        "FULL_HEALTH,FULL_HEALTH:noranges: more rounds for the same time",
    )
    ap.add_argument("--transformer-rounds", type=int)
    ap.add_argument("--breakdown", action="store_true", help="only the MLP cost breakdown")
    ap.add_argument(
        "--breakdown-native",
        help="only the native recorder's per-op cost ladder on these models, comma-separated "
        "(micro: small elementwise ops; mlp; lstm, lstm_unfused, rnn_relu)",
    )
    ap.add_argument("--json", help="also write the raw results here")
    ap.add_argument(
        "--as-script",
        action="store_true",
        help="run the children as this script (its <module> frame under every op)",
    )
    ap.add_argument(
        "--rnn",
        action="store_true",
        help="only the word-level language models (LSTM, unfused LSTM, ReLU RNN)",
    )
    ap.add_argument("--rnn-models", default=",".join(RNN_MODELS))
    ap.add_argument("--rnn-variants", default=",".join(RNN_VARIANTS))
    ap.add_argument("--compiled", action="store_true", help="only the torch.compile section")
    ap.add_argument("--compiled-layers", type=int, default=TRANSFORMER["layers"])
    ap.add_argument("--compiled-d-model", type=int, default=TRANSFORMER["d_model"])
    ap.add_argument("--compiled-batch", type=int, default=TRANSFORMER["batch"])
    ap.add_argument("--compiled-seq", type=int, default=TRANSFORMER["seq"])
    ap.add_argument("--compiled-steps", type=int, default=3)
    ap.add_argument("--compiled-variants", default=",".join(COMPILED_VARIANTS))
    ap.add_argument(
        "--compile-time",
        type=int,
        metavar="N",
        help="with --compiled: instead of step times, N rounds of cold first compiles "
        "(a fresh child and inductor cache per variant and round)",
    )
    ap.add_argument(
        "--compile-profile", help="with --compile-time: write cProfiles of one round here"
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("cfg", nargs="?", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child:
        from overhead_children import CHILDREN

        send_result(CHILDREN[args.child](json.loads(args.cfg)))
        return
    run_child = Runner(args.as_script)
    if args.compiled:
        run_compiled(args, run_child)
    elif args.rnn:
        run_rnn(args, run_child)
    elif args.breakdown:
        run_breakdown(args, run_child)
    elif args.breakdown_native:
        run_native_breakdown(args, run_child)
    else:
        run_all(args, run_child)


def run_breakdown(args: argparse.Namespace, run_child: Runner) -> None:
    """``--breakdown``: the MLP's cost ladder and profile."""
    steps = 10 if args.quick else 40
    cfg = {"rounds": args.rounds or (2 if args.quick else 11), "steps": steps, "warmup": 3}
    res = run_child("breakdown", cfg, timeout=1800)
    print_breakdown(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


def run_native_breakdown(args: argparse.Namespace, run_child: Runner) -> None:
    """``--breakdown-native``: the native recorder's per-op cost ladder, model by model."""
    out = {}
    for model in args.breakdown_native.split(","):
        small = model in ("micro", "mlp")
        cfg = {
            "model": model,
            "rounds": args.rounds or (2 if args.quick else 7),
            "steps": (10 if small else 3) if args.quick else (30 if small else 6),
            "warmup": 2,
        }
        out[model] = res = run_child("native-breakdown", cfg, timeout=1800)
        print(f"{source_state()}  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  {cfg}")
        print_native_breakdown(res)
        print()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


def run_all(args: argparse.Namespace, run_child: Runner) -> None:
    """The full run: timing of both models and frameworks, long runs, peak memory; the report."""
    quick = args.quick
    mlp_rounds = args.rounds or (2 if quick else 7)
    mlp_steps = 10 if quick else 40
    tr_rounds = args.transformer_rounds or (1 if quick else 3)
    tr_batch = 8 if quick else TRANSFORMER["batch"]
    mem_steps = 5 if quick else 20
    steady_steps = 150 if quick else 600
    started = time.time()
    load0 = os.getloadavg()
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
            "steady_steps": steady_steps,
            "steady_rounds": args.steady_rounds,
        },
    }
    no_full_tensor = [v for v in TORCH_VARIANTS if v != "FULL_TENSOR"]

    def log(msg: str) -> None:
        print(f"[{time.time() - started:6.0f}s] {msg}", file=sys.stderr, flush=True)

    def timing(
        kind: str, variants: list[str], rounds: int, steps: int, warmup: int, **cfg: Any
    ) -> Any:
        cfg.update(variants=variants, rounds=rounds, steps=steps, warmup=warmup)
        return run_child(kind, cfg, timeout=1800 if cfg.get("model") == "transformer" else 900)

    torch_variants = TORCH_VARIANTS
    if args.variants:
        asked = set(args.variants.split(","))
        known = TORCH_VARIANTS + ON_REQUEST
        unknown = asked - set(known)
        if unknown:
            sys.exit(f"unknown variants {sorted(unknown)}; choose from {known}")
        torch_variants = [v for v in known if v == "plain" or v in asked]
        no_full_tensor = [v for v in torch_variants if not v.endswith("FULL_TENSOR")]
    log("PyTorch MLP timing")
    results["mlp"] = timing("torch-time", torch_variants, mlp_rounds, mlp_steps, 3, model="mlp")
    if not args.skip_tf:
        log("TensorFlow MLP timing")
        results["tf_mlp"] = timing("tf-time", TF_VARIANTS, mlp_rounds, mlp_steps, 3)
    if not args.skip_transformer:
        log("PyTorch Transformer timing")
        results["transformer"] = timing(
            "torch-time", no_full_tensor, tr_rounds, 1, 1, model="transformer", batch=tr_batch
        )
    if not args.skip_steady:
        log("PyTorch MLP, long runs")
        steady = STEADY_VARIANTS
        if args.steady_variants:
            asked = set(args.steady_variants.split(","))
            steady = [v for v in STEADY_VARIANTS if v == "plain" or v in asked]
        results["steady"] = timing(
            "torch-time", steady, args.steady_rounds, steady_steps, 20, model="mlp"
        )
    mem: dict[str, dict[str, Any]] = {"mlp": {}, "tf_mlp": {}, "transformer": {}}
    if not args.skip_memory:
        log("peak memory")
        for v in torch_variants:
            cfg = {"model": "mlp", "variant": v, "steps": mem_steps}
            mem["mlp"][v] = run_child("torch-mem", cfg)
        for v in [] if args.skip_tf else TF_VARIANTS:
            mem["tf_mlp"][v] = run_child("tf-mem", {"variant": v, "steps": mem_steps})
        for v in [] if args.skip_transformer else no_full_tensor:
            cfg = {"model": "transformer", "batch": tr_batch, "variant": v, "steps": 2}
            mem["transformer"][v] = run_child("torch-mem", cfg)
    results["memory"] = mem
    results["loadavg_start"] = load0
    results["loadavg_end"] = os.getloadavg()
    results["seconds"] = time.time() - started
    log("done")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print("\n".join(report(results)))


def run_rnn(args: argparse.Namespace, run_child: Runner) -> None:
    """``--rnn``: the word_language_model-shaped models, plain vs the variants, side by side."""
    rounds = args.rounds or (2 if args.quick else 5)
    steps = 3 if args.quick else 8
    variants = ["plain", *[v for v in args.rnn_variants.split(",") if v != "plain"]]
    unknown = set(variants) - set(TORCH_VARIANTS)
    if unknown:
        sys.exit(f"unknown variants {sorted(unknown)}; choose from {TORCH_VARIANTS}")
    results: dict[str, Any] = {}
    started = time.time()
    for model in args.rnn_models.split(","):
        cfg = {"model": model, "variants": variants, "rounds": rounds, "steps": steps, "warmup": 2}
        results[model] = run_child("torch-time", cfg, timeout=1800)
    c = RNN_LM
    print(
        f"Word-level language models (embedding {c['emsize']}, {c['layers']} layers of "
        f"{c['hidden']}, vocabulary {c['vocab']}, batch {c['batch']}, bptt {c['bptt']}, "
        f"dropout {c['dropout']}, SGD lr {c['lr']}, clipping {c['clip']}): {rounds} rounds x "
        f"{steps} steps after 2 warm-up steps ({time.time() - started:.0f} s)"
    )
    print(f"{source_state()}  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    head = ["model", "variant", "ops/step", "step ms (median)", "wall ratio (min-max)", "CPU ratio"]
    print("\n".join(table_head(head, numeric=False)))
    for model, res in results.items():
        ops = next((r["ops_per_step"] for r in res.values() if r["ops_per_step"]), None)
        for v in variants:
            r = res[v]
            spread = (
                "" if v == "plain" else f" ({r['ratio_wall_min']:.2f}-{r['ratio_wall_max']:.2f})"
            )
            print(
                f"| {model} | {v} | {'' if ops is None else f'{ops:.0f}'} | {r['step_ms']:.1f} "
                f"| {r['ratio_wall']:.2f}x{spread} | {r['ratio_cpu']:.2f}x |"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def run_compiled(args: argparse.Namespace, run_child: Runner) -> None:
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
    if args.compile_time:
        run_compile_time(args, cfg, run_child)
        return
    res = run_child("torch-compiled-time", cfg, timeout=3600)
    print(f"torch.compile Transformer: {cfg}  ({time.time() - started:.0f} s)")
    print(f"{source_state()}  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print("\n".join(table_head(["variant", "step ms", "wall ratio (min-max)", "CPU ratio"])))
    for v in cfg["variants"]:
        r = res[v]
        print(
            f"| {v} | {r['step_ms']:.1f} | {r['ratio_wall']:.2f} "
            f"({r['ratio_wall_min']:.2f}-{r['ratio_wall_max']:.2f}) | {r['ratio_cpu']:.2f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"compiled": res, "cfg": cfg}, indent=1))


def run_compile_time(args: argparse.Namespace, cfg: dict[str, Any], run_child: Runner) -> None:
    """``--compiled --compile-time N``: cold first-compile times, variants interleaved."""
    import random
    import statistics

    started = time.time()
    times: dict[str, list[float]] = {v: [] for v in cfg["variants"]}
    profiles: dict[str, str] = {}
    for r in range(args.compile_time):
        order = list(cfg["variants"])
        random.Random(2000 + r).shuffle(order)
        for v in order:
            profile = bool(args.compile_profile) and r == 0
            res = run_child("torch-compile-cold", {**cfg, "variant": v, "profile": profile})
            times[v].append(res["compile_s"])
            if profile:
                profiles[v] = res["profile"]
            print(f"[compile] round {r + 1} {v}: {res['compile_s']:.1f} s", file=sys.stderr)
    shape = {k: cfg[k] for k in ("layers", "d_model", "batch", "seq")}
    print(f"torch.compile cold first compile: {shape}  ({time.time() - started:.0f} s)")
    print(f"{source_state()}  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print("\n".join(table_head(["variant", "compile s (median)", "all rounds s", "ratio"])))
    plain = statistics.median(times["plain"]) if times.get("plain") else None
    for v, ts in times.items():
        med = statistics.median(ts)
        ratio = f"{med / plain:.2f}" if plain else "-"
        print(f"| {v} | {med:.1f} | {', '.join(f'{t:.1f}' for t in ts)} | {ratio} |")
    if args.compile_profile:
        Path(args.compile_profile).write_text(
            "\n".join(f"=== {v}\n{text}" for v, text in profiles.items())
        )


if __name__ == "__main__":
    main()
