"""``nanscope run`` on hostile logdirs, programs with hooks of their own, and bad input.

Each test runs the real command in a subprocess, as a user would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

from nanscope import open_dump

# The -inf of log(0), on the program's line 2 in every program below that records.
LOG_ZERO = "import torch\ntorch.log(torch.zeros(2))\n"


def nanscope(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nanscope", *args], cwd=cwd, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def recorded_ops(logdir: Path) -> list[str]:
    with open_dump(logdir) as dump:
        return [e.op_type for e in dump.executions()]


def assert_no_launcher_frames(stderr: str) -> None:
    """A traceback shows the program's frames only, as ``python script.py`` does."""
    assert "nanscope/cli" not in stderr and "runpy" not in stderr, stderr


# --- `--force` on a logdir with links and other things that are no dump's files ---


def test_force_unlinks_links_without_following_them(tmp_path: Path) -> None:
    """A ``tfdbg_events.*`` symlink (to a directory, or dangling) is unlinked itself:
    what it points to keeps its contents, and the new dump is written."""
    elsewhere = tmp_path / "elsewhere"
    write(elsewhere / "keep" / "precious.txt", "data")
    dump = tmp_path / "dump"
    dump.mkdir()
    (dump / "tfdbg_events.1.host").symlink_to(elsewhere, target_is_directory=True)
    (dump / "tfdbg_events.2.host.metadata").symlink_to(tmp_path / "nowhere")
    (dump / "tfdbg_events.3.host.execution").write_text("old")
    write(tmp_path / "prog.py", LOG_ZERO)

    out = nanscope("run", "--force", "--logdir", "dump", "prog.py", cwd=tmp_path)

    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert (elsewhere / "keep" / "precious.txt").read_text() == "data"
    assert not any(p.is_symlink() for p in dump.iterdir())
    assert not (dump / "tfdbg_events.3.host.execution").exists()
    assert "aten.log.default" in recorded_ops(dump)


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_force_refuses_what_is_not_a_dump_file_and_removes_nothing(
    tmp_path: Path, kind: str
) -> None:
    """A directory or a named pipe is no file of a dump: one line, exit 2, nothing
    removed (not even the dump's own files), and the program does not run."""
    dump = tmp_path / "dump"
    odd = dump / "tfdbg_events.1.host"
    if kind == "directory":
        write(odd / "precious.txt", "data")
    else:
        dump.mkdir()
        os.mkfifo(odd)
    (dump / "tfdbg_events.2.host.metadata").write_text("old")
    write(tmp_path / "prog.py", "print('ran')\n")

    out = nanscope("run", "--force", "--logdir", "dump", "prog.py", cwd=tmp_path)

    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0, out.stderr
    assert out.stderr.startswith(f"nanscope run: error: {Path('dump') / odd.name} is a ")
    assert "--force will not delete it" in out.stderr and "--logdir" in out.stderr
    assert "ran" not in out.stdout
    assert (dump / "tfdbg_events.2.host.metadata").read_text() == "old"
    if kind == "directory":
        assert (odd / "precious.txt").read_text() == "data"
    else:
        assert odd.exists()


# --- the program's own exception hooks ---


@pytest.mark.parametrize("when", ["before_torch", "after_torch"])
def test_programs_sys_excepthook_is_called(tmp_path: Path, when: str) -> None:
    """As without nanscope: the program's hook handles its uncaught exception (so the
    default traceback is not printed), the dump is flushed, and the exit status is 1.
    Set before PyTorch is imported, nanscope's own hook chains to it; set after, it
    replaces nanscope's."""
    hook = textwrap.dedent("""
        import os, sys
        def my_hook(tp, value, tb):
            where = os.path.basename(tb.tb_frame.f_code.co_filename)
            print("MY-HOOK", tp.__name__, value, where, flush=True)
        sys.excepthook = my_hook
    """)
    before = hook + LOG_ZERO if when == "before_torch" else LOG_ZERO + hook
    write(tmp_path / "prog.py", before + "raise ValueError('boom')\n")

    out = nanscope("run", "--logdir", "dump", "prog.py", cwd=tmp_path)

    assert out.returncode == 1, out.stderr
    # The traceback handed to the hook begins at the program's frame, not the launcher's.
    assert "MY-HOOK ValueError boom prog.py" in out.stdout, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    assert "nanscope: dump written to dump" in out.stderr
    assert "aten.log.default" in recorded_ops(tmp_path / "dump")


