"""Preparing an artifact directory for a run: refuse to mix runs, clear replaced epochs."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from ember.errors import TrainingError

_EPOCH_DIR = re.compile(r"^epoch-(\d+)$")


def epoch_dirs(split_dir: Path) -> dict[int, Path]:
    """The `epoch-N` folders of a split directory, by epoch."""
    found: dict[int, Path] = {}
    if split_dir.is_dir():
        for entry in split_dir.iterdir():
            match = _EPOCH_DIR.match(entry.name)
            if match and entry.is_dir():
                found[int(match.group(1))] = entry
    return found


def prepare_artifact_dir(directory: Path, resume_epoch: int | None, overwrite: bool) -> None:
    """Make `directory` ready: a fresh run needs it free of an earlier run (or
    `overwrite=True`); a resumed run keeps logs of epochs <= `resume_epoch` only."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise TrainingError(f"Cannot create the artifact directory {directory}: {error}.") from None
    splits = [directory / "train", directory / "valid"]
    if resume_epoch is None:
        previous = [p for split in splits for p in epoch_dirs(split).values()]
        checkpoints = directory / "checkpoint"
        has_checkpoints = checkpoints.is_dir() and any(checkpoints.iterdir())
        if previous or has_checkpoints:
            if not overwrite:
                raise TrainingError(
                    f"{directory} already holds a run ({len(previous)} epoch log folder(s)"
                    f"{', checkpoints' if has_checkpoints else ''}). Resume it with "
                    "checkpoint(n), replace it with LearnerBuilder(dir, overwrite=True), or "
                    "choose a new directory."
                )
            for path in [*splits, checkpoints]:
                shutil.rmtree(path, ignore_errors=True)
            (directory / "experiment.log").unlink(missing_ok=True)
        return
    for split in splits:
        for epoch, path in epoch_dirs(split).items():
            if epoch > resume_epoch:
                shutil.rmtree(path)
