"""Real training programs under ``nanscope run``, held against an independent oracle: the
training-loop pieces.

The tests, the oracle and the runs are test_real_programs.py's (its docstring says what each
test holds); this file runs them on the other half of its ``CASES``, so that two test
workers share the programs evenly: loss scaling (GradScaler), gradient clipping and the
optimizers' in-place writes, masks held across steps and saved, writes through views, and
padded batches with an empty sequence.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

# The tests and fixtures are collected here too, parametrized with this file's cases.
from tests.integration.test_real_programs import (  # noqa: F401
    CASES,
    MODELS,
    _needs,
    lab,
    parametrize_cases,
    test_cause,
    test_check_numerics_runs_healthy_programs_to_the_end,
    test_exit_status,
    test_first_nan,
    test_found_harmful,
    test_headroom,
    test_lineages,
    test_origin,
    test_steps,
    test_story,
)

pytestmark = [pytest.mark.torch, pytest.mark.slow]

LOOPS = [
    "amp", "rnn", "clip_fused", "clip_foreach",
    "word_lm", "mask_buffer", "dataset_log", "rate_view",
    "padded_mha", "padded_manual", "padded_encoder", "padded_healthy",
]  # fmt: skip


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_cases(metafunc, LOOPS)


def test_each_case_runs_in_one_of_the_two_files() -> None:
    """A case added to ``CASES`` but to neither file's list would never run."""
    assert sorted(MODELS + LOOPS) == sorted(CASES)
    assert not set(MODELS) & set(LOOPS)
