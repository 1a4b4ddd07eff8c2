"""Gzip containers for the compressed recorders: deterministic output, strict, bounded reading.

Ember writes one standard gzip member (RFC 1952) whose header carries an extra field with the
exact uncompressed size, so a reader knows before inflating how much memory the content
needs and stops the moment the data would inflate past it:

    1f 8b 08 04        magic, deflate, FLG = FEXTRA only
    00 00 00 00 04 ff  MTIME 0, XFL 4 (fastest), OS 255 (unknown)
    0c 00              XLEN 12: one extra subfield
    45 4d 08 00        subfield "EM", 8 bytes long
    <u64>              the uncompressed size, little-endian
    <deflate data> <CRC-32> <ISIZE>

Every header byte must be exactly this, and the content must inflate to exactly the declared
size with a matching CRC-32. Gzip data without an extra field (records from earlier ember
releases, or a record recompressed with the gzip tool) is bounded by the size its trailer
declares instead (ISIZE: the size modulo 4 GiB). A declared size larger than deflate can
produce from the file's bytes (1032 to 1) is refused before anything is inflated.
"""

from __future__ import annotations

import struct
import zlib

from ember.record.problem import RecordProblem

GZIP_MAGIC = b"\x1f\x8b"
COMPRESS_LEVEL = 1
"""zlib level: about twice as fast as level 6 on weight data, and within ~1-2% of its size."""

MAX_RATIO = 1032
"""Most bytes deflate can inflate from one compressed byte (258-byte matches in 2 bits)."""

SIZE_FIELD = b"EM"
"""Subfield id of the extra field holding the uncompressed size."""

_FEXTRA = 0x04
_HEADER = GZIP_MAGIC + bytes([8, _FEXTRA, 0, 0, 0, 0, 4, 255]) + struct.pack("<H", 12)
_PREFIX = _HEADER + SIZE_FIELD + struct.pack("<H", 8)
_SIZE = struct.Struct("<Q")
_TRAILER = struct.Struct("<II")  # CRC-32, size modulo 2**32
_GZIP_WBITS = 31  # zlib's code for "gzip container" (16 + max window)
_RAW_WBITS = -15  # raw deflate, no container


def is_gzip(data: bytes) -> bool:
    """Whether `data` starts like a gzip stream."""
    return data[:2] == GZIP_MAGIC


def gzip_bytes(data: bytes | bytearray | memoryview, level: int = COMPRESS_LEVEL) -> bytes:
    """Compress `data` into one gzip member declaring its size (equal input, equal bytes)."""
    view = memoryview(data).cast("B")
    size = view.nbytes
    compressor = zlib.compressobj(level, zlib.DEFLATED, _RAW_WBITS)
    return b"".join(
        (
            _PREFIX,
            _SIZE.pack(size),
            compressor.compress(view),
            compressor.flush(),
            _TRAILER.pack(zlib.crc32(view), size & 0xFFFFFFFF),
        )
    )


def declared_size(data: bytes) -> int:
    """The uncompressed size the gzip data declares; a problem if it is missing or impossible."""
    if len(data) < 18:  # the smallest gzip member: 10-byte header, empty block, 8-byte trailer
        raise RecordProblem("the gzip data is truncated (the file is incomplete)")
    if data[3] & _FEXTRA:
        if data[: len(_PREFIX)] != _PREFIX:
            raise RecordProblem(
                "the gzip header is damaged (it is not the header ember writes, "
                "with the uncompressed size in its extra field)"
            )
        if len(data) < len(_PREFIX) + _SIZE.size + 10:  # + empty deflate block and trailer
            raise RecordProblem("the gzip data is truncated (the file is incomplete)")
        (size,) = _SIZE.unpack_from(data, len(_PREFIX))
        where = "its gzip header declares"
    else:
        (size,) = struct.unpack_from("<I", data, len(data) - 4)
        where = "its gzip trailer declares"
    if size > MAX_RATIO * len(data):
        raise RecordProblem(
            f"{where} {size} bytes of content, more than {len(data)} compressed bytes can "
            "hold (the file is damaged or not a genuine record)"
        )
    return size


def gunzip_bytes(data: bytes) -> bytes:
    """Decompress exactly one gzip member, never past its declared size.

    Damage, truncation, trailing bytes and content longer or shorter than declared are
    problems; memory use is bounded by the declared size.
    """
    size = declared_size(data)
    decompressor = zlib.decompressobj(_GZIP_WBITS)
    try:
        out = decompressor.decompress(data, size + 1)
    except zlib.error as exc:
        raise RecordProblem(f"the gzip data is damaged ({exc})") from None
    if len(out) > size:
        hint = ""
        if not data[3] & _FEXTRA:
            hint = (
                "; gzip files without ember's size field state their size modulo 4 GiB only: "
                "if this is a genuine record over 4 GiB, decompress it (gzip -dk FILE) "
                "and load the uncompressed file"
            )
        raise RecordProblem(
            f"the gzip data inflates past the {size} bytes it declares "
            f"(the file is damaged or not a genuine record){hint}"
        )
    if not decompressor.eof:
        raise RecordProblem("the gzip data is truncated (the file is incomplete)")
    if decompressor.unused_data:
        raise RecordProblem("unexpected bytes after the end of the gzip data")
    if len(out) != size:
        raise RecordProblem(
            f"the gzip data inflates to {len(out)} bytes, not the {size} it declares "
            "(the file is damaged)"
        )
    return out
