"""Coverage-guided fuzzing (atheris) of everything that reads a dump.

Each input damages one file of a small valid dump (one of the six tfdbg2 files
or a sidecar index): replaced whole, spliced at an offset, or cut short. The
dump is then opened, every indexed event decoded, the analysis and the report
run, and the GUI's API handlers called. Any exception other than a documented,
clear error is a crash that atheris reports with the input that caused it.

    python fuzz/fuzz_reader.py -max_total_time=3600 -rss_limit_mb=1024 fuzz/corpus
    python fuzz/fuzz_reader.py -runs=2000            # what tests/integration/test_fuzz.py runs, bounded

Hangs are caught by ``-timeout`` (seconds per input, default 20 here) and
unbounded memory by ``-rss_limit_mb``.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["nanscope"]):
    from nanscope.analysis import analyze
    from nanscope.format import files
    from nanscope.reader import EXECUTIONS, TRACES, UNREADABLE, DumpReader
    from nanscope.report import report_json
    from nanscope.server.api import ROUTES
    from nanscope.server.query import ApiError, Query
    from nanscope.server.runs import RunSet

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import write_small_dump

WORK = Path(tempfile.mkdtemp(prefix="nanscope-fuzz-"))
TEMPLATE = WORK / "template"
DUMP = WORK / "dump"
write_small_dump(TEMPLATE, n=12, bad=(5,))
# Executions, traces, their sidecars, and the four append-only files.
TARGETS = sorted(p.name for p in TEMPLATE.iterdir())
ORIGINAL = {name: (TEMPLATE / name).read_bytes() for name in TARGETS}


def damaged(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    name = TARGETS[fdp.ConsumeIntInRange(0, len(TARGETS) - 1)]
    how = fdp.ConsumeIntInRange(0, 2)
    original = ORIGINAL[name]
    if how == 0:
        new = fdp.ConsumeBytes(fdp.remaining_bytes())
    elif how == 1:
        at = fdp.ConsumeIntInRange(0, len(original))
        patch = fdp.ConsumeBytes(fdp.remaining_bytes())
        new = original[:at] + patch + original[at + len(patch) :]
    else:
        new = original[: fdp.ConsumeIntInRange(0, len(original))]
    if DUMP.exists():
        shutil.rmtree(DUMP)
    shutil.copytree(TEMPLATE, DUMP)
    (DUMP / name).write_bytes(new)


def read_everything() -> None:
    try:
        reader = DumpReader(DUMP)
    except files.DumpNotFoundError:
        return  # the metadata file was made unreadable as a dump: a clear, documented error
    with reader:
        for kind, get in ((EXECUTIONS, reader.execution), (TRACES, reader.trace)):
            for i in range(reader.num(kind)):
                with contextlib.suppress(*UNREADABLE):  # a damaged record, reported with its place
                    get(i)
        for p in range(len(reader.processes)):
            for f in reader.source_files(p):
                reader.source_lines(f.index, p)
        report_json(analyze(reader))
    runs = RunSet(DUMP.parent, refresh_interval=0.0)
    for route, params in (
        ("/api/runs", {}), ("/api/alerts", {"run": "dump"}), ("/api/analysis", {"run": "dump"}),
        ("/api/executions", {"run": "dump", "end": "50"}),
        ("/api/traces", {"run": "dump", "end": "50"}),
        ("/api/timeline", {"run": "dump"}), ("/api/source", {"run": "dump", "file": "0"}),
    ):  # fmt: skip
        with contextlib.suppress(ApiError):  # a 4xx answer with its message
            ROUTES[route](runs, Query(params), {})
    runs.close()


def test_one_input(data: bytes) -> None:
    damaged(data)
    read_everything()


def main() -> None:
    atheris.Setup([*sys.argv, "-timeout=20"], test_one_input)
    try:
        atheris.Fuzz()
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
