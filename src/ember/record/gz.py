"""Gzip containers for the compressed recorders: deterministic output, strict reading."""

from __future__ import annotations

import zlib

from ember.record.problem import RecordProblem

GZIP_MAGIC = b"\x1f\x8b"
COMPRESS_LEVEL = 1
"""zlib level: about twice as fast as level 6 on weight data, and within ~1-2% of its size."""

_GZIP_WBITS = 31  # zlib's code for "gzip container" (16 + max window)


def is_gzip(data: bytes) -> bool:
    """Whether `data` starts like a gzip stream."""
    return data[:2] == GZIP_MAGIC


def gzip_bytes(data: bytes | memoryview, level: int = COMPRESS_LEVEL) -> bytes:
    """Compress `data` into one gzip member (mtime 0, so equal input gives equal bytes)."""
    compressor = zlib.compressobj(level, zlib.DEFLATED, _GZIP_WBITS)
    return compressor.compress(data) + compressor.flush()


def gunzip_bytes(data: bytes) -> bytes:
    """Decompress exactly one gzip member; truncation, damage or trailing bytes are problems."""
    decompressor = zlib.decompressobj(_GZIP_WBITS)
    try:
        out = decompressor.decompress(data)
    except zlib.error as exc:
        raise RecordProblem(f"the gzip data is damaged ({exc})") from None
    if not decompressor.eof:
        raise RecordProblem("the gzip data is truncated (the file is incomplete)")
    if decompressor.unused_data:
        raise RecordProblem("unexpected bytes after the end of the gzip data")
    return out
