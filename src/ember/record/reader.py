"""Reading a record file: gunzip if needed, identify the format by content, decode safely.

Nothing here executes code from the file (no pickle, no eval), and every failure, whatever
its cause, reaches the caller as a `RecordError` that names the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from ember.record.format import FORMATS, RecordFormat, sniff
from ember.record.gz import gunzip_bytes, is_gzip
from ember.record.header import Record
from ember.record.paths import read_file
from ember.record.problem import RecordProblem, record_error


def read_record(
    path: Path, *, expected: RecordFormat | None = None, compressed: bool | None = None
) -> Record:
    """Decode the record in `path`; restrict to one format and/or compression if given."""
    data = read_file(path)
    try:
        return decode_record(data, expected=expected, compressed=compressed)
    except Exception as exc:  # any failure at all means an unreadable file
        raise record_error(path, exc) from (None if isinstance(exc, RecordProblem) else exc)


def decode_record(
    data: bytes, *, expected: RecordFormat | None = None, compressed: bool | None = None
) -> Record:
    """Decode record bytes (see `read_record`); raises `RecordProblem` on bad content."""
    if not data:
        raise RecordProblem("the file is empty")
    gzipped = is_gzip(data)
    label = f"an ember {expected.title} record" if expected is not None else "an ember record"
    if compressed is True and not gzipped:
        raise RecordProblem(f"expected {label} compressed with gzip; {describe(data)}")
    if compressed is False and gzipped:
        raise RecordProblem(
            f"the file is gzip-compressed but {label} is not; "
            "ember.record.load() reads every ember format"
        )

    def identify(content: bytes) -> RecordFormat:
        fmt = sniff(content)
        if fmt is None:
            raise RecordProblem(f"not {label}: {describe(content)}")
        if expected is not None and fmt is not expected:
            raise RecordProblem(
                f"it holds an ember {fmt.title} record, not {label}; "
                "ember.record.load() reads every ember format"
            )
        return fmt

    # gzip content is identified from its first bytes, before the rest is inflated; it
    # comes in a bytearray, which every decoder reads as it reads bytes (no copy)
    inner = cast(bytes, gunzip_bytes(data, check=identify)) if gzipped else data
    return identify(inner).decode(inner)


def describe(data: bytes) -> str:
    """A short guess at what foreign bytes are, for error messages."""
    if not data:
        return "it is empty"
    if data[:1] == b"\x80" and data[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "it looks like a Python pickle, which ember never loads (unpickling can run code)"
    if data[:4] == b"PK\x03\x04":
        return "it looks like a zip archive (torch.save output?), which ember does not read"
    if is_gzip(data):
        return "it is gzip-compressed data"
    names = ", ".join(fmt.title for fmt in FORMATS)
    return f"unknown content starting with {bytes(data[:8])!r} (ember reads {names})"
