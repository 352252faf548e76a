"""Interoperability: a dump written by nanscope, served by TensorBoard's real Debugger V2 plugin.

The module starts the ``tensorboard`` program of this environment on a free
port of 127.0.0.1, pointed at a FULL_HEALTH dump written by
:class:`nanscope.events.DumpWriter`, and queries the plugin's HTTP routes
(``/data/plugin/debugger-v2/...``) the way TensorBoard's web front end does.
TensorBoard is stopped (its whole process group) when the module is done.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("tensorboard")

from nanscope.events import DumpWriter, ExecutionEvent, Graph, GraphOp, Phase, TraceEvent

from ..helpers import marked_line

pytestmark = pytest.mark.tf

THIS_FILE = os.path.abspath(__file__)
RUN = "__default_debugger_run__"
CPU = "/job:localhost/replica:0/task:0/device:CPU:0"
STARTUP_TIMEOUT_S = 60.0  # TensorBoard (which imports TensorFlow) takes a few seconds
LOAD_TIMEOUT_S = 20.0  # the plugin reads the dump on a background thread


# -- the dump ----------------------------------------------------------------------------------


@overload
def full_health(tensor_id: int, array: np.ndarray) -> np.ndarray: ...
@overload
def full_health(tensor_id: int, array: None) -> None: ...
def full_health(tensor_id: int, array: np.ndarray | None) -> np.ndarray | None:
    """TensorFlow's FULL_HEALTH summary of a float32 tensor (None for no tensor)."""
    if array is None:
        return None
    flat = array.ravel().astype(np.float64)
    finite = flat[np.isfinite(flat)]
    return np.array(
        [
            tensor_id, -1, 1, array.ndim, flat.size,
            np.isneginf(flat).sum(), np.isposinf(flat).sum(), np.isnan(flat).sum(),
            (finite < 0).sum(), (finite == 0).sum(), (finite > 0).sum(),
        ],
        dtype=np.float64,
    )  # fmt: skip


def _f32(*values: float) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def _model_site(writer: DumpWriter) -> int:
    return writer.capture_stack()  # SITE:model


def line_of(marker: str) -> int:
    """The line of this file that ends with ``# SITE:<marker>``."""
    return marked_line(THIS_FILE, f"# SITE:{marker}")


# (op type, output tensor ids, output values); None: an int64 output without summary.
EXECUTIONS: list[tuple[str, list[int], list[np.ndarray | None]]] = [
    ("aten.exp.default", [2], [_f32(0.5, 1.0, 2.0)]),
    ("aten.log.default", [3], [_f32(-np.inf, 0.0, 0.75)]),
    ("aten.max.dim", [4, 5], [_f32(0.75), None]),
    ("aten.sqrt.default", [6], [_f32(np.nan, 1.0, np.nan, 4.0)]),
]
# Graph ops: op name -> (graph id, op type, inputs, output tensor ids).
GRAPH_OPS = {
    "probs": ("g0", "Placeholder", [], [101]),
    "Log": ("g0", "Log", ["probs:0"], [102]),
    "Neg": ("g0", "Neg", ["Log:0"], [103]),
    "x": ("g1", "Placeholder", [], [201]),
    "Sqrt": ("g1", "Sqrt", ["x:0"], [202]),
}
# Traces in writing order: (graph ids outermost first, op name, value).
TRACES = [
    (["g0"], "Log", _f32(-np.inf, -0.5)),  # write_trace
    (["g0", "g1"], "Sqrt", _f32(np.nan, 2.0)),  # write_trace, in the nested graph
    (["g0"], "probs", _f32(0.25, 0.5)),  # write_traces ...
    (["g0"], "Neg", _f32(1.5, 0.75)),  # ... one graph call
]


def _nonfinite(value: np.ndarray | None) -> bool:
    return value is not None and not np.isfinite(value).all()


EXPECTED_ALERTS = sum(_nonfinite(v) for _, _, vs in EXECUTIONS for v in vs) + sum(
    _nonfinite(v) for _, _, v in TRACES
)


@dataclass
class Dump:
    path: Path
    host_name: str


