"""The GUI's JSON API: the handlers called directly, and the contract in ``http_api.md``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import nanscope
from nanscope.server.api import ROUTES
from nanscope.server.query import ApiError
from nanscope.server.runs import RunSet
from tests.helpers import call, extract_tf_dumps, marked_line, write_small_dump

pytest.importorskip("torch")
import torch

DOC = Path(nanscope.__file__).parent / "server" / "http_api.md"


def refused(runs: RunSet, path: str, /, **params: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(runs, path, **params)
    return info.value


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> RunSet:
    """The tutorial's example (log of a zero probability), recorded in FULL_HEALTH."""
    from nanscope.examples import debug_mnist

    logdir = tmp_path_factory.mktemp("demo")
    debug_mnist.main(["--dump_dir", str(logdir), "--max_steps", "5"])
    return RunSet(logdir)


@pytest.fixture(scope="module")
def tf_logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TensorFlow's own dumps, one run per mode, under one logdir."""
    return extract_tf_dumps(tmp_path_factory.mktemp("tf"))


def origin_index(runs: RunSet) -> int:
    return int(call(runs, "/api/alerts")["first"]["index"])


# -- the walk of the tutorial -------------------------------------------------------------------


def test_runs_alerts_and_headline(demo: RunSet) -> None:
    runs = call(demo, "/api/runs")["runs"]
    assert [r["run"] for r in runs] == ["."]
    assert runs[0]["tensor_debug_mode"] == "FULL_HEALTH" and runs[0]["num_executions"] > 100
    assert runs[0]["steps_known"]
    alerts = call(demo, "/api/alerts")
    cats = {c["category"]: c for c in alerts["by_category"]}
    # The log made the -inf first; NaN came after.
    assert cats["neg_inf"]["first"] == alerts["first"]
    assert cats["nan"]["first"]["index"] > alerts["first"]["index"]
    assert alerts["total"] == sum(r["count"] for r in alerts["by_op_type"])
    analysis = call(demo, "/api/analysis")
    assert analysis["schema"] == "nanscope.report/2"
    assert re.match(
        r"aten\.log\.default produced -inf at step \d+: log of zero", analysis["headline"]
    )


def test_origin_detail_shows_the_zero_input_and_the_source_line(demo: RunSet) -> None:
    i = origin_index(demo)
    ev = call(demo, f"/api/executions/{i}")
    assert ev["op_type"] == "aten.log.default" and ev["phase"] == "forward"
    (inp,) = ev["inputs"]
    assert inp["producer"]["op_type"] == "aten._softmax.default"
    assert inp["counts"]["zero"] > 0 and inp["counts"]["neg_inf"] == 0
    (out,) = ev["outputs"]
    assert out["counts"]["neg_inf"] == inp["counts"]["zero"]
    assert len(out["summary"]) == 11 and out["tensor_id"] == ev["output_tensor_ids"][0]
    # The mul of labels * log(probs) reads the log's output.
    assert any(c["op_type"] == "aten.mul.Tensor" for c in ev["consumers"])
    user = [f for f in ev["stack"] if f["user"] and f["file"].endswith("debug_mnist.py")][-1]
    src = call(demo, "/api/source", file=user["file_index"])
    assert src["path"] == user["file"]
    line = "".join(text for _, text in src["lines"][user["line"] - 1])
    assert "torch.log(probs)" in line
    assert user["line"] == marked_line(user["file"], "# -inf where a probability is 0")


def test_backward_op_links_to_its_forward_op(demo: RunSet) -> None:
    page = call(demo, "/api/executions", begin=0, end=1000)
    backward = [r for r in page["rows"] if r["phase"] == "backward"]
    assert backward
    linked = [call(demo, f"/api/executions/{r['index']}") for r in backward[:20]]
    with_fwd = [e for e in linked if e["forward_index"] is not None]
    assert with_fwd
    for e in with_fwd:
        fwd = call(demo, f"/api/executions/{e['forward_index']}")
        assert fwd["phase"] == "forward" and fwd["index"] < e["index"]
        assert e["forward_op"] == fwd["op_type"]


