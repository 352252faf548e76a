"""Conversion between numpy arrays and ``TensorProto`` messages.

Writers put values into ``tensor_content`` (raw little-endian bytes), the way
TensorFlow's graph path does. Readers accept both ``tensor_content`` and the
typed repeated fields (``float_val``, ``half_val``, ...) that TensorFlow's eager
path uses for scalars, including the proto convention that one value fills
the whole shape.
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from nanscope.format.proto import tensor_pb2

# What a ``TensorProto`` read from a dump may claim (docs/FORMAT.md, "Limits"). Every other
# element a decoded value holds is backed by the record's own bytes.
MAX_RANK = 254  # TensorFlow's TensorShape::MaxDimensions()
# TensorFlow's convention that the last typed value repeats to fill the shape (or that no
# value means zeros) lets a few bytes claim any size: the reader fills at most this many.
MAX_FILL_ELEMENTS = 1 << 20


class DataType(enum.IntEnum):
    """TensorFlow's ``DataType`` numbers, as stored in FULL_HEALTH and SHAPE summaries."""

    DT_INVALID = 0
    DT_FLOAT = 1
    DT_DOUBLE = 2
    DT_INT32 = 3
    DT_UINT8 = 4
    DT_INT16 = 5
    DT_INT8 = 6
    DT_STRING = 7
    DT_COMPLEX64 = 8
    DT_INT64 = 9
    DT_BOOL = 10
    DT_QINT8 = 11
    DT_QUINT8 = 12
    DT_QINT32 = 13
    DT_BFLOAT16 = 14
    DT_QINT16 = 15
    DT_QUINT16 = 16
    DT_UINT16 = 17
    DT_COMPLEX128 = 18
    DT_HALF = 19
    DT_RESOURCE = 20
    DT_VARIANT = 21
    DT_UINT32 = 22
    DT_UINT64 = 23
    DT_FLOAT8_E5M2 = 24
    DT_FLOAT8_E4M3FN = 25
    DT_FLOAT8_E4M3FNUZ = 26
    DT_FLOAT8_E4M3B11FNUZ = 27
    DT_FLOAT8_E5M2FNUZ = 28
    DT_INT4 = 29
    DT_UINT4 = 30
    DT_INT2 = 31
    DT_UINT2 = 32
    DT_FLOAT4_E2M1FN = 33


# Short names used by every framework (torch.float32 -> "float32", tf.float32 -> "float32").
DTYPE_NAMES: dict[str, DataType] = {
    "float32": DataType.DT_FLOAT,
    "float64": DataType.DT_DOUBLE,
    "int32": DataType.DT_INT32,
    "uint8": DataType.DT_UINT8,
    "int16": DataType.DT_INT16,
    "int8": DataType.DT_INT8,
    "string": DataType.DT_STRING,
    "complex64": DataType.DT_COMPLEX64,
    "int64": DataType.DT_INT64,
    "bool": DataType.DT_BOOL,
    "bfloat16": DataType.DT_BFLOAT16,
    "uint16": DataType.DT_UINT16,
    "complex128": DataType.DT_COMPLEX128,
    "float16": DataType.DT_HALF,
    "uint32": DataType.DT_UINT32,
    "uint64": DataType.DT_UINT64,
    "float8_e5m2": DataType.DT_FLOAT8_E5M2,
    "float8_e4m3fn": DataType.DT_FLOAT8_E4M3FN,
    "float8_e4m3fnuz": DataType.DT_FLOAT8_E4M3FNUZ,
    "float8_e4m3b11fnuz": DataType.DT_FLOAT8_E4M3B11FNUZ,
    "float8_e5m2fnuz": DataType.DT_FLOAT8_E5M2FNUZ,
}
FLOAT_TYPES = frozenset(
    {DataType.DT_FLOAT, DataType.DT_DOUBLE, DataType.DT_HALF, DataType.DT_BFLOAT16}
)


@functools.lru_cache(maxsize=256)
def dtype_name(dtype: int) -> str:
    """A readable name for a ``DataType`` number (``float32``, ``DT_RESOURCE``, ``dtype 99``)."""
    for name, value in DTYPE_NAMES.items():
        if value == dtype:
            return name
    try:
        return DataType(dtype).name
    except ValueError:
        return f"dtype {dtype}"


