"""Small builders shared by the tests."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nanscope.events import DumpWriter, ExecutionEvent, Graph, GraphOp, TraceEvent
from nanscope.format.proto import tensor_pb2
from nanscope.format.records import scan
from nanscope.format.tensors import DataType
from nanscope.reader import Execution
from nanscope.server.api import ROUTES
from nanscope.server.query import Query
from nanscope.server.runs import RunSet

# TensorFlow 2.21's own dumps, one directory per name (tests/data/make_tf_dumps.py writes them).
TF_DUMPS = Path(__file__).parent / "data" / "tf_dumps.tar.xz"
TF_DUMP_NAMES = (
    "NO_TENSOR",
    "CURT_HEALTH",
    "CONCISE_HEALTH",
    "FULL_HEALTH",
    "SHAPE",
    "FULL_TENSOR",
    "FULL_HEALTH_circular",
    "FULL_HEALTH_eager_only",
)


def extract_tf_dumps(root: Path, only: str | None = None) -> Path:
    """TensorFlow's golden dumps extracted under ``root`` (``only``: that one's directory
    alone, with no ``expected.json``); returns ``root``."""
    with tarfile.open(TF_DUMPS) as tar:
        members = (
            None if only is None else [m for m in tar.getmembers() if m.name.startswith(f"{only}/")]
        )
        tar.extractall(root, members=members, filter="data")
    return root


# A jitted JAX MLP whose loss takes the log of a zero (tests/programs/jax_mlp.py).
JAX_MLP = Path(__file__).parent / "programs" / "jax_mlp.py"


def jax_mlp_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The FULL_HEALTH dump of ``tests/programs/jax_mlp.py``, run on the CPU, recorded once
    per test session (compiling the instrumented program takes seconds) under the base
    temporary folder: ``<base>/jax/mlp``. Skips without JAX."""
    pytest.importorskip("jax")
    dump = tmp_path_factory.getbasetemp() / "jax" / "mlp"
    done = dump.parent / "recorded"
    if not done.exists():
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        out = subprocess.run([sys.executable, str(JAX_MLP), str(dump)], env=env,
                             capture_output=True, text=True, timeout=600)  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        done.write_text(out.stdout)
    return dump


def call(runs: RunSet, path: str, /, **params: Any) -> dict[str, Any]:
    """Call the GUI's handler of ``path`` (``/api/executions/3`` style) as the server would."""
    for rule, handler in ROUTES.items():
        pattern = "^" + re.sub(r"<int:(\w+)>", r"(?P<\1>\\d+)", rule) + "$"
        m = re.match(pattern, path)
        if m:
            query = Query({k: str(v) for k, v in params.items()})
            result = handler(runs, query, {k: int(v) for k, v in m.groupdict().items()})
            json.dumps(result, allow_nan=False)  # what the server sends must be strict JSON
            return result
    raise AssertionError(f"no route for {path}")


def iter_payloads(data: bytes | memoryview, path: str) -> Iterator[bytes]:
    """Every record payload in ``data``; raises the first damage found."""
    result = scan(data, path, resync_limit=0)
    yield from (record.payload for record in result.records)
    if result.errors:
        raise result.errors[0]


def summary_to_proto(vector: np.ndarray) -> tensor_pb2.TensorProto:
    """A 1-D float64 summary vector as TensorFlow's graph path stores it."""
    v = np.ascontiguousarray(vector, dtype="<f8")
    proto = tensor_pb2.TensorProto(dtype=int(DataType.DT_DOUBLE), tensor_content=v.tobytes())  # type: ignore[arg-type]
    proto.tensor_shape.dim.add(size=v.shape[0])
    return proto


def full_health(neg_inf: int = 0, nan: int = 0, size: int = 10, zero: int = 3) -> np.ndarray:
    pos = size - neg_inf - nan - zero - 1
    return np.array([-1, -1, 1, 1, size, neg_inf, 0, nan, 1, zero, pos], dtype=np.float64)


def marked_line(path: str, suffix: str) -> int:
    """The 1-based number of the one line of ``path`` that ends with ``suffix``."""
    lines = Path(path).read_text().splitlines()
    hits = [i for i, line in enumerate(lines, 1) if line.rstrip().endswith(suffix)]
    assert len(hits) == 1, (suffix, hits)
    return hits[0]


