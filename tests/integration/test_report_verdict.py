"""Never a false all-clear: the report's verdict on damaged, cut and hostile dumps.

The dump is the seed's real PyTorch program (the tutorial's MLP, whose ``log`` of a zero
probability makes -inf at step 3), recorded whole. Its event file is then damaged the ways
a crash, a partial copy or a bad disk damage one. The oracle is the event file itself: the
byte offset of the first record whose summary holds Inf/NaN is found by walking the
TFRecord framing and decoding each ``DebugEvent`` with protobuf in the test, without
nanscope's reader.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nanscope.events import DumpWriter, ExecutionEvent
from nanscope.format.proto import debug_event_pb2 as pb

from ..helpers import full_health


def _nanscope(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nanscope", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "120"},
    )


def _first_nonfinite_offset(path: Path) -> int:
    """Oracle: where the first execution record holding Inf/NaN starts in ``path``."""
    data = path.read_bytes()
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        payload = data[pos + 12 : pos + 12 + length]
        event = pb.DebugEvent.FromString(payload)
        for t in event.execution.tensor_protos:
            v = np.frombuffer(t.tensor_content, dtype="<f8")
            # FULL_HEALTH: [device, mode?, dtype, rank, size, -inf, +inf, nan, ...]
            if v.size >= 8 and (v[5] or v[6] or v[7]):
                return pos
        pos += 12 + length + 4
    raise AssertionError("the recorded run made no Inf/NaN")


@pytest.fixture(scope="module")
def whole_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("whole") / "dump"
    subprocess.run(
        [sys.executable, "-m", "nanscope.examples.debug_mnist", "--dump_dir", str(d),
         "--max_steps", "6", "--dump_circular_buffer_size", "-1"],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return d


def _copy(whole: Path, tmp_path: Path) -> tuple[Path, Path]:
    d = tmp_path / "dump"
    shutil.copytree(whole, d)
    (execution,) = d.glob("*.execution")
    return d, execution


def _assert_no_verdict(out: str) -> None:
    """The damage leads, and nothing says the run was clean."""
    assert "✓" not in out and "no Inf/NaN recorded" not in out, out
    head = out.index("Incomplete dump")
    assert head < out.index("no verdict"), out


def test_the_whole_dump_is_harmful(whole_dump: Path) -> None:
    out = _nanscope("report", str(whole_dump))
    assert out.returncode == 1, out.stdout
    assert "Incomplete dump" not in out.stdout


@pytest.mark.parametrize("damage", ["cut before the NaN", "garbage", "deleted", "empty"])
def test_a_damaged_event_file_is_no_all_clear(
    whole_dump: Path, tmp_path: Path, damage: str
) -> None:
    d, execution = _copy(whole_dump, tmp_path)
    first_bad = _first_nonfinite_offset(execution)
    if damage == "cut before the NaN":
        # Mid-record, as a crash or a partial copy leaves it; the sidecar says more is there.
        with open(execution, "r+b") as fh:
            fh.truncate(first_bad + 7)
    elif damage == "garbage":
        size = execution.stat().st_size
        execution.write_bytes(np.random.default_rng(0).bytes(size))
    elif damage == "deleted":
        execution.unlink()
        Path(str(execution) + ".nsidx").unlink()
    else:
        execution.write_bytes(b"")
    out = _nanscope("report", str(d))
    assert out.returncode == 2, out.stdout + out.stderr
    _assert_no_verdict(out.stdout)
    assert "Traceback" not in out.stderr
    as_json = _nanscope("report", str(d), "--json")
    assert as_json.returncode == 2
    data = json.loads(as_json.stdout)
    assert data["verdict"] == "incomplete" and data["exit_status"] == 2
    assert data["found_harmful"] is False and data["incomplete"]
    assert data["headline"].startswith("no verdict")
    if damage == "cut before the NaN":
        said = {p["offset"] for p in data["incomplete"] if p["file"] == str(execution)}
        # The torn record starts at the oracle's first bad record, and the file ends 7 bytes
        # on while its index lists more: both said, with their offsets.
        assert said == {first_bad, first_bad + 7}, data["incomplete"]


def test_damage_after_the_nan_still_names_the_cause_first_saying_the_damage(
    whole_dump: Path, tmp_path: Path
) -> None:
    d, execution = _copy(whole_dump, tmp_path)
    first_bad = _first_nonfinite_offset(execution)
    with open(execution, "r+b") as fh:
        fh.truncate(first_bad + 2000)
    out = _nanscope("report", str(d))
    assert out.returncode == 1, out.stdout  # harm found is harm, whatever is missing
    text = out.stdout
    assert text.index("Incomplete dump") < text.index("Cause:"), text
    assert "aten.log.default" in text
    data = json.loads(_nanscope("report", str(d), "--json").stdout)
    assert data["verdict"] == "harmful" and data["exit_status"] == 1 and data["incomplete"]


def _hostile_dump(logdir: Path, op_type: str, run_id: str) -> None:
    w = DumpWriter(logdir, "FULL_HEALTH", -1, run_id=run_id, framework=op_type)
    stack = w.capture_stack()
    for i in range(3):
        h = full_health(neg_inf=2 if i == 2 else 0)
        w.write_execution(ExecutionEvent(op_type, [i + 1], [i], summaries=[h], stack=stack, step=i))
    w.close()


HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x9b1m\u202eevil"


def test_strings_from_a_dump_are_shown_never_obeyed(tmp_path: Path) -> None:
    _hostile_dump(tmp_path / "dump", op_type=f"op[/x][bold]{HOSTILE}:smile:", run_id="[/x]run")
    out = _nanscope("report", str(tmp_path / "dump"))
    assert out.returncode == 1, out.stderr  # the -inf is read by nothing: harmful
    assert "Traceback" not in out.stderr and "MarkupError" not in out.stderr
    text = out.stdout
    # Piped, rich emits no colour: every escape character would have come from the dump.
    for ch in ("\x1b", "\x07", "\x9b", "\u202e"):
        assert ch not in text, repr(ch)
    assert "[/x]run" in text and "op[/x][bold]" in text and ":smile:" in text
    # Shown escaped (rich itself drops the bell and backspace characters).
    assert "\\x1b]0;pwned" in text and "\\x1b[2J" in text and "\\u202eevil" in text
    # JSON keeps the data as it is (escaped by JSON itself).
    data = json.loads(_nanscope("report", str(tmp_path / "dump"), "--json").stdout)
    assert data["run_id"] == "[/x]run" and data["cause"]["op_type"].endswith("\u202eevil:smile:")
