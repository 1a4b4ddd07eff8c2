"""Ember's own binary container (.bin, .bin.gz): a small header, then aligned raw tensor data.

Layout (all integers little-endian):

    offset  size  field
    0       8     magic b"\\x89EMBBIN\\n" (the high byte and newline expose text-mode damage)
    8       4     u32  format version
    12      4     u32  CRC-32 of every byte from offset 24 to the end of the file
    16      8     u64  header length H
    24      H     msgpack map: "format": "ember.bin", "version", "precision", "ember_version",
                  "kind", "record": <state tree>, "tensors": <tensor table>
    24+H    ...   zero padding up to the next multiple of 64 (the start of the data section, D)
    D       ...   raw little-endian tensor bytes; each tensor starts at a multiple of 64 from D

The state tree uses the tagged codec (`ember.record.codec`) with {"$tensor": i} pointing at
entry i of the tensor table, [dtype name, shape, offset from D, byte length, shuffled]. In the
gzipped variant (the whole file is gzipped) multi-byte tensors are stored byte-shuffled
(grouped by significance) to compress better; `shuffled` says so.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import msgpack
import torch

from ember.record.arrays import (
    check_shape,
    expected_nbytes,
    shuffle_bytes,
    tensor_from_bytes,
    tensor_itemsize,
    tensor_to_bytes,
    unshuffle_bytes,
)
from ember.record.bounded import unpack_bounded
from ember.record.codec import MSGPACK, KeyPath, decode_tree, encode_tree
from ember.record.file_recorder import FileRecorder
from ember.record.format import EncodeOptions, RecordFormat, register
from ember.record.header import Header, Record, check_version
from ember.record.problem import RecordProblem

FORMAT_NAME = "ember.bin"
FORMAT_VERSION = 1
TITLE = "binary"
MAGIC = b"\x89EMBBIN\n"
ALIGN = 64

_PREFIX = struct.Struct("<8sIIQ")  # magic, version, crc32, header length


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _encode(header: Header, tree: Any, options: EncodeOptions) -> bytes:
    table: list[list[Any]] = []
    chunks: list[Any] = []
    offset = 0

    def add_tensor(tensor: torch.Tensor, path: KeyPath) -> int:
        nonlocal offset
        name, shape, data = tensor_to_bytes(tensor)
        itemsize = tensor_itemsize(name)
        shuffled = options.compressed and itemsize > 1
        if shuffled:
            data = shuffle_bytes(data, itemsize)
        start = _align(offset)
        if start > offset:
            chunks.append(bytes(start - offset))
        chunks.append(data)
        table.append([name, shape, start, len(data), shuffled])
        offset = start + len(data)
        return len(table) - 1

    plain = encode_tree(tree, MSGPACK, add_tensor, precision=options.precision)
    meta_plain = {**header.to_plain(), "record": plain, "tensors": table}
    meta = msgpack.packb(meta_plain, use_bin_type=True)
    pad = bytes(_align(_PREFIX.size + len(meta)) - _PREFIX.size - len(meta))
    body = b"".join([meta, pad, *chunks])
    prefix = _PREFIX.pack(MAGIC, header.version, zlib.crc32(body), len(meta))
    return prefix + body


def _sniff(data: bytes) -> bool:
    return data[: len(MAGIC)] == MAGIC


def _decode(data: bytes) -> Record:
    if len(data) < _PREFIX.size:
        raise RecordProblem("the file is truncated (shorter than its fixed header)")
    magic, version, crc, meta_len = _PREFIX.unpack_from(data, 0)
    if magic != MAGIC:
        raise RecordProblem("not an ember binary record (bad magic bytes)")
    check_version(version, title=TITLE, supported=FORMAT_VERSION)
    view = memoryview(data)
    if zlib.crc32(view[_PREFIX.size :]) != crc:
        raise RecordProblem("the checksum does not match (the file is damaged or truncated)")
    meta_end = _PREFIX.size + meta_len
    data_start = _align(meta_end)
    if data_start > len(data):
        raise RecordProblem("the header is longer than the file")
    meta = unpack_bounded(view[_PREFIX.size : meta_end])
    header = Header.from_plain(meta, format=FORMAT_NAME, title=TITLE, supported=FORMAT_VERSION)
    if header.version != version:
        raise RecordProblem("the two copies of the format version disagree")
    table = meta.get("tensors")
    if not isinstance(table, list) or "record" not in meta:
        raise RecordProblem("the tensor table or record body is missing")
    section = view[data_start:]

    def get_tensor(index: Any) -> torch.Tensor:
        if type(index) is not int or not 0 <= index < len(table):
            raise RecordProblem(f"tensor reference {index!r} is out of range")
        entry = table[index]
        if not isinstance(entry, list) or len(entry) != 5:
            raise RecordProblem(f"tensor table entry {index} is malformed")
        name, shape, start, nbytes, shuffled = entry
        if type(start) is not int or type(nbytes) is not int or start < 0 or nbytes < 0:
            raise RecordProblem(f"tensor table entry {index} is malformed")
        if start + nbytes > len(section):
            raise RecordProblem(f"tensor {index} lies beyond the end of the file")
        itemsize = tensor_itemsize(name)
        if nbytes != expected_nbytes(check_shape(shape), itemsize):
            raise RecordProblem(f"tensor {index} has a byte length that does not fit its shape")
        chunk: Any = section[start : start + nbytes]
        if shuffled is True:
            chunk = unshuffle_bytes(chunk, itemsize)
        return tensor_from_bytes(name, shape, chunk)

    return Record(header, decode_tree(meta["record"], MSGPACK, get_tensor))


BIN_FORMAT = register(RecordFormat(FORMAT_NAME, TITLE, FORMAT_VERSION, _sniff, _encode, _decode))


class BinFileRecorder(FileRecorder):
    """Records to ember's binary container (.bin): header plus aligned raw tensor data."""

    file_extension = "bin"
    format = BIN_FORMAT


class BinGzFileRecorder(FileRecorder):
    """Records to a gzipped binary container (.bin.gz)."""

    file_extension = "bin.gz"
    format = BIN_FORMAT
    compressed = True
