"""TensorFlow: its own Debugger V2 dumping, which nanscope reads."""

from __future__ import annotations

from typing import Any


class TensorFlowDumpSession:
    framework = "tensorflow"

    def __init__(self, settings: Any, options: dict[str, Any]) -> None:
        import tensorflow as tf

        if options:
            raise ValueError(
                f"options {sorted(options)} apply to nanscope's writer, not TensorFlow's dumping"
            )
        self._tf = tf
        self.writer = tf.debugging.experimental.enable_dump_debug_info(
            settings.logdir,
            tensor_debug_mode=settings.mode.name,
            circular_buffer_size=settings.circular_buffer_size,
            op_regex=settings.op_regex,
            tensor_dtypes=settings.tensor_dtypes,
        )

    def flush(self) -> None:
        self.writer.FlushNonExecutionFiles()
        self.writer.FlushExecutionFiles()

    def close(self) -> None:
        self._tf.debugging.experimental.disable_dump_debug_info()


class TensorFlowCheckNumerics:
    framework = "tensorflow"

    def __init__(self) -> None:
        import tensorflow as tf

        self._tf = tf
        tf.debugging.enable_check_numerics()

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self._tf.debugging.disable_check_numerics()
