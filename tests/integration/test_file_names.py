"""Two processes of the same rank, started in the same second, never share a file set."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import nanscope
from nanscope.analysis import analyze
from nanscope.reader import EXECUTIONS

pytest.importorskip("torch")

pytestmark = pytest.mark.torch

PROGRAM = """
import json, os, sys, time
import torch
import nanscope

logdir, sync, bad = sys.argv[1], sys.argv[2], sys.argv[3] == "bad"
# Imported: say so, then wait for the time both processes start recording at (one second).
open(os.path.join(sync, "ready-" + sys.argv[3]), "w").close()
go = os.path.join(sync, "go")
while not os.path.exists(go):
    time.sleep(0.01)
time.sleep(max(0.0, float(open(go).read()) - time.time()))
nanscope.enable_dump_debug_info(logdir, circular_buffer_size=-1)
x = torch.tensor([0.0, 1.0]) if bad else torch.tensor([2.0, 1.0])
y = torch.log(x)  # -inf only in the bad process
nanscope.disable_dump_debug_info()
print(json.dumps({"pid": os.getpid(), "bad": bad}))
"""


def test_same_rank_same_second_two_file_sets(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(PROGRAM))
    logdir = tmp_path / "dump"
    sync = tmp_path / "sync"
    sync.mkdir()
    env = {**os.environ, "NANSCOPE_RANK": "0", "NANSCOPE_RUN_ID": "same",
           "PYTHONPATH": os.pathsep.join(sys.path)}  # fmt: skip
    procs = [
        subprocess.Popen([sys.executable, str(script), str(logdir), str(sync), kind],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for kind in ("bad", "good")
    ]  # fmt: skip
    deadline = time.monotonic() + 120
    while len(list(sync.glob("ready-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    # Both imported: they start recording 0.2 s into the next whole second.
    (sync / "go.tmp").write_text(str(math.floor(time.time()) + 1.2))
    (sync / "go.tmp").rename(sync / "go")
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    pids = {json.loads(out)["pid"]: json.loads(out)["bad"] for out, _ in outs}
    names = sorted(p.name for p in logdir.glob("*.metadata"))
    assert len(names) == 2, names
    seconds = {name.split(".")[1] for name in names}
    if len(seconds) != 1:  # the machine was too slow to start both in one second
        pytest.skip(f"the two processes started in different seconds: {names}")
    for name in names:  # <host>-rank0-pid<P>-<tag>
        assert "-rank0-pid" in name, name
    with nanscope.open_dump(logdir) as r:
        assert r.problems == []
        assert sorted(p.rank for p in r.processes) == [0, 0]  # type: ignore[type-var]
        assert {p.pid for p in r.processes} == set(pids)
        rows, owner = r.index(EXECUTIONS), r.processes_of(EXECUTIONS)
        for info in r.processes:
            mine = rows[owner == info.index]
            # Each process's own events, the -inf in the bad one's only.
            assert len(mine) >= 1
            assert bool((mine["neg_inf"] > 0).any()) == pids[info.pid or 0], info
        a = analyze(r)
        assert a.origin is not None
        assert r.processes[a.origin.process].pid == next(pid for pid, bad in pids.items() if bad)
