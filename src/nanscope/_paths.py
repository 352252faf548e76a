"""Telling the user's code from libraries, in live stacks and in recorded ones.

Recorded paths may come from another machine, so the test is on the shape of
the path (``site-packages``, ``lib/pythonX.Y``), not only on this
interpreter's own directories.
"""

from __future__ import annotations

import os
import re
import sysconfig

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# nanscope's own example programs are user code as far as stacks are concerned.
USER_CODE_IN_PACKAGE = (os.path.join(PACKAGE_DIR, "examples") + os.sep,)
_LIBRARY_DIRS = tuple(
    os.path.abspath(p) + os.sep
    for p in {
        sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")
    }
    if p
)
_LIBRARY_SHAPE = re.compile(
    r"[\\/](site-packages|dist-packages)[\\/]|[\\/]lib[\\/]python\d+(\.\d+)?[\\/]"
)


def is_library_file(path: str) -> bool:
    """True for the standard library, installed packages and synthetic files."""
    if not path or path.startswith("<"):
        return True
    p = os.path.abspath(path)
    if p.startswith(USER_CODE_IN_PACKAGE):
        return False
    return bool(_LIBRARY_SHAPE.search(p)) or p.startswith(_LIBRARY_DIRS)


# What starts a program and is no part of it: nanscope's console script (``bin/nanscope``;
# on Windows the ``__main__.py`` inside ``Scripts\nanscope.exe``) and the standard library's
# runpy, through which ``nanscope run`` and ``python -m`` run the program.
_LAUNCHER_SHAPE = re.compile(
    r"[\\/](bin|Scripts)[\\/]nanscope(\.exe[\\/]__main__\.py|-script\.pyw?)?$"
    r"|[\\/]lib[\\/]python\d+(\.\d+)?[\\/]runpy\.py$"
)
_RUNPY = os.path.join(sysconfig.get_paths().get("stdlib", ""), "runpy.py")


def is_launcher_file(path: str) -> bool:
    """True for what starts a program under nanscope: its console script, and runpy.

    Their frames sit under every frame of a program run by ``nanscope run``
    (with ``python script.py`` they are not there; with ``python -m`` runpy's
    are Python's own launcher).
    """
    if not path or path.startswith("<"):
        return path == "<frozen runpy>"  # Python 3.11+ freezes runpy
    p = os.path.abspath(path)
    return p == _RUNPY or bool(_LAUNCHER_SHAPE.search(p))


def is_nanscope_file(path: str) -> bool:
    """True for nanscope's own machinery, whose frames are left out of recorded stacks.

    The launchers are part of it (:func:`is_launcher_file`): never the
    program's source, never a frame of its stacks.
    """
    p = os.path.abspath(path)
    return (
        p.startswith(PACKAGE_DIR + os.sep) and not p.startswith(USER_CODE_IN_PACKAGE)
    ) or is_launcher_file(path)


def is_user_file(path: str) -> bool:
    return not is_library_file(path) and not is_nanscope_file(path)
