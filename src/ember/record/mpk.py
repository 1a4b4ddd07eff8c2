"""Named msgpack records (.mpk, .mpk.gz): one msgpack map, readable by any msgpack tool.

The file is a msgpack map whose entries come in this order:

    "format": "ember.mpk", "version": 1, "precision", "ember_version", "kind",
    "record": <state tree>,
    "crc32": <CRC-32 of every byte before the "crc32" key, always as a 4-byte uint32>

The state tree uses the tagged codec (`ember.record.codec`): a module record is a map of
parameter and buffer names to {"$tensor": {"dtype", "shape", "data"}} with the raw
little-endian bytes of the tensor. In the gzipped variant multi-byte tensors carry
"shuffle": true and their bytes are grouped by significance, which compresses better;
since version 2 (written by the gzipped variant only) float16 and bfloat16 tensors also
carry "rotate": 1, their 16-bit values rotated one bit left before the grouping, which
puts the exponent alone in the high byte (bfloat16 records about 4% smaller). Version 1
files still load; the uncompressed variant writes version 1, which every ember reads.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import msgpack

from ember.record.bounded import unpack_bounded
from ember.record.codec import (
    MSGPACK,
    decode_tree,
    encode_tree,
    inline_tensor_decoder,
    inline_tensor_encoder,
)
from ember.record.file_recorder import FileRecorder
from ember.record.format import EncodeOptions, RecordFormat, register
from ember.record.header import Header, Record, check_version
from ember.record.problem import RecordProblem

FORMAT_NAME = "ember.mpk"
FORMAT_VERSION = 2
TITLE = "named msgpack"

_FORMAT_PAIR = msgpack.packb("format") + msgpack.packb(FORMAT_NAME)
_CRC_KEY = msgpack.packb("crc32") + b"\xce"  # "crc32" then a uint32 marker
_TRAILER_SIZE = len(_CRC_KEY) + 4
_PEEK_BYTES = 128


def _encode(header: Header, tree: Any, options: EncodeOptions) -> bytes:
    compressed = options.compressed
    tensors = inline_tensor_encoder(MSGPACK, shuffle=compressed, rotate=compressed)
    plain = encode_tree(tree, MSGPACK, tensors, precision=options.precision)
    # Only the gzipped variant rotates tensors (version 2); plain files stay version 1.
    version = 1 if header.version == FORMAT_VERSION and not compressed else header.version
    entries = {**header.to_plain(), "version": version, "record": plain}
    packer = msgpack.Packer(use_bin_type=True, autoreset=False)
    packer.pack_map_header(len(entries) + 1)
    for key, value in entries.items():
        packer.pack(key)
        packer.pack(value)
    body = packer.getbuffer()
    trailer = _CRC_KEY + struct.pack(">I", zlib.crc32(body))
    return b"".join((body, trailer))


def _sniff(data: bytes) -> bool:
    if not data:
        return False
    first = data[0]
    if 0x80 <= first <= 0x8F:
        start = 1
    elif first == 0xDE:
        start = 3
    else:
        return False
    return data[start : start + len(_FORMAT_PAIR)] == _FORMAT_PAIR


def _decode(data: bytes) -> Record:
    _peek_version(data)
    if len(data) < _TRAILER_SIZE or data[-_TRAILER_SIZE:-4] != _CRC_KEY:
        raise RecordProblem("the checksum is missing (the file is truncated or damaged)")
    (stored,) = struct.unpack(">I", data[-4:])
    if zlib.crc32(memoryview(data)[:-_TRAILER_SIZE]) != stored:
        raise RecordProblem("the checksum does not match (the file is damaged or truncated)")
    top = unpack_bounded(data)
    header = Header.from_plain(top, format=FORMAT_NAME, title=TITLE, supported=FORMAT_VERSION)
    if "record" not in top:
        raise RecordProblem("the record body is missing")
    tree = decode_tree(top["record"], MSGPACK, inline_tensor_decoder(MSGPACK))
    return Record(header, tree)


def _peek_version(data: bytes) -> None:
    """Check the format version first, so files from a newer ember say so."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=_PEEK_BYTES)
    unpacker.feed(data[:_PEEK_BYTES])
    try:
        unpacker.read_map_header()
        pairs = [unpacker.unpack() for _ in range(4)]
    except Exception:
        raise RecordProblem("the header is truncated or damaged") from None
    if pairs[2] != "version":
        raise RecordProblem("the header lacks a format version")
    check_version(pairs[3], title=TITLE, supported=FORMAT_VERSION)


MPK_FORMAT = register(RecordFormat(FORMAT_NAME, TITLE, FORMAT_VERSION, _sniff, _encode, _decode))


class NamedMpkFileRecorder(FileRecorder):
    """Records to a named msgpack file (.mpk): fast, exact and readable by msgpack tools."""

    file_extension = "mpk"
    format = MPK_FORMAT


class NamedMpkGzFileRecorder(FileRecorder):
    """Records to a gzipped named msgpack file (.mpk.gz): smaller, a little slower."""

    file_extension = "mpk.gz"
    format = MPK_FORMAT
    compressed = True