def _ml_dtype(name: str) -> np.dtype[Any] | None:
    try:
        import ml_dtypes
    except ImportError:  # optional: TensorFlow and JAX bring it
        return None
    return np.dtype(getattr(ml_dtypes, name))  # type: ignore[no-any-return]


_NUMPY: dict[DataType, str] = {
    DataType.DT_FLOAT: "<f4",
    DataType.DT_DOUBLE: "<f8",
    DataType.DT_INT32: "<i4",
    DataType.DT_UINT8: "u1",
    DataType.DT_INT16: "<i2",
    DataType.DT_INT8: "i1",
    DataType.DT_COMPLEX64: "<c8",
    DataType.DT_INT64: "<i8",
    DataType.DT_BOOL: "?",
    DataType.DT_UINT16: "<u2",
    DataType.DT_COMPLEX128: "<c16",
    DataType.DT_HALF: "<f2",
    DataType.DT_UINT32: "<u4",
    DataType.DT_UINT64: "<u8",
    DataType.DT_QINT8: "i1",
    DataType.DT_QUINT8: "u1",
    DataType.DT_QINT16: "<i2",
    DataType.DT_QUINT16: "<u2",
    DataType.DT_QINT32: "<i4",
}
_ML_DTYPES = {
    DataType.DT_BFLOAT16: "bfloat16",
    DataType.DT_FLOAT8_E5M2: "float8_e5m2",
    DataType.DT_FLOAT8_E4M3FN: "float8_e4m3fn",
    DataType.DT_FLOAT8_E4M3FNUZ: "float8_e4m3fnuz",
    DataType.DT_FLOAT8_E4M3B11FNUZ: "float8_e4m3b11fnuz",
    DataType.DT_FLOAT8_E5M2FNUZ: "float8_e5m2fnuz",
}


def numpy_dtype(dtype: int) -> np.dtype[Any] | None:
    """The numpy dtype for a ``DataType`` number, or ``None`` when there is none."""
    dt = DataType(dtype) if dtype in DataType._value2member_map_ else None
    if dt is None:
        return None
    if dt in _NUMPY:
        return np.dtype(_NUMPY[dt])
    if dt in _ML_DTYPES:
        return _ml_dtype(_ML_DTYPES[dt])
    if dt == DataType.DT_STRING:
        return np.dtype(object)
    return None


def data_type_of(array: np.ndarray) -> DataType:
    """The ``DataType`` of a numpy array (ml_dtypes' bfloat16 and float8 included)."""
    name = array.dtype.name
    if array.dtype.kind in "OSU":
        return DataType.DT_STRING
    try:
        return DTYPE_NAMES[name]
    except KeyError:
        raise ValueError(f"dtype {name} has no tfdbg2 DataType") from None


def array_to_proto(array: np.ndarray) -> tensor_pb2.TensorProto:
    """A full tensor value (FULL_TENSOR mode)."""
    dtype = data_type_of(array)
    proto = tensor_pb2.TensorProto(dtype=int(dtype))  # type: ignore[arg-type]
    for d in array.shape:
        proto.tensor_shape.dim.add(size=int(d))
    if dtype == DataType.DT_STRING:
        proto.string_val.extend(
            x if isinstance(x, bytes) else str(x).encode() for x in array.reshape(-1)
        )
    else:
        np_dtype = numpy_dtype(dtype)
        assert np_dtype is not None
        proto.tensor_content = np.ascontiguousarray(array, dtype=np_dtype).tobytes()
    return proto


