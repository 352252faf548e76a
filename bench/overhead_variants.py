"""The variants bench/overhead_torch.py compares, and the switches that turn each on and off."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

MODES = ["NO_TENSOR", "CURT_HEALTH", "CONCISE_HEALTH", "FULL_HEALTH", "SHAPE", "FULL_TENSOR"]
# "python:MODE": the same mode with the Python dispatch-mode recorder, the
# fallback where the native recorder cannot be built.
PYTHON_RECORDER = ["python:NO_TENSOR", "python:FULL_HEALTH"]
# FULL_HEALTH without the headroom ranges (NANSCOPE_HEADROOM=0): what the ranges cost.
NO_RANGES = "FULL_HEALTH:noranges"
# The Python dispatch-mode check_numerics, the fallback without a compiler.
PYTHON_CHECK = "python:check_numerics"
# FULL_TENSOR with the Python recorder: asked for by name only (--variants), never on the
# Transformer (see overhead_torch.py).
PYTHON_FULL_TENSOR = "python:FULL_TENSOR"
TORCH_VARIANTS = [
    "plain",
    *MODES,
    NO_RANGES,
    *PYTHON_RECORDER,
    "check_numerics",
    PYTHON_CHECK,
    "detect_anomaly",
]
ON_REQUEST = [PYTHON_FULL_TENSOR]
TF_VARIANTS = ["plain", *MODES, "check_numerics"]
# FULL_HEALTH with the summaries' counts reduced inside the compiled graph on CPU too, as
# before nanscope_graph::counts (nanscope.backends.torch.compiled.rewrite.USE_NATIVE_COUNTS).
IN_GRAPH = "FULL_HEALTH:ingraph"
COMPILED_VARIANTS = ["plain", *MODES, IN_GRAPH]
STEADY_VARIANTS = ["plain", "NO_TENSOR", "FULL_HEALTH", *PYTHON_RECORDER]
RNN_VARIANTS = ["plain", "NO_TENSOR", "FULL_HEALTH", "check_numerics"]


class TorchVariant:
    """Switches one PyTorch variant on and off (a fresh nanscope session each time)."""

    def __init__(self, torch: Any, name: str, logdir: Path) -> None:
        self.torch = torch
        self.name = name
        self.logdir = logdir
        self.session: Any = None
        self.anomaly: Any = None
        self.executions = 0

    def __enter__(self) -> TorchVariant:
        import nanscope

        if self.name in MODES:
            self.session = nanscope.enable_dump_debug_info(
                self.logdir, tensor_debug_mode=self.name, circular_buffer_size=1000
            )
        elif self.name in PYTHON_RECORDER or self.name == PYTHON_FULL_TENSOR:
            os.environ["NANSCOPE_TORCH_RECORDER"] = "python"
            try:
                self.session = nanscope.enable_dump_debug_info(
                    self.logdir,
                    tensor_debug_mode=self.name.split(":")[1],
                    circular_buffer_size=1000,
                )
            finally:
                del os.environ["NANSCOPE_TORCH_RECORDER"]
        elif self.name == NO_RANGES:
            os.environ["NANSCOPE_HEADROOM"] = "0"
            try:
                self.session = nanscope.enable_dump_debug_info(
                    self.logdir, tensor_debug_mode="FULL_HEALTH", circular_buffer_size=1000
                )
            finally:
                del os.environ["NANSCOPE_HEADROOM"]
        elif self.name == IN_GRAPH:
            from nanscope.backends.torch.compiled import rewrite

            rewrite.USE_NATIVE_COUNTS = False
            self.session = nanscope.enable_dump_debug_info(
                self.logdir, tensor_debug_mode="FULL_HEALTH", circular_buffer_size=1000
            )
        elif self.name == "check_numerics":
            nanscope.enable_check_numerics()
        elif self.name == PYTHON_CHECK:
            os.environ["NANSCOPE_TORCH_RECORDER"] = "python"
            try:
                nanscope.enable_check_numerics()
            finally:
                del os.environ["NANSCOPE_TORCH_RECORDER"]
        elif self.name == "detect_anomaly":
            self.anomaly = self.torch.autograd.detect_anomaly()
            self.anomaly.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        import nanscope

        if self.session is not None:
            self.session.close()
            self.executions = self.session.writer.stats.executions
            self.session = None
            if self.name == IN_GRAPH:
                from nanscope.backends.torch.compiled import rewrite

                rewrite.USE_NATIVE_COUNTS = True
        elif self.name in ("check_numerics", PYTHON_CHECK):
            nanscope.disable_check_numerics()
        elif self.anomaly is not None:
            self.anomaly.__exit__(None, None, None)
            self.anomaly = None


class TFVariant:
    """Switches one TensorFlow variant (its Debugger V2 dump, or check_numerics) on and off."""

    def __init__(self, tf: Any, name: str, logdir: Path) -> None:
        self.tf = tf
        self.name = name
        self.logdir = logdir

    def __enter__(self) -> TFVariant:
        if self.name in MODES:
            self.tf.debugging.experimental.enable_dump_debug_info(
                str(self.logdir), tensor_debug_mode=self.name, circular_buffer_size=1000
            )
        elif self.name == "check_numerics":
            self.tf.debugging.enable_check_numerics()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.name in MODES:
            self.tf.debugging.experimental.disable_dump_debug_info()
        elif self.name == "check_numerics":
            self.tf.debugging.disable_check_numerics()
