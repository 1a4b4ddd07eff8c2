"""`FileCheckpointer`: one record per part and epoch, e.g. `checkpoint/model-3.mpk.gz`."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ember.errors import TrainingError

PARTS = ("model", "optim", "scheduler")


class FileCheckpointer:
    """Saves and loads the parts of a checkpoint (`model`, `optim`, `scheduler`) with a
    recorder. Every file is written atomically by the recorder: a crash leaves the
    previous checkpoint whole."""

    def __init__(self, directory: str | os.PathLike[str], recorder: Any) -> None:
        self.directory = Path(directory)
        self.recorder = recorder
        self.extension: str = recorder.file_extension

    def path(self, part: str, epoch: int) -> Path:
        return self.directory / f"{part}-{epoch}.{self.extension}"

    def save(self, epoch: int, parts: dict[str, Any]) -> list[Path]:
        """Write each part of epoch `epoch`; the model part last is not required, but
        every part is complete on disk before this returns."""
        self.directory.mkdir(parents=True, exist_ok=True)
        written = []
        for part, item in parts.items():
            written.append(self.recorder.save(item, self.path(part, epoch)))
        return written

    def load(self, epoch: int, part: str, target: Any) -> Any:
        path = self.path(part, epoch)
        if not path.exists():
            available = self.epochs()
            listing = ", ".join(map(str, available)) if available else "none"
            raise TrainingError(
                f"No checkpoint {path.name} in {self.directory}: the epochs saved there are "
                f"{listing}. Pass one of them to checkpoint(), or start without checkpoint()."
            )
        return self.recorder.load(target, path)

    def epochs(self) -> list[int]:
        """The epochs whose model checkpoint is present, oldest first."""
        pattern = re.compile(rf"^model-(\d+)\.{re.escape(self.extension)}$")
        found = []
        if self.directory.is_dir():
            for entry in self.directory.iterdir():
                match = pattern.match(entry.name)
                if match:
                    found.append(int(match.group(1)))
        return sorted(found)

    def delete(self, epoch: int) -> None:
        """Remove every part of epoch `epoch` (missing parts are fine)."""
        for part in PARTS:
            try:
                self.path(part, epoch).unlink()
            except FileNotFoundError:
                pass
