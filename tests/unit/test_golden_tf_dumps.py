"""nanscope's reader on dumps written by TensorFlow itself.

``tests/data/tf_dumps.tar.xz`` holds dumps made by TensorFlow 2.21's own
``enable_dump_debug_info`` (every mode, eager and tf.function, circular and
not) and ``expected.json``, what TensorFlow's ``DebugDataReader`` read from
them; both come from ``tests/data/make_tf_dumps.py``. Our reader must agree
on every count and value. This test needs no TensorFlow.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import nanscope
from nanscope.reader import EXECUTIONS, TRACES

from ..helpers import TF_DUMP_NAMES, extract_tf_dumps


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = extract_tf_dumps(tmp_path_factory.mktemp("tf_dumps"))
    return root, json.loads((root / "expected.json").read_text())


def as_floats(values: list[Any] | None) -> list[float] | None:
    if values is None:
        return None
    return [float(v) for v in values]  # float() also parses "nan", "inf", "-inf"


def same(a: list[float] | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return len(a) == len(b) and all(
        (math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b.tolist(), strict=True)
    )


@pytest.mark.parametrize("name", TF_DUMP_NAMES)
def test_counts_and_run_facts(golden: tuple[Path, dict[str, Any]], name: str) -> None:
    root, expected = golden
    exp = expected[name]
    with nanscope.open_dump(root / name) as r:
        if exp["circular_buffer_size"] > 0:
            # TensorFlow's circular buffer let go of the first traces (20 of 42 kept): the
            # reader tells it from the calls whose traces are missing, as incomplete.
            (lost,) = r.problems
            assert lost.incomplete and "were not kept" in lost.message, lost
            assert lost.file is not None and lost.file.endswith(".graph_execution_traces")
        else:
            assert r.problems == []
        assert r.num_executions() == exp["num_executions"]
        assert r.num_graph_execution_traces() == exp["num_graph_execution_traces"]
        assert r.run_id == exp["tfdbg_run_id"]
        (proc,) = r.processes
        assert proc.tensorflow_version == exp["tensorflow_version"]
        assert proc.framework == f"tensorflow {exp['tensorflow_version']}"
        assert len(r.source_files()) == exp["num_source_files"]
        assert r.devices() == {int(k): v for k, v in exp["devices"].items()}
        graphs = r.graphs()
        assert {g["graph_id"] for g in exp["graphs"]} <= set(graphs)
        for g in exp["graphs"]:
            info = graphs[g["graph_id"]]
            assert info.name == (g["name"] or "") and info.outer_graph_id == (
                g["outer_graph_id"] or ""
            )


@pytest.mark.parametrize("name", TF_DUMP_NAMES)
def test_every_execution_agrees(golden: tuple[Path, dict[str, Any]], name: str) -> None:
    root, expected = golden
    with nanscope.open_dump(root / name) as r:
        for i, exp in enumerate(expected[name]["executions"]):
            ex = r.execution(i)
            assert ex.op_type == exp["op_type"]
            assert ex.graph_id == exp["graph_id"]
            assert list(ex.input_tensor_ids) == (exp["input_tensor_ids"] or [])
            assert list(ex.output_tensor_ids) == (exp["output_tensor_ids"] or [])
            assert list(ex.output_tensor_device_ids) == (exp["output_tensor_device_ids"] or [])
            assert ex.tensor_debug_mode == exp["tensor_debug_mode"]
            if exp["debug_tensor_values"] is None:
                # None in NO_TENSOR/FULL_TENSOR; an output-less record in the
                # other modes gives an empty tuple.
                assert not ex.debug_tensor_values
            else:
                assert ex.debug_tensor_values is not None
                assert len(ex.debug_tensor_values) == len(exp["debug_tensor_values"])
                for ours, theirs in zip(
                    ex.debug_tensor_values, exp["debug_tensor_values"], strict=True
                ):
                    assert same(as_floats(theirs), ours)
            if "tensor_values" in exp:
                assert ex.tensor_values is not None
                values = [v for v in ex.tensor_values if v is not None]
                assert len(values) == len(exp["tensor_values"])
                for ours_v, theirs_v in zip(values, exp["tensor_values"], strict=True):
                    if theirs_v is None:
                        continue
                    assert list(ours_v.shape) == theirs_v["shape"]
                    assert str(ours_v.dtype) == theirs_v["dtype"]
                    flat = np.asarray(ours_v, dtype=np.float64).reshape(-1)
                    assert same(as_floats(list(np.ravel(theirs_v["values"]))), flat)
            stack = [[f.file_path, f.lineno, f.function] for f in r.stack(ex)]
            assert stack == exp["stack"]


@pytest.mark.parametrize("name", TF_DUMP_NAMES)
def test_every_trace_agrees(golden: tuple[Path, dict[str, Any]], name: str) -> None:
    root, expected = golden
    with nanscope.open_dump(root / name) as r:
        op_types = r.trace_op_types()
        for i, exp in enumerate(expected[name]["graph_execution_traces"]):
            tr = r.trace(i)
            assert (tr.op_name, tr.op_type, tr.output_slot) == (
                exp["op_name"],
                exp["op_type"],
                exp["output_slot"],
            )
            assert r.string(int(op_types[i])) == exp["op_type"]
            assert tr.graph_id == exp["graph_id"] and list(tr.graph_ids) == exp["graph_ids"]
            assert tr.tensor_debug_mode == exp["tensor_debug_mode"]
            assert tr.device_name == exp["device_name"]
            assert same(as_floats(exp["debug_tensor_value"]), tr.debug_tensor_value)
            if exp.get("tensor_value"):
                assert tr.tensor_value is not None
                assert list(tr.tensor_value.shape) == exp["tensor_value"]["shape"]


@pytest.mark.parametrize("name", TF_DUMP_NAMES)
def test_first_nonfinite_agrees(golden: tuple[Path, dict[str, Any]], name: str) -> None:
    root, expected = golden
    exp = expected[name]
    with nanscope.open_dump(root / name) as r:
        for kind, key in (
            (TRACES, "first_nonfinite_trace_index"),
            (EXECUTIONS, "first_nonfinite_execution_index"),
        ):
            ref = r.first_nonfinite(kind)
            if exp[key] is None:
                # NO_TENSOR/SHAPE carry no health; FULL_TENSOR is judged from the values.
                if ref is not None:
                    assert exp["tensor_debug_mode_name"] == "FULL_TENSOR"
            else:
                assert ref is not None and ref.index == exp[key]


def test_seed_bug_located_in_tensorflow_dump(golden: tuple[Path, dict[str, Any]]) -> None:
    """The tutorial's walk: the first bad trace is ``Log``, fed by the softmax, at the log line."""
    root, expected = golden
    origin = expected["FULL_HEALTH"]["log_origin"]
    with nanscope.open_dump(root / "FULL_HEALTH") as r:
        ref = r.first_nonfinite(TRACES)
        assert ref is not None and ref.index == origin["trace_index"]
        tr = r.trace(ref.index)
        assert tr.op_type == "Log" and tr.health.neg_inf and tr.health.zero
        op = r.graph_op(tr.graph_id, tr.op_name)
        assert op is not None and list(op.input_names) == origin["input_names"]
        user = [f for f in r.stack(op) if f.file_path.endswith("tf_program.py")][-1]
        assert (Path(user.file_path).name, user.lineno, user.function) == (
            origin["file"],
            origin["lineno"],
            origin["func"],
        )
        lines = r.source_lines(user.file_index)
        assert lines[user.lineno - 1].strip() == origin["source_line"]
        # Its input, the softmax output, is the trace just before with exact zeros.
        producer, _ = op.inputs[0]
        earlier = [t for t in r.traces(0, ref.index) if t.op_name == producer]
        assert earlier and earlier[-1].health.zero and not earlier[-1].health.any_nonfinite
