"""NaN already in the input batch, in eager TensorFlow: it entered through tf.constant."""
# EXPECT origin.kind=execution origin.op_type=MatMul origin_kind=unknown

import numpy as np
import tensorflow as tf

batch = np.array([[0.5, 1.0], [np.nan, 2.0]], dtype=np.float32)
x = tf.constant(batch)
w = tf.constant([[1.0, 2.0], [3.0, 4.0]])
y = tf.matmul(x, w)  # <- origin first_nan
print(y.numpy())
