"""keras-io's "Writing a training loop from scratch" (TensorFlow): a ``tf.function`` train
step with ``tf.GradientTape`` and Adam, on generated 784-pixel digits.

    python tf_step_adam_from_scratch.py                          # Adam at 1e-3: trains
    python tf_step_adam_from_scratch.py --learning-rate 1e10     # far too fast: Inf, NaN

With a learning rate far too high the weights grow by about the learning rate at every
step, the logits and then the gradients with them, until Adam squares a gradient above
1.8e19 for its second moment: ``Square`` overflows float32.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from tensorflow import keras


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(args.seed)
    model = keras.Sequential(
        [
            keras.Input(shape=(784,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    optimizer = keras.optimizers.Adam(learning_rate=args.learning_rate)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    train_acc_metric = keras.metrics.SparseCategoricalAccuracy()

    rng = np.random.default_rng(args.seed)
    n = args.steps * args.batch_size
    prototypes = rng.uniform(0, 1, size=(10, 784))
    labels = rng.integers(0, 10, size=n)
    x_train = (prototypes[labels] + rng.normal(0, 0.2, size=(n, 784))).astype("float32")
    train_dataset = tf.data.Dataset.from_tensor_slices((x_train, labels)).batch(args.batch_size)

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss_value = loss_fn(y, logits)
        grads = tape.gradient(loss_value, model.trainable_weights)
        optimizer.apply(grads, model.trainable_weights)
        train_acc_metric.update_state(y, logits)
        return loss_value

    for step, (x_batch_train, y_batch_train) in enumerate(train_dataset):
        loss_value = train_step(x_batch_train, y_batch_train)
        print(f"Training loss (for 1 batch) at step {step}: {float(loss_value):.4f}", flush=True)
    print(f"Training acc over epoch: {float(train_acc_metric.result()):.4f}")


if __name__ == "__main__":
    main()
