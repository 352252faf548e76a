"""Recording the Python processes that a program run by ``nanscope run`` starts.

``nanscope run`` records its own process directly. Its children are new interpreters (a
``torch.multiprocessing.spawn`` worker, a spawn or forkserver ``multiprocessing`` worker, a
``subprocess`` running Python): for them, while the program runs, ``nanscope run`` puts
two variables in its environment, which children inherit:

- ``PYTHONPATH`` gets ``_bootstrap/`` first: its ``sitecustomize.py`` runs at the
  child's startup (and hands over to the next ``sitecustomize`` on the path);
- ``NANSCOPE_RUN_CHILD``: the recording settings (JSON: logdir, mode, circular buffer,
  op regex, check-numerics, run id).

A child that imports a framework then records into the same logdir as its own process,
with its own file set, as each rank under torchrun does; all of them share the run id
(``NANSCOPE_RUN_ID``, set for the run). Both variables are restored when the program
ends, so nothing started after it (in this process) inherits them; they never reach
processes that are not the program's descendants. A child whose interpreter cannot
import nanscope leaves a ``.nsunrecorded`` note in the dump when it imports a framework,
and the report then gives no all-clear (docs/RELIABILITY.md, section 8).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nanscope._imports import AfterImport
from nanscope.backends import RECORDED

if TYPE_CHECKING:
    from nanscope.api import DebugSession

ENV = "NANSCOPE_RUN_CHILD"
BOOTSTRAP_DIR = Path(__file__).resolve().parent / "_bootstrap"


class Recording:
    """Starts recording (or checking) when the program imports a framework nanscope records.

    One per process: ``nanscope run``'s own, and one in each child the bootstrap starts.
    """

    def __init__(
        self,
        logdir: Path,
        mode: Any,
        circular_buffer_size: int,
        op_regex: str | None,
        check_numerics: bool,
        statistics: bool = False,
    ) -> None:
        self.logdir = logdir
        self.statistics = statistics  # FULL_HEALTH's statistics (nanscope run --statistics)
        self.mode = mode
        self.circular_buffer_size = circular_buffer_size
        self.op_regex = op_regex
        self.check_numerics = check_numerics
        self.started: list[str] = []
        self.failed: list[str] = []
        self.sessions: list[DebugSession] = []
        self.run_id: str | None = None  # a child's: the run it belongs to
        # multiprocessing's forkserver: it only forks the workers, which record; it does not.
        self.hold_pid: int | None = None
        self.started_pid = 0
        self.over = False  # nanscope run's program has ended: no more forks to record
        # A worker that multiprocessing forks (fork and forkserver start methods) records
        # on its own: see after_fork.
        import multiprocessing.util

        multiprocessing.util.register_after_fork(self, Recording.after_fork)

    def __call__(self, framework: str) -> None:
        if self.started or self.hold_pid == os.getpid():
            return
        if framework == "jax" and "tensorflow" in sys.modules:
            # TensorFlow imports JAX (when installed) while it is being imported itself:
            # the program is TensorFlow's; its own hook starts recording when done.
            return
        self.started.append(framework)
        self.started_pid = os.getpid()
        import nanscope

        try:
            if self.check_numerics:
                nanscope.enable_check_numerics(framework=framework)
            else:
                self.sessions.append(
                    nanscope.enable_dump_debug_info(
                        self.logdir,
                        self.mode,
                        self.circular_buffer_size,
                        self.op_regex,
                        framework=framework,
                        **({"statistics": True} if self.statistics else {}),
                    )
                )
        except Exception as exc:  # the program runs on, unrecorded: never take it down
            self.failed.append(str(exc) or type(exc).__name__)
            print(f"nanscope: recording is off: {self.failed[0]}", file=sys.stderr)
            if self.run_id is not None and not self.check_numerics:  # a child: say so in the dump
                note_unrecorded(self.logdir, self.run_id, framework, self.failed[0])

    def after_fork(self) -> None:
        """In a worker that multiprocessing forked (called before its target runs): record.

        The session inherited from the parent writes nothing here (its writer let go of
        the parent's files at the fork, and its threads did not come along): it is put
        away, and a new one records this process into the same logdir. The worker ends
        with ``os._exit``, without ``atexit``: multiprocessing's own exit hook closes it.
        """
        import multiprocessing.util

        import nanscope

        if self.over:
            return
        if not (self.started and self.started_pid == os.getpid()):  # else: began here already
            framework = self.started[0] if self.started else _imported()
            self.started, self.failed, self.sessions = [], [], []
            with contextlib.suppress(Exception):
                nanscope.disable_dump_debug_info()
            if framework is not None:
                self(framework)
        multiprocessing.util.Finalize(self, self.stop, exitpriority=-100)

    def stop(self) -> None:
        """Stop recording in this process (a child): the writers flush and close."""
        _stop_child(self)

    def watch(self) -> AfterImport | None:
        """Start now if the program already imported a framework, else when it does: the
        finder that waits for that (None when started already)."""
        framework = _imported()
        if framework is not None:
            self(framework)
            return None
        return AfterImport(RECORDED, self)

    def settings(self, run_id: str) -> dict[str, Any]:
        """What a child needs to record the same way (``NANSCOPE_RUN_CHILD``)."""
        return {
            "logdir": str(self.logdir.resolve()),
            "mode": self.mode.name,
            "circular_buffer_size": self.circular_buffer_size,
            "op_regex": self.op_regex,
            "check_numerics": self.check_numerics,
            "statistics": self.statistics,
            "run_id": run_id,
        }


def _imported() -> str | None:
    """The first framework nanscope records that this process has imported."""
    return next((f for f in RECORDED if f in sys.modules), None)


@contextlib.contextmanager
def children_recorded(recording: Recording) -> Iterator[None]:
    """While the program runs: the environment that makes its Python children record.

    The run id is fixed for the run (``NANSCOPE_RUN_ID``, unless a launcher set one), so
    that every process's file set says it belongs to this run.
    """
    from nanscope.events._writer import default_run_id

    names = ("PYTHONPATH", ENV, "NANSCOPE_RUN_ID")
    saved = {name: os.environ.get(name) for name in names}
    run_id = default_run_id()
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOTSTRAP_DIR), path) if p)
    os.environ[ENV] = json.dumps(recording.settings(run_id))
    os.environ["NANSCOPE_RUN_ID"] = run_id
    try:
        yield
    finally:
        recording.over = True
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def start_child(settings: dict[str, Any]) -> AfterImport | None:
    """In a child started by the program (called by the bootstrap): record as the parent
    does, into its logdir; the finder that starts it at the framework's import, if any."""
    from nanscope.format.modes import parse_mode

    recording = Recording(
        Path(settings["logdir"]),
        parse_mode(settings.get("mode") or "FULL_HEALTH"),
        int(settings.get("circular_buffer_size", 1000)),
        settings.get("op_regex"),
        bool(settings.get("check_numerics")),
        bool(settings.get("statistics")),
    )
    recording.run_id = str(settings.get("run_id") or "")
    if recording.run_id:  # inherited from nanscope run, unless the program's env= left it out
        os.environ.setdefault("NANSCOPE_RUN_ID", recording.run_id)
    # The bootstrap's process (not a worker the forkserver forked since) is the forkserver.
    forkserver = "multiprocessing.forkserver" in " ".join(getattr(sys, "orig_argv", sys.argv))
    if forkserver and settings.get("pid") == os.getpid():
        recording.hold_pid = os.getpid()
    atexit.register(_stop_child, recording)  # before the writers' own: runs after them
    return recording.watch()


def note_unrecorded(logdir: Path, run_id: str, framework: str, why: str) -> None:
    """Leave a ``.nsunrecorded`` note in the dump: this process ran unrecorded (as the
    bootstrap does where nanscope cannot be imported)."""
    import secrets
    import socket
    import time

    from nanscope.format import files

    pid = os.getpid()
    host = files.process_host(socket.gethostname(), None, pid, secrets.token_hex(3))
    prefix = files.file_set_prefix(logdir, time.time(), host)
    path = prefix.with_name(f"{prefix.name}.{files.UNRECORDED}")
    note = {
        "pid": pid,
        "host": socket.gethostname(),
        "run_id": run_id,
        "executable": sys.executable,
        "argv": list(getattr(sys, "orig_argv", sys.argv)),
        "framework": framework,
        "why": why,
    }
    try:
        logdir.mkdir(parents=True, exist_ok=True)
        with open(path, "x", encoding="utf-8") as f:
            json.dump(note, f)
    except OSError as exc:
        print(f"nanscope: could not note an unrecorded process: {exc}", file=sys.stderr)


def _stop_child(recording: Recording) -> None:
    """At the child's exit: stop recording (the writers flush and close)."""
    if not recording.started or recording.failed:
        return
    import nanscope
    from nanscope.events import _lifecycle

    if not recording.check_numerics:
        # A pool's worker that ends on its own may be sent SIGTERM meanwhile: the signal
        # waits until the dump is closed.
        with _lifecycle.closing():
            nanscope.disable_dump_debug_info()
        return
    try:
        nanscope.disable_check_numerics()
    except nanscope.NonFiniteError as exc:
        print("".join(traceback.format_exception_only(exc)), end="", file=sys.stderr)
