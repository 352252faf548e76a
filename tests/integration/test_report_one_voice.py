"""The report says it in one voice: no note, headline or box contradicts the lineage list.

Real programs (``tests/programs`` and ``tests/programs/real``) are recorded with
``nanscope run`` and reported as text and as JSON. :func:`contradictions` holds every
sentence that makes a claim about a verdict against the lineage list and the verdict
fields of the same report (docs/ROOT_CAUSE.md, "One voice"):

* ``found_harmful``, ``verdict``, the exit status, ``cause`` and the lineage list agree on
  whether anything is harmful; "nothing harmful" is said only when nothing is;
* a note on the first Inf/NaN calls its lineage what the lineage list calls it;
* a harmful birth is never explained as an intended mask;
* an event shown once is referred to by the name of the box that shows it.

Then what each program is for: ``log(softmax(x))`` whose backward ``div`` makes the first
NaN leads with the forward line; a birth that a small circular buffer dropped is still
harmful, marked evicted with the steps lost; under the Hugging Face ``Trainer`` the cause
also names the library frame it ran in.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from nanscope.analysis._rootcause import library_frame
from nanscope.analysis._views import Source

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "tests" / "programs"
TIMEOUT = 300


@dataclass(frozen=True)
class Program:
    path: str  # under tests/programs
    args: tuple[str, ...] = ()
    run: tuple[str, ...] = ()  # nanscope run's options
    needs: tuple[str, ...] = ()
    records_itself: bool = False  # takes its logdir as argv[1] and enables recording itself


PROGRAMS_RUN: dict[str, Program] = {
    "log_of_zero": Program("log_of_zero.py", records_itself=True),
    "log_of_softmax": Program("log_of_softmax.py", run=("--circular-buffer-size", "-1")),
    "evicted_birth": Program("evicted_birth.py", run=("--circular-buffer-size", "200")),
    "evicted_birth_whole": Program("evicted_birth.py", run=("--circular-buffer-size", "-1")),
    "rnn": Program("real/rnn_lm.py", ("--steps", "5")),
    "nanogpt": Program("real/nanogpt.py", ("--steps", "4")),
    "amp": Program("real/amp_gradscaler.py", ("--steps", "8")),
    "hf_trainer_fp16": Program("real/hf_trainer_fp16.py", needs=("transformers", "accelerate")),
}


@dataclass
class Report:
    data: dict[str, Any]
    text: str
    status: int


def _env() -> dict[str, str]:
    env = dict(os.environ, COLUMNS="120")
    src = str(ROOT / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True,
        timeout=TIMEOUT,
    )  # fmt: skip


def record_and_report(p: Program, workdir: Path) -> Report:
    workdir.mkdir(parents=True)
    program = str(PROGRAMS / p.path)
    if p.records_itself:
        out = _run(program, "dump", *p.args, cwd=workdir)
    else:
        out = _run("-m", "nanscope", "run", "--logdir", "dump", *p.run, program, *p.args,
                   cwd=workdir)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    as_json = _run("-m", "nanscope", "report", "dump", "--json", cwd=workdir)
    text = _run("-m", "nanscope", "report", "dump", cwd=workdir)
    assert as_json.returncode == text.returncode, (as_json.stderr, text.stderr)
    return Report(json.loads(as_json.stdout), text.stdout, as_json.returncode)


def _available(p: Program) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("torch", *p.needs))


@pytest.fixture(scope="module")
def reports(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[Report]]]:
    """Every program the selected tests need, recorded once, two at a time."""
    wanted: set[str] = set()
    for item in request.session.items:
        if getattr(item, "module", None) is not sys.modules[__name__]:
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        wanted.update([params["program"]] if "program" in params else [])
        wanted.update(getattr(getattr(item, "function", None), "programs", ()))
    tmp = tmp_path_factory.mktemp("one-voice")
    pool = ThreadPoolExecutor(max_workers=2)
    futures = {
        name: pool.submit(record_and_report, PROGRAMS_RUN[name], tmp / name)
        for name in sorted(wanted)
        if _available(PROGRAMS_RUN[name])
    }
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def report_of(reports: dict[str, Future[Report]], name: str) -> Report:
    for module in ("torch", *PROGRAMS_RUN[name].needs):
        pytest.importorskip(module)
    return reports[name].result()


F = TypeVar("F", bound=Callable[..., None])


def uses(*names: str) -> Callable[[F], F]:
    """Mark a test as reading the reports of ``names`` (recorded by the fixture)."""

    def mark(fn: F) -> F:
        fn.programs = names  # type: ignore[attr-defined]
        return fn

    return mark


# -- the one voice ---------------------------------------------------------------------------

_FIRST_NOTE = re.compile(
    r"The first Inf/NaN \((\S+) #(\d+)\) (is harmful too|was benign|was handled"
    r"|is not what made the harmful values|is not in the cause's lineage)"
)
# What each wording claims of the first Inf/NaN's lineage.
_CLAIM = {
    "is harmful too": {"harmful"},
    "was benign": {"benign"},
    "was handled": {"handled"},
    "is not what made the harmful values": {"benign", "handled"},
}
_SHOWN = re.compile(r"^(.+?): (\S+) #(\d+), shown above in the (.+?) box$", re.MULTILINE)
_BOX_FIELD = {"Cause": "cause", "Origin": "origin", "First -inf/+inf": "first_inf"}


def contradictions(report: dict[str, Any], text: str = "", status: int | None = None) -> list[str]:
    """Every place where the report says two things of one verdict (empty: one voice)."""
    out: list[str] = []
    lineages = report["lineages"]
    kinds = {(g["birth"]["op_type"], g["birth"]["index"]): g["kind"] for g in lineages}
    harmful = report["found_harmful"]
    notes = report["notes"]
    if harmful != (report["verdict"] == "harmful"):
        out.append(f"found_harmful {harmful} but verdict {report['verdict']}")
    if status is not None and (status == 1) != harmful:
        out.append(f"exit status {status} but found_harmful {harmful}")
    if harmful != any(g["kind"] == "harmful" for g in lineages) and lineages:
        out.append(f"found_harmful {harmful} but the lineage list says otherwise")
    if harmful != (report["cause"] is not None) and lineages:
        out.append(f"found_harmful {harmful} but cause {report['cause'] is not None}")
    for note in notes:
        if "nothing harmful" in note.lower() and harmful:
            out.append(f"harmful, yet a note says nothing harmful: {note}")
        m = _FIRST_NOTE.search(note)
        if m is None:
            continue
        op, index, claim = m.group(1), int(m.group(2)), m.group(3)
        kind = kinds.get((op, index))
        if claim in _CLAIM and kind not in _CLAIM[claim]:
            out.append(f"a note says {op} #{index} {claim}, the lineage list says {kind}")
    headline = report["headline"] or ""
    if harmful and (headline.startswith(("no harmful", "no verdict")) or not headline):
        out.append(f"harmful, yet the headline is {headline!r}")
    if not harmful and report["found_nonfinite"] and not headline.startswith(("no ", "no:")):
        out.append(f"nothing harmful, yet the headline is {headline!r}")
    cause = report["cause"]
    if cause is not None:
        if cause["op_type"] not in headline:
            out.append(f"the headline does not name the cause {cause['op_type']}")
        if "intentional mask" in (cause.get("explanation") or ""):
            out.append(f"a harmful cause explained as an intended mask: {cause['explanation']}")
        evicted = [g for g in lineages if g.get("birth_evicted")]
        if (report.get("cause_evicted") is not None) != bool(evicted):
            out.append("cause_evicted and the lineage list's evicted birth disagree")
        for g in evicted:
            if g["birth"]["index"] != cause["index"] or g["kind"] != "harmful":
                out.append("the evicted lineage is not the cause's")
    for g in lineages:
        if g["kind"] == "harmful" and "intentional mask" in g["birth"]["explanation"]:
            out.append(f"a harmful birth explained as an intended mask: {g['birth']['op_type']}")
    if text:
        if "the event above" in text:
            out.append("the text says 'the event above' without naming the box")
        if harmful and headline and f"✗ {headline[:60]}" not in text.replace("\n", " "):
            out.append("the text report does not print the headline")
        for m in _SHOWN.finditer(text):
            title, index, box = m.group(1), int(m.group(3)), m.group(4)
            field = _BOX_FIELD.get(box)
            if f"╭─ {box}" not in text[: m.start()]:
                out.append(f"{title} refers to the {box} box, which is not above it")
            elif field is None or (report[field] or {}).get("index") != index:
                out.append(f"{title} says #{index} is in the {box} box; it is not")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("program", [p for p in PROGRAMS_RUN if not p.endswith("_whole")])
def test_no_sentence_contradicts_the_lineages(
    reports: dict[str, Future[Report]], program: str
) -> None:
    r = report_of(reports, program)
    assert contradictions(r.data, r.text, r.status) == [], (r.data["notes"], r.data["headline"])


def test_the_checker_catches_what_the_report_used_to_say() -> None:
    """The log-of-softmax report before issue 30, and an evicted birth before issue 38."""
    event = {"op_type": "aten.log.default", "index": 13, "explanation": "log of zero"}
    div = {"op_type": "aten.div.Tensor", "index": 17, "explanation": "0/0 in div"}
    old = {
        "verdict": "harmful", "found_harmful": True, "found_nonfinite": True,
        "headline": "aten.div.Tensor produced NaN at step 0: 0/0", "cause": div,
        "origin": event, "first_inf": event,
        "lineages": [{"kind": "harmful", "birth": event}, {"kind": "harmful", "birth": div}],
        "notes": ["The first Inf/NaN (aten.log.default #13) is not what made the harmful "
                  "values: the cause is aten.div.Tensor #17, born separately."],
    }  # fmt: skip
    assert len(contradictions(old)) == 1
    assert any(
        s.startswith("the text says") for s in contradictions(old, "First NaN: the event above")
    )
    evicted = {
        **old, "cause": None, "headline": None, "lineages": [{"kind": "benign", "birth": event}],
        "notes": ["Every Inf/NaN recorded was absorbed by a later op or handled by the program "
                  "(see the lineages): nothing harmful."],
    }  # fmt: skip
    said = contradictions(evicted, status=1)
    assert any("nothing harmful" in s for s in said) and any("headline" in s for s in said)


# -- what each program is for ----------------------------------------------------------------


def marked_line(path: Path, marker: str) -> int:
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if marker in line:
            return n
    raise AssertionError(marker)


@pytest.mark.slow
@uses("log_of_softmax")
def test_a_backward_cause_leads_with_the_forward_line(reports: dict[str, Future[Report]]) -> None:
    r = report_of(reports, "log_of_softmax")
    program = PROGRAMS / "log_of_softmax.py"
    forward = marked_line(program, "# <- forward")
    backward = marked_line(program, "# <- the backward div")
    cause = r.data["cause"]
    assert cause["op_type"] == "aten.div.Tensor" and cause["phase"] == "backward"
    assert cause["forward_op"] == "aten.log.default"
    assert cause["forward_source"]["line"] == forward and cause["source"]["line"] == backward
    assert r.data["first_nan"]["index"] == cause["index"]
    # The headline and the first source line shown are the forward line.
    assert r.data["headline"].startswith(f"log_of_softmax.py:{forward} `logp = torch.log(probs)")
    lines = re.findall(r"log_of_softmax\.py:(\d+)", r.text)
    assert lines and int(lines[0]) == forward, lines
    # The forward log is harmful too (its -inf reaches the loss), and the note says so.
    origin = r.data["origin"]
    assert origin["op_type"] == "aten.log.default"
    assert any(
        f"(aten.log.default #{origin['index']}) is harmful too" in n for n in r.data["notes"]
    )
    assert f"First NaN: aten.div.Tensor #{cause['index']}, shown above in the Cause box" in r.text


@pytest.mark.slow
@uses("evicted_birth", "evicted_birth_whole")
def test_an_evicted_birth_is_still_the_harm(reports: dict[str, Future[Report]]) -> None:
    """Born at step 10, carried as +inf to step 60's NaN: a buffer of 200 drops the birth."""
    r = report_of(reports, "evicted_birth")
    whole = report_of(reports, "evicted_birth_whole").data
    program = PROGRAMS / "evicted_birth.py"
    # The truth, from the whole recording: exp at the birth line, at step 10.
    born = whole["cause"]
    assert (born["op_type"], born["source"]["line"], born["step"]) == (
        "aten.exp.default", marked_line(program, "# <- birth"), 10,
    )  # fmt: skip
    assert whole["cause_evicted"] is None and whole["evicted"]["execution"] == 0
    data = r.data
    assert data["evicted"]["execution"] > 0
    assert data["verdict"] == "harmful" and data["exit_status"] == 1 and r.status == 1
    assert data["found_harmful"] is True
    lost = data["cause_evicted"]
    assert lost is not None and lost["events"] > 0 and lost["kind"] == "execution"
    assert lost["steps"][0] <= born["step"] <= lost["steps"][1]
    # The cause is the earliest kept event of those values, after the lost steps; the first
    # NaN (and its explanation) is the whole recording's.
    cause = data["cause"]
    assert cause is not None and cause["step"] >= lost["steps"][1]
    assert "circular buffer dropped" in cause["explanation"]
    assert (data["first_nan"]["op_type"], data["first_nan"]["step"]) == ("aten.sub.Tensor", 60)
    assert data["first_nan"]["explanation"] == whole["first_nan"]["explanation"]
    assert any(g["birth_evicted"] and g["kind"] == "harmful" for g in data["lineages"])
    assert "dropped" in data["headline"] and f"steps {lost['steps'][0]}–" in data["headline"]
    assert not any("nothing harmful" in n.lower() for n in data["notes"])
    assert "Cause: its birth was dropped by the circular buffer" in r.text