def test_execution_pages_and_filters(demo: RunSet) -> None:
    total = call(demo, "/api/runs")["runs"][0]["num_executions"]
    page = call(demo, "/api/executions", begin=10, end=20)
    assert (page["begin"], page["end"], page["total"]) == (10, 20, total)
    assert [r["index"] for r in page["rows"]] == list(range(10, 20))
    tail = call(demo, "/api/executions", begin=total - 3, end=total + 50)
    assert tail["end"] == total and len(tail["rows"]) == 3
    bad = call(demo, "/api/executions", nonfinite=1, begin=0, end=1000)
    alerts = call(demo, "/api/alerts")
    assert bad["total"] == alerts["executions"] and all(r["nonfinite"] for r in bad["rows"])
    assert bad["rows"][0]["index"] == alerts["first"]["index"]
    logs = call(demo, "/api/executions", op_type="aten.log.default", end=1000)
    assert logs["total"] >= 1 and {r["op_type"] for r in logs["rows"]} == {"aten.log.default"}
    assert call(demo, "/api/executions", op_type="no.such.op")["total"] == 0
    row = call(demo, "/api/executions", begin=alerts["first"]["index"], end=alerts["first"]["index"] + 1)["rows"][0]  # fmt: skip
    assert row["counts"]["neg_inf"] > 0 and row["counts"]["dtype"] == "float32"


def test_timeline_buckets(demo: RunSet) -> None:
    total = call(demo, "/api/runs")["runs"][0]["num_executions"]
    tl = call(demo, "/api/timeline", buckets=10)
    assert len(tl["status"]) == 10 and tl["total"] == total
    first_bad = origin_index(demo)
    bucket = int(first_bad // tl["bucket_size"])
    assert tl["status"][bucket] >= 2 and all(s == 1 for s in tl["status"][:bucket])
    assert sum(tl["nonfinite"]) == call(demo, "/api/alerts")["executions"]
    # One event per bucket when zoomed in: statuses are the events' own.
    zoom = call(demo, "/api/timeline", begin=first_bad - 2, end=first_bad + 3, buckets=4000)
    assert zoom["first_index"] == list(range(first_bad - 2, first_bad + 3))
    assert zoom["status"][:3] == [1, 1, 2]  # finite, finite, then the log's -inf
    assert call(demo, "/api/timeline", begin=5, end=5)["status"] == []


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"begin": "x"}, "begin must be an integer"),
        ({"begin": -1}, "at least 0"),
        ({"begin": 10, "end": 5}, "before begin"),
        ({"begin": 0, "end": 1001}, "at most 1000"),
        ({"begin": "9" * 30}, "longer than"),
        ({"nonfinite": "maybe"}, "must be 1 or 0"),
        ({"process": 7}, "no process 7"),
    ],
)
def test_bad_parameters_are_clear_4xx(demo: RunSet, params: dict[str, Any], message: str) -> None:
    err = refused(demo, "/api/executions", **params)
    assert err.status in (400, 404) and message in err.message


def test_unknown_things_are_404(demo: RunSet) -> None:
    assert refused(demo, "/api/executions/999999").status == 404
    assert refused(demo, "/api/traces/0").status == 404  # an eager run has no traces
    assert refused(demo, "/api/alerts", run="nope").status == 404
    assert refused(demo, "/api/timeline", kind="nope").status == 400
    assert refused(demo, "/api/tensor", index=0).status == 404  # not FULL_TENSOR


# -- security: only recorded files, never the disk ---------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "../../../../etc/passwd", "debug_mnist.py", "", "%2e%2e/%2e%2e/etc/passwd"],
)
def test_source_serves_only_recorded_files(demo: RunSet, path: str) -> None:
    assert refused(demo, "/api/source", path=path).status == 404


def test_source_by_recorded_path_and_index(demo: RunSet) -> None:
    ev = call(demo, f"/api/executions/{origin_index(demo)}")
    frame = [f for f in ev["stack"] if f["user"]][-1]
    by_path = call(demo, "/api/source", path=frame["file"])
    assert by_path["file_index"] == frame["file_index"]
    assert refused(demo, "/api/source", file=10_000).status == 404
    assert refused(demo, "/api/source").status == 400
    # A path that resolves to a recorded file but is spelled differently is not served.
    tricky = frame["file"].replace("/examples/", "/examples/../examples/")
    assert refused(demo, "/api/source", path=tricky).status == 404


# -- TensorFlow's dumps: graph traces and the graph structure ----------------------------------


