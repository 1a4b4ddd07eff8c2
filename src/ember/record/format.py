"""Record formats: how a header and state tree become bytes, and the registry `load` sniffs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ember.record.header import Header, Record
from ember.record.precision import Precision


@dataclass(frozen=True)
class EncodeOptions:
    """Encoding choices: store floating tensors at `precision` (None: as they are);
    output will be gzipped?"""

    precision: Precision | None = None
    compressed: bool = False


@dataclass(frozen=True)
class RecordFormat:
    """One on-disk format: its name, version, a content sniffer, an encoder and a decoder."""

    name: str
    title: str
    version: int
    sniff: Callable[[bytes], bool]
    encode: Callable[[Header, Any, EncodeOptions], bytes | bytearray]
    decode: Callable[[bytes], Record]


FORMATS: list[RecordFormat] = []
"""Every known format, in sniffing order; filled as the format modules are imported."""


def register(fmt: RecordFormat) -> RecordFormat:
    """Add `fmt` to the registry (once) and return it."""
    if all(existing.name != fmt.name for existing in FORMATS):
        FORMATS.append(fmt)
    return fmt


def sniff(data: bytes) -> RecordFormat | None:
    """The registered format whose sniffer recognises `data`, if any."""
    for fmt in FORMATS:
        if fmt.sniff(data):
            return fmt
    return None
