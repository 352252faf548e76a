"""The TensorFlow mixed-precision guide's custom training loop: a ``tf.function`` train step
with a ``LossScaleOptimizer``, on a small ConvNet and generated 28x28 images.

    python tf_step_loss_scale.py                       # healthy: overflows, skipped, go on
    python tf_step_loss_scale.py --learning-rate 10    # Adam far too fast: diverges

The loss is scaled before the gradients are taken (``optimizer.scale_loss``) and
``optimizer.apply`` unscales them, or skips the update and halves the scale when one of the
float16 gradients overflowed. The images' pixels are left in 0..255, so the first steps
overflow at the default scale of 2**15.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers, mixed_precision


def make_images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Ten noisy prototype images, 28x28x1, pixel values 0..255."""
    rng = np.random.default_rng(seed)
    prototypes = rng.uniform(0, 255, size=(10, 28, 28, 1))
    labels = rng.integers(0, 10, size=n)
    images = np.clip(prototypes[labels] + rng.normal(0, 40, size=(n, 28, 28, 1)), 0, 255)
    return images.astype("float32"), labels.astype("int64")


def build_model() -> keras.Model:
    inputs = keras.Input(shape=(28, 28, 1))
    x = layers.Conv2D(8, 3, activation="relu")(inputs)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(16, 3, activation="relu")(x)
    x = layers.Flatten()(x)
    x = layers.Dense(10)(x)
    outputs = layers.Activation("softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(args.seed)
    mixed_precision.set_global_policy("mixed_float16")
    model = build_model()
    optimizer = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(learning_rate=args.learning_rate)
    )
    loss_object = keras.losses.SparseCategoricalCrossentropy()

    x_all, y_all = make_images(args.steps * args.batch_size, args.seed)
    dataset = tf.data.Dataset.from_tensor_slices((x_all, y_all)).batch(args.batch_size)

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            predictions = model(x)
            loss = loss_object(y, predictions)
            scaled_loss = optimizer.scale_loss(loss)
        scaled_gradients = tape.gradient(scaled_loss, model.trainable_variables)
        optimizer.apply(scaled_gradients, model.trainable_variables)  # unscales, or skips
        return loss

    for step, (x, y) in enumerate(dataset):
        loss = train_step(x, y)
        print(f"step {step} loss {float(loss):.4f} scale {float(optimizer.dynamic_scale):g}")
    print(
        f"train steps {args.steps}, updates applied {int(optimizer.iterations.numpy())}, "
        f"loss scale {float(optimizer.dynamic_scale.numpy()):g}",
        flush=True,
    )


if __name__ == "__main__":
    main()
