"""The one owner of a run's artifact directory: every path in it, and (from metric_files.py)
the metric-line format.

```
ARTIFACT_DIR/
├── experiment.log              human text (Python logging)
├── rank-N.log                  each process's own log lines (`devices(..., rank_logs=True)`)
├── history.jsonl               exact epoch values, checkpoint epochs, outcome (history.py)
├── hparams.json                the run's hyperparameters, when given (run_record.py)
├── sessions.json               when each `fit` of the run started and ended (run_record.py)
├── wandb-run.json              the W&B run this run logs to, and its steps (wandb_logger.py)
├── wandb/                      W&B's own files (offline runs), when a W&B logger is used
├── .lock                       the run using the directory (host, pid, start time, boot id)
├── checkpoint/                 the file checkpointer's records (`.epoch-N.next/`: a
│                               checkpoint of epoch N written whole before it replaces the
│                               one there)
├── train/epoch-N/<Metric>.log  one "value,weight,check" line per iteration
├── train/epoch-N/<Metric>.json the epoch's count matrix of a matrix metric (confusion matrix)
├── valid/epoch-N/<Metric>.log  the end-of-epoch validation
├── valid/epoch-N/iteration-K/<Metric>.log
│                               a validation inside epoch N, after K training batches
│                               (`valid_every`), one line per validation batch (and
│                               a matrix metric's `<Metric>.json`)
└── lr-find.json                the learning-rate range test's curve (`lr_find`)
```

Everything else asks this module for a path or a parsed line; nothing builds one itself.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Iterator

from ember.errors import EmberError, TrainingError
from ember.train.files.metric_files import (
    _UNSAFE,
    matrix_file_name,
    metric_file_name,
    metric_log_path,
    read_matrix,
    truncate_log,
    write_matrix,
)

__all__ = [
    "SPLITS",
    "Artifacts",
    "checkpoint_epochs",
    "checkpoint_path",
]

SPLITS = ("train", "valid")
_EPOCH_DIR = re.compile(r"^epoch-(\d+)$")
_POINT_DIR = re.compile(r"^iteration-(\d+)$")
_TEMPORARY = re.compile(r"^\..+\.[0-9a-f]{12}\.tmp$")
_STAGED_DIR = re.compile(r"^\.epoch-(\d+)\.next$")
_RANK_LOG = re.compile(r"^rank-\d+\.log$")
log = logging.getLogger(__name__)


# Checkpoint files -------------------------------------------------------------------
def checkpoint_path(
    directory: str | os.PathLike[str], part: str, epoch: int, extension: str
) -> Path:
    """`directory/<part>-<epoch>.<extension>`, e.g. `checkpoint/model-3.mpk.gz`."""
    return Path(directory) / f"{part}-{epoch}.{extension}"


def checkpoint_shard_path(
    directory: str | os.PathLike[str], part: str, epoch: int, rank: int, extension: str
) -> Path:
    """`directory/<part>-<epoch>.rank-<rank>.<extension>`: one process's shard of a part
    of a sharded checkpoint, e.g. `checkpoint/model-3.rank-1.mpk`."""
    return Path(directory) / f"{part}-{epoch}.rank-{rank}.{extension}"


def checkpoint_shards(
    directory: str | os.PathLike[str], part: str, epoch: int, extension: str
) -> list[Path]:
    """Every shard file of a part of a checkpoint in `directory`."""
    pattern = re.compile(rf"^{re.escape(part)}-{epoch}\.rank-\d+\.{re.escape(extension)}$")
    root = Path(directory)
    if not root.is_dir():
        return []
    return sorted(entry for entry in root.iterdir() if pattern.match(entry.name))


def checkpoint_staging(directory: str | os.PathLike[str], epoch: int) -> Path:
    """`directory/.epoch-<epoch>.next/`: where a checkpoint of `epoch` is written whole
    before its parts replace the ones in `directory`."""
    return Path(directory) / f".epoch-{epoch}.next"


def staged_checkpoints(directory: str | os.PathLike[str]) -> dict[int, Path]:
    """The staging folders in `directory` (`checkpoint_staging`), by epoch."""
    return numbered_dirs(Path(directory), _STAGED_DIR)


def numbered_dirs(directory: Path, pattern: re.Pattern[str]) -> dict[int, Path]:
    """The folders in `directory` whose name `pattern` matches, by the number it captures."""
    found: dict[int, Path] = {}
    if directory.is_dir():
        for entry in directory.iterdir():
            match = pattern.match(entry.name)
            if match and entry.is_dir():
                found[int(match.group(1))] = entry
    return found


def checkpoint_epochs(directory: str | os.PathLike[str], part: str, extension: str) -> list[int]:
    """The epochs that have a `part` file in `directory`, oldest first."""
    pattern = re.compile(rf"^{re.escape(part)}-(\d+)\.{re.escape(extension)}$")
    root = Path(directory)
    if not root.is_dir():
        return []
    found = (pattern.match(entry.name) for entry in root.iterdir())
    return sorted(int(match.group(1)) for match in found if match)


# The directory ----------------------------------------------------------------------
class Artifacts:
    """The paths of one artifact directory, and the file operations a run needs on it."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    @property
    def experiment_log(self) -> Path:
        return self.root / "experiment.log"

    def rank_log(self, rank: int) -> Path:
        """`rank-N.log`: the log lines of the process of rank N (`rank_logs=True`)."""
        return self.root / f"rank-{rank}.log"

    def memory_snapshot(self, rank: int = 0) -> Path:
        """`memory-snapshot.pickle`: PyTorch's CUDA memory snapshot, written when an
        out-of-memory error ended the run (`memory-snapshot-rank<r>.pickle` of another rank;
        for https://pytorch.org/memory_viz, never loaded by ember)."""
        suffix = f"-rank{rank}" if rank else ""
        return self.root / f"memory-snapshot{suffix}.pickle"

    @property
    def history(self) -> Path:
        """`history.jsonl`: where a run writes its history."""
        return self.root / "history.jsonl"

    @property
    def legacy_history(self) -> Path:
        """`history.json`: the history of a run made by an earlier version of ember."""
        return self.root / "history.json"

    @property
    def saved_history(self) -> Path | None:
        """The history file a run left (`history.jsonl`, else an earlier version's
        `history.json`), or None."""
        for path in (self.history, self.legacy_history):
            if path.exists():
                return path
        return None

    @property
    def hparams(self) -> Path:
        """`hparams.json`: the hyperparameters given to `LearnerBuilder.hparams`."""
        return self.root / "hparams.json"

    @property
    def sessions(self) -> Path:
        """`sessions.json`: the start and end time of each `fit` of the run."""
        return self.root / "sessions.json"

    @property
    def wandb_run(self) -> Path:
        """`wandb-run.json`: the id of the W&B run a W&B logger writes to, and its steps."""
        return self.root / "wandb-run.json"

    @property
    def wandb_dir(self) -> Path:
        """Where W&B keeps its own files (it makes a `wandb/` folder in it)."""
        return self.root

    @property
    def wandb_files(self) -> Path:
        """`wandb/`: W&B's own files, its offline runs (`offline-run-*`) among them."""
        return self.wandb_dir / "wandb"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoint"

    def split_dir(self, split: str) -> Path:
        return self.root / split

    def epoch_dir(self, split: str, epoch: int) -> Path:
        return self.root / split / f"epoch-{epoch}"

    def metric_log(self, split: str, epoch: int, name: str) -> Path:
        return metric_log_path(self.root / split, epoch, name)

    # Validation inside an epoch (valid_every) ------------------------------------------
    def point_dir(self, epoch: int, iteration: int) -> Path:
        """`valid/epoch-N/iteration-K/`: the validation run inside epoch N after its K-th
        training batch. The end-of-epoch files of `valid/epoch-N/` keep their meaning."""
        return self.epoch_dir("valid", epoch) / f"iteration-{iteration}"

    def point_log(self, epoch: int, iteration: int, name: str) -> Path:
        """`valid/epoch-N/iteration-K/<Metric>.log`: one `value,weight,check` line per batch."""
        return self.point_dir(epoch, iteration) / metric_file_name(name)

    def point_matrix_file(self, epoch: int, iteration: int, name: str) -> Path:
        """`valid/epoch-N/iteration-K/<Metric>.json`: a matrix metric's counts at a point."""
        return self.point_dir(epoch, iteration) / matrix_file_name(name)

    def point_dirs(self, epoch: int) -> dict[int, Path]:
        """The `iteration-K` folders of epoch N's validation, by K."""
        return numbered_dirs(self.epoch_dir("valid", epoch), _POINT_DIR)

    @property
    def lr_find(self) -> Path:
        """`lr-find.json`: the curve of the learning-rate range test (`lr_find`)."""
        return self.root / "lr-find.json"

    # Evaluations -------------------------------------------------------------------
    @property
    def evaluation_log(self) -> Path:
        return self.root / "evaluation.log"

    @property
    def evaluations(self) -> Path:
        """`test/`: one folder per named evaluation."""
        return self.root / "test"

    def evaluation_dir(self, name: str) -> Path:
        """`test/<name>/`. A name must be usable as a folder name as it is (letters,
        digits and `._+-=@%()[]`, not starting with a dot), so that the folder holds
        exactly the name given."""
        if not isinstance(name, str) or not name or name.startswith(".") or _UNSAFE.search(name):
            raise EmberError(
                f"An evaluation name must be a non-empty folder name made of letters, digits "
                f"and ._+-=@%()[] (not starting with '.'), got {name!r}."
            )
        return self.evaluations / name

    def evaluation_metric_log(self, name: str, metric: str) -> Path:
        """`test/<name>/<Metric>.log`: one `value,weight,check` line per batch."""
        return self.evaluation_dir(name) / metric_file_name(metric)

    def evaluation_partial(self, name: str) -> Path:
        """`test/.<name>.partial/`: where an evaluation writes until it completes; it
        then replaces `test/<name>/` (an interrupted one is removed)."""
        return self.evaluations / f".{self.evaluation_dir(name).name}.partial"

    def evaluation_values(self, name: str) -> Path:
        """`test/<name>/values.json`: the evaluation's whole-set values."""
        return self.evaluation_dir(name) / "values.json"

    def epoch_dirs(self, split: str) -> dict[int, Path]:
        """The `epoch-N` folders of a split, by epoch."""
        return numbered_dirs(self.split_dir(split), _EPOCH_DIR)

    def metric_logs(self, split: str) -> Iterator[tuple[int, str, Path]]:
        """`(epoch, file stem, path)` of every metric log of a split, oldest epoch first."""
        for epoch, folder in sorted(self.epoch_dirs(split).items()):
            for path in sorted(folder.glob("*.log")):
                yield epoch, path.stem, path

    def matrix_file(self, split: str, epoch: int, name: str) -> Path:
        """`<split>/epoch-N/<Metric>.json`: a matrix metric's counts for one epoch."""
        return self.epoch_dir(split, epoch) / matrix_file_name(name)

    def write_matrix(self, split: str, epoch: int, name: str, counts: list[list[int]]) -> Path:
        """Save an epoch's count matrix (rows: targets, columns: predictions), atomically."""
        return write_matrix(self.matrix_file(split, epoch, name), name, counts)

    def matrices(self, split: str) -> Iterator[tuple[int, str, list[list[int]]]]:
        """`(epoch, metric name, counts)` of every saved matrix of a split, oldest first."""
        for epoch, folder in sorted(self.epoch_dirs(split).items()):
            for path in sorted(folder.glob("*.json")):
                found = read_matrix(path)
                if found is not None:
                    yield epoch, found[0], found[1]

    # Preparing a run ---------------------------------------------------------------
    def check_writable(self) -> None:
        """Create the directory and check that a run can write in it: writable, and no
        symlink inside it (`check_links`)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise TrainingError(
                f"Cannot create the artifact directory {self.root}: {error}."
            ) from None
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise TrainingError(
                f"The artifact directory {self.root} is not writable: fix its permissions or "
                "choose another directory."
            )
        self.check_links()

    def check_links(self, error: type[EmberError] = TrainingError) -> None:
        """Refuse a directory holding a symlink (to a file or a folder, at any depth):
        ember writes, appends and deletes only inside the artifact directory, and a
        write through a link would land outside it. W&B's own folder (`wandb/`) keeps
        the links W&B makes there; the folder itself may not be one."""
        link = find_link(self.root, skip=(self.wandb_files,))
        if link is not None:
            raise error(
                f"{link} is a symbolic link: ember never writes or deletes through a link "
                "inside an artifact directory, whose files would land outside it. Remove "
                f"the link (or replace it with the folder or file it points to), or "
                "choose another directory."
            )

    def prepare(self, resume_epoch: int | None, overwrite: bool) -> None:
        """Make the directory ready: a fresh run (`resume_epoch` None) needs it free of
        an earlier run (or `overwrite=True`, which removes the earlier run's logs,
        checkpoints, records and W&B files); a resumed run keeps the logs of epochs
        <= `resume_epoch` only. Temporaries left by a killed write are removed."""
        self.check_writable()
        for directory in (self.root, self.checkpoints):
            remove_stale_temporaries(directory)
        splits = [self.split_dir(split) for split in SPLITS]
        if resume_epoch is None:
            previous = [p for split in SPLITS for p in self.epoch_dirs(split).values()]
            checkpoints = self.checkpoints
            has_checkpoints = checkpoints.is_dir() and any(checkpoints.iterdir())
            if (previous or has_checkpoints) and not overwrite:
                epochs = {epoch for split in SPLITS for epoch in self.epoch_dirs(split)}
                if has_checkpoints:
                    fix = (
                        "Resume it with checkpoint('latest') (and the recorder that wrote its "
                        "checkpoints), replace it with LearnerBuilder(dir, overwrite=True), or "
                        "choose a new directory."
                    )
                else:
                    fix = (
                        "It saved no checkpoint to resume from: replace it with "
                        "LearnerBuilder(dir, overwrite=True), or choose a new directory."
                    )
                raise TrainingError(
                    f"{self.root} already holds a run (logs of {len(epochs)} epoch(s)"
                    f"{', checkpoints' if has_checkpoints else ''}). {fix}"
                )
            if overwrite:  # a new run: nothing of an earlier one is kept (a failed one included)
                # W&B's own files go too: `wandb sync .../offline-run-*` would upload the
                # earlier run's offline runs along with the new one.
                for path in [*splits, checkpoints, self.wandb_files]:
                    shutil.rmtree(path, ignore_errors=True)
                for file in (
                    self.experiment_log,
                    self.history,
                    self.legacy_history,
                    self.hparams,
                    self.sessions,
                    self.wandb_run,
                    *(f for f in self.root.glob("rank-*.log") if _RANK_LOG.match(f.name)),
                ):
                    file.unlink(missing_ok=True)
            return
        for split in SPLITS:
            for epoch, path in self.epoch_dirs(split).items():
                if epoch > resume_epoch:
                    shutil.rmtree(path)

    def drop_epoch(self, split: str, epoch: int, points_through: int | None = None) -> None:
        """Remove a split's logs of one epoch (a resumed run redoes it). With
        `points_through`, the validation points inside the epoch up to that training
        iteration stay (they ran before the checkpoint the run resumes from)."""
        if points_through is None:
            shutil.rmtree(self.epoch_dir(split, epoch), ignore_errors=True)
            return
        directory = self.epoch_dir(split, epoch)
        if not directory.is_dir():
            return
        kept = {path for k, path in self.point_dirs(epoch).items() if k <= points_through}
        for entry in directory.iterdir():
            if entry in kept:
                continue
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    def truncate_metric_log(
        self, split: str, epoch: int, name: str, keep: int
    ) -> list[tuple[float, float]]:
        """Keep the first `keep` lines of a metric log (a run resumed mid-epoch: later
        lines came after its checkpoint); return their rows. A missing log has none."""
        return truncate_log(self.metric_log(split, epoch, name), keep)


def find_link(root: Path, skip: tuple[Path, ...] = ()) -> Path | None:
    """The first symlink under `root` (never followed), or None; the folders in `skip`
    are not searched (a link in their place is still found)."""
    if not root.is_dir():
        return None
    pending = [root]
    while pending:
        folder = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.is_symlink():
                return Path(entry.path)
            if entry.is_dir(follow_symlinks=False) and Path(entry.path) not in skip:
                pending.append(Path(entry.path))
    return None


def remove_stale_temporaries(directory: Path) -> None:
    """Delete temp files left by a write that a kill interrupted (never a final file)."""
    if directory.is_dir():
        for entry in directory.iterdir():
            if _TEMPORARY.match(entry.name) and entry.is_file():
                entry.unlink(missing_ok=True)
