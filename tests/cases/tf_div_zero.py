"""x/0 inside a tf.function: a per-class mean divides by an empty class's count of 0."""
# EXPECT origin.kind=graph_execution_trace origin.op_type=RealDiv origin_kind=born
# EXPECT origin.explanation~="x/0" first_nan=null

import tensorflow as tf


@tf.function  # type: ignore[untyped-decorator]  # TensorFlow is untyped
def class_means(values: tf.Tensor, classes: tf.Tensor) -> tf.Tensor:
    totals = tf.math.unsorted_segment_sum(values, classes, num_segments=3) + 1.0
    counts = tf.math.unsorted_segment_sum(tf.ones_like(values), classes, num_segments=3)
    return totals / counts  # <- origin first_inf


print(class_means(tf.constant([1.0, 2.0, 3.0, 4.0]), tf.constant([0, 0, 2, 2])).numpy())
