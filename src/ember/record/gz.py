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

The deflate data is compressed in 256 KiB chunks on several threads at once (zlib and
ISA-L release the GIL), each chunk primed with the 32 KiB before it and ended by a sync
flush, so the chunks join into one ordinary deflate stream (as `pigz` does): `gunzip`,
Python's `gzip` and the gzip reader of earlier ember releases read it as any other gzip
file. With the `isal` package (installed with ember) the chunks are compressed by
ISA-L, several times faster than zlib at a similar size; where it is missing (a
platform without its wheels, or removed), by the standard library's zlib. The output
depends only on the input and the compressor (equal input, equal bytes).

Every header byte must be exactly this, and the content must inflate to exactly the declared
size with a matching CRC-32. Inflating is streamed and never holds more than the declared
size: the content goes into one buffer of that size (no second copy), and a reader may look
at the first 64 KiB of content (`check`: is it an ember record, with a header it reads?)
before the rest is inflated, so a small file whose content is no record is refused after
64 KiB whatever size it declares. Gzip data without an extra field (records from earlier ember
releases, or a record recompressed with the gzip tool) is bounded by the size its trailer
declares instead (ISIZE: the size modulo 4 GiB). A declared size larger than deflate can
produce from the file's bytes (1032 to 1) is refused before anything is inflated. Several
gzip members one after the other (what `cat a.gz b.gz` makes) read as their contents
joined, each member checked in the same way (a member without the size field is bounded by
the size the file's last trailer declares).
"""

from __future__ import annotations

import os
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Callable, Literal

from ember.errors import ConfigError
from ember.record.problem import RecordProblem

GZIP_MAGIC = b"\x1f\x8b"
COMPRESS_LEVEL = 1
"""Compression level: zlib's fastest is about twice as fast as its level 6 on weight data,
within ~1-2% of its size; ISA-L's level 1 is faster still and a little smaller."""

CHUNK_BYTES = 1 << 18
"""Bytes of content compressed as one piece (on one thread). Each piece ends its deflate
block, so the Huffman codes adapt to the data often (weights alternate between byte planes
of very different statistics): 256 KiB chunks are a few percent smaller than 1 MiB ones."""

MAX_THREADS = 8
"""Most threads one record is compressed on."""

MAX_RATIO = 1032
"""Most bytes deflate can inflate from one compressed byte (258-byte matches in 2 bits)."""

SIZE_FIELD = b"EM"
"""Subfield id of the extra field holding the uncompressed size."""

Compressor = Literal["auto", "isal", "zlib"]
"""Which library deflates: "isal" (the optional `isal` package), "zlib" (the standard
library), or "auto": isal when it is installed, else zlib."""

_FEXTRA = 0x04
_HEADER = GZIP_MAGIC + bytes([8, _FEXTRA, 0, 0, 0, 0, 4, 255]) + struct.pack("<H", 12)
_PREFIX = _HEADER + SIZE_FIELD + struct.pack("<H", 8)
_SIZE = struct.Struct("<Q")
_TRAILER = struct.Struct("<II")  # CRC-32, size modulo 2**32
_GZIP_WBITS = 31  # zlib's code for "gzip container" (16 + max window)
_RAW_WBITS = -15  # raw deflate, no container
_WINDOW = 32 * 1024  # deflate's history: each chunk is primed with this much before it
_MEMBER_MIN = 18  # the smallest gzip member: 10-byte header, empty block, 8-byte trailer
_FEED = 1 << 20  # compressed bytes handed to the decompressor at a time
_PIECE = 1 << 18  # most content bytes inflated at a time
HEAD_BYTES = 64 * 1024
"""Content bytes inflated, and shown to a reader's check, before the rest."""


def is_gzip(data: bytes) -> bool:
    """Whether `data` starts like a gzip stream."""
    return data[:2] == GZIP_MAGIC


def deflate_module(compressor: Compressor = "auto") -> ModuleType:
    """The zlib-compatible module that compresses: `isal.isal_zlib` or `zlib`."""
    if compressor == "zlib":
        return zlib
    if compressor not in ("auto", "isal"):
        raise ConfigError(f"unknown compressor {compressor!r}; expected 'auto', 'isal' or 'zlib'")
    try:
        from isal import isal_zlib
    except ImportError:
        if compressor == "isal":
            raise ConfigError(
                "the 'isal' compressor needs the isal package, which ember installs: pip install isal"
            ) from None
        return zlib
    return isal_zlib


def compress_threads() -> int:
    """Threads a record is compressed on by default: the usable cores, at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_THREADS, cores))


def gzip_bytes(
    data: bytes | bytearray | memoryview,
    level: int = COMPRESS_LEVEL,
    *,
    threads: int | None = None,
    compressor: Compressor = "auto",
) -> bytes:
    """Compress `data` into one gzip member declaring its size, 256 KiB chunks on up to
    `threads` threads at once (default `compress_threads()`); equal input and compressor,
    equal bytes, whatever the thread count."""
    view = memoryview(data).cast("B")
    size = view.nbytes
    module = deflate_module(compressor)
    starts = list(range(0, size, CHUNK_BYTES)) or [0]

    def deflate(start: int) -> bytes:
        end = min(start + CHUNK_BYTES, size)
        if start:  # primed with the window before it: matches may reach back across
            zdict = bytes(view[max(0, start - _WINDOW) : start])
            deflater = module.compressobj(
                level, zlib.DEFLATED, _RAW_WBITS, 8, zlib.Z_DEFAULT_STRATEGY, zdict
            )
        else:
            deflater = module.compressobj(level, zlib.DEFLATED, _RAW_WBITS)
        # A sync flush ends a chunk on a byte boundary without ending the stream.
        mode = zlib.Z_FINISH if end >= size else zlib.Z_SYNC_FLUSH
        return bytes(deflater.compress(view[start:end])) + bytes(deflater.flush(mode))

    workers = min(threads if threads is not None else compress_threads(), len(starts))
    if workers < 1:
        raise ConfigError(f"threads must be at least 1, got {threads}")
    if workers == 1:
        crc = module.crc32(view)
        pieces = [deflate(start) for start in starts]
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="ember-gzip") as pool:
            checksum = pool.submit(module.crc32, view)
            pieces = list(pool.map(deflate, starts))
            crc = checksum.result()
    return b"".join((_PREFIX, _SIZE.pack(size), *pieces, _TRAILER.pack(crc, size & 0xFFFFFFFF)))


def declared_size(data: bytes | memoryview) -> int:
    """The uncompressed size the (first) gzip member of `data` declares; a problem if it
    is missing or impossible. Without ember's size field, the size in the last 4 bytes."""
    if len(data) < _MEMBER_MIN:
        raise RecordProblem("the gzip data is truncated (the file is incomplete)")
    if data[3] & _FEXTRA:
        if bytes(data[: len(_PREFIX)]) != _PREFIX:
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
    return int(size)


def gunzip_bytes(data: bytes, check: Callable[[bytes], object] | None = None) -> bytes | bytearray:
    """Decompress gzip data (one member, or several one after the other), never past
    the size each member declares.

    Damage, truncation, trailing bytes and content longer or shorter than declared are
    problems; memory use is bounded by the declared sizes (one buffer a member). `check`
    is called with the first `HEAD_BYTES` of the content (all of it when shorter) before
    the rest is inflated: it raises to refuse the content there.
    """
    view = memoryview(data)
    pieces: list[bytes | bytearray] = []
    position = 0
    while True:
        piece, used = _inflate_member(view[position:], check if not pieces else None)
        pieces.append(piece)
        position += used
        if position == len(view):
            break
        if view[position : position + 2] != GZIP_MAGIC:
            raise RecordProblem("unexpected bytes after the end of the gzip data")
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _inflate_member(
    data: memoryview, check: Callable[[bytes], object] | None
) -> tuple[bytes | bytearray, int]:
    """Inflate the gzip member at the start of `data`: its content and its length. The
    content goes into one buffer of the declared size once `check` passed its head."""
    size = declared_size(data)
    sized = bool(data[3] & _FEXTRA)
    decompressor = zlib.decompressobj(_GZIP_WBITS)
    head = bytearray()
    out: bytearray | None = None
    produced = consumed = 0
    pending: bytes | memoryview = b""
    try:
        while not decompressor.eof:
            if not pending:
                if consumed >= len(data):
                    raise RecordProblem("the gzip data is truncated (the file is incomplete)")
                pending = data[consumed : consumed + _FEED]
                consumed += len(pending)
            want = HEAD_BYTES - produced if out is None else _PIECE
            piece = decompressor.decompress(pending, min(want, size + 1 - produced))
            pending = decompressor.unconsumed_tail
            if produced + len(piece) > size:
                raise RecordProblem(_past_message(size, sized))
            if out is None:
                head += piece
            else:
                out[produced : produced + len(piece)] = piece
            produced += len(piece)
            if out is None and (produced >= HEAD_BYTES or decompressor.eof):
                if check is not None:
                    check(bytes(head))
                out = bytearray(max(size, produced))
                out[:produced] = head
                head = bytearray()
    except zlib.error as exc:
        raise RecordProblem(f"the gzip data is damaged ({exc})") from None
    used = consumed - len(pending) - len(decompressor.unused_data)
    # zlib has checked the member's own trailer (CRC-32 and size modulo 4 GiB); a member
    # without ember's field was only bounded by the size the last trailer declares.
    if sized and produced != size:
        raise RecordProblem(
            f"the gzip data inflates to {produced} bytes, not the {size} it declares "
            "(the file is damaged)"
        )
    assert out is not None
    if produced < len(out):  # a member without ember's field, shorter than its trailer says
        del out[produced:]
    return out, used


def _past_message(size: int, sized: bool) -> str:
    hint = ""
    if not sized:
        hint = (
            "; gzip files without ember's size field state their size modulo 4 GiB only: "
            "if this is a genuine record over 4 GiB, decompress it (gzip -dk FILE) "
            "and load the uncompressed file"
        )
    return (
        f"the gzip data inflates past the {size} bytes it declares "
        f"(the file is damaged or not a genuine record){hint}"
    )
