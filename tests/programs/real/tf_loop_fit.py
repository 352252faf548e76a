"""A Keras regression trained with ``Model.fit`` and plain SGD, validated every epoch.

    python tf_loop_fit.py                    # SGD at 0.05: trains
    python tf_loop_fit.py --learning-rate 1  # too fast for the data: the error grows every
                                             # step until the squared error overflows float32

Above the largest stable learning rate (2 over the largest eigenvalue of the inputs'
second moment) gradient descent overshoots further each step: the predictions grow
geometrically, and after a couple of dozen steps the mean squared error's ``Sum`` passes
float32's largest value (+inf), then the gradients turn -inf/+inf and NaN.

``STEP <n>`` is printed before each training step (a callback counting from 0 over the
epochs; with ``--steps-per-execution`` it is called once per execution). ``--dump-dir``,
``--dump-buffer`` and ``--check-numerics`` as in ``tf_loop_from_scratch.py``.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf


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
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--steps-per-execution", type=int, default=1)
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
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(256, 1))).astype("float32")

    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=args.learning_rate),
        loss="mse",
        steps_per_execution=args.steps_per_execution,
    )
    model.fit(x, y, batch_size=32, epochs=args.epochs, validation_split=0.25, verbose=2,
              callbacks=[PrintStep()])  # fmt: skip
    if args.dump_dir:
        tf.debugging.experimental.disable_dump_debug_info()


if __name__ == "__main__":
    main()
