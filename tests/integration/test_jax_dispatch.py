"""How a recorded JAX program runs: what JAX itself does around a call must not change.

nanscope runs each instrumented executable itself after its first call (skipping JAX's
input handling when it would change nothing), and keeps glibc's freed memory while it
records on the CPU. Neither may change what the user's program sees: donated arguments are
donated, ``jax_debug_nans`` still raises at a NaN, results are plain JAX's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("optax")
pytest.importorskip("flax")

import nanscope  # noqa: E402
from nanscope.backends.jax import heap  # noqa: E402
from nanscope.reader import DumpReader  # noqa: E402
from tests.jax_programs import PROGRAMS  # noqa: E402


@pytest.mark.parametrize("mode", ["NO_TENSOR", "FULL_HEALTH"])
def test_donated_arguments_are_donated_as_without_nanscope(mode: str, tmp_path: Path) -> None:
    training = PROGRAMS["mlp"].build(steps=4)

    def train() -> tuple[list[float], list[bool]]:
        step = jax.jit(training.train_step, donate_argnums=(0, 1))
        # Fresh copies: donation deletes what it is given.
        params = jax.tree_util.tree_map(lambda a: a.copy(), training.params)
        opt_state = jax.tree_util.tree_map(lambda a: a.copy(), training.opt_state)
        losses, deleted = [], []
        for batch in training.batches:
            before = params
            params, opt_state, loss = step(params, opt_state, *batch)
            losses.append(float(loss))
            deleted.append(all(a.is_deleted() for a in jax.tree_util.tree_leaves(before)))
        return losses, deleted

    plain_losses, plain_deleted = train()
    with nanscope.enable_dump_debug_info(
        tmp_path, framework="jax", circular_buffer_size=-1, tensor_debug_mode=mode
    ):
        losses, deleted = train()
    np.testing.assert_array_equal(losses, plain_losses)
    assert plain_deleted == [True] * 4
    if mode == "NO_TENSOR":
        # Nothing to replay: the program donates as the user asked, at every call (the
        # later ones run the executable without JAX's input handling).
        assert deleted == plain_deleted
    else:
        # A guarded program keeps its arguments for a replay (docs/JAX.md).
        assert deleted == [False] * 4
    with DumpReader(tmp_path) as reader:
        assert len(reader.executions()) >= 4


def test_jax_debug_nans_still_raises_while_recording(tmp_path: Path) -> None:
    import jax.numpy as jnp

    def divide_by_sum(x: Any) -> Any:
        return x / x.sum()

    normalise = jax.jit(divide_by_sum)

    healthy = jnp.arange(1.0, 5.0)
    zeros = jnp.zeros(4)  # 0 / 0: NaN, with the healthy calls' signature
    jax.config.update("jax_debug_nans", True)
    try:
        with nanscope.enable_dump_debug_info(
            tmp_path, framework="jax", circular_buffer_size=-1, tensor_debug_mode="NO_TENSOR"
        ):
            for _ in range(3):  # the later calls run nanscope's cached executable
                np.testing.assert_allclose(normalise(healthy), np.arange(1.0, 5.0) / 10.0)
            with pytest.raises(FloatingPointError):
                normalise(zeros)
    finally:
        jax.config.update("jax_debug_nans", False)


def test_the_heap_is_left_to_a_user_who_set_it(monkeypatch: pytest.MonkeyPatch) -> None:
    if os.uname().sysname != "Linux":
        pytest.skip("glibc's heap: Linux only")
    # Nobody set it: nanscope keeps freed memory while recording, and gives the
    # setting back when the last user lets go.
    assert heap.keep()
    heap.release()
    monkeypatch.setenv("MALLOC_TOP_PAD_", str(1 << 20))
    assert not heap.keep()
    monkeypatch.delenv("MALLOC_TOP_PAD_")
    monkeypatch.setenv("NANSCOPE_JAX_HEAP", "0")
    assert not heap.keep()
