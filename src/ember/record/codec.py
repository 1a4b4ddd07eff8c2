"""Tagged tree codec: Python state trees <-> plain data that msgpack or JSON can carry.

A state tree is made of dicts (str, int or other hashable scalar keys), lists, tuples, tensors,
numpy arrays and scalars (int, float incl. nan/inf, bool, None, str, bytes, numpy scalars).
Plain data has only maps, lists and scalars, so everything else becomes a *tagged map*: a map
with exactly one key that starts with "$", holding that kind of value:

    {"$tensor": <format-specific node>}         {"$tuple": [items]}
    {"$ndarray": {"dtype", "shape", "data"}}    {"$npscalar": {"dtype", "data"}}
    {"$bytes": "<base64>"}   (JSON only)        {"$float": "nan" | "inf" | "-inf"}   (JSON only)
    {"$int": "<decimal>"}    (ints msgpack cannot hold)
    {"$dict": [[key, value], ...]}   (dicts with keys the syntax cannot hold, or that look tagged)

Every other map is a plain dict, so the mapping is reversible and key types survive exactly.
"""

from __future__ import annotations

import base64
import binascii
import math
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ember.record.arrays import (
    ndarray_from_bytes,
    ndarray_to_bytes,
    rotate_left_16,
    rotate_right_16,
    shuffle_bytes,
    tensor_from_bytes,
    tensor_itemsize,
    tensor_to_bytes,
    unshuffle_bytes,
)
from ember.record.precision import Precision
from ember.record.problem import RecordProblem

MAX_DEPTH = 100
"""Deepest nesting a tree may have; deeper (or self-referencing) trees are refused."""

MAX_INT_DIGITS = 4000
"""Longest decimal string accepted for a "$int" tag."""

KeyPath = tuple[Any, ...]
TensorEncoder = Callable[[torch.Tensor, KeyPath], Any]
TensorDecoder = Callable[[Any], torch.Tensor]


@dataclass(frozen=True)
class Dialect:
    """What a serialization syntax carries natively; anything else is tagged."""

    name: str
    native_bytes: bool
    native_nonfinite: bool
    native_int_keys: bool
    int_min: int | None
    int_max: int | None


MSGPACK = Dialect("msgpack", True, True, True, -(2**63), 2**64 - 1)
JSON = Dialect("json", False, False, False, None, None)


def encode_tree(
    tree: Any,
    dialect: Dialect,
    encode_tensor: TensorEncoder,
    *,
    precision: Precision | None = None,
) -> Any:
    """Turn a state tree into plain data; floating tensors are stored at `precision` if
    given (`Precision.stored`)."""

    def bytes_out(data: bytes) -> Any:
        return data if dialect.native_bytes else base64.b64encode(data).decode("ascii")

    def plain_key(key: Any) -> bool:
        if type(key) is str:
            return True
        return dialect.native_int_keys and type(key) is int and _int_fits(key, dialect)

    def enc(value: Any, path: KeyPath) -> Any:
        if len(path) > MAX_DEPTH:
            raise RecordProblem(
                f"the state is nested more than {MAX_DEPTH} levels deep "
                f"(or refers to itself) at {format_path(path[:8])}..."
            )
        if value is None or type(value) in (bool, str):
            return value
        if isinstance(value, str):
            return str(value)
        if isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
            return data if dialect.native_bytes else {"$bytes": bytes_out(data)}
        if isinstance(value, np.generic):
            name, _, data = ndarray_to_bytes(np.asarray(value))
            return {"$npscalar": {"dtype": name, "data": bytes_out(data)}}
        if isinstance(value, int):
            value = int(value)
            return value if _int_fits(value, dialect) else {"$int": str(value)}
        if isinstance(value, float):
            value = float(value)
            if dialect.native_nonfinite or math.isfinite(value):
                return value
            return {"$float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
        if isinstance(value, torch.Tensor):
            if precision is not None and value.is_floating_point():
                stored = precision.stored(value.dtype)
                if stored != value.dtype:
                    value = value.detach().to(dtype=stored)
            return {"$tensor": encode_tensor(value, path)}
        if isinstance(value, np.ndarray):
            name, shape, data = ndarray_to_bytes(value)
            return {"$ndarray": {"dtype": name, "shape": shape, "data": bytes_out(data)}}
        if isinstance(value, tuple):
            return {"$tuple": [enc(item, (*path, i)) for i, item in enumerate(value)]}
        if isinstance(value, list):
            return [enc(item, (*path, i)) for i, item in enumerate(value)]
        if isinstance(value, Mapping):
            keys = list(value.keys())
            tag_like = len(keys) == 1 and isinstance(keys[0], str) and keys[0].startswith("$")
            if not tag_like and all(plain_key(k) for k in keys):
                return {k: enc(value[k], (*path, k)) for k in keys}
            return {"$dict": [[enc(k, (*path, "<key>")), enc(value[k], (*path, k))] for k in keys]}
        raise RecordProblem(
            f"cannot record a value of type {type(value).__name__} at {format_path(path)}"
        )

    return enc(tree, ())


def decode_tree(plain: Any, dialect: Dialect, decode_tensor: TensorDecoder) -> Any:
    """Turn plain data produced by `encode_tree` back into the state tree (validating it)."""

    def bytes_in(data: Any) -> bytes:
        if dialect.native_bytes:
            if not isinstance(data, bytes):
                raise RecordProblem("expected raw bytes")
            return data
        return _b64decode(data)

    def dec(node: Any, depth: int) -> Any:
        if depth > MAX_DEPTH + 1:
            raise RecordProblem(f"the data is nested more than {MAX_DEPTH} levels deep")
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, bytes) and dialect.native_bytes:
            return node
        if isinstance(node, list):
            return [dec(item, depth + 1) for item in node]
        if isinstance(node, dict):
            if len(node) == 1:
                ((key, payload),) = node.items()
                if isinstance(key, str) and key.startswith("$"):
                    return tagged(key, payload, depth)
            out = {}
            for key, value in node.items():
                if not (type(key) is str or (dialect.native_int_keys and type(key) is int)):
                    raise RecordProblem(f"unexpected map key of type {type(key).__name__}")
                out[key] = dec(value, depth + 1)
            return out
        raise RecordProblem(f"unexpected value of type {type(node).__name__} in the data")

    def tagged(tag: str, payload: Any, depth: int) -> Any:
        if tag == "$tensor":
            return decode_tensor(payload)
        if tag == "$tuple":
            if not isinstance(payload, list):
                raise RecordProblem("malformed $tuple entry")
            return tuple(dec(item, depth + 1) for item in payload)
        if tag == "$dict":
            if not isinstance(payload, list):
                raise RecordProblem("malformed $dict entry")
            out = {}
            for pair in payload:
                if not isinstance(pair, list) or len(pair) != 2:
                    raise RecordProblem("malformed $dict entry")
                key = dec(pair[0], depth + 1)
                try:
                    hash(key)
                except TypeError:
                    raise RecordProblem("a dict key in the data is not hashable") from None
                out[key] = dec(pair[1], depth + 1)
            return out
        if tag == "$ndarray":
            fields = _fields(payload, tag, ("dtype", "shape", "data"))
            return ndarray_from_bytes(fields["dtype"], fields["shape"], bytes_in(fields["data"]))
        if tag == "$npscalar":
            fields = _fields(payload, tag, ("dtype", "data"))
            return ndarray_from_bytes(fields["dtype"], [], bytes_in(fields["data"]))[()]
        if tag == "$bytes" and not dialect.native_bytes:
            return _b64decode(payload)
        if tag == "$float" and payload in ("nan", "inf", "-inf"):
            return float(payload)
        if tag == "$int" and isinstance(payload, str) and 0 < len(payload) <= MAX_INT_DIGITS:
            try:
                return int(payload, 10)
            except ValueError:
                raise RecordProblem(f"malformed $int entry {payload[:40]!r}") from None
        raise RecordProblem(f"unknown or malformed tagged entry {tag!r}")

    return dec(plain, 0)


