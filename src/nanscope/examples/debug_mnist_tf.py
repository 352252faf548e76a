"""The Debugger V2 tutorial's example in TensorFlow, dumped by TensorFlow itself.

The same 784-500-10 MLP and hand-written cross-entropy as
:mod:`nanscope.examples.debug_mnist`, written the way the tutorial writes it
(``tf.function`` model and loss, Adam, ``GradientTape``). With ``--dump_dir``
TensorFlow's own ``enable_dump_debug_info`` writes the dump, which nanscope
reads like its own:

    python -m nanscope.examples.debug_mnist_tf --dump_dir /tmp/tf_logdir
    nanscope report /tmp/tf_logdir
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from nanscope.examples import data
from nanscope.examples.debug_mnist import INIT_STD, parse_args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv, __doc__.split("\n\n")[0])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    tf.random.set_seed(args.seed)
    x_train, y_train, x_test, y_test = data.load(args.data, seed=args.seed)
    if args.dump_dir:
        tf.debugging.experimental.enable_dump_debug_info(
            args.dump_dir,
            tensor_debug_mode=args.dump_tensor_debug_mode,
            circular_buffer_size=args.dump_circular_buffer_size,
        )
    if args.check_numerics:
        tf.debugging.enable_check_numerics()

    init = tf.keras.initializers.TruncatedNormal(stddev=INIT_STD, seed=args.seed)
    hidden_w = tf.Variable(init([784, 500]), name="hidden_weights")
    hidden_b = tf.Variable(tf.fill([500], 0.1), name="hidden_biases")
    out_w = tf.Variable(init([500, 10]), name="output_weights")
    out_b = tf.Variable(tf.fill([10], 0.1), name="output_biases")
    variables = [hidden_w, hidden_b, out_w, out_b]

    @tf.function
    def model(x: Any) -> Any:
        hidden = tf.nn.relu(tf.matmul(x, hidden_w) + hidden_b)
        logits = tf.matmul(hidden, out_w) + out_b
        return tf.nn.softmax(logits)

    @tf.function
    def loss(probs: Any, labels: Any) -> Any:
        if args.fix:
            probs = tf.clip_by_value(probs, 1e-6, 1.0)
        return tf.reduce_mean(-labels * tf.math.log(probs))  # -inf where a probability is 0

    optimizer = tf.optimizers.Adam(args.learning_rate)
    rng = np.random.default_rng(args.seed)
    test_x = tf.constant(x_test)
    for step in range(args.max_steps):
        idx = rng.choice(len(x_train), args.train_batch_size, replace=False)
        x = tf.constant(x_train[idx])
        labels = tf.one_hot(y_train[idx], 10)
        with tf.GradientTape() as tape:
            value = loss(model(x), labels)
        grads = tape.gradient(value, variables)
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        predictions = tf.argmax(model(test_x), axis=1).numpy()
        accuracy = float(np.mean(predictions == y_test))
        print(f"Accuracy at step {step}: {accuracy:.3f}")
    if args.dump_dir:
        tf.debugging.experimental.disable_dump_debug_info()
    return 0


if __name__ == "__main__":
    sys.exit(main())
