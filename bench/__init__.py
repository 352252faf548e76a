"""nanscope's benchmarks: one suite per module, each with a ``main(argv)``.

Run a suite as ``python -m bench SUITE [ARGS]`` (``python -m bench`` lists them, see
bench/__main__.py), or as before as ``python bench/SUITE.py [ARGS]`` or
``python -m bench.SUITE [ARGS]``, from the repository root with ``PYTHONPATH=src``.
The figures, and the command that gave each, are in bench/RESULTS.md.

The modules import each other by their plain names (``from harness import ...``), as a
script in bench/ finds its siblings, and the children that bench/harness.py starts
import them the same way. Importing the package therefore puts bench/ first on
``sys.path``, as running a script in it does, so that ``python -m bench ...`` finds them too.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
