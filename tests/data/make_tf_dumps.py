"""Make ``tests/data/tf_dumps.tar.xz``: golden tfdbg2 dumps written by TensorFlow.

nanscope reads and writes TensorFlow's Debugger V2 ("tfdbg2") dump format.  To
test interoperability against the real thing rather than against our own
understanding of it, this script has TensorFlow itself
(``tf.debugging.experimental.enable_dump_debug_info``) dump a tiny program
(``tf_program.py``, a miniature of the seed example: an MLP whose hand-written
cross entropy takes ``log`` of a softmax probability that underflows to 0, so
``Log`` yields -inf and the loss becomes NaN), and records what TensorFlow's own
reader (``DebugDataReader``) makes of each dump in ``expected.json``.

Dumps (one dump root per directory in the tarball):

* ``NO_TENSOR``, ``CURT_HEALTH``, ``CONCISE_HEALTH``, ``FULL_HEALTH``,
  ``SHAPE``, ``FULL_TENSOR``: eager ops plus a ``tf.function`` loss, no
  circular buffer (``circular_buffer_size=-1``);
* ``FULL_HEALTH_circular``: as ``FULL_HEALTH`` with ``circular_buffer_size=20``
  so that executions and graph execution traces are really evicted;
* ``FULL_HEALTH_eager_only``: as ``FULL_HEALTH`` without any ``tf.function``.

``expected.json`` (at the tarball root) maps each dump name to counts,
executions (with stacks), graph execution traces, graphs, devices, the first
non-finite execution / trace by the tfdbg2 summary layouts, and, for
``FULL_TENSOR``, the small tensor values.  For ``FULL_HEALTH`` it also has
``log_origin``: the first ``Log`` trace holding -inf, its inputs and the user
source line that created it.  Non-finite floats are encoded as the strings
``"nan"``, ``"inf"`` and ``"-inf"``.

Each dump is made in its own subprocess, because TensorFlow's dumping callback
is a per-process singleton.  The source-file snapshots TensorFlow takes (every
file in every recorded stack, TensorFlow's own included) are several MB per dump
but identical across dumps, so one ``xz -9e`` tarball keeps them small.  Tar
entries are sorted with zeroed mtime/uid/gid; the dump contents themselves
(wall times, graph UUIDs, host name, absolute paths) differ from run to run.

Usage::

    python tests/data/make_tf_dumps.py              # rebuild the tarball
    python tests/data/make_tf_dumps.py --keep DIR   # and leave the dumps in DIR

Needs TensorFlow (CPU is enough).
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import math
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROGRAM = HERE / "tf_program.py"
TARBALL = HERE / "tf_dumps.tar.xz"

CIRCULAR_BUFFER_SIZE = 20
# Tensors with at least this many elements get no values in expected.json.
MAX_VALUE_ELEMENTS = 1000

Json = Any


@dataclass(frozen=True)
class DumpSpec:
    name: str
    mode: str
    circular_buffer_size: int = -1
    eager_only: bool = False


DUMPS: tuple[DumpSpec, ...] = (
    *(
        DumpSpec(mode, mode)
        for mode in (
            "NO_TENSOR",
            "CURT_HEALTH",
            "CONCISE_HEALTH",
            "FULL_HEALTH",
            "SHAPE",
            "FULL_TENSOR",
        )
    ),
    DumpSpec("FULL_HEALTH_circular", "FULL_HEALTH", circular_buffer_size=CIRCULAR_BUFFER_SIZE),
    DumpSpec("FULL_HEALTH_eager_only", "FULL_HEALTH", eager_only=True),
)


# --------------------------------------------------------------------------- making dumps


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        TF_CPP_MIN_LOG_LEVEL="2",
        # oneDNN rewrites/fuses ops and changes rounding depending on the CPU;
        # keep the graphs and numerics the same everywhere.
        TF_ENABLE_ONEDNN_OPTS="0",
        CUDA_VISIBLE_DEVICES="",
        PYTHONHASHSEED="0",
    )
    return env


def make_dump(spec: DumpSpec, dump_root: Path) -> None:
    cmd = [
        sys.executable,
        str(PROGRAM),
        spec.mode,
        str(dump_root),
        "--circular-buffer-size",
        str(spec.circular_buffer_size),
    ]
    if spec.eager_only:
        cmd.append("--eager-only")
    print(f"[{spec.name}] {' '.join(cmd[1:])}", flush=True)
    proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"[{spec.name}] tf_program.py failed with exit code {proc.returncode}")


# --------------------------------------------------------------------------- JSON encoding


def encode_float(value: float) -> float | str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def encode(value: Json) -> Json:
    """Recursively make a reader value JSON-safe (tuples -> lists, non-finite -> str)."""
    if isinstance(value, float):
        return encode_float(value)
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    return value


def encode_array(array: Any) -> Json:
    """A numpy array (or None) as {"dtype", "shape", "values"}; values null if large."""
    import numpy as np

    if array is None:
        return None
    array = np.asarray(array)
    entry: dict[str, Json] = {"dtype": str(array.dtype), "shape": list(array.shape), "values": None}
    if array.size >= MAX_VALUE_ELEMENTS:
        return entry
    if array.dtype.kind in "biu":
        entry["values"] = array.tolist()
    elif array.dtype.kind == "f" or str(array.dtype) == "bfloat16":
        entry["values"] = encode(array.astype(np.float64).tolist())
    elif array.dtype.kind == "c":
        entry["values"] = encode(np.stack([array.real, array.imag], -1).astype(np.float64).tolist())
    return entry


# --------------------------------------------------------------------------- reading dumps


NONFINITE_SLOTS = {
    "CURT_HEALTH": slice(1, 2),
    "CONCISE_HEALTH": slice(2, 5),
    "FULL_HEALTH": slice(5, 8),
}


def is_nonfinite(mode: str, summary: Any) -> bool:
    """Whether one tfdbg2 summary vector reports any inf/NaN (None: not recorded)."""
    if summary is None:
        return False
    return any(v != 0 for v in summary[NONFINITE_SLOTS[mode]])


def first_index(items: list[bool]) -> int | None:
    return next((i for i, flag in enumerate(items) if flag), None)


def all_graphs(reader: Any) -> list[Any]:
    """All DebuggedGraphs, outermost first, then their inner graphs depth-first."""
    result: list[Any] = []

    def visit(graph: Any) -> None:
        result.append(graph)
        for inner_id in graph.inner_graph_ids:
            visit(reader.graph_by_id(inner_id))

    for graph in reader.outermost_graphs():
        visit(graph)
    return result


def count_stack_frames(dump_root: Path) -> int:
    from tensorflow.python.debug.lib.debug_events_reader import DebugEventsReader

    with DebugEventsReader(str(dump_root)) as events:
        return sum(1 for _ in events.stack_frames_iterator())


def log_origin(reader: Any, traces: list[Any]) -> Json:
    """The first Log trace holding -inf (FULL_HEALTH slot 5) and where it was created."""
    index = first_index(
        [
            t.op_type == "Log" and t.debug_tensor_value is not None and t.debug_tensor_value[5] > 0
            for t in traces
        ]
    )
    if index is None:
        return None
    trace = traces[index]
    digest = reader.graph_by_id(trace.graph_id).get_op_creation_digest(trace.op_name)
    host_name, stack = reader.read_graph_op_creation_stack_trace(digest)
    user_frames = [frame for frame in stack if Path(frame[0]).name == PROGRAM.name]
    file_path, lineno, func = user_frames[-1]
    return {
        "trace_index": index,
        "op_type": trace.op_type,
        "op_name": trace.op_name,
        "graph_id": trace.graph_id,
        "input_names": list(digest.input_names),
        "file": Path(file_path).name,
        "lineno": lineno,
        "func": func,
        "source_line": reader.source_lines(host_name, file_path)[lineno - 1].strip(),
    }


def describe_dump(spec: DumpSpec, dump_root: Path) -> Json:
    """What TensorFlow's DebugDataReader reads from one dump, as JSON-safe data."""
    from tensorflow.python.debug.lib.debug_events_reader import DebugDataReader

    full_tensor = spec.mode == "FULL_TENSOR"
    health = spec.mode in NONFINITE_SLOTS
    with DebugDataReader(str(dump_root)) as reader:
        reader.update()
        executions = reader.executions(digest=False)
        traces = reader.graph_execution_traces(digest=False)

        execution_entries = []
        for execution in executions:
            _, stack = reader.read_execution_stack_trace(execution)
            entry: dict[str, Json] = {
                "op_type": execution.op_type,
                "graph_id": execution.graph_id,
                "input_tensor_ids": encode(execution.input_tensor_ids),
                "output_tensor_ids": encode(execution.output_tensor_ids),
                "output_tensor_device_ids": encode(execution.output_tensor_device_ids),
                "tensor_debug_mode": execution.tensor_debug_mode,
                "debug_tensor_values": encode(execution.debug_tensor_values),
                "stack": [list(frame) for frame in stack],
            }
            if full_tensor:
                entry["tensor_values"] = [
                    encode_array(v) for v in reader.execution_to_tensor_values(execution)
                ]
            execution_entries.append(entry)

        trace_entries = []
        for trace in traces:
            entry = {
                "op_type": trace.op_type,
                "op_name": trace.op_name,
                "output_slot": trace.output_slot,
                "graph_id": trace.graph_id,
                "graph_ids": list(trace.graph_ids),
                "tensor_debug_mode": trace.tensor_debug_mode,
                "debug_tensor_value": encode(trace.debug_tensor_value),
                "device_name": trace.device_name,
            }
            if full_tensor:
                entry["tensor_value"] = encode_array(
                    reader.graph_execution_trace_to_tensor_value(trace)
                )
            trace_entries.append(entry)

        graphs = all_graphs(reader)
        result: dict[str, Json] = {
            "tensor_debug_mode_name": spec.mode,
            "circular_buffer_size": spec.circular_buffer_size,
            "num_executions": reader.num_executions(),
            "num_graph_execution_traces": reader.num_graph_execution_traces(),
            "num_graphs": len(graphs),
            "num_source_files": len(reader.source_file_list()),
            "num_stack_frames": count_stack_frames(dump_root),
            "executions": execution_entries,
            "graph_execution_traces": trace_entries,
            "graphs": [
                {"graph_id": g.graph_id, "name": g.name, "outer_graph_id": g.outer_graph_id}
                for g in graphs
            ],
            "devices": {str(k): v for k, v in sorted(reader.device_name_map().items())},
            "first_nonfinite_trace_index": None,
            "first_nonfinite_execution_index": None,
            "tfdbg_run_id": reader.tfdbg_run_id(),
            "tensorflow_version": reader.tensorflow_version(),
        }
        if health:
            result["first_nonfinite_execution_index"] = first_index(
                [
                    any(is_nonfinite(spec.mode, v) for v in (e.debug_tensor_values or ()))
                    for e in executions
                ]
            )
            result["first_nonfinite_trace_index"] = first_index(
                [is_nonfinite(spec.mode, t.debug_tensor_value) for t in traces]
            )
        if spec.name == "FULL_HEALTH":
            result["log_origin"] = log_origin(reader, traces)
    return result


