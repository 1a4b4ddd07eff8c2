"""Reader for IDX files, the big-endian array format the original MNIST files use.

Layout: two zero bytes, a type code, the number of dimensions, one big-endian
uint32 per dimension, then the values in C order. Files may be gzip-compressed.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from ember.errors import DatasetError

__all__ = ["IDX_DTYPES", "read_idx"]

IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
"""IDX type code -> big-endian numpy dtype of the values."""


def _read_bytes(path: Path) -> bytes:
    """Return the file's contents, gunzipped when its name ends in `.gz`."""
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"{path}: file not found") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise DatasetError(f"{path}: cannot read: {exc}") from exc


def read_idx(path: str | os.PathLike[str], *, magic: int | None = None) -> np.ndarray:
    """Read one IDX file into a native-endian array, validating header and length.

    `magic`, if given, is the 32-bit magic number the file must start with
    (0x00000803 for a stack of images, 0x00000801 for labels).
    """
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise DatasetError(f"{path}: {len(data)} bytes is too short for an IDX header")
    (found,) = struct.unpack(">I", data[:4])
    if magic is not None and found != magic:
        raise DatasetError(f"{path}: bad magic number 0x{found:08X}, expected 0x{magic:08X}")
    zeros, code, ndim = found >> 16, (found >> 8) & 0xFF, found & 0xFF
    if zeros != 0 or code not in IDX_DTYPES:
        raise DatasetError(f"{path}: bad magic number 0x{found:08X}, not an IDX file")
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise DatasetError(
            f"{path}: header declares {ndim} dimensions but the file ends after {len(data)} bytes"
        )
    shape = struct.unpack(f">{ndim}I", data[4:header_len])
    dtype = IDX_DTYPES[code]
    expected = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    if len(data) - header_len != expected:
        raise DatasetError(
            f"{path}: header says shape {shape} ({expected} bytes of data) "
            f"but the file holds {len(data) - header_len} bytes after the header"
        )
    array = np.frombuffer(data, dtype=dtype, offset=header_len).reshape(shape)
    return array.astype(dtype.newbyteorder("="), copy=False)