def test_many_runs_in_one_logdir(tf_logdir: Path) -> None:
    runs = RunSet(tf_logdir)
    names = [r["run"] for r in call(runs, "/api/runs")["runs"]]
    assert "FULL_HEALTH" in names and "SHAPE" in names and len(names) == 8
    # TensorFlow records no steps: nanscope counts them from the training function's calls
    # where it has the whole history, and says it does not know them elsewhere.
    known = {r["run"]: r["steps_known"] for r in call(runs, "/api/runs")["runs"]}
    assert known["FULL_HEALTH"] and not known["FULL_HEALTH_circular"], known
    assert not known["FULL_HEALTH_eager_only"]  # no function call to count
    err = refused(runs, "/api/alerts")
    assert err.status == 404 and "name one with run=" in err.message


def test_tf_graph_walk(tf_logdir: Path) -> None:
    """Alert -> the Log trace -> its input Softmax trace, as the tutorial clicks through."""
    runs = RunSet(tf_logdir)
    first = call(runs, "/api/traces", run="FULL_HEALTH", nonfinite=1, end=1)["rows"][0]
    tr = call(runs, f"/api/traces/{first['index']}", run="FULL_HEALTH")
    assert tr["op_type"] == "Log" and tr["counts"]["neg_inf"] > 0
    row = call(runs, "/api/traces", run="FULL_HEALTH", begin=first["index"], end=first["index"] + 1)
    assert row["rows"][0]["op_type"] == "Log" and row["rows"][0]["graph_name"]
    op = call(runs, "/api/graph_op", run="FULL_HEALTH", graph_id=tr["graph_id"],
              op_name=tr["op_name"], near=first["index"])  # fmt: skip
    assert op["op"]["op_type"] == "Log"
    (inp,) = op["inputs"]
    assert inp["op_type"] == "Softmax" and inp["trace_index"] < first["index"]
    softmax = call(runs, f"/api/traces/{inp['trace_index']}", run="FULL_HEALTH")
    assert softmax["op_name"] == inp["op_name"] and softmax["counts"]["zero"] > 0
    assert op["consumers"] and all(c["trace_index"] is None or c["trace_index"] > first["index"]
                                   for c in op["consumers"])  # fmt: skip
    user = [f for f in tr["stack"] if f["file"].endswith("tf_program.py")][-1]
    src = call(runs, "/api/source", run="FULL_HEALTH", file=user["file_index"])
    assert "log" in "".join(t for _, t in src["lines"][user["line"] - 1]).lower()
    traces_tl = call(runs, "/api/timeline", run="FULL_HEALTH", kind="graph_execution_trace")
    assert max(traces_tl["status"]) == 3
    # Counted from the training function's calls: the tutorial program's three steps.
    assert traces_tl["steps"] is not None and min(traces_tl["steps"]) == 0


def test_tf_shape_mode_rows(tf_logdir: Path) -> None:
    runs = RunSet(tf_logdir)
    rows = call(runs, "/api/traces", run="SHAPE", end=50)["rows"]
    assert any(r["shape"] for r in rows)
    assert all(r["nonfinite"] is None for r in rows)
    assert call(runs, "/api/alerts", run="SHAPE")["total"] == 0


def test_full_tensor_values(tmp_path: Path) -> None:
    x = torch.tensor([[1.0, 0.0, 4.0], [0.5, -1.0, 2.0]])
    with nanscope.enable_dump_debug_info(tmp_path, tensor_debug_mode="FULL_TENSOR"):
        torch.log(x)
    runs = RunSet(tmp_path)
    page = call(runs, "/api/executions", end=100)["rows"]
    (log,) = [r for r in page if r["op_type"] == "aten.log.default"]
    ev = call(runs, f"/api/executions/{log['index']}")
    assert ev["has_values"] and ev["outputs"][0]["shape"] == [2, 3]
    t = call(runs, "/api/tensor", index=log["index"])
    assert t["values"] == [0.0, "-inf", pytest.approx(1.3862943), pytest.approx(-0.6931472), "nan",
                           pytest.approx(0.6931472)]  # fmt: skip
    assert t["stats"]["finite"] == 4 and not t["truncated"]
    capped = call(runs, "/api/tensor", index=log["index"], limit=2)
    assert capped["truncated"] and len(capped["values"]) == 2
    assert refused(runs, "/api/tensor", index=log["index"], limit=10**6).status == 400