def test_programs_threading_excepthook_is_called(tmp_path: Path) -> None:
    """An exception that ends a thread goes to the program's ``threading.excepthook``,
    and what the thread recorded is in the dump."""
    write(
        tmp_path / "prog.py",
        """\
        import threading
        import torch
        def my_hook(args):
            print("MY-THREAD-HOOK", args.exc_type.__name__, args.thread.name, flush=True)
        threading.excepthook = my_hook
        def work():
            torch.log(torch.zeros(2))
            raise KeyError("in a thread")
        t = threading.Thread(target=work, name="worker")
        t.start()
        t.join()
        """,
    )
    out = nanscope("run", "--logdir", "dump", "prog.py", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "MY-THREAD-HOOK KeyError worker" in out.stdout
    assert "aten.log.default" in recorded_ops(tmp_path / "dump")


def test_recording_waits_for_the_programs_threads(tmp_path: Path) -> None:
    """Python waits for non-daemon threads before it exits: recording must too, or a
    NaN made after the main module returned is missing and the dump looks clean."""
    write(
        tmp_path / "prog.py",
        """\
        import threading, time
        import torch
        def late():
            time.sleep(0.5)
            torch.log(torch.zeros(2))
        threading.Thread(target=late).start()
        """,
    )
    out = nanscope("run", "--logdir", "dump", "prog.py", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "aten.log.default" in recorded_ops(tmp_path / "dump")


# --- bad input, and programs that crash ---


def test_crash_shows_the_programs_traceback_only(tmp_path: Path) -> None:
    write(tmp_path / "prog.py", LOG_ZERO + "raise RuntimeError('boom')\n")
    out = nanscope("run", "--logdir", "dump", "prog.py", cwd=tmp_path)
    assert out.returncode == 1
    assert out.stderr.startswith(
        'Traceback (most recent call last):\n  File "prog.py", line 3, in <module>\n'
    ), out.stderr
    assert "RuntimeError: boom" in out.stderr
    assert_no_launcher_frames(out.stderr)


def test_script_that_does_not_compile_shows_as_python_shows_it(tmp_path: Path) -> None:
    write(tmp_path / "prog.py", "x = (\n")
    out = nanscope("run", "--logdir", "dump", "prog.py", cwd=tmp_path)
    assert out.returncode == 1
    assert out.stderr.startswith('  File "prog.py", line 1\n'), out.stderr
    assert "SyntaxError" in out.stderr
    assert_no_launcher_frames(out.stderr)


@pytest.mark.parametrize(
    ("module", "message"),
    [
        ("no_such_module", "-m no_such_module: No module named no_such_module"),
        ("json", "'json' is a package and cannot be directly executed"),
        ("os.nope", "-m os.nope: Error while finding module specification for 'os.nope'"),
    ],
)
def test_module_that_cannot_run_is_one_clear_line(
    tmp_path: Path, module: str, message: str
) -> None:
    out = nanscope("run", "--logdir", "dump", "-m", module, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.startswith("nanscope run: error: ") and message in out.stderr
    assert out.stderr.strip().count("\n") == 0, out.stderr


def test_import_error_of_the_programs_package_is_the_programs(tmp_path: Path) -> None:
    """Only a module that cannot be found is nanscope's error: an ImportError raised by
    the program's own code while its package is imported is the program's crash."""
    write(tmp_path / "pkg" / "__init__.py", "import not_installed_anywhere\n")
    write(tmp_path / "pkg" / "train.py", "print('ran')\n")
    out = nanscope("run", "--logdir", "dump", "-m", "pkg.train", cwd=tmp_path)
    assert out.returncode == 1
    assert "ModuleNotFoundError: No module named 'not_installed_anywhere'" in out.stderr
    assert "nanscope run: error" not in out.stderr
    assert_no_launcher_frames(out.stderr)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--op-regex", "aten\\.(log", "prog.py"], "--op-regex 'aten\\\\.(log' is not a regular"),
        (["sub"], "sub: is a directory"),
    ],
)
def test_bad_arguments_are_one_clear_line_before_the_program_runs(
    tmp_path: Path, args: list[str], message: str
) -> None:
    """A bad --op-regex used to surface only when the program imported PyTorch: the whole
    run went unrecorded. A directory was called "no such file"."""
    write(tmp_path / "prog.py", LOG_ZERO + "print('ran')\n")
    (tmp_path / "sub").mkdir()
    out = nanscope("run", "--logdir", "dump", *args, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.startswith("nanscope run: error: ") and message in out.stderr, out.stderr
    assert out.stderr.strip().count("\n") == 0, out.stderr
    assert "ran" not in out.stdout and not (tmp_path / "dump").exists()


def test_check_numerics_crash_is_reported_once(tmp_path: Path) -> None:
    """The program died of its own exception: that is the report, with no second
    traceback from nanscope about Inf it had not read yet."""
    write(tmp_path / "prog.py", LOG_ZERO + "raise RuntimeError('boom')\n")
    out = nanscope("run", "--check-numerics", "prog.py", cwd=tmp_path)
    assert out.returncode == 1
    assert "RuntimeError: boom" in out.stderr
    assert "NonFiniteError" not in out.stderr and out.stderr.count("Traceback") == 1
    assert_no_launcher_frames(out.stderr)


def test_check_numerics_unread_at_the_end_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    write(tmp_path / "prog.py", LOG_ZERO + "print('end')\n")
    out = nanscope("run", "--check-numerics", "prog.py", cwd=tmp_path)
    assert out.returncode == 1
    assert out.stdout.strip() == "end"
    assert out.stderr.startswith(
        "nanscope.errors.NonFiniteError: aten.log.default produced -inf"
    ), out.stderr
    assert "no op read them before checking ended" in out.stderr
    assert "Traceback" not in out.stderr
