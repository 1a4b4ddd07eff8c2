"""Safetensors records (.safetensors): plain safetensors files that other tools can read.

Tensors are stored as ordinary safetensors entries, so `safetensors.torch.load_file` returns
them directly. A module record uses the state-dict names as they are ("fc1.weight"); in other
records a tensor is named by its key path joined with dots ("state.0.exp_avg"), with "#2",
"#3"... appended if two paths join to the same name.

The rest goes in the safetensors "__metadata__" string map: "format": "pt" (the usual
marker) and "ember": a JSON object holding the header ("format": "ember.safetensors",
"version", "precision", "ember_version", "kind") and "record", the state tree in the JSON
dialect of the tagged codec (`ember.record.codec`), where each tensor is
{"$tensor": {"name": <safetensors entry>, "crc32": <CRC-32 of its raw bytes>}}. The tree
alone defines the structure, so names need not be parsed back. Tensors of dtypes safetensors
lacks are kept inside the JSON as {"$tensor": {"inline": {"dtype", "shape", "crc32", "data"}}}.

Safetensors files without "ember" metadata load as a flat dict of tensors (kind "state").
The `safetensors` package is needed only when such a file is saved or loaded.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import numpy as np
import torch

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
FORMAT_VERSION = 1
TITLE = "safetensors"
MAX_HEADER_BYTES = 100_000_000
"""Largest safetensors JSON header accepted (the safetensors library's own limit)."""

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


def _encode(header: Header, tree: Any, options: EncodeOptions) -> bytes:
    library = _library()
    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    inline = inline_tensor_encoder(JSON, shuffle=False, checksum=True)

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
        return {"name": name, "crc32": zlib.crc32(_raw_view(t))}

    plain = encode_tree(tree, JSON, add_tensor, float_dtype=options.float_dtype)
    ember = json.dumps(
        {**header.to_plain(), "record": plain}, separators=(",", ":"), allow_nan=False
    )
    return bytes(library.save(tensors, metadata={"format": "pt", "ember": ember}))


def _sniff(data: bytes) -> bool:
    if len(data) < 9:
        return False
    (size,) = struct.unpack_from("<Q", data, 0)
    return 2 <= size <= MAX_HEADER_BYTES and data[8:9] == b"{"


def _decode(data: bytes) -> Record:
    (size,) = struct.unpack_from("<Q", data, 0)
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
    ember_text = metadata.get("ember")
    ember: Any = None
    if ember_text is not None:
        if not isinstance(ember_text, str):
            raise RecordProblem("the ember metadata is not a string")
        try:
            ember = json.loads(ember_text)
        except ValueError:
            raise RecordProblem("the ember metadata is not valid JSON") from None
        header = Header.from_plain(ember, format=FORMAT_NAME, title=TITLE, supported=FORMAT_VERSION)
        if "record" not in ember:
            raise RecordProblem("the record body is missing from the ember metadata")
    try:
        tensors = _library().load(bytes(data))
    except RecordProblem:
        raise
    except Exception as exc:
        raise RecordProblem(f"the safetensors data is invalid ({exc})") from None
    if ember is None:  # a safetensors file from another tool: a flat dict of tensors
        header = Header(FORMAT_NAME, FORMAT_VERSION, Precision.FULL, "state", "unknown")
        return Record(header, dict(tensors))
    inline = inline_tensor_decoder(JSON)

    def get_tensor(node: Any) -> torch.Tensor:
        if isinstance(node, dict) and "inline" in node:
            return inline(node["inline"])
        if not isinstance(node, dict) or not isinstance(node.get("name"), str):
            raise RecordProblem("malformed tensor entry in the ember metadata")
        tensor = tensors.get(node["name"])
        if tensor is None:
            raise RecordProblem(f"the tensor {node['name']!r} is missing from the file")
        crc = node.get("crc32")
        if crc is not None and crc != zlib.crc32(_raw_view(tensor)):
            raise RecordProblem(
                f"tensor {node['name']!r} does not match its checksum (the file is damaged)"
            )
        return tensor

    return Record(header, decode_tree(ember["record"], JSON, get_tensor))


SAFETENSORS_FORMAT = register(
    RecordFormat(FORMAT_NAME, TITLE, FORMAT_VERSION, _sniff, _encode, _decode)
)


class SafetensorsFileRecorder(FileRecorder):
    """Records to a .safetensors file that any safetensors reader can open."""

    file_extension = "safetensors"
    format = SAFETENSORS_FORMAT
