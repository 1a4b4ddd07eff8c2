"""JSON records (.json pretty-printed, .json.gz compact): human-readable and lossless.

The file is one JSON object whose keys come in this order:

    "format": "ember.json", "version": 2, "precision", "ember_version", "kind", "record",
    "crc32": "<8 hex digits>"

The state tree uses the tagged codec (`ember.record.codec`): scalars, lists and str-keyed
dicts appear as plain JSON; tuples, int-keyed dicts, bytes, nan/inf and the like as tagged
objects. Each tensor is {"$tensor": {"dtype", "shape", "data"}} where "data" is the base64 of
its raw little-endian bytes. In the gzipped variant multi-byte tensors also carry
"shuffle": true (bytes grouped by significance).

"crc32" is the CRC-32 of every byte of the (uncompressed) file, computed with its own 8 digits
read as "00000000" (`ember.record.checksum`): a learning rate, a beta, a step count or a
space changed after writing makes the file unreadable rather than different.

Version 1 files have no "crc32" key; each of their tensors carries the CRC-32 of its bytes
instead, and that is all they can be checked against. They still load.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ember.record import checksum
from ember.record.codec import (
    JSON,
    decode_tree,
    encode_tree,
    inline_tensor_decoder,
    inline_tensor_encoder,
)
from ember.record.file_recorder import FileRecorder
from ember.record.format import EncodeOptions, RecordFormat, register
from ember.record.header import Header, Record
from ember.record.problem import RecordProblem

FORMAT_NAME = "ember.json"
FORMAT_VERSION = 2
TITLE = "JSON"
CHECKSUM_KEY = "crc32"

_START = re.compile(rb"\A\s{0,64}\{")
_SNIFF_BYTES = 4096
_TRAILER = re.compile(rb'"crc32": ?"([^"]{0,16})"\n?\}\n?\Z')
_TAIL_BYTES = 64
_V1_KEYS = frozenset({"format", "version", "precision", "ember_version", "kind", "record"})


def _encode(header: Header, tree: Any, options: EncodeOptions) -> bytearray:
    tensors = inline_tensor_encoder(JSON, shuffle=options.compressed)
    plain = encode_tree(tree, JSON, tensors, precision=options.precision)
    document = {
        **header.to_plain(),
        "record": plain,
        CHECKSUM_KEY: checksum.PLACEHOLDER.decode("ascii"),
    }
    if options.compressed:
        text = json.dumps(document, separators=(",", ":"), allow_nan=False)
    else:
        text = json.dumps(document, indent=2, allow_nan=False) + "\n"
    data = bytearray(text.encode("ascii"))
    at = _digest_position(data)
    if at is None:  # the placeholder is written just above; it is always found
        raise RecordProblem("the JSON checksum could not be placed")
    checksum.seal(data, at)
    return data


def _digest_position(data: bytes | bytearray) -> int | None:
    """Where the 8 digest digits of the final "crc32" entry start, if the file ends with one."""
    match = _TRAILER.search(data, max(0, len(data) - _TAIL_BYTES))
    return None if match is None else match.start(1)


def _sniff(data: bytes) -> bool:
    return bool(_START.match(data)) and b'"ember.json"' in data[:_SNIFF_BYTES]


def _decode(data: bytes) -> Record:
    at = _digest_position(data)
    if at is not None and not checksum.verify(data, at):
        raise RecordProblem(checksum.CHANGED)
    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise RecordProblem("the file is not valid UTF-8 text") from None
    except ValueError as exc:
        raise RecordProblem(f"the file is not valid JSON ({exc})") from None
    if not isinstance(document, dict):
        raise RecordProblem("not an ember JSON record (the top level is not an object)")
    header = Header.from_plain(document, format=FORMAT_NAME, title=TITLE, supported=FORMAT_VERSION)
    if "record" not in document:
        raise RecordProblem("the record body is missing")
    if header.version == 1:
        if at is not None or set(document) != _V1_KEYS:
            raise RecordProblem(
                "the file says JSON format version 1 but does not have its layout "
                "(the file is damaged)"
            )
    elif at is None or CHECKSUM_KEY not in document:
        raise RecordProblem("the checksum at the end of the file is missing (the file is damaged)")
    return Record(header, decode_tree(document["record"], JSON, inline_tensor_decoder(JSON)))


JSON_FORMAT = register(RecordFormat(FORMAT_NAME, TITLE, FORMAT_VERSION, _sniff, _encode, _decode))


class PrettyJsonFileRecorder(FileRecorder):
    """Records to indented JSON (.json): readable and diffable, large for big tensors."""

    file_extension = "json"
    format = JSON_FORMAT


class JsonGzFileRecorder(FileRecorder):
    """Records to compact gzipped JSON (.json.gz)."""

    file_extension = "json.gz"
    format = JSON_FORMAT
    compressed = True
