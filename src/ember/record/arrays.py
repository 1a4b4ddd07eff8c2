"""Tensors and numpy arrays to raw little-endian bytes and back, without per-element Python work.

Sizes declared by a file are checked against the bytes actually present before anything is
allocated, so a corrupt shape can never trigger a huge allocation.
"""

from __future__ import annotations

import math
import re
import sys
from typing import Any

import numpy as np
import torch

from ember.record.problem import RecordProblem

MAX_DIMS = 64
"""Most dimensions a stored tensor or array may declare."""

# Torch dtype name -> (torch dtype, little-endian numpy dtype its bytes are stored as).
# bfloat16 has no numpy dtype: its raw bits travel as int16.
_TENSOR_DTYPES: dict[str, tuple[torch.dtype, np.dtype]] = {
    "float64": (torch.float64, np.dtype("<f8")),
    "float32": (torch.float32, np.dtype("<f4")),
    "float16": (torch.float16, np.dtype("<f2")),
    "bfloat16": (torch.bfloat16, np.dtype("<i2")),
    "complex128": (torch.complex128, np.dtype("<c16")),
    "complex64": (torch.complex64, np.dtype("<c8")),
    "int64": (torch.int64, np.dtype("<i8")),
    "int32": (torch.int32, np.dtype("<i4")),
    "int16": (torch.int16, np.dtype("<i2")),
    "int8": (torch.int8, np.dtype("i1")),
    "uint64": (torch.uint64, np.dtype("<u8")),
    "uint32": (torch.uint32, np.dtype("<u4")),
    "uint16": (torch.uint16, np.dtype("<u2")),
    "uint8": (torch.uint8, np.dtype("u1")),
    "bool": (torch.bool, np.dtype("?")),
}
_TENSOR_NAMES: dict[torch.dtype, str] = {dt: name for name, (dt, _) in _TENSOR_DTYPES.items()}

_NUMPY_DTYPE_NAME = re.compile(r"[<>|=]?[biufc][0-9]{1,2}\Z")
_LITTLE = sys.byteorder == "little"


def tensor_dtype_name(tensor: torch.Tensor) -> str:
    """The stored name of `tensor`'s dtype; raises `RecordProblem` if it cannot be stored."""
    try:
        return _TENSOR_NAMES[tensor.dtype]
    except KeyError:
        raise RecordProblem(f"tensors of dtype {tensor.dtype} cannot be recorded") from None


def tensor_itemsize(name: object) -> int:
    """Bytes per element of the stored dtype `name`."""
    return _tensor_dtype(name)[1].itemsize


def tensor_to_bytes(tensor: torch.Tensor) -> tuple[str, list[int], memoryview]:
    """Return (dtype name, shape, raw little-endian bytes) of `tensor` (any device).

    The bytes may share memory with a CPU tensor: use them before the tensor changes.
    """
    name = tensor_dtype_name(tensor)
    if tensor.layout != torch.strided:
        raise RecordProblem(f"only dense tensors can be recorded, not {tensor.layout}")
    if tensor.device.type == "meta":
        raise RecordProblem("a tensor on the meta device has no data to record")
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    array = t.numpy()
    if not _LITTLE and array.dtype.itemsize > 1:
        array = array.astype(array.dtype.newbyteorder("<"))
    return name, list(tensor.shape), memoryview(array.reshape(-1).view(np.uint8))  # type: ignore[arg-type]


def tensor_from_bytes(name: object, shape: object, data: bytes | memoryview) -> torch.Tensor:
    """Rebuild a CPU tensor from its stored dtype name, shape and raw bytes (validated)."""
    torch_dtype, storage = _tensor_dtype(name)
    dims = check_shape(shape)
    array = _array_from_bytes(storage, dims, data, what=f"{name} tensor")
    tensor = torch.from_numpy(array)
    if torch_dtype == torch.bfloat16:
        tensor = tensor.view(torch.bfloat16)
    return tensor


def ndarray_to_bytes(array: np.ndarray) -> tuple[str, list[int], bytes]:
    """Return (little-endian dtype string, shape, raw bytes) of a numeric numpy array."""
    dtype = array.dtype
    if dtype.kind not in "biufc" or dtype.fields is not None or dtype.subdtype is not None:
        raise RecordProblem(f"numpy arrays of dtype {dtype} cannot be recorded (numeric only)")
    little = dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype
    return little.str, list(array.shape), np.ascontiguousarray(array, dtype=little).tobytes()


