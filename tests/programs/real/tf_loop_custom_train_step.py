"""keras-io's "Customizing what happens in fit()": a ``Model.train_step`` override with a
loss tracker, here with the cross-entropy written by hand (the log of a softmax), trained
on generated data with ``Model.fit``.

    python tf_loop_custom_train_step.py                     # SGD at 0.5: trains
    python tf_loop_custom_train_step.py --learning-rate 4   # too fast: the logits spread
                                                            # until a softmax probability is 0

With a learning rate too high the logits of some rows grow apart until ``Softmax`` rounds a
probability to exactly 0: ``Log`` makes -inf, ``y * log(p)`` makes NaN where the label is
0, and the NaN gradients ruin the weights.

``STEP <n>`` is printed before each training step (a callback counting from 0 over the
epochs). ``--dump-dir``, ``--dump-buffer`` and ``--check-numerics`` as in
``tf_loop_from_scratch.py``.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf


class CustomModel(keras.Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            probs = tf.nn.softmax(self(x, training=True))
            # The cross-entropy as people write it by hand: -inf where a probability is 0.
            loss = -tf.reduce_mean(tf.reduce_sum(y * tf.math.log(probs), axis=-1))
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    @property
    def metrics(self):
        return [self.loss_tracker]


class PrintStep(keras.callbacks.Callback):
    """Prints the global step before each training batch: the program's own count."""

    def __init__(self) -> None:
        super().__init__()
        self.step = 0

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        print(f"STEP {self.step}", flush=True)
        self.step += 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--learning-rate", type=float, default=0.5)
    parser.add_argument("--dump-dir")
    parser.add_argument("--dump-buffer", type=int, default=-1)
    parser.add_argument("--check-numerics", action="store_true")
    args = parser.parse_args(argv)

    if args.dump_dir:
        tf.debugging.experimental.enable_dump_debug_info(
            args.dump_dir, tensor_debug_mode="FULL_HEALTH", circular_buffer_size=args.dump_buffer
        )
    if args.check_numerics:
        tf.debugging.enable_check_numerics()
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 16)).astype("float32")
    labels = np.argmax(x[:, :4] @ rng.normal(size=(4, 4)), axis=1)
    y = np.eye(4, dtype="float32")[labels]

    inputs = keras.Input(shape=(16,))
    hidden = keras.layers.Dense(32, activation="relu")(inputs)
    outputs = keras.layers.Dense(4)(hidden)
    model = CustomModel(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=args.learning_rate))
    model.fit(x, y, batch_size=32, epochs=args.epochs, verbose=2, callbacks=[PrintStep()])
    if args.dump_dir:
        tf.debugging.experimental.disable_dump_debug_info()


if __name__ == "__main__":
    main()
