"""TensorFlow: its own Debugger V2 dumping, which nanscope reads and windows."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

# check_numerics for TensorFlow lives in its own module; imported here, where it was.
from nanscope.backends.tf_check_numerics import TensorFlowCheckNumerics
from nanscope.events import _lifecycle as lifecycle
from nanscope.format import files

if TYPE_CHECKING:
    from nanscope.backends import DumpSettings

__all__ = ["TensorFlowCheckNumerics", "TensorFlowDumpSession", "start_checking", "start_dump"]


def start_dump(settings: DumpSettings, options: dict[str, Any]) -> TensorFlowDumpSession:
    """TensorFlow's own dumping into ``settings.logdir`` (the backend's entry point,
    :class:`nanscope.backends.Entry`)."""
    return TensorFlowDumpSession(settings, options)


def start_checking(sync_every: int) -> TensorFlowCheckNumerics:
    """check_numerics through an op callback (``sync_every`` is PyTorch's: every op is
    looked at)."""
    return TensorFlowCheckNumerics()


class TensorFlowDumpSession:
    """TensorFlow's own dumping into ``settings.logdir``, kept the way nanscope keeps events.

    TensorFlow writes the whole history into the logdir as the program runs (flushed
    every ``flush_interval`` seconds, so that a killed process leaves what it had); when
    recording ends (:meth:`close`: ``disable_dump_debug_info``, the program's exit, an
    uncaught exception, SIGTERM or SIGINT), :mod:`nanscope.backends.tf_spool` keeps of it
    what a circular buffer of ``settings.circular_buffer_size`` keeps in nanscope's own
    writer: the last events and windows around the first Inf/NaN (docs/TENSORFLOW.md).
    ``options``: ``origin_window`` and ``flush_interval``, as for nanscope's writer.
    """

    framework = "tensorflow"

    def __init__(self, settings: Any, options: dict[str, Any]) -> None:
        import tensorflow as tf

        from nanscope.backends import tf_spool

        options = dict(options)
        self._window = int(options.pop("origin_window", tf_spool.ORIGIN_WINDOW))
        interval = float(options.pop("flush_interval", 1.0))
        if options:
            raise ValueError(
                f"options {sorted(options)} apply to nanscope's writer, not TensorFlow's dumping"
            )
        self._tf = tf
        self._capacity = int(settings.circular_buffer_size)
        self._lock = threading.Lock()
        self._closed = False
        # The whole history, whatever the buffer asked for: windowed when recording ends.
        self.writer = tf.debugging.experimental.enable_dump_debug_info(
            settings.logdir,
            tensor_debug_mode=settings.mode.name,
            circular_buffer_size=-1,
            op_regex=settings.op_regex,
            tensor_dtypes=settings.tensor_dtypes,
        )
        # TensorFlow's dumping is on from here: whatever goes wrong below leaves it on, and
        # the whole history kept as TensorFlow writes it.
        self._file_set: files.FileSet | None = None
        run_id = getattr(self.writer, "_tfdbg_run_id", None)
        try:
            # Found by an absolute path: the program may change its working directory.
            logdir = os.path.abspath(settings.logdir)
            if isinstance(run_id, str):
                self._file_set = tf_spool.find_file_set(logdir, run_id)
            if self._file_set is None:
                raise ValueError("TensorFlow's file set was not found")
            tf_spool.start(self._file_set, settings.mode, self._capacity)
        except Exception as exc:
            self._file_set = None
            print(
                f"nanscope: keeping TensorFlow's whole history in {settings.logdir} as it "
                f"writes it ({type(exc).__name__}: {exc})",
                file=sys.stderr,
            )
        self._stop = threading.Event()
        self._flusher = threading.Thread(
            target=self._flush_every, args=(interval,), name="nanscope-tf-flush", daemon=True
        )
        self._flusher.start()
        # Closed (windowed) at exit, on an uncaught exception, SIGTERM and SIGINT.
        lifecycle.register(self)

    def _flush_every(self, interval: float) -> None:
        """Push TensorFlow's buffered records to the files now and then: a process killed
        by SIGKILL or the OOM killer then loses at most the last ``interval`` seconds."""
        while not self._stop.wait(interval):
            with contextlib.suppress(Exception):
                self.flush()

    def flush(self, timeout: float | None = None) -> bool:
        """Write what TensorFlow holds in memory to the files (the whole history so far)."""
        with self._lock:
            if not self._closed:
                self.writer.FlushNonExecutionFiles()
                self.writer.FlushExecutionFiles()
        return True

    def close(self) -> None:
        """Stop TensorFlow's dumping and keep of the history what the buffer keeps."""
        from nanscope.backends import tf_spool

        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        lifecycle.unregister(self)
        self._tf.debugging.experimental.disable_dump_debug_info()
        # Closes the files even where disable did nothing (TensorFlow's dumping is per
        # thread: this may run on another); closing twice does nothing.
        self.writer.Close()
        if self._file_set is None:
            return
        try:
            tf_spool.finish(self._file_set, self._capacity, self._window)
        except Exception as exc:  # the whole history stays: a bigger dump, not a lost one
            print(
                f"nanscope: kept TensorFlow's whole history in {self._file_set.prefix}.*: "
                f"could not window it ({type(exc).__name__}: {exc})",
                file=sys.stderr,
            )
