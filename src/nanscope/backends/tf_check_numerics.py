"""check_numerics for TensorFlow: raise when Inf/NaN do harm, not when a loss scaler handles them.

``tf.debugging.enable_check_numerics()`` raises at the first op whose output holds
Inf/NaN. Under ``mixed_float16`` that is the first float16 gradient that overflowed,
which Keras's ``LossScaleOptimizer`` was about to find and skip: a healthy run stops.
This checker is an op callback, as TensorFlow's is (``op_callbacks.add_op_callback``,
called as each op is created in a ``tf.function`` and after each eager op), but it
checks only where Inf/NaN do harm (docs/CHECK_NUMERICS.md, "TensorFlow"):

* the values an op writes into a variable (``AssignVariableOp``,
  ``AssignSubVariableOp``, ``ResourceApplyAdam``...): a parameter, an optimizer state
  or a metric (Keras's loss tracker: a loss that is Inf/NaN);
* the forward values that the backward pass reads (an op under the ``gradient_tape/``
  name scope reading an op's output from outside it): Inf/NaN made in the forward pass
  reach the loss and the gradients, and no loss scale can help.

Gradients that overflow in the backward pass are checked only where they are written:
the loss scaler's update runs in the branch of its ``cond`` that it takes when every
gradient is finite, so a skipped step writes nothing and raises nothing; the same
gradients applied without a scaler raise at the first write. In a graph the check is
TensorFlow's own pair of ops (a ``DebugNumericSummaryV2`` reduction and
``CheckNumericsV2``), which ``tf.function``'s automatic control dependencies run; the
error is TensorFlow's ``InvalidArgumentError`` with nanscope's message. Eager ops are
checked in Python and raise :class:`nanscope.NonFiniteError`.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from nanscope._paths import is_library_file
from nanscope.analysis._tf_graphs import is_backward_op, writes_variable
from nanscope.errors import NonFiniteError

# Ops whose outputs or inputs need no check: this checker's own, and what op callbacks
# cannot instrument (TensorFlow's OP_CALLBACK_SKIP_OPS).
_OWN = frozenset({"DebugNumericSummaryV2", "CheckNumericsV2", "CheckNumerics"})
_SKIP = frozenset(
    {
        "Enter",
        "Exit",
        "Identity",
        "If",
        "LoopCond",
        "Merge",
        "NextIteration",
        "StatelessIf",
        "StatefulPartitionedCall",
        "Switch",
        "While",
        "RemoteCall",
        "DestroyResourceOp",
        "Placeholder",
        "Const",
        "VarHandleOp",
    }
)
# Backward ops that read a forward tensor's shape, not its values (the gradient of an add
# reads its inputs' shapes): an intended -inf mask they read is no harm.
_SHAPE_ONLY = frozenset(
    {
        "Shape",
        "ShapeN",
        "Size",
        "Rank",
        "ZerosLike",
        "OnesLike",
        "BroadcastArgs",
        "BroadcastGradientArgs",
    }
)
# tfdbg2's REDUCE_INF_NAN_THREE_SLOTS: [-inf or 0, +inf or 0, nan or 0], one small tensor.
_REDUCE_INF_NAN_THREE_SLOTS = 8


class TensorFlowCheckNumerics:
    """``nanscope.enable_check_numerics()`` for TensorFlow (module docstring)."""

    framework = "tensorflow"

    def __init__(self) -> None:
        import tensorflow as tf
        from tensorflow.python.framework import op_callbacks

        self._tf = tf
        self._callbacks = op_callbacks
        self._busy = threading.local()  # creating our own check ops: no callback for them
        # Per graph: forward tensors already checked where the backward pass reads them.
        self._checked: dict[tuple[int, str], bool] = {}
        op_callbacks.add_op_callback(self.callback)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self._callbacks.remove_op_callback(self.callback)
        self._checked.clear()

    def callback(
        self,
        op_type: str,
        inputs: Any,
        attrs: Any,
        outputs: Any,
        op_name: str | None = None,
        graph: Any = None,
    ) -> None:
        """Called by TensorFlow after each eager op and as each graph op is created."""
        del attrs
        if isinstance(op_type, bytes):
            op_type = op_type.decode()
        if op_type in _OWN or op_type in _SKIP or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            if graph is not None:
                self._instrument(op_type, op_name or "", inputs, graph)
            else:
                self._check_eager(op_type, inputs)
        finally:
            self._busy.on = False
        return None  # the outputs stay as they are

    # -- graphs ----------------------------------------------------------------------------

    def _instrument(self, op_type: str, op_name: str, inputs: Any, graph: Any) -> None:
        """Add the checks that a graph op being created needs (module docstring)."""
        if writes_variable(op_type):
            op = graph.get_operation_by_name(op_name)
            for slot, value in enumerate(inputs):
                if slot == 0 or not value.dtype.is_floating:
                    continue  # input 0 is the variable itself
                self._check_tensor(
                    value,
                    graph,
                    f"{op_type} {op_name!r} wrote Inf/NaN into a variable (a parameter, an "
                    f"optimizer state or a metric): input {slot} "
                    f"({_produced_by(value)}) held Inf/NaN",
                    _user_line(op.traceback),
                    "parameter",
                )
            return
        if not is_backward_op(op_name) or op_type in _SHAPE_ONLY:
            return
        op = graph.get_operation_by_name(op_name)
        for value in inputs:
            producer = value.op
            if (
                not value.dtype.is_floating
                or producer.graph is not graph
                or is_backward_op(producer.name)
                or producer.type in ("Const", "VarHandleOp")
            ):
                continue
            key = (id(graph), value.name)
            if key in self._checked:
                continue
            self._checked[key] = True
            self._check_tensor(
                value,
                graph,
                f"{producer.type} {producer.name!r} (forward pass) made Inf/NaN that reach the "
                f"loss and the gradients: the backward op {op_type} {op_name!r} reads them; a "
                "loss scaler cannot help Inf/NaN made in the forward pass",
                _user_line(producer.traceback),
                "loss",
            )

    def _check_tensor(self, value: Any, graph: Any, what: str, where: str, reason: str) -> None:
        """TensorFlow's own check on a small summary of ``value``: raises in the graph when
        it runs (automatic control dependencies run every stateful op of a function)."""
        from tensorflow.python.ops import array_ops, gen_debug_ops

        with graph.as_default():
            summary = gen_debug_ops.debug_numeric_summary_v2(
                value, tensor_debug_mode=_REDUCE_INF_NAN_THREE_SLOTS
            )
            array_ops.check_numerics_v2(
                summary, f"\n\nnanscope check_numerics ({reason}): {what}\n  {where}\n"
            )

    # -- eager ops -------------------------------------------------------------------------

    def _check_eager(self, op_type: str, inputs: Any) -> None:
        """An eager op that wrote Inf/NaN into a variable raises :class:`NonFiniteError`."""
        if not writes_variable(op_type):
            return
        for slot, value in enumerate(inputs):
            if slot == 0 or not value.dtype.is_floating:
                continue
            array = np.asarray(value)
            if np.isfinite(array).all():
                continue
            counts = _counts(array)
            raise NonFiniteError(
                f"{op_type} wrote Inf/NaN into a variable (a parameter, an optimizer state or "
                f"a metric): input {slot} held {counts['neg_inf']} -inf, {counts['pos_inf']} "
                f"+inf, {counts['nan']} NaN of {counts['size']}",
                op_type=op_type,
                counts=counts,
                reason="parameter",
            )


def _counts(array: np.ndarray) -> dict[str, int]:
    values = array.astype(np.float64, copy=False).ravel()
    return {
        "neg_inf": int(np.isneginf(values).sum()),
        "pos_inf": int(np.isposinf(values).sum()),
        "nan": int(np.isnan(values).sum()),
        "size": int(values.size),
    }


def _produced_by(value: Any) -> str:
    return f"{value.op.type} {value.op.name!r}"


def _user_line(traceback: Any) -> str:
    """``at train.py:42 in train_step: loss = ...``: the innermost frame of the user's code
    in a graph op's creation stack (TensorFlow's and Keras's frames skipped)."""
    for frame in reversed(list(traceback or ())):
        filename, lineno, name, line = (
            frame[0],
            frame[1],
            frame[2],
            frame[3] if len(frame) > 3 else "",
        )
        if not is_library_file(filename):
            code = f": {line.strip()}" if line else ""
            return f"at {filename}:{lineno} in {name}{code}"
    return "(created in library code)"