def write_dump(logdir: Path) -> Dump:
    w = DumpWriter(logdir, "FULL_HEALTH", circular_buffer_size=-1, framework="test")
    stack = _model_site(w)  # SITE:call-model
    dev = w.register_device(CPU)
    w.write_graph(Graph(graph_id="g0", graph_name="loss", outer_graph_id=""))
    w.write_graph(Graph(graph_id="g1", graph_name="cond_true", outer_graph_id="g0"))
    for op_name, (graph_id, op_type, inputs, out_ids) in GRAPH_OPS.items():
        w.write_graph_op(
            GraphOp(
                graph_id=graph_id,
                op_type=op_type,
                op_name=op_name,
                graph_name="loss" if graph_id == "g0" else "cond_true",
                input_names=inputs,
                num_outputs=len(out_ids),
                output_tensor_ids=out_ids,
                stack=stack,
            )
        )
    for step, (op_type, out_ids, values) in enumerate(EXECUTIONS):
        w.write_execution(
            ExecutionEvent(
                op_type=op_type,
                input_tensor_ids=[out_ids[0] - 1],
                output_tensor_ids=out_ids,
                output_device_ids=[dev] * len(out_ids),
                summaries=[full_health(t, v) for t, v in zip(out_ids, values, strict=True)],
                stack=stack,
                phase=Phase.FORWARD,
                step=step,
            )
        )
    for graph_ids, op_name, value in TRACES[:2]:
        summary = full_health(GRAPH_OPS[op_name][3][0], value)
        w.write_trace(TraceEvent(graph_ids[-1], op_name, 0, summary, device_name=CPU))
    batch = TRACES[2:]
    matrix = np.stack([full_health(GRAPH_OPS[name][3][0], v) for _, name, v in batch])
    w.write_traces("g0", [name for _, name, _ in batch], [0] * len(batch), matrix, device_name=CPU)
    w.close()
    return Dump(logdir, w.host_name)


# -- TensorBoard -------------------------------------------------------------------------------

# Never through a proxy, whatever the environment says.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tensorboard_command() -> list[str]:
    script = Path(sys.executable).parent / "tensorboard"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-m", "tensorboard.main"]


@dataclass
class Server:
    base: str  # http://127.0.0.1:PORT/data/plugin/debugger-v2/
    dump: Dump
    log: Path

    def get(self, route: str, **params: Any) -> Any:
        """GET a plugin route; the decoded JSON."""
        url = self.base + route + ("?" + urllib.parse.urlencode(params) if params else "")
        with _OPENER.open(url, timeout=10) as response:
            return json.loads(response.read().decode())

    def poll(self, route: str, ready: Callable[[Any], bool], **params: Any) -> Any:
        """GET a route until ``ready(answer)``; the plugin loads the dump asynchronously."""
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        answer: Any = None
        while time.monotonic() < deadline:
            try:
                answer = self.get(route, **params)
            except urllib.error.HTTPError as exc:  # e.g. an index not loaded yet
                answer = f"HTTP {exc.code}: {exc.read()[:500]!r}"
            else:
                if ready(answer):
                    return answer
            time.sleep(0.25)
        pytest.fail(f"{route} not ready after {LOAD_TIMEOUT_S} s; last answer: {answer!r}")