def write_small_dump(
    logdir: Path, n: int = 10, bad: tuple[int, ...] = (6,), **kwargs: object
) -> DumpWriter:
    """``n`` executions and ``n`` traces; those at positions in ``bad`` hold -inf. Returns the closed writer."""
    kwargs.setdefault("circular_buffer_size", -1)
    w = DumpWriter(logdir, "FULL_HEALTH", **kwargs)  # type: ignore[arg-type]
    stack = w.capture_stack()
    w.write_graph(Graph("g", "loss"))
    w.write_graph_op(
        GraphOp("g", "Placeholder", "probs", "loss", output_tensor_ids=[1], stack=stack)
    )
    w.write_graph_op(
        GraphOp(
            "g", "Log", "Log", "loss", input_names=["probs:0"], output_tensor_ids=[2], stack=stack
        )
    )
    for i in range(n):
        h = full_health(neg_inf=2 if i in bad else 0)
        w.write_execution(
            ExecutionEvent(f"op{i % 3}", [i + 1], [i], summaries=[h], stack=stack, step=i)
        )
        w.write_trace(TraceEvent("g", "Log" if i % 2 else "probs", 0, h, step=i))
    w.close()
    return w


def summaries_of(execution: Execution) -> tuple[np.ndarray | None, ...]:
    """Each output's summary vector; the test fails in NO_TENSOR and FULL_TENSOR (no vectors)."""
    assert execution.debug_tensor_values is not None, execution.op_type
    return execution.debug_tensor_values


def summary_of(execution: Execution, slot: int = 0) -> np.ndarray:
    """Output ``slot``'s summary vector; the test fails where it was not recorded."""
    summary = summaries_of(execution)[slot]
    assert summary is not None, (execution.op_type, slot)
    return summary


def torch_recorder() -> str:
    """Which PyTorch recorder a session started now uses: ``"native"`` or ``"python"``."""
    from nanscope.backends.torch.native import native_library

    return "native" if native_library() is not None else "python"


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "16m") -> Iterator[Path]:
    """A fresh tmpfs of ``size`` mounted at ``path`` (a real file system that fills
    up, or can be remounted read-only); skips the test where mounting is impossible."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        out = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except OSError as exc:
        pytest.skip(f"cannot mount a tmpfs here ({exc})")
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {out.stderr.strip()}")
    try:
        yield path
    finally:
        # Lazy: a test's process that still holds a file open must not make this fail.
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def shift_clock(logdir: Path, rank: int, seconds: float) -> None:
    """Rewrite one rank's file set as if its wall clock had run ``seconds`` ahead (behind,
    when negative): every record's ``wall_time`` and the metadata's clock anchor. The index
    sidecars are removed, so that readers index the rewritten records."""
    from nanscope.format.proto import debug_event_pb2 as pb
    from nanscope.format.records import frame

    (meta,) = logdir.glob(f"*-rank{rank}-pid*.metadata")
    prefix = str(meta)[: -len(".metadata")]
    for path in Path(prefix).parent.glob(Path(prefix).name + ".*"):
        if path.suffix == ".nsidx":
            path.unlink()
            continue
        if path.suffix in (".nsdrops", ".nsranges"):  # no wall times in them
            continue
        out = []
        for payload in iter_payloads(path.read_bytes(), str(path)):
            event = pb.DebugEvent.FromString(payload)
            event.wall_time += seconds
            if event.WhichOneof("what") == "debug_metadata" and event.debug_metadata.clock_wall:
                event.debug_metadata.clock_wall += seconds
            out.append(frame(event.SerializeToString()))
        path.write_bytes(b"".join(out))


CHROMIUM = "/usr/bin/chromium"  # Debian's: tests never download a browser
# Headless, and nothing reaching out (updates, sync, QUIC).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def require_chromium(module_level: bool = False) -> None:
    """Skip where Debian's chromium is not installed, except in CI (.ci/run installs it and
    sets NANSCOPE_REQUIRE_BROWSER): there, a skip would hide the GUI, so it is an error."""
    if not os.path.exists(CHROMIUM):
        if os.environ.get("NANSCOPE_REQUIRE_BROWSER"):
            raise RuntimeError(f"{CHROMIUM} is not installed: apt-get install chromium")
        pytest.skip(f"{CHROMIUM} is not installed", allow_module_level=module_level)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """Debian's chromium launched through Playwright (see :func:`require_chromium`)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    require_chromium()
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()
