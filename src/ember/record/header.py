"""The small header every record carries, and the decoded `Record` (header + state tree)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from ember._version import __version__
from ember.record.precision import Precision
from ember.record.problem import RecordProblem

Kind = Literal["module", "optimizer", "state"]
"""What a record holds: a module's weights, an optimizer's state, or any other state tree."""

KINDS: tuple[str, ...] = get_args(Kind)


@dataclass(frozen=True)
class Header:
    """Format name and version, precision, writing ember version and item kind of a record."""

    format: str
    version: int
    precision: Precision
    kind: Kind
    ember_version: str = __version__

    def to_plain(self) -> dict[str, Any]:
        """The header as plain data, "format" and "version" first so readers can peek at them."""
        return {
            "format": self.format,
            "version": self.version,
            "precision": self.precision.value,
            "ember_version": self.ember_version,
            "kind": self.kind,
        }

    @classmethod
    def from_plain(cls, plain: Any, *, format: str, title: str, supported: int) -> Header:
        """Validate a decoded header against the expected format and supported version."""
        if not isinstance(plain, dict):
            raise RecordProblem("the record header is missing")
        if plain.get("format") != format:
            raise RecordProblem(f"not an ember {title} record (format {plain.get('format')!r})")
        version = check_version(plain.get("version"), title=title, supported=supported)
        precision = plain.get("precision")
        try:
            parsed = Precision(precision)
        except ValueError:
            raise RecordProblem(f"unknown precision {precision!r} in the header") from None
        kind = plain.get("kind")
        if kind not in KINDS:
            raise RecordProblem(f"unknown record kind {kind!r} in the header")
        ember_version = plain.get("ember_version")
        if not isinstance(ember_version, str):
            raise RecordProblem("the header lacks the ember version that wrote it")
        return cls(format, version, parsed, kind, ember_version)


def check_version(version: Any, *, title: str, supported: int) -> int:
    """Return a valid format version, or explain that a newer ember wrote the file."""
    if type(version) is not int or version < 1:
        raise RecordProblem(f"invalid format version {version!r} in the header")
    if version > supported:
        raise RecordProblem(
            f"{title} format version {version} was written by a newer ember; "
            f"ember {__version__} reads versions up to {supported}; upgrade ember to read it"
        )
    return version


@dataclass(frozen=True)
class Record:
    """A decoded record: its header and its state tree (tensors on the CPU)."""

    header: Header
    tree: Any
