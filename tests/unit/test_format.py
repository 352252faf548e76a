"""The format layer: record framing, tensors, summary layouts, file sets, the wire encoder."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nanscope.events import _wire as wire
from nanscope.format import files, records
from nanscope.format.health import of_summary as health
from nanscope.format.modes import TensorDebugMode, parse_mode, shape_from_summary
from nanscope.format.proto import debug_event_pb2 as pb
from nanscope.format.proto import types_pb2
from nanscope.format.proto.tensor_pb2 import TensorProto
from nanscope.format.tensors import DataType, array_to_proto, proto_to_array
from tests.helpers import summary_to_proto


def test_masked_crc_matches_tfrecord_reference_value() -> None:
    # The masked CRC32C of the 8 length bytes of an empty record, as every
    # TFRecord writer produces it (crc32c(8 zero bytes) = 0x8C28B28A).
    crc = 0x8C28B28A
    expected = ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
    assert records.masked_crc32c(b"\0" * 8) == expected


@given(st.lists(st.binary(max_size=300), max_size=20))
def test_frame_then_scan_round_trips(payloads: list[bytes]) -> None:
    blob = b"".join(records.frame(p) for p in payloads)
    result = records.scan(blob, "mem")
    assert [r.payload for r in result.records] == payloads
    assert result.end == len(blob) and not result.torn and not result.errors


@given(st.lists(st.binary(min_size=1, max_size=100), min_size=1, max_size=10), st.data())
def test_truncation_anywhere_is_a_torn_tail_not_an_error(
    payloads: list[bytes], data: st.DataObject
) -> None:
    blob = b"".join(records.frame(p) for p in payloads)
    cut = data.draw(st.integers(0, len(blob) - 1))
    result = records.scan(blob[:cut], "mem")
    assert not result.errors
    complete = [r.payload for r in result.records]
    assert complete == payloads[: len(complete)]
    assert result.torn == (result.end < cut)


def test_flipped_payload_byte_skips_only_that_record() -> None:
    blob = bytearray(b"".join(records.frame(bytes([i]) * 20) for i in range(5)))
    rec_len = 20 + records.OVERHEAD
    blob[2 * rec_len + records.HEADER_SIZE + 3] ^= 0xFF
    result = records.scan(bytes(blob), "f")
    assert [r.payload[0] for r in result.records] == [0, 1, 3, 4]
    assert len(result.errors) == 1
    err = result.errors[0]
    assert err.offset == 2 * rec_len and "payload CRC" in err.reason
    assert f"byte offset {2 * rec_len}" in str(err)


def test_corrupt_length_resyncs_to_the_next_record() -> None:
    blob = bytearray(b"".join(records.frame(bytes([i]) * 30) for i in range(4)))
    rec_len = 30 + records.OVERHEAD
    blob[rec_len + 2] ^= 0x40  # inside record 1's length field
    result = records.scan(bytes(blob), "f")
    assert [r.payload[0] for r in result.records] == [0, 2, 3]
    assert "length CRC" in result.errors[0].reason and "skipped" in result.errors[0].reason


def test_giant_length_with_valid_crc_is_rejected_without_allocating() -> None:
    length = struct.pack("<Q", 1 << 60)
    blob = length + struct.pack("<I", records.masked_crc32c(length)) + b"x" * 100
    result = records.scan(blob, "f")
    assert not result.records and result.errors and "absurd" in result.errors[0].reason


@pytest.mark.parametrize(
    "array",
    [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.array([1.5, -np.inf, np.nan], dtype=np.float64),
        np.array([1, -2], dtype=np.int64),
        np.array([[True, False]]),
        np.array(3.25, dtype=np.float16),
        np.array([1 + 2j], dtype=np.complex64),
        np.zeros((0, 4), dtype=np.float32),
        np.array([7, 8], dtype=np.uint8),
    ],
)
def test_array_proto_round_trip(array: np.ndarray) -> None:
    proto = array_to_proto(array)
    back = proto_to_array(TensorProto.FromString(proto.SerializeToString()))
    assert back is not None
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)


def test_typed_fields_and_broadcast_scalar() -> None:
    # TensorFlow's eager path puts scalars in the typed fields.
    p = TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[2.5])
    assert proto_to_array(p) == np.float32(2.5)
    p = TensorProto(dtype=types_pb2.DT_DOUBLE, double_val=[1.0])
    p.tensor_shape.dim.add(size=3)
    np.testing.assert_array_equal(proto_to_array(p), [1.0, 1.0, 1.0])  # one value fills the shape
    half = np.array([1.5, -2.0], dtype=np.float16)
    p = TensorProto(dtype=types_pb2.DT_HALF, half_val=half.view(np.uint16).tolist())
    p.tensor_shape.dim.add(size=2)
    np.testing.assert_array_equal(proto_to_array(p), half)
    bf16_bits = [0x3FC0]  # 1.5 in bfloat16
    p = TensorProto(dtype=types_pb2.DT_BFLOAT16, half_val=bf16_bits)
    assert float(proto_to_array(p)) == 1.5  # type: ignore[arg-type]


def test_empty_proto_is_none_and_bad_content_is_a_clear_error() -> None:
    assert proto_to_array(TensorProto()) is None
    p = TensorProto(dtype=types_pb2.DT_FLOAT, tensor_content=b"abc")
    p.tensor_shape.dim.add(size=2)
    with pytest.raises(ValueError, match="tensor_content has 3 bytes"):
        proto_to_array(p)


def test_summary_proto_is_tensorflow_graph_layout() -> None:
    v = np.arange(11, dtype=np.float64)
    p = summary_to_proto(v)
    assert int(p.dtype) == DataType.DT_DOUBLE and [d.size for d in p.tensor_shape.dim] == [11]
    assert p.tensor_content == v.tobytes()


def test_health_layouts() -> None:
    full = np.array([5, -1, 1, 2, 12, 1, 2, 3, 1, 2, 3], dtype=np.float64)
    h = health(TensorDebugMode.FULL_HEALTH, full)
    assert (h.size, h.neg_inf, h.pos_inf, h.nan, h.neg, h.zero, h.pos) == (12, 1, 2, 3, 1, 2, 3)
    assert h.any_nonfinite and h.has_inf and h.nan
    h = health(TensorDebugMode.CONCISE_HEALTH, np.array([5, 10, 0, 0, 0.0]))
    assert h.size == 10 and h.any_nonfinite is False
    assert health(TensorDebugMode.CURT_HEALTH, np.array([-1, 1.0])).any_nonfinite is True
    assert (
        health(TensorDebugMode.SHAPE, np.array([1, 1, 2, 6, 2, 3, 0, 0, 0, 0])).any_nonfinite
        is None
    )
    three = np.array([-np.inf, 0, np.nan])
    assert health(TensorDebugMode.REDUCE_INF_NAN_THREE_SLOTS, three).any_nonfinite is True
    assert health(TensorDebugMode.REDUCE_INF_NAN_THREE_SLOTS, np.zeros(3)).any_nonfinite is False


def test_shape_summary_keeps_last_six_dims() -> None:
    v = np.array([1, 1, 8, 256, 1, 1, 2, 2, 2, 32], dtype=np.float64)
    assert shape_from_summary(v) == (None, None, 1, 1, 2, 2, 2, 32)
    assert shape_from_summary(np.array([1, 1, 2, 6, 2, 3, 0, 0, 0, 0.0])) == (2, 3)


def test_parse_mode() -> None:
    assert parse_mode("full_health") == TensorDebugMode.FULL_HEALTH
    assert parse_mode(7) == TensorDebugMode.FULL_TENSOR
    with pytest.raises(ValueError, match="unknown tensor debug mode 'BOGUS'; use one of"):
        parse_mode("BOGUS")
    with pytest.raises(ValueError, match="cannot be written"):
        parse_mode("FULL_NUMERICS")


def test_file_set_naming_and_discovery(tmp_path: Path) -> None:
    prefix = files.file_set_prefix(tmp_path, 1593123456.7, "my.host/rank 3")
    assert prefix.name == "tfdbg_events.1593123456.my.host_rank_3"
    for s in files.SUFFIXES:
        files.FileSet(prefix).path(s).touch()
    (found,) = files.discover(tmp_path)
    assert found.prefix == prefix and found.host == "my.host_rank_3" and not found.missing()


def test_discovery_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(files.DumpNotFoundError, match="no such directory"):
        files.discover(tmp_path / "nope")
    with pytest.raises(files.DumpNotFoundError, match="no tfdbg2 dump here"):
        files.discover(tmp_path)
    sub = tmp_path / "run1"
    sub.mkdir()
    (sub / "tfdbg_events.1.h.metadata").touch()
    with pytest.raises(files.DumpNotFoundError, match="found dumps in subdirectories: run1"):
        files.discover(tmp_path)


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_varint_matches_protobuf(value: int) -> None:
    ev = pb.DebugEvent(step=value)
    assert wire.int_field(2, value) == ev.SerializeToString()


# -- FULL_TENSOR views ----------------------------------------------------------------------------


def test_a_view_reads_the_elements_numpy_reads() -> None:
    from nanscope.format.tensors import ValueView, view_of

    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    # base.T[1:, ::2] as offset, shape and strides in elements of the flat values.
    want = base.T[1:, ::2]
    got = view_of(base, ValueView(1, 0, offset=1, shape=(5, 2), strides=(1, 12)))
    np.testing.assert_array_equal(got, want)
    broadcast = view_of(base, ValueView(1, 0, offset=2, shape=(3, 4), strides=(0, 6)))
    np.testing.assert_array_equal(broadcast, np.broadcast_to(base[:, 2], (3, 4)))
    assert view_of(base, ValueView(1, 0, offset=0, shape=(0, 3), strides=(3, 1))).shape == (0, 3)


@pytest.mark.parametrize(
    "offset, shape, strides",
    [
        (20, (2, 3), (3, 1)),  # past the end
        (-1, (2,), (1,)),
        (0, (2, 2), (1,)),  # a stride missing
        (0, (1 << 30,), (0,)),  # a broadcast claiming far more than the values hold
    ],
)
def test_a_view_that_reads_outside_its_values_is_refused(
    offset: int, shape: tuple[int, ...], strides: tuple[int, ...]
) -> None:
    from nanscope.format.tensors import ValueView, view_of

    with pytest.raises(ValueError):
        view_of(np.zeros(24, dtype=np.float32), ValueView(1, 0, offset, shape, strides))


def test_a_view_s_health_is_its_counts() -> None:
    from nanscope.format.tensors import ValueView

    view = ValueView(3, 0, 0, (2,), (1,), (2, 0, 1, 0, 1, 0, 0))
    h = health(TensorDebugMode.FULL_TENSOR, view)  # type: ignore[arg-type]
    assert (h.size, h.pos_inf, h.neg, h.any_nonfinite) == (2, 1, 1, True)
    malformed = ValueView(3, 0, 0, (2,), (1,), (2, -1))
    assert health(TensorDebugMode.FULL_TENSOR, malformed).size is None  # type: ignore[arg-type]
