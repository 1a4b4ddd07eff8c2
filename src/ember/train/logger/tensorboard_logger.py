"""A metric logger writing TensorBoard scalars (needs the optional `tensorboard` package)."""

from __future__ import annotations

import logging
import os
import struct
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from ember.durable import atomic_write_bytes
from ember.errors import EmberError
from ember.train.logger._steps import GlobalSteps, ProcessMerge
from ember.train.logger.base import MetricRecord, RunStart

log = logging.getLogger(__name__)

STEPS_FILE = "ember-steps.json"
"""Beside the event files: the number of iterations of each finished epoch, per split."""
KEPT_EVENTS = "events.out.tfevents.0000000000.ember"
"""The event file a resumed run leaves the earlier events in (it sorts before any other)."""
_TEMPORARY = ".ember-events.tmp"
_READY = ".ember-events.ready"


class TensorBoardMetricLogger:
    """Writes scalars with `torch.utils.tensorboard.SummaryWriter` under `log_dir`.

    Iteration values are tagged `"{split}/{name}"` at the global step: the number of
    iterations this logger has seen in that split so far, across epochs (epoch 2 of a
    5-iteration split starts at step 6). Epoch aggregates are tagged
    `"{split}/epoch/{name}"` at step = epoch number. Events are flushed at each epoch end
    and on `close()`; logging after `close()` reopens a new event file in `log_dir`.

    `log_dir` belongs to this logger. Beside the event files it keeps `ember-steps.json`,
    the number of iterations of each finished epoch per split, so that a resumed run
    (`start_run`) knows where its steps go. A resumed run first removes the events
    logged after its checkpoint: the events that stay are written to one new event
    file, `events.out.tfevents.0000000000.ember`, which then replaces the earlier
    files. A kill at any point leaves a directory that the next start repairs, and
    no step is ever held twice.

    Under several processes, each iteration's values from every process become one
    point at the iteration's step: their weighted mean. The other processes' values
    reach this logger when the processes exchange them (at each split's epoch end and
    when a run stops), so an epoch's points are written then.

    A run given hyperparameters (`LearnerBuilder.hparams`) writes them when it ends,
    with its final epoch values (the last `split/epoch/name` scalars), for the
    HPARAMS tab: launch TensorBoard on the folder holding several runs' `log_dir`s to
    compare them in one table.
    """

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        self.log_dir = Path(log_dir)
        self._summary_writer = _import_summary_writer()
        self._writer: Any = None
        self._steps = GlobalSteps()
        self._merge = ProcessMerge()
        self._run: RunStart | None = None
        self._saved_steps: str | None = None
        self._hparams: dict[str, Any] | None = None
        self._final: dict[str, dict[str, float]] = {}

    def _open(self) -> Any:
        if self._writer is None:
            self._writer = self._summary_writer(log_dir=str(self.log_dir))
        return self._writer

    def start_run(self, run: RunStart) -> None:
        """Before training: a resumed run removes the events logged after its
        checkpoint and continues the steps after the ones it keeps."""
        if run == self._run:
            return  # told twice before logging anything
        self.close()
        self._run = run
        self._merge = ProcessMerge(run.processes)
        self._hparams = _hparam_values(run.hparams) if run.hparams is not None else None
        self._final = {}
        if self.log_dir.is_dir():
            _finish_interrupted_rewrite(self.log_dir)
        if not run.resumed:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        stored = self.log_dir / STEPS_FILE
        files = _event_files(self.log_dir)
        if stored.exists():
            try:
                self._steps = GlobalSteps.from_text(stored.read_text(encoding="utf-8"))
            except (OSError, ValueError) as error:
                raise EmberError(
                    f"{stored} cannot be read ({error}): the resumed run cannot place its "
                    "steps after the earlier ones. Remove the directory or choose another "
                    "log_dir."
                ) from None
        elif files:
            log.warning(
                "%s holds event files but no %s: the events of the resumed epochs are kept as "
                "they are and the resumed run's steps start again at 1.",
                self.log_dir,
                STEPS_FILE,
            )
            self._steps = GlobalSteps()
            return
        self._steps.resume(run)
        if files:
            _rewrite(self.log_dir, files, lambda tag, step: self._keeps(run, tag, step))
        self._save_steps()

    def _keeps(self, run: RunStart, tag: str, step: int) -> bool:
        if tag.startswith(_HPARAMS_TAGS):
            return False  # the resumed run writes its hyperparameters again when it ends
        split, _, name = tag.partition("/")
        if not name or split not in ("train", "valid"):
            return True
        if name.startswith("epoch/"):
            return run.keeps(split, step)
        return step <= self._steps.last(split)

    def log(self, split: str, epoch: int, records: Sequence[MetricRecord]) -> None:
        """One scalar per record (per iteration under several processes), tagged
        `split/name`, at the split's global step."""
        for record_epoch, record in self._merge.add(split, epoch, records):
            self._scalar(split, record_epoch, record)

    def _scalar(self, split: str, epoch: int, record: MetricRecord) -> None:
        step = self._steps.step(split, epoch, record.iteration)
        self._open().add_scalar(f"{split}/{record.name}", float(record.value), step)

    def end_epoch(self, split: str, epoch: int, aggregates: dict[str, float]) -> None:
        """One scalar per aggregate, tagged `split/epoch/name`, at step = epoch; then flush."""
        for record_split, record_epoch, record in self._merge.release(split):
            self._scalar(record_split, record_epoch, record)
        self._steps.end_epoch(split, epoch)
        writer = self._open()
        for name, value in aggregates.items():
            writer.add_scalar(f"{split}/epoch/{name}", float(value), epoch)
        self._final[split] = {f"{split}/epoch/{name}": float(v) for name, v in aggregates.items()}
        writer.flush()
        self._save_steps()

    def close(self) -> None:
        """Write what waits for other processes' values, flush and close the event file
        (later calls do nothing)."""
        self._run = None
        for split, epoch, record in self._merge.release():
            self._scalar(split, epoch, record)
        if self._hparams is not None:
            self._write_hparams(self._hparams)
            self._hparams = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._save_steps()

    def _write_hparams(self, hparams: dict[str, Any]) -> None:
        """The run's hyperparameters and its final epoch values, for TensorBoard's
        HPARAMS table: the values are those of the `split/epoch/name` scalars."""
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        final = {tag: value for values in self._final.values() for tag, value in values.items()}
        writer = self._open().file_writer
        for summary in hparams_summary(hparams, final):
            writer.add_summary(summary)

    def _save_steps(self) -> None:
        text = self._steps.to_text()
        if text != self._saved_steps:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(self.log_dir / STEPS_FILE, text.encode("utf-8"))
            self._saved_steps = text


