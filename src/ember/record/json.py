"""JSON records (.json pretty-printed, .json.gz compact): human-readable and lossless.

The file is one JSON object whose keys come in this order:

    "format": "ember.json", "version": 1, "precision", "ember_version", "kind", "record"

The state tree uses the tagged codec (`ember.record.codec`): scalars, lists and str-keyed
dicts appear as plain JSON; tuples, int-keyed dicts, bytes, nan/inf and the like as tagged
objects. Each tensor is {"$tensor": {"dtype", "shape", "crc32", "data"}} where "data" is the
base64 of its raw little-endian bytes and "crc32" their CRC-32, so damage is detected. In the
gzipped variant multi-byte tensors also carry "shuffle": true (bytes grouped by significance).
"""

from __future__ import annotations

import json
import re
from typing import Any

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
FORMAT_VERSION = 1
TITLE = "JSON"

_START = re.compile(rb"\A\s{0,64}\{")
_SNIFF_BYTES = 4096


def _encode(header: Header, tree: Any, options: EncodeOptions) -> bytes:
    tensors = inline_tensor_encoder(JSON, shuffle=options.compressed, checksum=True)
    plain = encode_tree(tree, JSON, tensors, float_dtype=options.float_dtype)
    document = {**header.to_plain(), "record": plain}
    if options.compressed:
        text = json.dumps(document, separators=(",", ":"), allow_nan=False)
    else:
        text = json.dumps(document, indent=2, allow_nan=False) + "\n"
    return text.encode("ascii")


def _sniff(data: bytes) -> bool:
    return bool(_START.match(data)) and b'"ember.json"' in data[:_SNIFF_BYTES]


def _decode(data: bytes) -> Record:
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
