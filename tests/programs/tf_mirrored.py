"""A tiny MirroredStrategy training step over two logical CPUs, dumped by TensorFlow itself.

``tf_mirrored.py LOGDIR``: TensorFlow's own ``enable_dump_debug_info``
(FULL_HEALTH) records one step of a one-weight linear model trained with a
hand-written cross entropy ``-mean(labels * log(pred))``. Each replica's half
of the batch holds a row whose prediction is exactly 0 (and whose label is 0),
so on both devices ``Log`` makes -inf (the line marked ``# <- origin``) and
``labels * log(pred)`` makes NaN (``0 * -inf``, the line marked
``# <- first_nan``); the gradients and the update are NaN. Prints the loss.
Keep this file free of heavy imports (no Keras): TensorFlow snapshots every
file in a recorded stack.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf


def main() -> None:
    logdir = sys.argv[1]
    (cpu,) = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )
    writer = tf.debugging.experimental.enable_dump_debug_info(
        logdir, tensor_debug_mode="FULL_HEALTH", circular_buffer_size=-1
    )
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        w = tf.Variable([[1.0], [-1.0]])
    # Rows 0 and 2 predict exactly 0; replica 0 gets rows 0-1, replica 1 rows 2-3.
    x = tf.constant([[1.0, 1.0], [3.0, 1.0], [2.0, 2.0], [4.0, 1.0]])
    labels = tf.constant([[0.0], [1.0], [0.0], [1.0]])
    dataset = tf.data.Dataset.from_tensor_slices((x, labels)).batch(4)
    (xs, ys) = next(iter(strategy.experimental_distribute_dataset(dataset)))

    def replica_step(x: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            pred = tf.matmul(x, w)
            log_pred = tf.math.log(pred)  # <- origin
            loss = -tf.reduce_mean(labels * log_pred)  # <- first_nan
        (grad,) = tape.gradient(loss, [w])
        ctx = tf.distribute.get_replica_context()
        grad = ctx.all_reduce(tf.distribute.ReduceOp.MEAN, grad)
        w.assign_sub(0.1 * grad)
        return loss

    @tf.function  # type: ignore[untyped-decorator]  # TensorFlow is untyped
    def train_step(x: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        losses = strategy.run(replica_step, args=(x, labels))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)

    print(float(train_step(xs, ys)))
    writer.FlushNonExecutionFiles()
    writer.FlushExecutionFiles()
    tf.debugging.experimental.disable_dump_debug_info()


if __name__ == "__main__":
    main()
