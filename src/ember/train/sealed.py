"""Sealed JSON: how a run record (a line of `history.jsonl`, `sessions.json`,
`hparams.json`, the run lock) carries the check of its own bytes.

A sealed record is JSON text whose last key (`"crc32"`, or the name given) holds the
CRC-32 of every byte of the text, computed with its own 8 hex digits read as
"00000000": the scheme of the checkpoint records (`ember.checksum`). A record
whose bytes changed after it was written (a flipped bit, a torn or edited line) no
longer matches. A record without the key was written by an earlier version of ember
and is read as it is (`unseal` says it was not sealed), unless its last key is the
key's name with a character or two changed: that record was sealed, then damaged.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from ember.checksum import CHANGED, DIGITS, PLACEHOLDER, verify
from ember.checksum import seal as seal_bytes

KEY = "crc32"
"""The key holding a record's checksum."""


class SealBroken(ValueError):
    """A sealed record's bytes do not read back as written: the problem in words."""


def not_json(error: ValueError) -> str:
    """What is wrong with text that is not JSON, placed within the record itself
    (character N of it), not as a line and column of its own."""
    if isinstance(error, json.JSONDecodeError):
        return f"it is not JSON ({error.msg} at character {error.pos + 1} of the record)"
    return f"it is not JSON ({error})"


def _marker(key: str) -> bytes:
    return json.dumps(key).encode("utf-8") + b': "'


def seal(
    record: Mapping[str, Any],
    key: str = KEY,
    indent: int | None = None,
    separators: tuple[str, str] | None = (", ", ": "),
) -> bytes:
    """`record` as JSON text (UTF-8) with its checksum as the last key."""
    if key in record:
        raise ValueError(f"a record to seal cannot hold the key {key!r}")
    text = json.dumps(
        {**record, key: PLACEHOLDER.decode()},
        indent=indent,
        separators=None if indent is not None else separators,
        allow_nan=False,
    )
    data = bytearray(text.encode("utf-8"))
    seal_bytes(data, data.rindex(_marker(key)) + len(_marker(key)))
    return bytes(data)


def unseal(data: bytes, key: str = KEY) -> tuple[Any, bool]:
    """The JSON value in `data` without its checksum, and whether it was sealed; a
    `SealBroken` when it is not JSON or its checksum does not match its bytes. The
    checksum covers the record as `seal` made it: a file's last newline is not part of it."""
    if data.endswith(b"\n"):
        data = data[:-1]
    try:
        value = json.loads(data)
    except ValueError as error:
        raise SealBroken(not_json(error)) from None
    if not isinstance(value, dict) or key not in value:
        _check_key_name(value, key)
        return value, False
    at = data.rindex(_marker(key)) + len(_marker(key))
    if not isinstance(value[key], str) or len(value[key]) != DIGITS or not verify(data, at):
        raise SealBroken(CHANGED)
    del value[key]
    return value, True


def _check_key_name(value: Any, key: str) -> None:
    """A record whose last key is the checksum's name with a character or two changed,
    holding 8 characters, was sealed and then damaged: never one of an earlier version."""
    if not isinstance(value, dict) or not value:
        return
    last = list(value)[-1]
    if not isinstance(last, str) or len(last) != len(key) or not isinstance(value[last], str):
        return
    if len(value[last]) == DIGITS and 0 < sum(a != b for a, b in zip(last, key)) <= 2:
        raise SealBroken(
            f"its checksum key reads {last!r}, not {key!r}: the file was damaged or edited "
            "after it was written"
        )