def test_processes_filter(tmp_path: Path) -> None:
    """Two processes (ranks) in one run: the process filter keeps global indices."""
    write_small_dump(tmp_path, n=10, bad=(6,), rank=0, world_size=2)
    write_small_dump(tmp_path, n=10, bad=(), rank=1, world_size=2)
    runs = RunSet(tmp_path)
    info = call(runs, "/api/runs")["runs"][0]
    assert [p["label"] for p in info["processes"]] == ["rank 0", "rank 1"]
    for p in (0, 1):
        rows = call(runs, "/api/executions", process=p, end=100)
        assert rows["total"] == 10 and {r["process"] for r in rows["rows"]} == {p}
    bad = call(runs, "/api/executions", nonfinite=1, end=100)["rows"]
    assert len(bad) == 1 and info["processes"][bad[0]["process"]]["rank"] == 0
    tl = call(runs, "/api/timeline", process=1, buckets=100)
    assert tl["total"] == 10 and max(tl["status"]) == 1


def test_live_dump_is_followed(tmp_path: Path) -> None:
    write_small_dump(tmp_path / "a", n=5, bad=())
    runs = RunSet(tmp_path, refresh_interval=0.0)
    assert [r["run"] for r in call(runs, "/api/runs")["runs"]] == ["a"]
    assert call(runs, "/api/alerts", run="a")["total"] == 0
    write_small_dump(tmp_path / "b", n=5, bad=(2,))  # a second run appears
    names = [r["run"] for r in call(runs, "/api/runs")["runs"]]
    assert names == ["a", "b"]
    assert call(runs, "/api/alerts", run="b")["total"] == 2  # one execution, one trace


# -- the contract ------------------------------------------------------------------------------


def documented_routes() -> dict[str, str]:
    """Route -> the JSON example under its heading in http_api.md."""
    text = DOC.read_text()
    out = {}
    for m in re.finditer(r"^### `GET (/api/[^`?\s]+)[^`]*`(.*?)(?=^### |\Z)", text, re.M | re.S):
        route = re.sub(r"<index>", "<int:index>", m.group(1))
        example = re.search(r"```json\n(.*?)```", m.group(2), re.S)
        out[route] = example.group(1) if example else ""
    return out


def test_every_route_is_documented_and_every_documented_route_exists() -> None:
    assert set(documented_routes()) == set(ROUTES)