def start_tensorboard(logdir: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """TensorBoard started over ``logdir`` on a free port of 127.0.0.1 (its output into
    ``log``), in a process group of its own; the process and its Debugger V2 routes' base
    URL. Its plugin reads a dump that appears in ``logdir`` later, when first asked."""
    port = _free_port()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            [
                *_tensorboard_command(),
                *("--logdir", str(logdir)),
                *("--host", "127.0.0.1"),
                *("--port", str(port)),
                *("--load_fast", "false"),  # no separate data server process
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group, killed as a whole by stop_tensorboard
        )
    return proc, f"http://127.0.0.1:{port}/data/plugin/debugger-v2/"


def wait_for_tensorboard(proc: subprocess.Popen[bytes], server: Server) -> None:
    """Until the plugin answers (fails the test if TensorBoard exits or never does)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(
                f"tensorboard exited with {proc.returncode}:\n{server.log.read_text()[-3000:]}"
            )
        try:
            server.get("runs")
            return
        except (urllib.error.URLError, ConnectionError, OSError):
            if time.monotonic() > deadline:
                pytest.fail(f"tensorboard did not answer in {STARTUP_TIMEOUT_S} s:\n"
                            f"{server.log.read_text()[-3000:]}")  # fmt: skip
            time.sleep(0.25)


@contextlib.contextmanager
def running_tensorboard(dump: Dump, log: Path) -> Iterator[Server]:
    """TensorBoard over ``dump``, once its Debugger V2 plugin answers; stopped, with its
    whole process group, on exit."""
    proc, base = start_tensorboard(dump.path, log)
    try:
        server = Server(base, dump, log)
        wait_for_tensorboard(proc, server)
        yield server
    finally:
        stop_tensorboard(proc)


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("tensorboard")
    with running_tensorboard(write_dump(root / "dump"), root / "tensorboard.log") as server:
        yield server


def stop_tensorboard(proc: subprocess.Popen[bytes]) -> None:
    """Stop TensorBoard and everything it started (its process group)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except ProcessLookupError:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    else:
        # TensorBoard itself is gone; make sure nothing it started lingers.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


# -- the routes --------------------------------------------------------------------------------


def test_runs(tensorboard: Server) -> None:
    runs = tensorboard.get("runs")
    assert list(runs) == [RUN]
    assert runs[RUN]["start_time"] > 0


def test_alerts(tensorboard: Server) -> None:
    answer = tensorboard.poll(
        "alerts", lambda a: a["num_alerts"] >= EXPECTED_ALERTS, run=RUN, begin=0, end=-1
    )
    assert EXPECTED_ALERTS == 4
    assert answer["num_alerts"] == EXPECTED_ALERTS
    assert answer["alerts_breakdown"] == {"InfNanAlert": EXPECTED_ALERTS}
    alerts = answer["alerts"]
    by_execution = {a["execution_index"]: a for a in alerts if a["execution_index"] is not None}
    by_trace = {
        a["graph_execution_trace_index"]: a
        for a in alerts
        if a["graph_execution_trace_index"] is not None
    }
    # Executions 1 (log: one -inf) and 3 (sqrt: two NaN).
    assert sorted(by_execution) == [1, 3]
    assert by_execution[1]["op_type"] == "aten.log.default"
    assert (by_execution[1]["num_neg_inf"], by_execution[1]["num_nan"]) == (1, 0)
    assert by_execution[3]["op_type"] == "aten.sqrt.default"
    assert (by_execution[3]["size"], by_execution[3]["num_nan"]) == (4, 2)
    # Traces 0 (Log: -inf) and 1 (Sqrt in the nested graph: NaN).
    assert sorted(by_trace) == [0, 1]
    assert by_trace[0]["op_type"] == "Log" and by_trace[0]["num_neg_inf"] == 1
    assert by_trace[1]["op_type"] == "Sqrt" and by_trace[1]["num_nan"] == 1


def test_execution_digests(tensorboard: Server) -> None:
    answer = tensorboard.poll(
        "execution/digests",
        lambda a: a["num_digests"] >= len(EXECUTIONS),
        run=RUN,
        begin=0,
        end=-1,
    )
    assert answer["num_digests"] == len(EXECUTIONS)
    digests = answer["execution_digests"]
    assert [d["op_type"] for d in digests] == [op for op, _, _ in EXECUTIONS]
    assert [d["output_tensor_device_ids"] for d in digests] == [
        [1] * len(ids) for _, ids, _ in EXECUTIONS
    ]


def test_execution_data(tensorboard: Server) -> None:
    answer = tensorboard.poll(
        "execution/data",
        lambda a: len(a["executions"]) >= len(EXECUTIONS),
        run=RUN,
        begin=0,
        end=-1,
    )
    executions = answer["executions"]
    assert len(executions) == len(EXECUTIONS)
    for got, (op_type, out_ids, values) in zip(executions, EXECUTIONS, strict=True):
        assert got["op_type"] == op_type
        assert got["output_tensor_ids"] == out_ids
        assert got["input_tensor_ids"] == [out_ids[0] - 1]
        assert got["tensor_debug_mode"] == 4  # FULL_HEALTH
        assert got["host_name"] == tensorboard.dump.host_name
        expected = [
            None if v is None else full_health(t, v).tolist()
            for t, v in zip(out_ids, values, strict=True)
        ]
        assert got["debug_tensor_values"] == expected


def test_graph_execution_digests(tensorboard: Server) -> None:
    answer = tensorboard.poll(
        "graph_execution/digests",
        lambda a: a["num_digests"] >= len(TRACES),
        run=RUN,
        begin=0,
        end=-1,
    )
    assert answer["num_digests"] == len(TRACES)
    digests = answer["graph_execution_digests"]
    assert [(d["op_name"], d["op_type"], d["graph_id"]) for d in digests] == [
        (name, GRAPH_OPS[name][1], ids[-1]) for ids, name, _ in TRACES
    ]


def test_graph_execution_data(tensorboard: Server) -> None:
    answer = tensorboard.poll(
        "graph_execution/data",
        lambda a: len(a["graph_executions"]) >= len(TRACES),
        run=RUN,
        begin=0,
        end=-1,
    )
    traces = answer["graph_executions"]
    assert len(traces) == len(TRACES)
    for got, (graph_ids, op_name, value) in zip(traces, TRACES, strict=True):
        assert got["op_name"] == op_name
        assert got["graph_ids"] == graph_ids
        assert got["output_slot"] == 0
        assert got["tensor_debug_mode"] == 4
        assert got["device_name"] == CPU
        assert got["debug_tensor_value"] == full_health(GRAPH_OPS[op_name][3][0], value).tolist()


def test_graph_op_info(tensorboard: Server) -> None:
    info = tensorboard.poll("graphs/op_info", lambda a: True, run=RUN, graph_id="g0", op_name="Log")
    assert info["op_type"] == "Log"
    assert info["op_name"] == "Log"
    assert info["graph_ids"] == ["g0"]
    assert info["output_tensor_ids"] == [102]
    assert info["num_outputs"] == 1
    assert [i["op_name"] for i in info["inputs"]] == ["probs"]
    assert info["inputs"][0]["output_slot"] == 0
    assert info["inputs"][0]["data"]["op_type"] == "Placeholder"
    assert [[c["op_name"] for c in slot] for slot in info["consumers"]] == [["Neg"]]

    nested = tensorboard.get("graphs/op_info", run=RUN, graph_id="g1", op_name="Sqrt")
    assert nested["graph_ids"] == ["g0", "g1"]
    assert [i["op_name"] for i in nested["inputs"]] == ["x"]

    graph = tensorboard.get("graphs/graph_info", run=RUN, graph_id="g1")
    assert graph["name"] == "cond_true"
    assert graph["outer_graph_id"] == "g0"
    assert tensorboard.get("graphs/graph_info", run=RUN, graph_id="g0")["inner_graph_ids"] == ["g1"]


def test_source_files(tensorboard: Server) -> None:
    host = tensorboard.dump.host_name
    files = tensorboard.poll("source_files/list", lambda a: [host, THIS_FILE] in a, run=RUN)
    index = files.index([host, THIS_FILE])
    content = tensorboard.get("source_files/file", run=RUN, index=index)
    assert content["host_name"] == host
    assert content["file_path"] == THIS_FILE
    assert content["lines"] == Path(THIS_FILE).read_text().splitlines()


def test_stack_frames(tensorboard: Server) -> None:
    answer = tensorboard.poll(
        "execution/data", lambda a: len(a["executions"]) >= 1, run=RUN, begin=0, end=1
    )
    frame_ids = answer["executions"][0]["stack_frame_ids"]
    assert frame_ids
    frames = tensorboard.get(
        "stack_frames/stack_frames", run=RUN, stack_frame_ids=",".join(frame_ids)
    )["stack_frames"]
    assert len(frames) == len(frame_ids)
    host = tensorboard.dump.host_name
    # Outermost first: ... -> the fixture -> write_dump -> _model_site.
    assert frames[-1] == [host, THIS_FILE, line_of("model"), "_model_site"]
    assert frames[-2] == [host, THIS_FILE, line_of("call-model"), "write_dump"]
    assert frames[-3][1] == THIS_FILE and frames[-3][3] == "tensorboard"
