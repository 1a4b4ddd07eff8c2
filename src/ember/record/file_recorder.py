"""The shared save/load pipeline of every file recorder (subclasses only pick a format), and
`load`: read any ember record, choosing the reader from the file's contents."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from ember.errors import RecordError
from ember.record.atomic import atomic_write_bytes
from ember.record.format import EncodeOptions, RecordFormat
from ember.record.gz import gzip_bytes
from ember.record.header import Header, Kind
from ember.record.paths import find_record, with_extension
from ember.record.precision import Precision, PrecisionLike
from ember.record.problem import record_error
from ember.record.reader import read_record
from ember.record.target import Device, item_state, restore

EXTENSIONS: tuple[str, ...] = ("mpk", "mpk.gz", "bin", "bin.gz", "json", "json.gz", "safetensors")
"""Extensions `load` tries, in order, when `path` names no existing file."""


def load(target: Any, path: str | os.PathLike[str], *, device: Device = None) -> Any:
    """Load the ember record at `path` into `target`, whatever recorder wrote it.

    The format is recognised from the content (gzip and format magic), not the name; the
    extension may be left out. Returns the target, or the decoded state tree (tensors on the
    CPU or `device`) when `target` is None or a dict. Every failure is a `RecordError`.
    """
    file = find_record(path, EXTENSIONS)
    return restore(read_record(file), target, file, device)


class FileRecorder:
    """Saves items to one file each, atomically, in `format`, gzipped if `compressed`."""

    file_extension: str
    format: ClassVar[RecordFormat]
    compressed: ClassVar[bool] = False

    def __init__(self, precision: PrecisionLike = "full") -> None:
        self.precision: Precision = Precision.parse(precision)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(precision={self.precision.value!r})"

    def save(self, item: Any, path: str | os.PathLike[str], *, kind: Kind | None = None) -> Path:
        """Record `item` at `path` (extension appended if missing); returns the final path.

        Module weights are stored at this recorder's precision; optimizer and other state is
        stored exactly. Parent directories are created; the write is atomic.
        """
        final = with_extension(path, self.file_extension)
        chosen, tree = item_state(item, kind)
        header = Header(self.format.name, self.format.version, self.precision, chosen)
        options = EncodeOptions(
            precision=self.precision if chosen == "module" else None,
            compressed=self.compressed,
        )
        try:
            data = self.format.encode(header, tree, options)
            if self.compressed:
                data = gzip_bytes(data)
            final.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(final, data)
        except RecordError:
            raise
        except Exception as exc:
            raise record_error(final, exc, action="save") from exc
        return final

    def load(self, target: Any, path: str | os.PathLike[str], *, device: Device = None) -> Any:
        """Read the record at `path` (extension optional) into `target`; see `ember.record.load`.

        Returns the target, or the decoded state tree when `target` is None or a dict.
        """
        file = find_record(path, (self.file_extension,))
        record = read_record(file, expected=self.format, compressed=self.compressed)
        return restore(record, target, file, device)