def keys_of(value: Any) -> set[str]:
    """Every key of every object inside ``value`` (the first items of lists)."""
    if isinstance(value, dict):
        return set(value).union(*(keys_of(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(keys_of(v) for v in value[:3]))
    return set()


def test_documented_examples_name_the_fields_the_handlers_return(
    demo: RunSet, tf_logdir: Path, tmp_path: Path
) -> None:
    tf = RunSet(tf_logdir)
    i = origin_index(demo)
    tr = call(tf, "/api/traces", run="FULL_HEALTH", nonfinite=1, end=1)["rows"][0]["index"]
    write_small_dump(tmp_path)
    (execution,) = tmp_path.glob("*.execution")
    execution.write_bytes(execution.read_bytes()[:-3])  # a torn tail: a problem to list
    live = {
        "/api/runs": call(RunSet(tmp_path), "/api/runs"),
        "/api/alerts": call(demo, "/api/alerts"),
        "/api/executions": call(demo, "/api/executions", begin=100, end=102),
        "/api/traces": call(tf, "/api/traces", run="FULL_HEALTH", end=2),
        "/api/timeline": call(demo, "/api/timeline"),
        "/api/graph_op": call(
            tf,
            "/api/graph_op",
            run="FULL_HEALTH",
            graph_id=call(tf, f"/api/traces/{tr}", run="FULL_HEALTH")["graph_id"],
            op_name="Log",
            near=tr,
        ),
        "/api/source": call(demo, "/api/source", file=1),
    }
    keys_in = re.compile(r'"(\w+)":')
    for route, example in documented_routes().items():
        if route not in live or not example:
            continue
        documented = set(keys_in.findall(example))
        returned = keys_of(live[route])
        assert documented <= returned, (route, documented - returned)
    detail = call(demo, f"/api/executions/{i}")
    for field in ("stack", "outputs", "input_tensor_ids", "output_tensor_ids", "forward_index",
                  "consumers", "has_values", "graph"):  # fmt: skip
        assert field in detail


def test_position_of_in_filtered_lists(demo: RunSet) -> None:
    alerts = call(demo, "/api/alerts")
    bad = call(demo, "/api/executions", nonfinite=1, end=1000)["rows"]
    third = bad[2]["index"]
    at = call(demo, "/api/executions", nonfinite=1, begin=0, end=0, position_of=third)
    assert (at["position"], at["exact"], at["rows"]) == (2, True, [])
    # A finite event just before the first alert: the first alert is the next one.
    before = call(
        demo, "/api/executions", nonfinite=1, end=0, position_of=alerts["first"]["index"] - 1
    )
    assert (before["position"], before["exact"]) == (0, False)
    after = call(demo, "/api/executions", nonfinite=1, end=0, position_of=10**9)
    assert after["position"] is None
    plain = call(demo, "/api/executions", end=0, position_of=17)
    assert (plain["position"], plain["exact"]) == (17, True)


def test_alerts_by_step_and_by_process(tmp_path: Path) -> None:
    write_small_dump(tmp_path, n=10, bad=(6, 8), rank=0, world_size=2)
    write_small_dump(tmp_path, n=10, bad=(3,), rank=1, world_size=2)
    runs = RunSet(tmp_path)
    everything = call(runs, "/api/alerts")
    assert everything["total"] == 6  # each bad position is one execution and one trace
    assert [s["step"] for s in everything["by_step"]] == [3, 6, 8]
    for s in everything["by_step"]:
        ev = call(runs, f"/api/{'executions' if s['first']['kind'] == 'execution' else 'traces'}/"
                        f"{s['first']['index']}")  # fmt: skip
        assert ev["step"] == s["step"] and ev["counts"]["neg_inf"] == 2
    rank1 = call(runs, "/api/alerts", process=1)
    assert rank1["total"] == 2 and [s["step"] for s in rank1["by_step"]] == [3]
    first = call(runs, "/api/executions/" + str(rank1["first"]["index"]))
    assert first["process"] == 1 and first["step"] == 3


def test_source_files_lists_only_recorded_text(demo: RunSet) -> None:
    listed = call(demo, "/api/source_files")["files"]
    assert any(f["path"].endswith("debug_mnist.py") and f["user"] for f in listed)
    for f in listed:
        assert f["num_lines"] > 0
        assert (
            call(demo, "/api/source", file=f["file_index"], process=f["process"])["path"]
            == f["path"]
        )


def test_frames_without_recorded_text_have_no_file_index(demo: RunSet) -> None:
    ev = call(demo, f"/api/executions/{origin_index(demo)}")
    recorded = {f["file_index"] for f in call(demo, "/api/source_files")["files"]}
    for frame in ev["stack"]:
        assert frame["file_index"] == -1 or frame["file_index"] in recorded
        if frame["file"].startswith("<") or "/<" in frame["file"]:
            assert not frame["user"] and frame["file_index"] == -1


def test_finite_events_get_no_explanation(tf_logdir: Path) -> None:
    runs = RunSet(tf_logdir)
    for run in ("SHAPE", "FULL_HEALTH"):
        rows = call(runs, "/api/traces", run=run, end=20)["rows"]
        fine = [r for r in rows if not r["nonfinite"]]
        assert fine
        assert call(runs, f"/api/traces/{fine[0]['index']}", run=run)["explanation"] == ""


def test_curt_health_flag_is_in_every_route(tmp_path: Path) -> None:
    """CURT_HEALTH records only "any Inf/NaN": every route that shows counts says so.

    The oracle is the event's own summary vector (slot 1 is the flag), read with
    TensorFlow's layout, independently of nanscope's decoding.
    """
    from nanscope.examples import debug_mnist

    debug_mnist.main(
        ["--dump_dir", str(tmp_path), "--max_steps", "4", "--dump_tensor_debug_mode", "CURT_HEALTH"]
    )
    runs = RunSet(tmp_path)
    first = origin_index(runs)
    with nanscope.open_dump(tmp_path) as r:
        flags = [
            bool(
                any(v is not None and v[1] != 0 for v in (r.execution(i).debug_tensor_values or ()))
            )
            for i in (first - 1, first)
        ]
    assert flags == [False, True]
    detail = call(runs, f"/api/executions/{first}")
    assert detail["op_type"] == "aten.log.default"
    assert detail["counts"]["any_nonfinite"] is True and detail["counts"]["nan"] is None
    assert [o["counts"]["any_nonfinite"] for o in detail["outputs"]] == [True]
    assert detail["inputs"][0]["counts"]["any_nonfinite"] is False
    rows = call(runs, "/api/executions", begin=first - 1, end=first + 1)["rows"]
    assert [row["counts"]["any_nonfinite"] for row in rows] == flags
    assert [row["nonfinite"] for row in rows] == flags
    origin = call(runs, "/api/analysis")["origin"]
    assert origin["index"] == first and origin["counts"]["any_nonfinite"] is True
