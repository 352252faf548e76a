"""check_numerics on the real programs that go wrong: it raises, naming the oracle's cause.

The programs and their stories are ``CASES`` of test_real_programs.py; the healthy ones
run to the end under ``nanscope run --check-numerics`` there. Here each program that
goes wrong runs in this process under ``enable_check_numerics()`` and under
``tests/oracle.py``: the error's birth must be the oracle's cause (op, line, counts).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
import torch

import nanscope
from tests.integration.test_real_programs import CASES, PROGRAMS
from tests.oracle import load_program, run_oracle

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.mark.parametrize("case", [name for name, c in CASES.items() if not c.healthy])
def test_check_numerics_names_the_oracles_cause(case: str) -> None:
    c = CASES[case]
    if not c.available:
        pytest.skip(f"needs {', '.join(c.needs)}")
    path = PROGRAMS / c.program
    cause = run_oracle(path, list(c.args)).cause
    assert cause is not None

    program = load_program(path)
    threads = torch.get_num_threads()
    nanscope.enable_check_numerics()
    try:
        with torch.random.fork_rng(devices=[]), pytest.raises(nanscope.NonFiniteError) as info:
            program.main(list(c.args))
    finally:
        nanscope.disable_check_numerics()
        torch.set_num_threads(threads)

    err = info.value
    birth = err.birth
    assert birth is not None, str(err)
    assert birth.op_type == cause.op, str(err)
    assert birth.source is not None and birth.source[0] == str(path), str(err)
    assert birth.source[1] == cause.line, str(err)
    counts = (birth.counts["neg_inf"], birth.counts["pos_inf"], birth.counts["nan"])
    assert counts == (cause.neg_inf, cause.pos_inf, cause.nan), str(err)
    # Raised at a later op than the birth: the message names the birth. (The birth's counts
    # are all its outputs'; the error's, the output it raised on: LayerNorm's mean, rstd.)
    if (err.op_type, err.source) != (birth.op_type, birth.source):
        assert f"born at {cause.op}" in str(err)
