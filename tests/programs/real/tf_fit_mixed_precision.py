"""The TensorFlow mixed-precision guide's ``Model.fit`` under ``mixed_float16``, on generated
digits (784 pixels, 10 classes) instead of MNIST.

    python tf_fit_mixed_precision.py                     # pixels left in 0..255: the guide's
                                                         # x / 255 forgotten; healthy
    python tf_fit_mixed_precision.py --learning-rate 30  # RMSprop far too fast: diverges

Keras wraps the optimizer in a ``LossScaleOptimizer``: the loss is multiplied by a dynamic
scale (2**15 at first) so that small float16 gradients do not underflow. Where the scaled
float16 gradients overflow, the optimizer finds the Inf/NaN, skips the update and halves the
scale; training goes on. With a learning rate far too high the weights grow until the float16
forward pass overflows: the loss is Inf/NaN, and no scale can help.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers, mixed_precision


def make_digits(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Ten noisy prototype images, pixel values 0..255 like MNIST's."""
    rng = np.random.default_rng(seed)
    prototypes = rng.uniform(0, 255, size=(10, 784))
    labels = rng.integers(0, 10, size=n)
    images = np.clip(prototypes[labels] + rng.normal(0, 40, size=(n, 784)), 0, 255)
    return images.astype("float32"), labels.astype("int64")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="batches to train on")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--units", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=0.001)
    parser.add_argument("--normalize", action="store_true", help="divide the pixels by 255")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(args.seed)
    mixed_precision.set_global_policy("mixed_float16")

    inputs = keras.Input(shape=(784,), name="digits")
    x = layers.Dense(args.units, activation="relu", name="dense_1")(inputs)
    x = layers.Dense(args.units, activation="relu", name="dense_2")(x)
    x = layers.Dense(10, name="dense_logits")(x)
    # The softmax in float32, as the guide says: float16 would be numerically unstable.
    outputs = layers.Activation("softmax", dtype="float32", name="predictions")(x)
    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(
        loss="sparse_categorical_crossentropy",
        optimizer=keras.optimizers.RMSprop(learning_rate=args.learning_rate),
        metrics=["accuracy"],
    )

    x_train, y_train = make_digits(args.steps * args.batch_size, args.seed)
    if args.normalize:
        x_train = x_train / 255
    history = model.fit(x_train, y_train, batch_size=args.batch_size, epochs=1, verbose=2)

    optimizer = model.optimizer  # the LossScaleOptimizer that Keras put around RMSprop
    print(f"loss {history.history['loss'][-1]:.4f}", flush=True)
    print(
        f"train steps {args.steps}, updates applied {int(optimizer.iterations.numpy())}, "
        f"loss scale {float(optimizer.dynamic_scale.numpy()):g}",
        flush=True,
    )
    print("weights finite:", all(bool(tf.reduce_all(tf.math.is_finite(w))) for w in model.weights))


if __name__ == "__main__":
    main()
