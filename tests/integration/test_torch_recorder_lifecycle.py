"""Recording must never take the program down: sessions switched on and off while other
threads run ops, ops that come and go, signals raised inside nanscope's callbacks, and views
that cost no memory. Each runs with both PyTorch recorders (the native one where it builds)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
import torch

import nanscope

from ..helpers import summary_of, torch_recorder

RECORDERS = ["native", "python"]
# How many runs of the switch-on-and-off program each recorder gets; `make stress` asks for 20.
STRESS_RUNS = int(os.environ.get("NANSCOPE_STRESS_RUNS", "1"))


@pytest.fixture(params=RECORDERS)
def recorder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    name: str = request.param
    if name == "native" and os.environ.get("NANSCOPE_TORCH_RECORDER", "auto") == "python":
        pytest.skip("NANSCOPE_TORCH_RECORDER=python")
    monkeypatch.setenv("NANSCOPE_TORCH_RECORDER", name)
    if name == "native" and torch_recorder() != "native":
        pytest.skip("the native recorder cannot be built here")
    return name


def child_env(recorder: str) -> dict[str, str]:
    env = dict(os.environ, NANSCOPE_TORCH_RECORDER=recorder, PYTHONUNBUFFERED="1")
    src = str(Path(nanscope.__file__).parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    return env


def one_core() -> None:
    """Runs the child on one core, where a thread is preempted anywhere (races show)."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


TOGGLE = """
import sys, tempfile, threading, time
import torch, nanscope
torch.set_num_threads(1)
stop = False
def work(i):
    x = torch.randn(64)
    while not stop:
        y = torch.exp(x) + i
        z = (y * 2).sum()
threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
for t in threads:
    t.start()
logdir = tempfile.mkdtemp()
for i in range(100):
    with nanscope.enable_dump_debug_info(logdir, tensor_debug_mode="FULL_HEALTH"):
        torch.ones(4).mul(2)  # the Python recorder records this thread only
        time.sleep(0.01)
stop = True
for t in threads:
    t.join()
print("recorded", len(nanscope.open_dump(logdir).executions()))
"""


@pytest.mark.parametrize("run", range(STRESS_RUNS))
def test_switching_recording_on_and_off_while_threads_run_ops(
    tmp_path: Path, recorder: str, run: int
) -> None:
    # Ops that began before a session ended are still inside the recorder's
    # callbacks when it stops: it must wait for them, not tear its tables down
    # under them (this crashed in 3 of 4 runs on one core).
    proc = subprocess.run(
        [sys.executable, "-c", TOGGLE],
        env=child_env(recorder),
        preexec_fn=one_core,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[-1]) > 0, proc.stdout  # it did record


POOL_AT_EXIT = """
import concurrent.futures, sys
import torch, nanscope
with nanscope.enable_dump_debug_info(sys.argv[1], circular_buffer_size=-1):
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=64)
    print(sum(pool.map(lambda i: (torch.ones(3) * i).sum().item(), range(128))))
# The pool is left for concurrent.futures to join at exit, as programs (and torch.compile's
# own compile pool) do.
"""


