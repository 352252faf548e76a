"""The harness the bench scripts share: child processes, their environment, peak memory, tables.

Every measurement runs in a fresh child Python process, so that its peak memory
(``ru_maxrss``) is its own: the parents import nothing heavy (no numpy, nanscope,
PyTorch or TensorFlow) and cannot inflate it. A child is a function of a module
in bench/, listed in that module's ``CHILDREN`` (``kind -> function(cfg) -> result``).
:func:`start_child` runs it from a few-line ``python -c`` stub, so that the Python
stack under the child's work is a short script's (a stub, then functions), or as
``python SCRIPT --child KIND CFG``; the child's result comes back as one JSON line
tagged with :data:`RESULT_TAG` on its stdout. Imported as a sibling: ``python bench/x.py`` puts
bench/ first on ``sys.path``, and so does importing the package (``python -m bench``, see
bench/__init__.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULT_TAG = "BENCH-RESULT "

# -- the children's environment -----------------------------------------------------------------

# The readers' and writers' children: TensorFlow's C++ logging off, output unbuffered.
QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
# Timing children: one compute thread for every framework (see pin_torch_threads and
# pin_tf_threads for the settings made inside the child), warnings off.
ONE_THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_NUM_INTEROP_THREADS": "1",
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "PYTHONWARNINGS": "ignore",
}


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with ``extra`` on top: what a child starts with."""
    return {**os.environ, **(extra or {})}


def pin_torch_threads() -> Any:
    """Import PyTorch in a child and give it one compute thread; returns the module."""
    import torch

    torch.set_num_threads(1)
    with contextlib.suppress(RuntimeError):  # already set in this process
        torch.set_num_interop_threads(1)
    return torch


def pin_tf_threads() -> Any:
    """Import TensorFlow in a child with one intra- and one inter-op thread; returns it."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    return tf


def use_head_snapshot(root: Path) -> str:
    """Make every later child import ``src/`` of the commit at HEAD; returns the source line.

    ``src/`` is extracted under ``root`` (``git archive``; the repository and its
    working tree are only read) and put first on the children's ``PYTHONPATH``, so
    that edits to the working tree during a run cannot leak into the figures.
    """
    import io
    import shutil
    import tarfile

    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dest = root / f"nanscope-{sha}"
    if not (dest / "src" / "nanscope" / "__init__.py").exists():
        shutil.rmtree(dest, ignore_errors=True)
        blob = subprocess.run(
            ["git", "archive", "HEAD", "src"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            tar.extractall(dest, filter="data")
    snap = dest / "src"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(snap), os.environ.get("PYTHONPATH", "")) if p
    )
    return f"src/ of commit {sha} (git archive HEAD, extracted to {snap})"


# -- the child's side -----------------------------------------------------------------------------


def peak_rss_mib() -> float:
    """This process's peak resident memory (``ru_maxrss``), in MiB."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def vm_hwm_mib() -> float | None:
    """This process's peak resident memory as /proc says it (``VmHWM``), in MiB, if known."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def nanscope_location() -> str:
    """The directory a child imported nanscope from (the working tree, or a snapshot)."""
    import nanscope

    return os.path.dirname(os.path.abspath(nanscope.__file__))


def with_peak_memory(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with this process's ``peak_rss_mib`` and ``vm_hwm_mib`` added (a child's last step)."""
    result["peak_rss_mib"] = peak_rss_mib()
    result["vm_hwm_mib"] = vm_hwm_mib()
    return result


def send_result(result: Any) -> None:
    """Print a child's result for the parent: one tagged JSON line on stdout."""
    print(RESULT_TAG + json.dumps(result), flush=True)


# The stub: bench/ on sys.path, then the child function called from the stub's own frame.
_STUB = (
    "import importlib, json, sys\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "from harness import send_result\n"
    "children = importlib.import_module(sys.argv[2]).CHILDREN\n"
    "send_result(children[sys.argv[3]](json.loads(sys.argv[4])))\n"
)


# -- the parent's side ----------------------------------------------------------------------------


def log(msg: str) -> None:
    """A progress line on stderr, with the time of day."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class ChildFailed(Exception):
    """A child exited with an error, printed no result, or ran out of time."""

    def __init__(
        self, label: str, message: str, reason: str, wall_s: float, output: str, timed_out: bool
    ) -> None:
        super().__init__(f"child {label} failed ({reason})")
        self.label = label
        self.message = message  # the last line the child wrote to stderr, else ``reason``
        self.reason = reason  # "exit N", or "did not finish in N s"
        self.wall_s = wall_s
        self.output = output  # the tails of its stdout and stderr (captured ones only)
        self.timed_out = timed_out

    def exit(self) -> NoReturn:
        """Show the child's output and stop the parent."""
        sys.stderr.write(self.output)
        raise SystemExit(str(self))


