"""FULL_TENSOR on PyTorch programs: the values read back are the values the ops made.

The oracle is independent of nanscope: the same program runs first under this
test's own ``TorchDispatchMode``, which clones every op's outputs as they are
made, then recorded by nanscope. A dispatch mode changes a little of what
autograd runs (it accumulates gradients out of place, saves tensors through
``detach``), so the two op sequences are aligned (``difflib``) and nearly all
ops must pair up. Every paired recorded value, read back through
``nanscope.open_dump`` (and TensorFlow's ``DebugDataReader``), must equal the
clone, for float32, float64, float16 and bfloat16 programs whose outputs
include transposed, sliced, strided and broadcast layouts. Views are recorded
as references to values recorded before (``Execution.output_views``): the test
checks that they are, that they are not copied again, and that a view of a
tensor written since its values were recorded is copied instead.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import nanscope
from nanscope.format.files import EXECUTION
from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.reader import EXECUTIONS

from ..helpers import iter_payloads, torch_recorder

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def program(dtype: torch.dtype) -> Callable[[], None]:
    """Two training steps of a small MLP, with views, non-contiguous results and Inf/NaN
    (made here, run by the function returned)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 4)).to(
        dtype
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(5, 8).to(dtype)
    return lambda: run(model, opt, x)


def run(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    for _ in range(2):
        out = model(x)
        y = out.t() * 2  # a transposed (non-contiguous) result
        z = y[1:, ::2]  # a strided view of it
        w = z.exp()  # an op on the strided view
        flat = out.view(-1)  # views of a contiguous output
        d = torch.diagonal(out)
        e = out[:, :1].expand(5, 3) + 0  # a broadcast input
        bad = torch.log(out)  # -inf and NaN
        (out > 0).sum()  # bool and int64 outputs
        out.argmax(1)
        loss = w.sum() + flat[::3].sum() + d.sum() + e.mean() + bad.nan_to_num().sum() * 0
        opt.zero_grad()
        loss.backward()
        opt.step()
    a = x * 1
    a.add_(1)  # written in place: a's values are recorded again
    a.t().sum()  # a view of the new values
    a.unbind(0)  # several views in one op
    b = a[0]
    b.mul_(2)  # written through a view: a's recorded values are stale
    a.t().sum()  # a view that must be copied, not pointed at the stale values


class Oracle(TorchDispatchMode):
    """Clones every op's tensor outputs as the op returns them."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: list[tuple[str, list[torch.Tensor]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        flat = out if isinstance(out, (tuple, list)) else [out]
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        self.ops.append((str(func), [t.detach().clone() for t in tensors]))
        return out


def expected(dtype: torch.dtype) -> list[tuple[str, list[np.ndarray]]]:
    """Each op of ``program`` and its outputs' values, as the oracle saw them."""
    oracle = Oracle()
    step = program(dtype)
    with oracle:
        step()
    return [
        (name, [(t.float() if t.dtype == torch.bfloat16 else t).numpy() for t in outs])
        for name, outs in oracle.ops
    ]


def raw_views(logdir: Path) -> list[list[tuple[Any, ...]]]:
    """Each execution record's ``output_views`` entries, as tuples."""
    (path,) = logdir.glob(f"*{EXECUTION}")
    out = []
    for payload in iter_payloads(path.read_bytes(), str(path)):
        ex = pb.DebugEvent.FromString(payload).execution
        out.append([_view_tuple(v) for v in ex.output_views])
    return out


def _view_tuple(v: pb.ValueView) -> tuple[Any, ...]:
    return (
        v.output_slot,
        v.sequence,
        v.slot,
        v.offset,
        *map(tuple, (v.shape, v.strides, v.counts)),
    )


def record(logdir: Path, dtype: torch.dtype) -> None:
    step = program(dtype)
    with nanscope.enable_dump_debug_info(logdir, "FULL_TENSOR", circular_buffer_size=-1):
        step()


def paired(recorded: list[str], want: list[str]) -> list[tuple[int, int]]:
    """(recorded index, oracle index) of the ops the two sequences share, aligned;
    nearly all of the recorded ones."""
    matcher = difflib.SequenceMatcher(None, recorded, want, autojunk=False)
    pairs = [(b.a + k, b.b + k) for b in matcher.get_matching_blocks() for k in range(b.size)]
    assert len(pairs) >= 0.85 * len(recorded), (len(pairs), len(recorded))
    return pairs


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: str(d).replace("torch.", ""))
def test_values_read_back_are_the_values_the_ops_made(tmp_path: Path, dtype: torch.dtype) -> None:
    want = expected(dtype)
    record(tmp_path, dtype)
    r = nanscope.open_dump(tmp_path)
    assert r.problems == []
    execs = r.executions()
    pairs = paired([e.op_type for e in execs], [name for name, _ in want])
    checked: set[str] = set()
    for i, j in pairs:
        e, (name, outs) = execs[i], want[j]
        checked.add(name)
        assert e.tensor_values is not None and len(e.tensor_values) == len(outs), name
        for slot, (got, value) in enumerate(zip(e.tensor_values, outs, strict=True)):
            if name.startswith("aten.empty"):
                assert got is None, name  # uninitialised memory is never recorded
                continue
            where = f"{e.index} {name} output {slot}"
            assert got is not None, where
            assert got.dtype == value.dtype and got.shape == value.shape, where
            np.testing.assert_array_equal(got, value, err_msg=where)
            # The index and the decoded record agree on the value's Inf/NaN.
            h = e.output_health[slot]
            assert h is not None and h.size == value.size, where
            if value.dtype.kind == "f":
                assert h.nan == np.isnan(value).sum(), where
                assert h.neg_inf == np.isneginf(value).sum(), where
    idx = r.index(EXECUTIONS)
    assert idx["nan"].tolist() == [-1 if e.health.nan is None else e.health.nan for e in execs]

    # Views point at values recorded before instead of holding a copy of their own.
    views = raw_views(tmp_path)
    by_op: dict[str, int] = {}
    for e, entries in zip(execs, views, strict=True):
        if entries:
            by_op[e.op_type] = by_op.get(e.op_type, 0) + 1
            for _, sequence, *_ in entries:
                assert sequence < e.sequence
    for op in ("aten.t.default", "aten.slice.Tensor", "aten.view.default",
               "aten.diagonal.default", "aten.expand.default", "aten.unbind.int"):  # fmt: skip
        assert by_op.get(op, 0) > 0, (op, by_op)
        assert op in checked
    # The view of `a` after a write through `b` is a copy; the one before points at add_'s record.
    ts = [i for i, e in enumerate(execs) if e.op_type == "aten.t.default"]
    before, after = ts[-2], ts[-1]
    add = [e for e in execs[:before] if e.op_type == "aten.add_.Tensor"][-1]
    assert [v[1] for v in views[before]] == [add.sequence]
    assert views[after] == []


def inference(dtype: torch.dtype) -> Callable[[], None]:
    """Ops without autograd (which runs a little differently under a dispatch mode, as
    the Python recorder is): both recorders see the very same ops."""
    torch.manual_seed(1)
    w, x = torch.randn(6, 4).to(dtype), torch.randn(5, 6).to(dtype)

    def run() -> None:
        y = x @ w
        y.t().exp()
        y[1:, ::2].exp()
        y.view(-1)[::3].sum()
        torch.diagonal(y).sum()
        y[:, :1].expand(5, 3) + 0
        torch.log(y)
        (y > 0).sum()
        y.argmax(1)
        y.add_(1)
        y.t().sum()
        y.unbind(0)
        y[0].mul_(2)
        y.t().sum()

    return run


@pytest.mark.skipif(torch_recorder() != "native", reason="the native recorder is not in use")
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: str(d).replace("torch.", ""))
def test_both_recorders_write_the_same_values_and_views(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    for recorder in ("native", "python"):
        monkeypatch.setenv("NANSCOPE_TORCH_RECORDER", recorder)
        step = inference(dtype)
        with nanscope.enable_dump_debug_info(
            tmp_path / recorder, "FULL_TENSOR", circular_buffer_size=-1
        ):
            step()
    dumps = [nanscope.open_dump(tmp_path / k) for k in ("native", "python")]
    native, python = (r.executions() for r in dumps)
    assert [e.op_type for e in native] == [e.op_type for e in python]
    for a, b in zip(native, python, strict=True):
        assert a.output_health == b.output_health, a.op_type
        assert a.output_ranges == b.output_ranges, a.op_type
        assert a.tensor_values is not None and b.tensor_values is not None
        for x, y in zip(a.tensor_values, b.tensor_values, strict=True):
            assert x is not None and y is not None, a.op_type
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y, err_msg=a.op_type)
    views = [raw_views(tmp_path / k) for k in ("native", "python")]
    assert views[0] == views[1]
    assert sum(map(len, views[0])) >= 8
    idx = [r.index(EXECUTIONS) for r in dumps]
    for col in ("neg_inf", "pos_inf", "nan", "nonfinite"):
        assert idx[0][col].tolist() == idx[1][col].tolist(), col
    assert dumps[0].range_history().tolist() == dumps[1].range_history().tolist()


def test_tensorflow_reads_the_values_back(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    from tensorflow.python.debug.lib.debug_events_reader import DebugDataReader

    want = expected(torch.float32)
    record(tmp_path, torch.float32)
    ours = nanscope.open_dump(tmp_path).executions()
    views = raw_views(tmp_path)
    with DebugDataReader(str(tmp_path)) as reader:
        reader.update()
        execs = reader.executions()
        assert [e.op_type for e in execs] == [e.op_type for e in ours]
        for i, j in paired([e.op_type for e in execs], [name for name, _ in want]):
            e, mine, entries, (name, outs) = execs[i], ours[i], views[i], want[j]
            values = reader.execution_to_tensor_values(e)
            assert len(values) == len(outs), name
            viewed = {v[0] for v in entries}
            for slot, (got, value) in enumerate(zip(values, outs, strict=True)):
                if slot in viewed or name.startswith("aten.empty"):
                    assert got is None, name  # an empty TensorProto: not recorded, for TF
                    continue
                assert got is not None and got.dtype == value.dtype, name
                np.testing.assert_array_equal(got, value, err_msg=name)
                assert mine.tensor_values is not None
                np.testing.assert_array_equal(got, mine.tensor_values[slot])