def ndarray_from_bytes(name: object, shape: object, data: bytes | memoryview) -> np.ndarray:
    """Rebuild a numpy array (native byte order) from its stored dtype string, shape and bytes."""
    if not isinstance(name, str) or not _NUMPY_DTYPE_NAME.match(name):
        raise RecordProblem(f"unsupported numpy dtype {name!r}")
    try:
        dtype = np.dtype(name)
    except TypeError as exc:
        raise RecordProblem(f"unsupported numpy dtype {name!r}") from exc
    dims = check_shape(shape)
    return _array_from_bytes(dtype, dims, data, what=f"{name} array")


def check_shape(shape: object) -> list[int]:
    """Validate a stored shape: a short list of non-negative ints."""
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_DIMS:
        raise RecordProblem(f"invalid tensor shape {shape!r}")
    for dim in shape:
        if type(dim) is not int or dim < 0:
            raise RecordProblem(f"invalid tensor shape {shape!r}")
    return list(shape)


def expected_nbytes(dims: list[int], itemsize: int) -> int:
    """Exact byte count of an array with shape `dims` (Python ints: no overflow)."""
    return math.prod(dims) * itemsize


def shuffle_bytes(data: Any, itemsize: int) -> Any:
    """Regroup bytes by significance (all first bytes, then all second bytes...) to help gzip."""
    if itemsize <= 1 or len(data) == 0:
        return data
    items = np.frombuffer(data, dtype=np.uint8).reshape(-1, itemsize)
    planes = np.empty((itemsize, items.shape[0]), dtype=np.uint8)
    for i in range(itemsize):  # one strided copy per byte plane: far faster than a transpose
        planes[i] = items[:, i]
    return memoryview(planes.reshape(-1))  # type: ignore[arg-type]


def rotate_left_16(data: Any) -> Any:
    """Rotate every 16-bit little-endian value one bit left: the sign bit of a float16 or
    bfloat16 moves next to the mantissa, so the high byte holds the exponent alone (for
    bfloat16, its whole exponent), which compresses much better."""
    if len(data) == 0:
        return data
    values = np.frombuffer(data, dtype="<u2")
    return memoryview(((values << 1) | (values >> 15)).astype("<u2").view(np.uint8))  # type: ignore[arg-type]


def rotate_right_16(data: bytes | memoryview) -> bytes | memoryview:
    """Undo `rotate_left_16` (the length must be even)."""
    if len(data) == 0:
        return data
    if len(data) % 2:
        raise RecordProblem("rotated tensor data has an odd length")
    values = np.frombuffer(data, dtype="<u2")
    return memoryview(((values >> 1) | (values << 15)).astype("<u2").view(np.uint8))  # type: ignore[arg-type]


def unshuffle_bytes(data: bytes | memoryview, itemsize: int) -> bytes | memoryview:
    """Undo `shuffle_bytes` (the length must be a multiple of `itemsize`)."""
    if itemsize <= 1 or len(data) == 0:
        return data
    if len(data) % itemsize:
        raise RecordProblem("shuffled tensor data has a length that does not fit its dtype")
    planes = np.frombuffer(data, dtype=np.uint8).reshape(itemsize, -1)
    items = np.empty((planes.shape[1], itemsize), dtype=np.uint8)
    for i in range(itemsize):
        items[:, i] = planes[i]
    return memoryview(items.reshape(-1))  # type: ignore[arg-type]


def _tensor_dtype(name: object) -> tuple[torch.dtype, np.dtype]:
    if not isinstance(name, str) or name not in _TENSOR_DTYPES:
        raise RecordProblem(f"unsupported tensor dtype {name!r}")
    return _TENSOR_DTYPES[name]


def _array_from_bytes(
    dtype: np.dtype, dims: list[int], data: bytes | memoryview, *, what: str
) -> np.ndarray:
    want = expected_nbytes(dims, dtype.itemsize)
    if want != len(data):
        raise RecordProblem(
            f"{what} of shape {tuple(dims)} needs {want} bytes but the file holds {len(data)}"
        )
    count = math.prod(dims)
    array = np.frombuffer(data, dtype=dtype, count=count)
    native = dtype.newbyteorder("=") if dtype.itemsize > 1 else dtype
    array = array.astype(native, copy=True)  # own, writable memory in native byte order
    if dtype.kind == "b" and count and array.view(np.uint8).max() > 1:
        raise RecordProblem(f"{what} holds bytes that are not valid booleans")
    return array.reshape(dims)