@pytest.mark.slow
@uses("hf_trainer_fp16")
def test_under_a_trainer_the_library_frame_is_shown(reports: dict[str, Future[Report]]) -> None:
    """The user's only line is ``trainer.train()``: the cause also names where in the
    optimizer's code the op ran."""
    r = report_of(reports, "hf_trainer_fp16")
    cause = r.data["cause"]
    assert cause["op_type"] == "aten.addcdiv_.default"
    assert cause["source"]["code"] == "trainer.train()"
    lib = cause["library_source"]
    assert lib is not None and re.search(r"torch[\\/]optim[\\/]adamw?\.py$", lib["file"]), lib
    assert f"in library code: {lib['file']}:{lib['line']}" in r.text.replace("\n", "")


def test_library_frame_skips_the_plumbing() -> None:
    site = "/venv/lib/python3.11/site-packages"
    stack = [
        Source("/home/me/train.py", 40, "<module>"),
        Source(f"{site}/transformers/trainer.py", 2000, "train"),
        Source(f"{site}/torch/nn/modules/module.py", 1700, "_call_impl"),
        Source(f"{site}/transformers/models/gpt2/modeling_gpt2.py", 201, "forward"),
        Source(f"{site}/torch/nn/modules/normalization.py", 228, "forward"),
        Source(f"{site}/torch/nn/functional.py", 2100, "layer_norm"),
        Source("/usr/lib/python3.11/contextlib.py", 81, "inner"),
    ]
    lib = library_frame(stack)
    assert lib is not None and (Path(lib.file).name, lib.line) == ("modeling_gpt2.py", 201)
    # The user's own code called the op (through plumbing only): no library frame.
    assert library_frame([stack[0], stack[2], stack[4], stack[5]]) is None
    # Library frames above the user's own frame (the program's launcher) do not count.
    assert library_frame([stack[3], stack[0]]) is None


def test_harm_with_no_lineage_to_follow_is_said_harmful_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no lineage could be followed (events that could not be decoded), the dump is
    harmful to be safe: the headline and the notes say so, never "nothing harmful"."""
    from nanscope.analysis import _rootcause, analyze
    from nanscope.events import DumpWriter, ExecutionEvent
    from nanscope.reader import open_dump
    from nanscope.report import report_json

    from ..helpers import full_health

    w = DumpWriter(tmp_path / "dump", "FULL_HEALTH", -1, run_id="r", framework="torch")
    stack = w.capture_stack()
    for i in range(3):
        h = full_health(neg_inf=2 if i == 2 else 0)
        w.write_execution(
            ExecutionEvent("aten.log.default", [i + 1], [i], summaries=[h], stack=stack, step=i)
        )
    w.close()
    monkeypatch.setattr(_rootcause, "find_lineages", lambda reader, skip=None: ([], True))
    a = analyze(open_dump(tmp_path / "dump"))
    data = report_json(a)
    assert data["verdict"] == "harmful" and data["found_harmful"] is True
    assert contradictions(data, status=a.exit_status) == []
    assert data["headline"] and "harmful" in data["headline"]
    assert any("could not be followed" in n for n in data["notes"])