class Child:
    """A started child; :meth:`wait` collects its result."""

    def __init__(self, cmd: list[str], label: str, env: dict[str, str], capture_stderr: bool):
        self.label = label
        self.started = time.perf_counter()
        self.wall_s = 0.0
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if capture_stderr else None,
            text=True,
            env=env,
        )

    def wait(self, timeout: float | None = None) -> Any:
        """The child's result; raises :class:`ChildFailed` (killing it after ``timeout`` s)."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            self.wall_s = time.perf_counter() - self.started
            reason = f"did not finish in {timeout:.0f} s"
            raise ChildFailed(self.label, reason, reason, self.wall_s, "", True) from None
        self.wall_s = time.perf_counter() - self.started
        err = err or ""
        lines = [ln for ln in out.splitlines() if ln.startswith(RESULT_TAG)]
        if self.proc.returncode != 0 or not lines:
            reason = f"exit {self.proc.returncode}"
            tail = [ln for ln in err.strip().splitlines() if ln.strip()]
            raise ChildFailed(
                self.label,
                tail[-1] if tail else reason,
                reason,
                self.wall_s,
                out[-4000:] + err[-4000:],
                False,
            )
        return json.loads(lines[-1][len(RESULT_TAG) :])


def start_child(
    module: str,
    kind: str,
    cfg: Mapping[str, Any],
    *,
    env: Mapping[str, str] = QUIET_ENV,
    label: str | None = None,
    capture_stderr: bool = True,
    script: Path | None = None,
) -> Child:
    """Start ``CHILDREN[kind](cfg)`` of ``bench/<module>.py`` in a fresh Python.

    ``env`` is added to this process's environment. The child starts from the
    stub; with ``script``, as ``python SCRIPT --child KIND CFG`` instead, where
    the script's ``main`` calls the child and :func:`send_result` itself (so that
    the stack under the child is the script's ``<module>`` and ``main`` frames,
    as where a dump's recorded stacks must keep that shape). With
    ``capture_stderr`` false, the child's stderr (its progress lines) goes to
    this process's.
    """
    if script is not None:
        cmd = [sys.executable, str(script), "--child", kind, json.dumps(cfg)]
    else:
        cmd = [sys.executable, "-c", _STUB, str(BENCH), module, kind, json.dumps(cfg)]
    return Child(cmd, label or f"{module} {kind}", child_env(env), capture_stderr)


def run_child(
    module: str, kind: str, cfg: Mapping[str, Any], *, timeout: float | None = None, **kw: Any
) -> Any:
    """Run one child (see :func:`start_child`) and return its result."""
    return start_child(module, kind, cfg, **kw).wait(timeout)


def run_timed(
    module: str, kind: str, cfg: Mapping[str, Any], *, timeout: float | None = None, **kw: Any
) -> dict[str, Any]:
    """Run one child whose result is a dict, adding its wall time as ``wall_s``."""
    child = start_child(module, kind, cfg, **kw)
    result: dict[str, Any] = child.wait(timeout)
    result["wall_s"] = child.wall_s
    return result


# -- result tables --------------------------------------------------------------------------------


def source_state() -> str:
    """The commit measured, and whether src/ had uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"], cwd=ROOT, capture_output=True, text=True
        ).stdout.split("\n")
    except OSError:
        return "unknown (no git)"
    changed = [ln[3:] for ln in dirty if ln.strip()]
    return f"git {head or '?'}" + (
        f" + uncommitted changes in {', '.join(changed)}" if changed else " (src/ clean)"
    )


def source_line(start: str, end: str) -> str:
    """The measured-commit line of a table: the source at the start, and a warning if it changed."""
    changed = "" if end == start else f"; WARNING, at the end: {end}"
    return f"Source: {start}{changed}"


def machine() -> str:
    """The machine, for a table's header: architecture, CPUs, Python version."""
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def median_of(results: Iterable[Mapping[str, Any]], field: str) -> float | None:
    """The median of ``field`` over the results that have it (failed children left out)."""
    vals = [r[field] for r in results if "error" not in r and r.get(field) is not None]
    return statistics.median(vals) if vals else None


def fmt_s(x: float | None) -> str:
    """Seconds for a table: 3 decimals below 10 s, "-" when not measured."""
    if x is None:
        return "-"
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def fmt_mib(x: float | None) -> str:
    """MiB for a table, whole numbers, "-" when not measured."""
    return "-" if x is None else f"{x:,.0f}"


def fmt_ratio(num: float | None, den: float | None, spec: str | None = None) -> str:
    """``num / den`` as "2.5x" (``spec``; default one decimal, none from 100x), "-" when missing."""
    if num is None or den is None or den <= 0:
        return "-"
    r = num / den
    if spec is None:
        spec = ",.0f" if r >= 100 else ".1f"
    return f"{r:{spec}}x"


def table_row(cells: Sequence[object]) -> str:
    """One markdown table row."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table_head(cells: Sequence[str], numeric: bool = True) -> list[str]:
    """A markdown table's header and rule; ``numeric`` right-aligns all columns but the first."""
    rule = "|---|" + ("---:|" if numeric else "---|") * (len(cells) - 1)
    return [table_row(cells), rule]
