"""Born in backward, inside a tf.function: the gradient of sqrt at 0 is +inf."""
# EXPECT origin.kind=graph_execution_trace origin_kind=born origin.counts.pos_inf=1
# EXPECT origin.op_type=SqrtGrad origin.op_name~=gradient_tape/

import tensorflow as tf

w = tf.Variable([4.0, 0.0, 9.0])


@tf.function  # type: ignore[untyped-decorator]  # TensorFlow is untyped
def grad() -> tf.Tensor:
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.sqrt(w))
    return tape.gradient(loss, w)  # <- origin first_inf


print(grad().numpy())
