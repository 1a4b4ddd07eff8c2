"""A CRC-32 over every byte of a file, stored inside that same file as 8 hex digits.

The digest is computed with its own 8 digits read as "00000000", so it covers everything
else in the file: keys, hyperparameters, whitespace, padding and tensor bytes alike. Text
formats (JSON, the safetensors header) keep it where a reader can see it.
"""

from __future__ import annotations

import re
import zlib

DIGITS = 8
"""Length of the stored digest: a CRC-32 as lowercase hex."""

PLACEHOLDER = b"0" * DIGITS
"""What the digest reads as while it is computed."""

CHANGED = "the checksum does not match: the file was damaged or edited after it was written"
"""The problem reported when a sealed file's bytes differ from those written."""

_HEX = re.compile(rb"[0-9a-f]{8}\Z")


def seal(data: bytearray, at: int) -> None:
    """Write into `data[at:at + 8]` the CRC-32 of `data` with those 8 bytes as the placeholder."""
    data[at : at + DIGITS] = PLACEHOLDER
    data[at : at + DIGITS] = b"%08x" % zlib.crc32(data)


def verify(data: bytes | bytearray | memoryview, at: int) -> bool:
    """Whether the digest stored at `data[at:at + 8]` matches every other byte of `data`."""
    view = memoryview(data).cast("B")
    stored = bytes(view[at : at + DIGITS])
    if not _HEX.match(stored):
        return False
    crc = zlib.crc32(view[:at])
    crc = zlib.crc32(PLACEHOLDER, crc)
    crc = zlib.crc32(view[at + DIGITS :], crc)
    return int(stored, 16) == crc
