"""Safetensors records (.safetensors): plain safetensors files that other tools can read.

Tensors are stored as ordinary safetensors entries, so `safetensors.torch.load_file` returns
them directly. A module record uses the state-dict names as they are ("fc1.weight"); in other
records a tensor is named by its key path joined with dots ("state.0.exp_avg"), with "#2",
"#3"... appended if two paths join to the same name.

The rest goes in the safetensors "__metadata__" string map:

- "format": "pt" (the usual marker);
- "ember": a JSON object holding the header ("format": "ember.safetensors", "version": 2,
  "precision", "ember_version", "kind") and "record", the state tree in the JSON dialect of
  the tagged codec (`ember.record.codec`), where each tensor is {"$tensor": {"name":
  <safetensors entry>}}. The tree alone defines the structure, so names need not be parsed
  back. Tensors of dtypes safetensors lacks are kept inside the JSON as
  {"$tensor": {"inline": {"dtype", "shape", "data"}}};
- "ember_crc32": the CRC-32 of every byte of the file, computed with its own 8 hex digits
  read as "00000000" (`ember.record.checksum`). It covers the safetensors header (names,
  dtypes, shapes, offsets, the metadata with the optimizer's hyperparameters and every
  other value of the tree) and all tensor bytes.

Version 1 files have no "ember_crc32"; each of their tensors carries the CRC-32 of its bytes
instead ("crc32" next to "name"), and that is all they can be checked against. They still load.

Safetensors files without ember metadata load as a flat dict of tensors (kind "state"); a
file that names ember anywhere in its header must be a whole ember record. The `safetensors`
package is needed only when such a file is saved or loaded.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import numpy as np
import torch

from ember.record import checksum
from ember.record.codec import (
    JSON,
    KeyPath,
    decode_tree,
    encode_tree,
    inline_tensor_decoder,
    inline_tensor_encoder,
)
from ember.record.file_recorder import FileRecorder
from ember.record.format import EncodeOptions, RecordFormat, register
from ember.record.header import Header, Record
from ember.record.precision import Precision
from ember.record.problem import RecordProblem

FORMAT_NAME = "ember.safetensors"
FORMAT_VERSION = 2
TITLE = "safetensors"
CHECKSUM_KEY = "ember_crc32"
MAX_HEADER_BYTES = 100_000_000
"""Largest safetensors JSON header accepted (the safetensors library's own limit)."""

_DIGEST_ENTRY = b'"' + CHECKSUM_KEY.encode("ascii") + b'":"'
_V1_METADATA = frozenset({"format", "ember"})

_NATIVE_DTYPES = frozenset(
    {
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    }
)


def _library() -> Any:
    try:
        import safetensors.torch
    except ImportError:
        raise RecordProblem(
            "the safetensors package is not installed (pip install 'ember[safetensors]')"
        ) from None
    return safetensors.torch


def _raw_view(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without copying."""
    t = tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor
    return memoryview(t.contiguous().numpy().reshape(-1).view(np.uint8))  # type: ignore[arg-type]


def _encode(header: Header, tree: Any, options: EncodeOptions) -> bytearray:
    library = _library()
    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    inline = inline_tensor_encoder(JSON, shuffle=False)

    def add_tensor(tensor: torch.Tensor, path: KeyPath) -> dict[str, Any]:
        if tensor.dtype not in _NATIVE_DTYPES:
            return {"inline": inline(tensor, path)}
        t = tensor.detach().to("cpu").resolve_conj().resolve_neg().contiguous()
        storage = t.untyped_storage()
        if storage.data_ptr() in storages or storage.nbytes() != t.numel() * t.element_size():
            t = t.clone()  # safetensors refuses tensors that share or over-span storage
        storages.add(t.untyped_storage().data_ptr())
        base = ".".join(str(part) for part in path) or "tensor"
        name, n = base, 1
        while name in tensors:
            n += 1
            name = f"{base}#{n}"
        tensors[name] = t
        return {"name": name}

    plain = encode_tree(tree, JSON, add_tensor, precision=options.precision)
    ember = json.dumps(
        {**header.to_plain(), "record": plain}, separators=(",", ":"), allow_nan=False
    )
    metadata = {
        "format": "pt",
        "ember": ember,
        CHECKSUM_KEY: checksum.PLACEHOLDER.decode("ascii"),
    }
    data = bytearray(library.save(tensors, metadata=metadata))
    checksum.seal(data, _digest_position(data, _header_size(data)))
    return data


def _header_size(data: bytes | bytearray) -> int:
    (size,) = struct.unpack_from("<Q", data, 0)
    return int(size)


def _digest_position(data: bytes | bytearray, size: int) -> int:
    """Where the 8 digits of the "ember_crc32" metadata entry start in the file."""
    end = 8 + size
    at = data.find(_DIGEST_ENTRY, 8, end)
    if at < 0 or data.find(_DIGEST_ENTRY, at + 1, end) >= 0:
        raise RecordProblem("the checksum entry is missing or repeated (the file is damaged)")
    return at + len(_DIGEST_ENTRY)


def _sniff(data: bytes) -> bool:
    if len(data) < 9:
        return False
    (size,) = struct.unpack_from("<Q", data, 0)
    return 2 <= size <= MAX_HEADER_BYTES and data[8:9] == b"{"


def _decode(data: bytes) -> Record:
    size = _header_size(data)
    if size > len(data) - 8:
        raise RecordProblem("the file is truncated (shorter than its safetensors header says)")
    try:
        table = json.loads(bytes(data[8 : 8 + size]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise RecordProblem("the safetensors header is not valid JSON") from None
    if not isinstance(table, dict):
        raise RecordProblem("the safetensors header is not a JSON object")
    metadata = table.get("__metadata__") or {}
    if not isinstance(metadata, dict):
        raise RecordProblem("the safetensors metadata is not a map")
    sealed = CHECKSUM_KEY in metadata
    if sealed and not checksum.verify(data, _digest_position(data, size)):
        raise RecordProblem(checksum.CHANGED)
    ember_text = metadata.get("ember")
    if ember_text is None:
        if sealed or _names_ember(data, size, metadata):
            raise RecordProblem("the ember metadata is missing (the file is damaged)")
        tensors = _load_tensors(data)  # a safetensors file from another tool
        header = Header(FORMAT_NAME, FORMAT_VERSION, Precision.FULL, "state", "unknown")
        return Record(header, dict(tensors))
    if not isinstance(ember_text, str):
        raise RecordProblem("the ember metadata is not a string")
    try:
        ember = json.loads(ember_text)
    except ValueError:
        raise RecordProblem("the ember metadata is not valid JSON") from None
    header = Header.from_plain(ember, format=FORMAT_NAME, title=TITLE, supported=FORMAT_VERSION)
    if header.version == 1:
        if set(metadata) != _V1_METADATA:
            raise RecordProblem(
                "the file says safetensors format version 1 but does not have its layout "
                "(the file is damaged)"
            )
    elif not sealed:
        raise RecordProblem("the checksum entry is missing (the file is damaged)")
    if "record" not in ember:
        raise RecordProblem("the record body is missing from the ember metadata")
    tensors = _load_tensors(data)
    inline = inline_tensor_decoder(JSON)

    def get_tensor(node: Any) -> torch.Tensor:
        if isinstance(node, dict) and "inline" in node:
            return inline(node["inline"])
        if not isinstance(node, dict) or not isinstance(node.get("name"), str):
            raise RecordProblem("malformed tensor entry in the ember metadata")
        tensor = tensors.get(node["name"])
        if tensor is None:
            raise RecordProblem(f"the tensor {node['name']!r} is missing from the file")
        crc = node.get("crc32")  # version 1: each tensor's own checksum
        if crc is not None and crc != zlib.crc32(_raw_view(tensor)):
            raise RecordProblem(
                f"tensor {node['name']!r} does not match its checksum (the file is damaged)"
            )
        return tensor

    return Record(header, decode_tree(ember["record"], JSON, get_tensor))


def _names_ember(data: bytes, size: int, metadata: dict[Any, Any]) -> bool:
    """Whether a header without ember metadata still shows it was written by ember."""
    if any(isinstance(key, str) and key.startswith("ember") for key in metadata):
        return True
    return data.find(FORMAT_NAME.encode("ascii"), 8, 8 + size) >= 0


def _load_tensors(data: bytes) -> dict[str, torch.Tensor]:
    try:
        return dict(_library().load(bytes(data)))
    except RecordProblem:
        raise
    except Exception as exc:
        raise RecordProblem(f"the safetensors data is invalid ({exc})") from None


SAFETENSORS_FORMAT = register(
    RecordFormat(FORMAT_NAME, TITLE, FORMAT_VERSION, _sniff, _encode, _decode)
)


class SafetensorsFileRecorder(FileRecorder):
    """Records to a .safetensors file that any safetensors reader can open."""

    file_extension = "safetensors"
    format = SAFETENSORS_FORMAT