def check(expected: dict[str, Json]) -> None:
    """Sanity checks that the program did what it is meant to."""
    full = expected["FULL_HEALTH"]
    origin = full["log_origin"]
    assert origin is not None, "no Log trace with -inf in FULL_HEALTH"
    assert full["first_nonfinite_trace_index"] == origin["trace_index"], (
        "the first non-finite trace should be the Log that produces -inf"
    )
    for spec in DUMPS:
        dump = expected[spec.name]
        assert dump["num_executions"] > 0, spec.name
        if spec.eager_only:
            assert dump["num_graph_execution_traces"] == 0, spec.name
        else:
            assert dump["num_graph_execution_traces"] > 0, spec.name
    circular = expected["FULL_HEALTH_circular"]
    assert full["num_executions"] > CIRCULAR_BUFFER_SIZE
    assert circular["num_executions"] == CIRCULAR_BUFFER_SIZE, circular["num_executions"]
    assert circular["num_graph_execution_traces"] == min(
        CIRCULAR_BUFFER_SIZE, full["num_graph_execution_traces"]
    )


# --------------------------------------------------------------------------- packing


def normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if info.isdir() else 0o644
    return info


def pack(dumps_dir: Path, expected: dict[str, Json], tarball: Path) -> None:
    """Write all dumps plus expected.json into one deterministic, maximally xz'd tarball."""
    tmp = tarball.with_suffix(".tmp")
    # Same as tarfile's "w:xz" mode, whose preset the type stubs limit to 0..9.
    with (
        lzma.open(tmp, "wb", preset=9 | lzma.PRESET_EXTREME) as xz,
        tarfile.open(fileobj=xz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        payload = (json.dumps(expected, indent=1, sort_keys=True, allow_nan=False) + "\n").encode()
        info = normalized(tarfile.TarInfo("expected.json"))
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
        for path in sorted(dumps_dir.rglob("*")):
            arcname = path.relative_to(dumps_dir).as_posix()
            tar.add(path, arcname=arcname, recursive=False, filter=normalized)
    tmp.replace(tarball)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--keep", type=Path, metavar="DIR", help="also leave the dumps and expected.json in DIR"
    )
    parser.add_argument(
        "--output", type=Path, default=TARBALL, help=f"tarball to write (default: {TARBALL})"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    with tempfile.TemporaryDirectory(prefix="tf_dumps_") as tmp:
        dumps_dir = Path(tmp)
        expected: dict[str, Json] = {}
        for spec in DUMPS:
            dump_root = dumps_dir / spec.name
            make_dump(spec, dump_root)
            expected[spec.name] = describe_dump(spec, dump_root)
        check(expected)
        pack(dumps_dir, expected, args.output)
        if args.keep is not None:
            if args.keep.exists():
                shutil.rmtree(args.keep)
            shutil.copytree(dumps_dir, args.keep)
            (args.keep / "expected.json").write_text(
                json.dumps(expected, indent=1, sort_keys=True, allow_nan=False) + "\n"
            )

    print(f"wrote {args.output} ({args.output.stat().st_size:,} bytes)")
    for spec in DUMPS:
        dump = expected[spec.name]
        print(
            f"  {spec.name:24s} executions={dump['num_executions']:3d} "
            f"traces={dump['num_graph_execution_traces']:3d} graphs={dump['num_graphs']} "
            f"source_files={dump['num_source_files']} stack_frames={dump['num_stack_frames']}"
        )


if __name__ == "__main__":
    main()
