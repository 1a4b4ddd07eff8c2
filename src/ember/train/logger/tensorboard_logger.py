"""A metric logger writing TensorBoard scalars (needs the optional `tensorboard` package)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from ember.errors import EmberError
from ember.train.logger._steps import GlobalSteps
from ember.train.logger.base import MetricRecord


class TensorBoardMetricLogger:
    """Writes scalars with `torch.utils.tensorboard.SummaryWriter` under `log_dir`.

    Iteration values are tagged `"{split}/{name}"` at the global step: the number of
    iterations this logger has seen in that split so far, across epochs (epoch 2 of a
    5-iteration split starts at step 6). Epoch aggregates are tagged
    `"{split}/epoch/{name}"` at step = epoch number. Events are flushed at each epoch end
    and on `close()`; logging after `close()` reopens a new event file in `log_dir`.
    """

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        self.log_dir = Path(log_dir)
        summary_writer = _import_summary_writer()
        self._writer: Any = summary_writer(log_dir=str(self.log_dir))
        self._steps = GlobalSteps()
        self._closed = False

    def log(self, split: str, epoch: int, records: Sequence[MetricRecord]) -> None:
        """One scalar per record, tagged `split/name`, at the split's global step."""
        self._closed = False
        for record in records:
            step = self._steps.step(split, epoch, record.iteration)
            self._writer.add_scalar(f"{split}/{record.name}", float(record.value), step)

    def end_epoch(self, split: str, epoch: int, aggregates: dict[str, float]) -> None:
        """One scalar per aggregate, tagged `split/epoch/name`, at step = epoch; then flush."""
        self._closed = False
        self._steps.end_epoch(split, epoch)
        for name, value in aggregates.items():
            self._writer.add_scalar(f"{split}/epoch/{name}", float(value), epoch)
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file (once; later calls do nothing)."""
        if self._closed:
            return
        self._closed = True
        self._writer.close()


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
