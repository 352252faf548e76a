"""The reader against damaged dumps: never a crash, only reported problems.

Property-based: a valid dump is damaged at random (bytes flipped, files cut,
garbage appended, lengths made huge) and the reader must still open it,
report what it skipped, and decode every event it indexed.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nanscope
from nanscope.format import files, records
from nanscope.reader import EXECUTIONS, TRACES, Execution

from ..helpers import write_small_dump

_TEMPLATE: dict[str, Path] = {}


def template(tmp_root: Path) -> Path:
    if "dump" not in _TEMPLATE:
        d = tmp_root / "template"
        write_small_dump(d, n=12, bad=(5,))
        _TEMPLATE["dump"] = d
    return _TEMPLATE["dump"]


damage = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=64), st.just(0)),
    st.tuples(st.just("huge_length"), st.integers(0, 10), st.just(0)),
)


def apply(path: Path, how: tuple[str, int | bytes, int]) -> None:
    data = bytearray(path.read_bytes())
    kind, arg, extra = how
    if kind == "flip" and data:
        data[int(arg) % len(data)] ^= extra
    elif kind == "cut":
        data = data[: int(arg) % (len(data) + 1)]
    elif kind == "append":
        assert isinstance(arg, bytes)
        data += arg
    elif kind == "huge_length" and len(data) >= records.HEADER_SIZE:
        # A length field with a valid CRC that claims an absurd record size.
        length = struct.pack("<Q", 1 << (40 + int(arg)))
        data[0:12] = length + struct.pack("<I", records.masked_crc32c(length))
    path.write_bytes(bytes(data))


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    which=st.lists(st.sampled_from((*files.SUFFIXES, "execution.nsidx")), min_size=1, max_size=3),
    hows=st.lists(damage, min_size=1, max_size=3),
)
def test_damaged_dumps_never_crash_the_reader(
    tmp_path_factory: pytest.TempPathFactory,
    which: list[str],
    hows: list[tuple[str, int | bytes, int]],
) -> None:
    d = tmp_path_factory.mktemp("damaged")
    shutil.copytree(template(tmp_path_factory.getbasetemp()), d, dirs_exist_ok=True)
    (fs,) = files.discover(d)
    for suffix, how in zip(which, hows, strict=False):
        apply(fs.path(suffix), how)
    with nanscope.open_dump(d) as r:
        assert r.num_executions() <= 12 and r.num_graph_execution_traces() <= 12
        for p in r.problems:
            assert p.severity in ("warning", "error") and p.message
        # Everything indexed decodes (or is reported corrupt, with its offset).
        for kind, n in ((EXECUTIONS, r.num_executions()), (TRACES, r.num_graph_execution_traces())):
            for i in range(n):
                try:
                    event = r.execution(i) if kind == EXECUTIONS else r.trace(i)
                except records.RecordError as exc:
                    assert "byte offset" in str(exc)
                    continue
                if isinstance(event, Execution):
                    r.stack(event)
        from nanscope.analysis import analyze

        analyze(r)  # the report never crashes on what the reader accepted


def _read_all(root: Path) -> tuple[int, int, list[str]]:
    """Open, index, decode everything and analyze, in a thread that must finish in 30 s."""
    import threading

    from nanscope.analysis import analyze
    from nanscope.report import report_json

    out: dict[str, object] = {}

    def work() -> None:
        try:
            with nanscope.open_dump(root) as r:
                for i in range(r.num(EXECUTIONS)):
                    r.execution(i)
                for i in range(r.num(TRACES)):
                    r.trace(i)
                report_json(analyze(r))
                out["result"] = (r.num(EXECUTIONS), r.num(TRACES), [p.message for p in r.problems])
        except BaseException as exc:  # reported below, with the failing case
            out["error"] = exc

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the reader hung"
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["result"]  # type: ignore[return-value]


def _replace(path: Path, how: str, other: Path) -> None:
    path.unlink()
    if how == "dev_zero":
        path.symlink_to("/dev/zero")
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "directory":
        path.mkdir()
    elif how == "dangling":
        path.symlink_to(path.parent / "nowhere")
    elif how == "loop":
        loop = path.parent / "loop"
        loop.symlink_to(path)
        path.symlink_to(loop)
    elif how == "wrong_type":
        path.write_bytes(other.read_bytes())  # records of another kind of file


@pytest.mark.parametrize("how", ["dev_zero", "fifo", "directory", "dangling", "loop", "wrong_type"])
@pytest.mark.parametrize(
    "suffix", [files.EXECUTION, files.GRAPH_EXECUTION_TRACES, files.STACK_FRAMES, files.GRAPHS]
)
def test_special_files_in_a_dump_are_reported_not_followed(
    tmp_path: Path, how: str, suffix: str
) -> None:
    """Symlinks to devices, FIFOs, directories, dangling and looping links, wrong record kinds."""
    write_small_dump(tmp_path, n=6, bad=(2,))
    (fs,) = files.discover(tmp_path)
    other = fs.path(files.GRAPHS if suffix != files.GRAPHS else files.EXECUTION)
    _replace(fs.path(suffix), how, other)
    n_exec, n_traces, problems = _read_all(tmp_path)
    damaged_events = suffix in (files.EXECUTION, files.GRAPH_EXECUTION_TRACES)
    if damaged_events:
        assert (n_exec if suffix == files.EXECUTION else n_traces) == 0
    assert (n_traces if suffix == files.EXECUTION else n_exec) == 6  # the rest is read
    if how in ("dev_zero", "fifo", "directory"):
        assert any("not a regular file" in p for p in problems), problems
    elif how == "loop":
        assert any("symbolic links" in p.lower() or "missing" in p for p in problems), problems


def test_symlinked_files_of_a_real_dump_are_read(tmp_path: Path) -> None:
    """A dump assembled from links (to regular files) reads as the original."""
    write_small_dump(tmp_path / "real", n=6, bad=(2,))
    (tmp_path / "linked").mkdir()
    for p in (tmp_path / "real").iterdir():
        (tmp_path / "linked" / p.name).symlink_to(p)
    n_exec, n_traces, problems = _read_all(tmp_path / "linked")
    assert (n_exec, n_traces, problems) == (6, 6, [])
