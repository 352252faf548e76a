"""The replay's dump, read back: the cause its report names, and whether the NaN came back."""

from __future__ import annotations

from pathlib import Path

from nanscope.sentinel._history import Cause

NOT_REPRODUCED = "not reproduced: non-determinism or a transient hardware fault"


def replay_dir_name(step: int) -> str:
    """The replay dump's directory, relative to the sentinel's logdir."""
    return f"replay-step-{step}"


def analyse_replay(dump: Path) -> tuple[Cause | None, bool]:
    """The replay dump's root cause (``None`` when none), and whether it found harmful Inf/NaN."""
    import nanscope
    from nanscope.analysis import analyze
    from nanscope.report import headline

    with nanscope.open_dump(dump) as reader:
        analysis = analyze(reader)
    event = analysis.cause
    if event is None:
        return None, analysis.found_harmful
    words = headline(analysis) or f"harmful Inf/NaN from {event.op_type}"
    source = event.source
    return (
        Cause(
            headline=words,
            op_type=event.op_type,
            file=None if source is None else source.file,
            line=None if source is None else source.line,
            step=event.step,
        ),
        analysis.found_harmful,
    )