def test_threads_started_while_recording_end_cleanly_at_exit(tmp_path: Path, recorder: str) -> None:
    """A thread started while recording holds the Python recorder's dispatch mode; when the
    program joins it at exit, the mode must not be let go of after the interpreter began
    finalising (that aborted about one exit in three: "terminate called without an active
    exception"). The workers' ops are recorded."""
    for run in range(3):
        logdir = tmp_path / str(run)
        proc = subprocess.run(
            [sys.executable, "-c", POOL_AT_EXIT, str(logdir)],
            env=child_env(recorder),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert float(proc.stdout.split()[-1]) == 3 * sum(range(128))
        with nanscope.open_dump(logdir) as dump:
            muls = [e for e in dump.executions() if e.op_type == "aten.mul.Tensor"]
        assert len(muls) == 128


def test_a_thread_lets_go_of_the_mode_before_it_ends(tmp_path: Path, recorder: str) -> None:
    """Deterministically, what the exit test shows by chance: by the time a thread started
    while recording ends, its dispatch mode stack is empty again (the C++ thread-local state
    that holds it is destroyed after ``join()`` has returned)."""
    seen: list[int] = []

    class Probe:  # made after the mode was pushed, so let go of after it was popped
        def __del__(self) -> None:
            seen.append(torch._C._len_torch_dispatch_stack())

    local = threading.local()

    def work() -> None:
        seen.append(torch._C._len_torch_dispatch_stack())
        torch.ones(2).mul(3)
        local.probe = Probe()

    with nanscope.enable_dump_debug_info(tmp_path, circular_buffer_size=-1):
        t = threading.Thread(target=work)
        t.start()
        t.join()
    assert seen == [1 if recorder == "python" else 0, 0]
    with nanscope.open_dump(tmp_path) as dump:
        assert [e.op_type for e in dump.executions()] == ["aten.ones.default", "aten.mul.Tensor"]


def test_ops_registered_and_removed_keep_their_own_names(tmp_path: Path, recorder: str) -> None:
    # A torch.library op removed and another registered in its place may get
    # the same addresses (short names live inside the schema's memory); each
    # event must still carry its own op's name.
    x = torch.randn(8)
    with nanscope.enable_dump_debug_info(tmp_path, tensor_debug_mode="FULL_HEALTH"):
        for i in range(60):
            lib = torch.library.Library(f"nsc{i}", "DEF")
            lib.define("op(Tensor x) -> Tensor")
            lib.impl("op", lambda t, i=i: t * float(i), "CPU")
            getattr(torch.ops, f"nsc{i}").op(x)
            del lib
    churn = [e for e in nanscope.open_dump(tmp_path).executions() if "nsc" in e.op_type]
    assert [e.op_type for e in churn] == [f"nsc{i}.op.default" for i in range(60)]


INTERRUPTED = """
import os, signal, sys, tempfile
import torch, nanscope
torch.set_num_threads(1)
mode, kind = sys.argv[1], sys.argv[2]
if kind == "exit":
    def leave(num, frame):
        sys.exit(7)
    signal.signal(signal.SIGUSR1, leave)
x = torch.randn(256)
with nanscope.enable_dump_debug_info(tempfile.mkdtemp(), tensor_debug_mode=mode,
                                     circular_buffer_size=500):
    print("ready", flush=True)
    try:
        while True:
            y = torch.exp(x).sin() + 1
    except KeyboardInterrupt:
        print("interrupted at", sys.exc_info()[2].tb_frame.f_code.co_filename, flush=True)
        raise
"""


@pytest.mark.parametrize("mode", ["FULL_TENSOR", "FULL_HEALTH"])
@pytest.mark.parametrize("kind", ["ctrl-c", "exit"])
def test_signals_raised_inside_callbacks_reach_the_program(
    tmp_path: Path, recorder: str, mode: str, kind: str
) -> None:
    # Python runs signal handlers wherever the main thread is: often inside
    # nanscope's own Python code, called back for an op (every op in
    # FULL_TENSOR, and on GPUs in every mode). KeyboardInterrupt and the
    # SystemExit of a handler that calls sys.exit belong to the program.
    proc = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED, mode, kind],
        env=child_env(recorder),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # well inside the loop
        proc.send_signal(signal.SIGINT if kind == "ctrl-c" else signal.SIGUSR1)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if kind == "ctrl-c":
        assert proc.returncode == -signal.SIGINT, err[-3000:]
        assert "interrupted at <string>" in out  # raised in the program's loop
        assert "KeyboardInterrupt" in err
    else:
        assert proc.returncode == 7, err[-3000:]