def _typed_values(proto: tensor_pb2.TensorProto, dt: DataType) -> np.ndarray | None:
    """The values held in the typed repeated fields, as a flat array."""
    if dt == DataType.DT_FLOAT:
        return np.asarray(proto.float_val, dtype=np.float32)
    if dt == DataType.DT_DOUBLE:
        return np.asarray(proto.double_val, dtype=np.float64)
    if dt in (DataType.DT_HALF, DataType.DT_BFLOAT16) or dt in _ML_DTYPES:
        bits = np.asarray(proto.half_val, dtype=np.int64).astype(np.uint16)
        if dt == DataType.DT_HALF:
            return bits.view(np.float16)
        if dt == DataType.DT_BFLOAT16:
            return _bfloat16_from_bits(bits)
        ml = numpy_dtype(dt)
        return None if ml is None else bits.astype(np.uint8).view(ml)
    if dt in (DataType.DT_INT64,):
        return np.asarray(proto.int64_val, dtype=np.int64)
    if dt == DataType.DT_BOOL:
        return np.asarray(proto.bool_val, dtype=bool)
    if dt == DataType.DT_UINT32:
        return np.asarray(proto.uint32_val, dtype=np.uint32)
    if dt == DataType.DT_UINT64:
        return np.asarray(proto.uint64_val, dtype=np.uint64)
    if dt == DataType.DT_COMPLEX64:
        pairs = np.asarray(proto.scomplex_val, dtype=np.float32)
        return pairs[0::2] + 1j * pairs[1::2]
    if dt == DataType.DT_COMPLEX128:
        pairs = np.asarray(proto.dcomplex_val, dtype=np.float64)
        return pairs[0::2] + 1j * pairs[1::2]
    if dt == DataType.DT_STRING:
        return np.asarray(list(proto.string_val), dtype=object)
    np_dtype = numpy_dtype(dt)
    if np_dtype is not None and np_dtype.kind in "iub":
        return np.asarray(proto.int_val, dtype=np.int64).astype(np_dtype)
    return None


def _bfloat16_from_bits(bits: np.ndarray) -> np.ndarray:
    ml = _ml_dtype("bfloat16")
    if ml is not None:
        return bits.view(ml)
    # Without ml_dtypes, widen to float32: the value is exact.
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _shape_text(shape: tuple[int, ...]) -> str:
    """``12000x12000`` (``[]`` for a scalar, the rank alone for a long shape)."""
    if not shape:
        return "[]"
    return "x".join(map(str, shape)) if len(shape) <= 8 else f"rank {len(shape)}"


def _typed_count(proto: tensor_pb2.TensorProto, dt: DataType) -> int:
    """How many values the typed repeated field of ``dt`` holds, without decoding them."""
    if dt == DataType.DT_FLOAT:
        return len(proto.float_val)
    if dt == DataType.DT_DOUBLE:
        return len(proto.double_val)
    if dt in (DataType.DT_HALF, DataType.DT_BFLOAT16) or dt in _ML_DTYPES:
        return len(proto.half_val)
    if dt == DataType.DT_INT64:
        return len(proto.int64_val)
    if dt == DataType.DT_BOOL:
        return len(proto.bool_val)
    if dt == DataType.DT_UINT32:
        return len(proto.uint32_val)
    if dt == DataType.DT_UINT64:
        return len(proto.uint64_val)
    if dt == DataType.DT_COMPLEX64:
        return len(proto.scomplex_val) // 2
    if dt == DataType.DT_COMPLEX128:
        return len(proto.dcomplex_val) // 2
    if dt == DataType.DT_STRING:
        return len(proto.string_val)
    return len(proto.int_val)