_HPARAMS_TAGS = ("_hparams_/",)


def _hparam_values(hparams: Any) -> dict[str, Any]:
    """Flattened hyperparameters as TensorBoard takes them: numbers, bools and text
    (a list or None becomes its JSON text)."""
    import json

    from ember.train.files.run_record import flatten_hparams

    return {
        key: value if isinstance(value, (bool, int, float, str)) else json.dumps(value)
        for key, value in flatten_hparams(hparams).items()
    }


def _event_files(directory: Path) -> list[Path]:
    """The event files of a directory, in the order TensorBoard reads them."""
    return sorted(
        (p for p in directory.iterdir() if "tfevents" in p.name and p.is_file()),
        key=lambda p: p.name,
    )


def _rewrite(directory: Path, files: list[Path], keeps: Any) -> None:
    """Replace `files` by one event file holding, in order, their events that
    `keeps(tag, step)`. The new file is complete and synced before any old file goes."""
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog
    from tensorboard.summary.writer.record_writer import RecordWriter

    kept: list[tuple[Any, bytes]] = []  # (event, its record as read, or b"" when changed)
    dropped = 0
    for event, record in _read_records(files):
        if event.HasField("file_version"):
            continue
        if event.HasField("session_log") and event.session_log.status == SessionLog.START:
            # A restart marker: readers drop the earlier values from its step on.
            kept = [(e, r) for e, r in kept if not e.HasField("summary") or e.step < event.step]
            continue
        if event.HasField("summary"):
            values = [v for v in event.summary.value if keeps(v.tag, event.step)]
            if len(values) < len(event.summary.value):
                dropped += len(event.summary.value) - len(values)
                if not values:
                    continue
                del event.summary.value[:]
                event.summary.value.extend(values)
                record = b""
        kept.append((event, record))
    if not dropped:
        return
    temporary, ready = directory / _TEMPORARY, directory / _READY
    first = min((e.wall_time for e, _ in kept), default=time.time())
    with open(temporary, "wb") as handle:
        records = RecordWriter(handle)
        records.write(Event(wall_time=first, file_version="brain.Event:2").SerializeToString())
        for event, record in kept:
            if record:
                handle.write(record)
            else:
                records.write(event.SerializeToString())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, ready)  # complete: from now on the next start finishes the job
    _fsync_directory(directory)
    _finish_interrupted_rewrite(directory)


def _read_records(files: list[Path]) -> Iterator[tuple[Any, bytes]]:
    """Each event of `files` with its whole record, in order. A file ends at its first
    incomplete or damaged record (a kill mid-write leaves at most one, at the end)."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    for path in files:
        with open(path, "rb") as handle:
            while True:
                header = handle.read(12)
                if len(header) < 12:
                    break
                (length,) = struct.unpack("<Q", header[:8])
                if struct.unpack("<I", header[8:])[0] != masked_crc32c(header[:8]):
                    break
                data = handle.read(length)
                footer = handle.read(4)
                if len(data) < length or len(footer) < 4:
                    break
                try:
                    event = Event.FromString(data)
                except Exception:  # a damaged record: readers stop here too
                    break
                yield event, header + data + footer


def _finish_interrupted_rewrite(directory: Path) -> None:
    """A complete rewritten file replaces every other event file; an incomplete one goes."""
    ready = directory / _READY
    if ready.exists():
        for path in _event_files(directory):
            path.unlink()
        os.replace(ready, directory / KEPT_EVENTS)
        _fsync_directory(directory)
    (directory / _TEMPORARY).unlink(missing_ok=True)


def _fsync_directory(directory: Path) -> None:
    if os.name == "nt":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _import_summary_writer() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as error:
        raise EmberError(
            "TensorBoardMetricLogger needs the tensorboard package, which cannot be "
            f"imported ({error}). Install it with `pip install tensorboard` "
            "(or `pip install ember[tensorboard]`)."
        ) from error
    return SummaryWriter
