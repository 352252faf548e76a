"""keras-io's "Customizing what happens in fit()": a ``Model.train_step`` override with a
hand-written cross-entropy, trained by ``Model.fit`` on generated data.

    python tf_fit_custom_train_step.py                       # SGD at 0.01: trains
    python tf_fit_custom_train_step.py --learning-rate 50    # far too fast: NaN

The loss is ``-mean(sum(y * log(softmax(logits))))``. With a learning rate far too high the
logits spread by hundreds, the softmax of the wrong classes underflows to exactly 0, ``log``
makes -inf and ``0 * -inf`` makes NaN: the loss, the gradients and then the weights are NaN.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from tensorflow import keras


def cross_entropy(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    """-sum(y * log(p)) per sample, averaged: the textbook formula, with no clipping."""
    return -tf.reduce_mean(tf.reduce_sum(y_true * tf.math.log(y_pred), axis=-1))


class CustomModel(keras.Model):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def train_step(self, data: tuple[tf.Tensor, tf.Tensor]) -> dict[str, tf.Tensor]:
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)  # forward pass
            loss = cross_entropy(y, y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    @property
    def metrics(self) -> list[keras.metrics.Metric]:
        return [self.loss_tracker]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(args.seed)
    inputs = keras.Input(shape=(32,))
    hidden = keras.layers.Dense(32, activation="relu")(inputs)
    outputs = keras.layers.Dense(10, activation="softmax")(hidden)
    model = CustomModel(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=args.learning_rate))

    rng = np.random.default_rng(args.seed)
    n = args.steps * args.batch_size
    centers = rng.normal(0, 2, size=(10, 32))
    labels = rng.integers(0, 10, size=n)
    x = (centers[labels] + rng.normal(size=(n, 32))).astype("float32")
    y = np.eye(10, dtype="float32")[labels]
    history = model.fit(x, y, batch_size=args.batch_size, epochs=1, verbose=2)
    print(f"loss {history.history['loss'][-1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
