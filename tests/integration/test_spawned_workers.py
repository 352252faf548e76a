"""``nanscope run`` records the Python processes a program starts, not only its own.

The programs (``tests/programs/``) are written the way such programs are, without nanscope:

- ``spawn_ddp.py``: DDP (gloo, 2 ranks) launched with ``torch.multiprocessing.spawn``;
  rank 1 makes NaN at step 2 and the gradient allreduce carries it to rank 0;
- ``spawn_pool.py``: a ``multiprocessing`` pool or a ``ProcessPoolExecutor`` (spawn,
  forkserver, fork) whose workers make NaN; the parent computes nothing with PyTorch;
- ``subprocess_worker.py``: ``subprocess.run([sys.executable, worker])``, the worker makes
  NaN; the parent never imports PyTorch; or the worker's interpreter cannot import
  nanscope.

Each is run under ``nanscope run`` (with the default circular buffer and with
``--circular-buffer-size -1``), and its report is checked against an oracle the workers
write themselves (``SPAWN_ORACLE_DIR``, set only here): which process (rank, pid) made NaN
first, with which op, at which step and line, found with ``torch.isnan`` after the op.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from nanscope import open_dump
from nanscope.cli._children import BOOTSTRAP_DIR, ENV, Recording, children_recorded
from nanscope.events import DumpWriter
from nanscope.format import files
from nanscope.format.modes import parse_mode

PROGRAMS = Path(__file__).parents[1] / "programs"
TIMEOUT_S = 300
# Variables of an enclosing launcher (or nanscope run) must not leak in.
OUTER_VARS = (
    "NANSCOPE_RUN_ID", "NANSCOPE_RANK", "TORCHELASTIC_RUN_ID", "RANK", "LOCAL_RANK",
    "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", ENV,
)  # fmt: skip
BUFFERS = [pytest.param([], id="circular-1000"), pytest.param(["--circular-buffer-size", "-1"], id="keep-all")]  # fmt: skip


def env(oracle: Path | None = None) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in OUTER_VARS}
    e["OMP_NUM_THREADS"] = "1"
    if oracle is not None:
        e["SPAWN_ORACLE_DIR"] = str(oracle)
    return e


def nanscope_run(
    tmp_path: Path, program: str, *args: str, options: list[str] | None = None
) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    """Run ``program`` under ``nanscope run``; the result, its logdir and its oracle dir."""
    logdir, oracle = tmp_path / "dump", tmp_path / "oracle"
    oracle.mkdir()
    cmd = [sys.executable, "-m", "nanscope", "run", "--logdir", str(logdir), *(options or [])]
    # Should it hang, every process of the run (the workers too) prints its threads'
    # Python stacks when it is sent SIGABRT: what a hang's diagnosis starts from.
    run_env = {**env(oracle), "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen(
        [*cmd, str(PROGRAMS / program), *args], cwd=tmp_path, env=run_env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"nanscope run hung for {TIMEOUT_S} s; its processes' stacks:\n{err[-30000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), logdir, oracle


def report(logdir: Path) -> tuple[int, dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "nanscope", "report", "--json", str(logdir)],
        env=env(), capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    return out.returncode, json.loads(out.stdout)


def oracle_files(oracle: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(oracle.glob("*.json"))]


def marked_line(program: str) -> int:
    lines = (PROGRAMS / program).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.rstrip().endswith("# <- origin"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pid_of(data: dict[str, Any], process: int) -> int:
    return int(data["processes"][process]["pid"])


# -- torch.multiprocessing.spawn: DDP ----------------------------------------------------------


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("options", BUFFERS)
def test_spawned_ddp_ranks_are_recorded_and_named(tmp_path: Path, options: list[str]) -> None:
    bad_rank, bad_step = 1, 2
    out, logdir, oracle = nanscope_run(
        tmp_path, "spawn_ddp.py", str(free_port()), str(bad_rank), str(bad_step), "4",
        options=options,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    seen = {o["rank"]: o for o in oracle_files(oracle)}
    assert sorted(seen) == [0, 1]
    (born,) = [o for o in seen.values() if o["made_nan"] is not None]  # the oracle's origin
    status, data = report(logdir)
    assert (status, data["verdict"]) == (1, "harmful")
    # Every worker recorded, as its rank (known only at init_process_group), with its pid.
    ranked = {p["rank"]: p["pid"] for p in data["processes"] if p["rank"] is not None}
    assert ranked == {r: o["pid"] for r, o in seen.items()}
    assert data["run_id"] and data["problems"] == []
    origin = data["origin"]
    assert (origin["op_type"], origin["rank"], origin["step"], origin["source"]["line"]) == (
        "aten.sqrt.default", born["rank"], born["made_nan"]["step"], born["made_nan"]["line"],
    )  # fmt: skip
    assert data["first_nan"]["rank"] == born["rank"]
    # The other rank only received it, through DDP's allreduce, from the origin's rank.
    roles = {
        data["processes"][p["process"]]["rank"]: (p["role"], p["senders"])
        for p in data["ranks"]["processes"]
    }
    origin_process = data["ranks"]["origin_process"]
    assert data["processes"][origin_process]["rank"] == born["rank"]
    other = 1 - born["rank"]
    assert roles[born["rank"]] == ("origin", [])
    assert roles[other] == ("received", [origin_process])
    assert data["ranks"]["spread"]["op_type"] == "c10d.allreduce_.default"


@pytest.mark.torch
@pytest.mark.slow
def test_healthy_spawned_ddp_is_clean(tmp_path: Path) -> None:
    out, logdir, oracle = nanscope_run(tmp_path, "spawn_ddp.py", str(free_port()), "-1", "0", "3")
    assert out.returncode == 0, out.stderr
    assert all(o["made_nan"] is None for o in oracle_files(oracle))
    status, data = report(logdir)
    assert (status, data["verdict"]) == (0, "clean")
    assert sorted(p["rank"] for p in data["processes"] if p["rank"] is not None) == [0, 1]
    assert data["num_executions"] > 0


# -- multiprocessing pools ---------------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "method", "options"),
    [
        ("pool", "spawn", []),
        ("pool", "spawn", ["--circular-buffer-size", "-1"]),
        ("executor", "spawn", ["--circular-buffer-size", "-1"]),
        ("pool", "forkserver", []),
        ("executor", "fork", ["--circular-buffer-size", "-1"]),
    ],
)
def test_pool_workers_are_recorded(
    tmp_path: Path, kind: str, method: str, options: list[str]
) -> None:
    out, logdir, oracle = nanscope_run(
        tmp_path, "spawn_pool.py", kind, "4", method, options=options
    )
    assert out.returncode == 0, out.stderr
    assert "2 of 4 results are NaN" in out.stdout
    made_nan = {o["pid"] for o in oracle_files(oracle) if o["made_nan"]}
    assert made_nan
    status, data = report(logdir)
    assert (status, data["verdict"]) == (1, "harmful"), data["headline"]
    assert data["incomplete"] == []  # every worker's writer closed, SIGTERM or not
    origin = data["origin"]
    assert origin["op_type"] == "aten.sqrt.default"
    assert origin["source"]["line"] == marked_line("spawn_pool.py")
    assert pid_of(data, origin["process"]) in made_nan
    # The processes where NaN was born are the workers that saw it, and only those.
    born = {
        pid_of(data, p["process"])
        for p in data["ranks"]["processes"]
        if p["role"] in ("origin", "born")
    }
    assert born == made_nan


# -- subprocess ---------------------------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("options", BUFFERS)
def test_subprocess_python_worker_is_recorded(tmp_path: Path, options: list[str]) -> None:
    out, logdir, oracle = nanscope_run(tmp_path, "subprocess_worker.py", options=options)
    assert out.returncode == 0, out.stderr
    (worker,) = oracle_files(oracle)
    assert worker["made_nan"]
    assert "dump written to" in out.stderr  # the parent imported no framework; its child did
    status, data = report(logdir)
    assert (status, data["verdict"]) == (1, "harmful")
    assert [p["pid"] for p in data["processes"]] == [worker["pid"]]
    origin = data["origin"]
    assert (origin["op_type"], origin["source"]["line"]) == (
        "aten.log.default", marked_line("subprocess_worker.py"),
    )  # fmt: skip


@pytest.fixture
def no_nanscope(tmp_path: Path) -> Path:
    """A directory whose ``nanscope`` cannot be imported: put on a child's path, it is an
    interpreter without nanscope."""
    shadow = tmp_path / "shadow"
    (shadow / "nanscope").mkdir(parents=True)
    (shadow / "nanscope" / "__init__.py").write_text(
        'raise ImportError("nanscope is not installed here (test)")\n'
    )
    return shadow


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("healthy", [False, True], ids=["nan", "healthy"])
def test_a_child_that_cannot_be_recorded_is_no_all_clear(
    tmp_path: Path, no_nanscope: Path, healthy: bool
) -> None:
    """The parent records a healthy op; its child computes (NaN or not) where nanscope
    cannot be imported. The report must not read clean: it says the child ran unrecorded."""
    args = ["--parent-computes", "--hide-nanscope", str(no_nanscope)]
    out, logdir, oracle = nanscope_run(
        tmp_path, "subprocess_worker.py", *args, *(["--healthy"] if healthy else [])
    )
    assert out.returncode == 0, out.stderr
    (worker,) = oracle_files(oracle)
    assert worker["made_nan"] is not healthy
    assert "ran unrecorded" in out.stderr
    status, data = report(logdir)
    assert (status, data["verdict"]) == (2, "incomplete")
    assert data["found_nonfinite"] is False  # the parent's own events are finite
    assert [p["pid"] for p in data["processes"]] != [worker["pid"]]
    (problem,) = data["incomplete"]
    assert f"pid {worker['pid']}" in problem["message"]
    assert "ran unrecorded" in problem["message"]
    text = subprocess.run(
        [sys.executable, "-m", "nanscope", "report", str(logdir)],
        env={**env(), "COLUMNS": "400"}, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert text.returncode == 2
    # the problem sits in a bordered panel; a wide terminal keeps it on one line
    assert "ran unrecorded" in " ".join(text.stdout.replace("│", " ").split())


# -- the bootstrap and its environment ---------------------------------------------------------


def test_the_environment_is_set_only_while_the_program_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in OUTER_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    recording = Recording(tmp_path / "dump", parse_mode("FULL_HEALTH"), 1000, None, False)
    before = dict(os.environ)
    with children_recorded(recording):
        assert os.environ["PYTHONPATH"] == f"{BOOTSTRAP_DIR}{os.pathsep}/somewhere"
        settings = json.loads(os.environ[ENV])
        assert settings["logdir"] == str((tmp_path / "dump").resolve())
        assert settings["run_id"] == os.environ["NANSCOPE_RUN_ID"]
    assert dict(os.environ) == before


def child(code: str, env_: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], env=env_, cwd=cwd, capture_output=True, text=True,
        timeout=TIMEOUT_S,
    )  # fmt: skip


def test_the_bootstrap_does_nothing_without_its_settings_and_keeps_other_sitecustomize(
    tmp_path: Path,
) -> None:
    """A process that inherits the path but not the settings (or any process after the
    run) records nothing; another ``sitecustomize`` on the path still runs; the program
    sees a ``sys.path`` without the bootstrap."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = '1'\n")
    e = env()
    e["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP_DIR), str(theirs)])
    code = (
        "import os, sys, json; "
        "print(json.dumps([os.environ.get('THEIRS_RAN'), sys.path, 'torch' in sys.modules]))"
    )
    ran, path, torch_loaded = json.loads(child(code, e, tmp_path).stdout)
    assert ran == "1" and not torch_loaded
    assert str(BOOTSTRAP_DIR) not in path and str(theirs) in path
    # With its settings: recorded into the logdir; without: nothing written anywhere.
    logdir = tmp_path / "dump"
    settings = {"logdir": str(logdir), "mode": "FULL_HEALTH", "circular_buffer_size": -1,
                "op_regex": None, "check_numerics": False, "run_id": "abc"}  # fmt: skip
    code = "import torch; torch.log(torch.tensor([-1.0]))"
    assert child(code, e, tmp_path).returncode == 0
    assert not logdir.exists()
    assert child(code, {**e, ENV: json.dumps(settings)}, tmp_path).returncode == 0
    dump = open_dump(logdir)
    assert dump.run_id == "abc" and dump.processes[0].pid is not None
    assert [e.op_type for e in dump.executions()][-1] == "aten.log.default"


def test_a_rank_known_later_is_read_from_the_last_metadata_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in OUTER_VARS:
        monkeypatch.delenv(var, raising=False)
    w = DumpWriter(tmp_path, "FULL_HEALTH", -1, framework="test", rank=None, world_size=0)
    live = open_dump(tmp_path)  # opened before the rank is known, as a live viewer is
    assert live.processes[0].rank is None
    w.set_rank(3, 4)
    w.close()
    live.update()
    (now,) = live.processes
    assert (now.rank, now.label) == (3, "rank 3")
    names = [p.name for p in tmp_path.glob(f"*.{files.METADATA}")]
    assert len(names) == 1 and "-rank" not in names[0]  # named before the rank was known
    (p,) = open_dump(tmp_path).processes
    assert (p.rank, p.world_size, p.label) == (3, 4, "rank 3")


# -- DataLoader workers ------------------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("options", BUFFERS)
def test_dataloader_workers_values_are_traced_to_the_worker(
    tmp_path: Path, options: list[str]
) -> None:
    """A ``Dataset`` whose ``__getitem__`` makes -inf, loaded by two worker processes: the main
    process only receives the batch (a ``set_`` from shared memory); the cause is the
    ``log`` in the worker that made it, at the ``Dataset``'s line."""
    program = PROGRAMS / "real" / "dataset_log_features.py"
    line = next(
        i for i, text in enumerate(program.read_text().splitlines(), 1)
        if "torch.log(x[: self.logged])" in text
    )  # fmt: skip
    logdir = tmp_path / "dump"
    cmd = [sys.executable, "-m", "nanscope", "run", "--logdir", str(logdir), *options]
    out = subprocess.run(
        [*cmd, str(program), "--steps", "4", "--workers", "2"], cwd=tmp_path, env=env(),
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    status, data = report(logdir)
    assert (status, data["verdict"]) == (1, "harmful")
    assert len(data["processes"]) == 3  # the program and its two workers
    cause = data["cause"]
    assert (cause["op_type"], cause["source"]["line"]) == ("aten.log.default", line)
    main_pid = min(pid_of(data, p) for p in range(3))  # the workers were started after it
    assert pid_of(data, cause["process"]) != main_pid
    assert any("made in another process" in note for note in data["notes"])


@pytest.mark.torch
def test_a_worker_forked_while_the_recording_holds_its_locks_records_and_ends(
    tmp_path: Path,
) -> None:
    """A fork copies a lock held by another thread (the writer, the drain) as held, and that
    thread does not come along: a worker that took one of the parent's locks would hang for
    ever (a DataLoader then waits on it). Forked while every lock is held, the worker
    records into a state of its own and ends; its ``log`` of zero is the cause."""
    program = PROGRAMS / "fork_while_locked.py"
    logdir = tmp_path / "dump"
    out = subprocess.run(
        [sys.executable, "-m", "nanscope", "run", "--logdir", str(logdir), str(program)],
        cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "worker log -inf" in out.stdout
    assert "worker exit code 0" in out.stdout, out.stdout
    status, data = report(logdir)
    assert (status, data["verdict"]) == (1, "harmful")
    assert len(data["processes"]) == 2
    cause = data["cause"]
    assert cause["op_type"] == "aten.log.default"
    assert pid_of(data, cause["process"]) != min(pid_of(data, p) for p in range(2))
