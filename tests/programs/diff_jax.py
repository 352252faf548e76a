"""The flax Transformer LM of tests/jax_programs.py, two training steps, recorded by nanscope.

``diff_jax.py LOGDIR``: one run of a pair that differs only in the XLA flags the test sets
(``XLA_FLAGS``), for ``nanscope diff`` to compare jaxpr equation by equation.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.*

import nanscope
from tests.jax_programs import build_transformer


def main() -> None:
    training = build_transformer(steps=2)
    session = nanscope.enable_dump_debug_info(sys.argv[1], "FULL_HEALTH", circular_buffer_size=-1)
    training.run(jit=True)
    session.close()


if __name__ == "__main__":
    main()