def proto_to_array(
    proto: tensor_pb2.TensorProto, max_elements: int | None = None
) -> np.ndarray | None:
    """The value of a ``TensorProto``; ``None`` for an empty proto (``DT_INVALID``).

    Raises ``ValueError``, before allocating anything, for content that does not fit its
    dtype and shape, and for a shape that claims more elements than the proto's bytes
    hold: beyond :data:`MAX_FILL_ELEMENTS` for TensorFlow's fill convention, beyond
    ``max_elements`` in any case (a summary vector's bound), beyond :data:`MAX_RANK` dims.
    """
    dt_num = int(proto.dtype)
    if dt_num == DataType.DT_INVALID:
        return None
    dims = proto.tensor_shape.dim
    if len(dims) > MAX_RANK:
        raise ValueError(f"tensor shape has {len(dims)} dimensions (at most {MAX_RANK})")
    shape = tuple(int(d.size) for d in dims)
    if any(d < 0 for d in shape):
        raise ValueError(f"tensor shape {shape} has a negative dimension")
    # A Python int: numpy's int64 product wraps around for dims that multiply past 2**63.
    size = math.prod(shape)
    try:
        dt = DataType(dt_num)
    except ValueError:
        raise ValueError(f"unknown DataType {dt_num}") from None
    if max_elements is not None and size > max_elements:
        raise ValueError(
            f"a summary of shape {_shape_text(shape)} claims {size:,} elements "
            f"(a summary holds at most {max_elements:,})"
        )
    if proto.tensor_content:
        np_dtype = numpy_dtype(dt)
        if dt == DataType.DT_BFLOAT16 and np_dtype is None:
            np_dtype = np.dtype("<u2")  # decoded below, widened to float32
        elif np_dtype is None or np_dtype.kind == "O":
            raise ValueError(f"{dt.name} cannot be stored in tensor_content")
        if len(proto.tensor_content) != size * np_dtype.itemsize:
            raise ValueError(
                f"tensor_content has {len(proto.tensor_content):,} bytes, "
                f"shape {_shape_text(shape)} of {dtype_name(dt)} needs "
                f"{size * np_dtype.itemsize:,}"
            )
        flat = np.frombuffer(proto.tensor_content, dtype=np_dtype)
        if dt == DataType.DT_BFLOAT16 and numpy_dtype(dt) is None:
            flat = _bfloat16_from_bits(flat)
        return flat.reshape(shape)
    count = _typed_count(proto, dt)
    if count > size or (count < size and size > MAX_FILL_ELEMENTS):
        raise ValueError(
            f"shape {_shape_text(shape)} of {dtype_name(dt)} claims {size:,} elements, "
            f"the record holds {count:,} value{'s' if count != 1 else ''}"
        )
    values = _typed_values(proto, dt)
    if values is None:
        raise ValueError(f"cannot decode values of {dt.name}")
    if values.size == size:
        return values.reshape(shape)
    if values.size == 0:
        np_dtype = numpy_dtype(dt) or values.dtype
        return np.zeros(shape, dtype=np_dtype)
    if values.size < size:
        # TensorFlow's convention: the last value repeats to fill the shape.
        padded = np.empty(size, dtype=values.dtype)
        padded[: values.size] = values
        padded[values.size :] = values[-1]
        return padded.reshape(shape)
    raise ValueError(f"{values.size} values do not fit shape {shape}")


# -- FULL_TENSOR views ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ValueView:
    """FULL_TENSOR: an output whose values are a view of values recorded before.

    Its record holds no copy of them (an empty ``TensorProto``) but an
    ``Execution.output_views`` entry (docs/FORMAT.md): output ``slot`` of
    execution ``sequence`` (same process) holds the values, flattened in C
    order; this output reads them from element ``offset`` with its ``shape``
    and ``strides`` (in elements). In a recorder's memory it also carries the
    view's own counts, ``(size, -inf, +inf, nan, negative, zero, positive)``
    (``None`` beyond the size for a non-float type), for the index.
    """

    sequence: int
    slot: int
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    counts: tuple[int, ...] = ()


def view_of(values: np.ndarray, view: ValueView) -> np.ndarray:
    """The values ``view`` names, read from the recorded ``values`` it is a view of (a copy).

    Raises ``ValueError`` for a view that reads outside those values or has a
    malformed shape (a damaged or crafted record).
    """
    shape, strides = tuple(view.shape), tuple(view.strides)
    if len(shape) != len(strides) or len(shape) > MAX_RANK:
        raise ValueError(f"a view of shape {shape} has {len(strides)} strides")
    if any(d < 0 for d in shape) or any(s < 0 for s in strides) or view.offset < 0:
        raise ValueError("a view has a negative size, stride or offset")
    flat = values.reshape(-1)
    size = math.prod(shape)
    if size == 0:
        return np.zeros(shape, dtype=flat.dtype)
    if size > max(flat.size, MAX_FILL_ELEMENTS):
        raise ValueError(
            f"a view of shape {_shape_text(shape)} claims {size:,} elements "
            f"of values that hold {flat.size:,}"
        )
    last = view.offset + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))
    if last >= flat.size:
        raise ValueError(
            f"a view reads element {last:,} of values that hold {flat.size:,} elements"
        )
    item = flat.dtype.itemsize
    window = np.lib.stride_tricks.as_strided(
        flat[view.offset :], shape=shape, strides=[s * item for s in strides], writeable=False
    )
    return np.array(window, copy=True)
