"""The seed's bug in eager TensorFlow: softmax underflows to 0 and log(0) = -inf."""
# EXPECT origin.kind=execution origin.op_type=Log origin_kind=born
# EXPECT origin.explanation~="log of zero"
# EXPECT first_nan.op_type=Mul

import tensorflow as tf

logits = tf.constant([[200.0, 0.0, -5.0], [1.0, 2.0, 3.0]])
labels = tf.constant([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
probs = tf.nn.softmax(logits)
log_probs = tf.math.log(probs)  # <- origin first_inf
loss = tf.reduce_mean(-(labels * log_probs))  # <- first_nan
print(float(loss))
