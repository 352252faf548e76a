"""Tiny TensorFlow program that ``make_tf_dumps.py`` runs under tfdbg2 dumping.

It is a miniature of nanscope's seed example: a 16 -> 8 (relu) -> 3 MLP with
softmax and a hand-written cross entropy ``-reduce_mean(labels * log(probs))``,
trained for three plain-SGD steps with a huge learning rate.  Everything is
deterministic:

* step 0 has small, finite logits and a finite loss;
* the step-0 update (learning rate 100) pushes the logit spread of every row to
  hundreds, so in step 1 ``Softmax`` underflows to exactly 0.0, ``Log`` yields
  ``-inf`` and ``labels * log(probs)`` yields NaN (``0 * -inf``);
* the step-1 gradients are NaN, so step 2 runs on all-NaN weights.

Before training, a handful of eager-only ops run so that the dumps also cover
an eager ``Log`` of a tensor containing 0, int32 and bool ops, and float16 /
bfloat16 ops, with both multi-element and single-element outputs.

Usage (normally only via ``make_tf_dumps.py``)::

    python tf_program.py MODE DUMP_ROOT [--circular-buffer-size N] [--eager-only]

``--eager-only`` runs the loss function eagerly instead of as a
``tf.function``, so the dump has executions but no graph execution traces.
Keep this file small and free of heavy imports (no Keras): TensorFlow
snapshots the source of every file that appears in a recorded stack.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

SEED = 0
BATCH = 4
N_IN, N_HIDDEN, N_OUT = 16, 8, 3
LEARNING_RATE = 100.0
STEPS = 3

LossFn = Callable[[tf.Tensor, tf.Tensor, list[tf.Variable]], tf.Tensor]


def eager_ops() -> None:
    """A few eager-only ops covering several dtypes and an eager -inf."""
    x = tf.constant([1.0, 0.0, 2.0, 4.0])
    tf.math.log(x)  # contains -inf (log 0)
    ints = tf.constant([1, 2, 3], dtype=tf.int32)
    tf.math.multiply(ints, 2)  # int32 output
    tf.math.is_finite(x)  # bool output
    half = tf.cast(x, tf.float16)
    tf.math.multiply(half, tf.constant(3.0, dtype=tf.float16))  # float16
    brain = tf.cast(x, tf.bfloat16)
    tf.math.add(brain, tf.constant(1.0, dtype=tf.bfloat16))  # bfloat16
    # Single-element outputs: in FULL_TENSOR, TF stores these with the typed
    # TensorProto fields (int_val, half_val) rather than tensor_content.
    tf.math.reduce_sum(ints)  # int32 scalar
    tf.math.reduce_max(half)  # float16 scalar
    tf.math.reduce_max(brain)  # bfloat16 scalar


def cross_entropy(x: tf.Tensor, labels: tf.Tensor, params: list[tf.Variable]) -> tf.Tensor:
    """Forward pass and hand-written cross entropy of the MLP."""
    w1, b1, w2, b2 = params
    hidden = tf.nn.relu(tf.matmul(x, w1) + b1)
    logits = tf.matmul(hidden, w2) + b2
    probs = tf.nn.softmax(logits)
    log_probs = tf.math.log(probs)  # -inf once a probability underflows to 0
    return -tf.reduce_mean(labels * log_probs)


def make_data() -> tuple[tf.Tensor, tf.Tensor, list[tf.Variable]]:
    rng = np.random.RandomState(SEED)
    x = rng.randn(BATCH, N_IN).astype(np.float32)
    labels = np.eye(N_OUT, dtype=np.float32)[[0, 1, 2, 0]]
    w1 = (rng.randn(N_IN, N_HIDDEN) * 0.5).astype(np.float32)
    w2 = (rng.randn(N_HIDDEN, N_OUT) * 0.5).astype(np.float32)
    params = [
        tf.Variable(w1, name="w1"),
        tf.Variable(np.zeros(N_HIDDEN, np.float32), name="b1"),
        tf.Variable(w2, name="w2"),
        tf.Variable(np.zeros(N_OUT, np.float32), name="b2"),
    ]
    return tf.constant(x), tf.constant(labels), params


def train(loss_fn: LossFn) -> list[float]:
    x, labels, params = make_data()
    losses = []
    for _ in range(STEPS):
        with tf.GradientTape() as tape:
            loss = loss_fn(x, labels, params)
        grads = tape.gradient(loss, params)
        for param, grad in zip(params, grads, strict=True):
            param.assign_sub(LEARNING_RATE * grad)
        losses.append(float(loss.numpy()))
    return losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", help="tfdbg2 TensorDebugMode name, e.g. FULL_HEALTH")
    parser.add_argument("dump_root")
    parser.add_argument("--circular-buffer-size", type=int, default=-1)
    parser.add_argument("--eager-only", action="store_true")
    parser.add_argument(
        "--no-dump", action="store_true", help="run without dumping (to check the numerics)"
    )
    args = parser.parse_args(argv)

    tf.random.set_seed(SEED)
    if not args.no_dump:
        tf.debugging.experimental.enable_dump_debug_info(
            args.dump_root,
            tensor_debug_mode=args.mode,
            circular_buffer_size=args.circular_buffer_size,
        )
    try:
        eager_ops()
        loss_fn: LossFn = cross_entropy if args.eager_only else tf.function(cross_entropy)
        losses = train(loss_fn)
    finally:
        if not args.no_dump:
            tf.debugging.experimental.disable_dump_debug_info()
    print("losses:", losses)


if __name__ == "__main__":
    main()