ROTATED_DTYPES = ("float16", "bfloat16")
"""16-bit floats whose bits `inline_tensor_encoder(rotate=True)` rotates before shuffling."""


def inline_tensor_encoder(
    dialect: Dialect, *, shuffle: bool, rotate: bool = False
) -> TensorEncoder:
    """Encode tensors in place as {"dtype", "shape", "data"[, "shuffle"][, "rotate"]} maps.

    `shuffle` stores the bytes grouped by significance (better gzip ratio); with `rotate`
    too, the bits of 16-bit floats are first rotated one place left ("rotate": 1), so the
    sign bit joins the mantissa and the high byte holds the exponent. The formats
    checksum their whole file, so tensors carry no checksum of their own.
    """

    def encode(tensor: torch.Tensor, path: KeyPath) -> Any:
        name, shape, data = tensor_to_bytes(tensor)
        node: dict[str, Any] = {"dtype": name, "shape": shape}
        itemsize = tensor_itemsize(name)
        if shuffle and rotate and name in ROTATED_DTYPES:
            data = rotate_left_16(data)
            node["rotate"] = 1
        if shuffle and itemsize > 1:
            data = shuffle_bytes(data, itemsize)
            node["shuffle"] = True
        node["data"] = data if dialect.native_bytes else base64.b64encode(data).decode("ascii")
        return node

    return encode


def inline_tensor_decoder(dialect: Dialect) -> TensorDecoder:
    """Decode tensors written by `inline_tensor_encoder`, checking sizes.

    A "crc32" entry (the CRC-32 of the raw bytes, in files written before the formats
    checksummed the whole file) is checked too.
    """

    def decode(node: Any) -> torch.Tensor:
        if not isinstance(node, dict):
            raise RecordProblem("malformed tensor entry")
        fields = _fields(node, "$tensor", ("dtype", "shape", "data"))
        raw = fields["data"]
        if dialect.native_bytes:
            if not isinstance(raw, bytes):
                raise RecordProblem("malformed tensor entry: data is not raw bytes")
            data: bytes | memoryview = raw
        else:
            data = _b64decode(raw)
        if node.get("shuffle", False) is True:
            data = unshuffle_bytes(data, tensor_itemsize(fields["dtype"]))
        rotate = node.get("rotate")
        if rotate is not None:
            if rotate != 1 or fields["dtype"] not in ROTATED_DTYPES:
                raise RecordProblem(f"malformed tensor entry: rotate {rotate!r}")
            data = rotate_right_16(data)
        crc = node.get("crc32")
        if crc is not None and crc != zlib.crc32(data):
            raise RecordProblem("tensor data does not match its checksum (the file is damaged)")
        return tensor_from_bytes(fields["dtype"], fields["shape"], data)

    return decode


def format_path(path: KeyPath) -> str:
    """Human-readable location of a value, e.g. state[0]['exp_avg']."""
    return "state" + "".join(f"[{k!r}]" for k in path)


def _int_fits(value: int, dialect: Dialect) -> bool:
    low, high = dialect.int_min, dialect.int_max
    return (low is None or value >= low) and (high is None or value <= high)


def _fields(payload: Any, tag: str, names: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(payload, dict) or any(name not in payload for name in names):
        raise RecordProblem(f"malformed {tag} entry")
    return payload


def _b64decode(text: Any) -> bytes:
    if not isinstance(text, str):
        raise RecordProblem("expected base64 text")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise RecordProblem("malformed base64 data") from None