EXPAND = """
import resource, sys, tempfile
import torch, nanscope
torch.set_num_threads(1)
w = torch.randn(1, 1024)
if sys.argv[1] != "check":
    w[0, 3] = float("nan")  # check_numerics would stop at it
def step():
    mask = w.expand(250_000, 1024)  # 1 GB if it were materialised
    return mask[:2].sum()
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
logdir = tempfile.mkdtemp()
if sys.argv[1] == "check":
    nanscope.enable_check_numerics()
    for _ in range(3):
        step()
    nanscope.disable_check_numerics()
else:
    with nanscope.enable_dump_debug_info(logdir, tensor_debug_mode=sys.argv[1]):
        for _ in range(3):
            step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


@pytest.mark.parametrize("mode", ["FULL_HEALTH", "CURT_HEALTH", "check"])
def test_expanded_view_is_summarised_without_materialising_it(recorder: str, mode: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", EXPAND, mode],
        env=child_env(recorder),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    extra_mib = int(proc.stdout.split()[-1])
    assert extra_mib < 100, f"recording an expand() view cost {extra_mib} MiB"


VIEWS = {
    "expand": lambda x: x[:, :1].expand(64, 40),
    "broadcast 3-d": lambda x: x.unsqueeze(0).expand(5, 64, 48),
    "sliding window": lambda x: x.flatten().unfold(0, 8, 3),
    # More elements than nanscope copies at once: counted a slab at a time.
    "large sliding window": lambda x: x.flatten().repeat(120).unfold(0, 16, 1),
}


@pytest.mark.parametrize("view", list(VIEWS))
def test_view_summaries_match_the_materialised_values(
    tmp_path: Path, recorder: str, view: str
) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 48, generator=g)
    x[3, 0], x[7, 1], x[9, 0], x[0, 0] = float("nan"), float("inf"), float("-inf"), 0.0
    with nanscope.enable_dump_debug_info(tmp_path, "FULL_HEALTH", circular_buffer_size=-1):
        out = VIEWS[view](x)
    last = nanscope.open_dump(tmp_path).executions()[-1]
    got = summary_of(last)
    # The oracle: the same view, copied and counted by PyTorch.
    v = out.contiguous().flatten().double()
    finite = torch.isfinite(v)
    want = [
        out.numel(),
        int((v == float("-inf")).sum()),
        int((v == float("inf")).sum()),
        int(torch.isnan(v).sum()),
        int((finite & (v < 0)).sum()),
        int((v == 0).sum()),
        int((finite & (v > 0)).sum()),
    ]
    assert [int(n) for n in got[4:11]] == want


@pytest.mark.skipif(torch_recorder() != "native", reason="the native recorder is not in use")
def test_a_full_buffer_drops_events_but_keeps_the_nonfinite_one(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # (The Python recorder has no buffer of its own: it hands events to the writer.)
    x = torch.ones(4)
    with nanscope.enable_dump_debug_info(
        tmp_path, "FULL_HEALTH", circular_buffer_size=-1, origin_window=5
    ) as s:
        session: Any = s._session
        eager = session.eager  # the native recorder
        eager.lib.set_capacity(50)
        # The drain thread stalls on the lock it takes to hand events over:
        # the buffer fills up, and each later op waits briefly, then lets go.
        with eager._write_lock:
            for _ in range(60):
                torch.add(x, 1)
            born = torch.log(x - 1)  # -inf, in an over-full buffer
            dropped = eager.lib.dropped()
    # Of the 11 events past the capacity (adds 51 to 60 and the subtraction), the -inf log's
    # window of 5 before it (4 adds and the subtraction) is kept with it: 6 are dropped.
    assert dropped == 6
    assert "6 events dropped" in capfd.readouterr().err
    reader = nanscope.open_dump(tmp_path)
    (drops,) = reader.writer_drops().values()
    assert drops.executions == 6
    executions = reader.executions()
    ops = [e.op_type for e in executions]
    assert ops.count("aten.add.Tensor") == 54
    assert ops[-2:] == ["aten.sub.Tensor", "aten.log.default"]
    log = [e for e in executions if e.op_type == "aten.log.default"]
    assert len(log) == 1 and summary_of(log[0])[5] == 4  # its four -inf
    assert torch.isinf(born).all()
