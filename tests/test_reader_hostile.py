"""The reader against damaged dumps: never a crash, only reported problems.

Property-based: a valid dump is damaged at random (bytes flipped, files cut,
garbage appended, lengths made huge) and the reader must still open it,
report what it skipped, and decode every event it indexed.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nanscope
from nanscope.format import files, records
from nanscope.reader import EXECUTIONS, TRACES

from .helpers import write_small_dump

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


def apply(path: Path, how: tuple[str, object, int]) -> None:
    data = bytearray(path.read_bytes())
    kind, arg, extra = how
    if kind == "flip" and data:
        data[int(arg) % len(data)] ^= extra  # type: ignore[call-overload]
    elif kind == "cut":
        data = data[: int(arg) % (len(data) + 1)]  # type: ignore[call-overload]
    elif kind == "append":
        data += arg  # type: ignore[operator]
    elif kind == "huge_length" and len(data) >= records.HEADER_SIZE:
        # A length field with a valid CRC that claims an absurd record size.
        length = struct.pack("<Q", 1 << (40 + int(arg)))  # type: ignore[call-overload]
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
    tmp_path_factory, which: list[str], hows: list[tuple[str, object, int]]
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
                r.stack(event) if kind == EXECUTIONS else None
        from nanscope.analysis import analyze

        analyze(r)  # the report never crashes on what the reader accepted
