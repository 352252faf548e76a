"""keras-io's "Writing a training loop from scratch" (TensorFlow): ``tf.function`` train and
test steps with ``tf.GradientTape`` and Adam, on generated digits, validated every epoch.

    python tf_loop_from_scratch.py                                   # Adam at 1e-3: trains
    python tf_loop_from_scratch.py --learning-rate 1e9 --warmup-steps 16
                                              # warms up to far too fast a rate: Inf, then NaN

With the learning rate far too high the weights grow by about the learning rate every
step, the logits and the gradients with them, until Adam squares a gradient above 1.8e19
for its second moment (``Square`` overflows float32) or a matmul overflows. The warmup
(a cosine schedule's, as people use) brings the rate there a few steps into training.

``STEP <n>`` is printed before each training step (counted from 0 over the epochs).
``--dump-dir`` records with TensorFlow's own ``enable_dump_debug_info`` (FULL_HEALTH,
keeping ``--dump-buffer`` events, -1: all), ``--check-numerics`` turns on
``tf.debugging.enable_check_numerics()``, as a user would add either to the script.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf


def get_model() -> keras.Model:
    inputs = keras.Input(shape=(784,), name="digits")
    x1 = keras.layers.Dense(64, activation="relu")(inputs)
    x2 = keras.layers.Dense(64, activation="relu")(x1)
    outputs = keras.layers.Dense(10, name="predictions")(x2)
    return keras.Model(inputs=inputs, outputs=outputs)


def make_digits(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Ten prototype "digits" of 784 pixels, each sample one of them plus noise."""
    prototypes = rng.uniform(0, 1, size=(10, 784))
    labels = rng.integers(0, 10, size=n)
    x = np.clip(prototypes[labels] + rng.normal(0, 0.2, size=(n, 784)), 0, 1)
    return x.astype("float32"), labels


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--warmup-steps", type=int, default=0)
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
    x_train, y_train = make_digits(512, rng)
    x_val, y_val = x_train[-128:], y_train[-128:]
    x_train, y_train = x_train[:-128], y_train[:-128]
    train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
    train_dataset = train_dataset.shuffle(buffer_size=1024, seed=0).batch(args.batch_size)
    val_dataset = tf.data.Dataset.from_tensor_slices((x_val, y_val)).batch(args.batch_size)

    model = get_model()
    learning_rate: float | keras.optimizers.schedules.LearningRateSchedule = args.learning_rate
    if args.warmup_steps:
        learning_rate = keras.optimizers.schedules.CosineDecay(
            initial_learning_rate=0.0,
            decay_steps=1000,
            warmup_target=args.learning_rate,
            warmup_steps=args.warmup_steps,
        )
    optimizer = keras.optimizers.Adam(learning_rate=learning_rate)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    train_acc_metric = keras.metrics.SparseCategoricalAccuracy()
    val_acc_metric = keras.metrics.SparseCategoricalAccuracy()

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss_value = loss_fn(y, logits)
        grads = tape.gradient(loss_value, model.trainable_weights)
        optimizer.apply(grads, model.trainable_weights)
        train_acc_metric.update_state(y, logits)
        return loss_value

    @tf.function
    def test_step(x, y):
        val_logits = model(x, training=False)
        val_acc_metric.update_state(y, val_logits)

    global_step = 0
    for epoch in range(args.epochs):
        for step, (x_batch_train, y_batch_train) in enumerate(train_dataset):
            print(f"STEP {global_step}", flush=True)
            loss_value = train_step(x_batch_train, y_batch_train)
            global_step += 1
            if step % 4 == 0:
                print(f"epoch {epoch} step {step}: loss {float(loss_value):.4g}", flush=True)
        print(f"training acc over epoch: {float(train_acc_metric.result()):.4f}", flush=True)
        train_acc_metric.reset_state()
        for x_batch_val, y_batch_val in val_dataset:
            test_step(x_batch_val, y_batch_val)
        print(f"validation acc: {float(val_acc_metric.result()):.4f}", flush=True)
        val_acc_metric.reset_state()
    if args.dump_dir:
        tf.debugging.experimental.disable_dump_debug_info()


if __name__ == "__main__":
    main()
