"""A damaged part of the checkpoint a run resumes from is noticed even when the run
does not need that part: the scheduler record of a run with a constant rate, edited
after it was written (lr 0.01 -> 0.91) or with a byte flipped, in every recorder
format. `checkpoint("latest")` falls back past it and says so where the user watches
(the renderer) and in experiment.log; `checkpoint(2)` refuses, naming the file."""

from __future__ import annotations

import io
import struct

import pytest
from ember_testing import BlobBatcher, BlobDataset, Classifier

import ember
from ember.data import DataLoaderBuilder
from ember.errors import TrainingError
from ember.optim import AdamConfig
from ember.record import (
    BinFileRecorder,
    CompactRecorder,
    DefaultRecorder,
    PrettyJsonFileRecorder,
    SafetensorsFileRecorder,
)
from ember.train import LearnerBuilder
from ember.train.renderer import PlainRenderer

RECORDERS = {
    "mpk": DefaultRecorder,
    "json": PrettyJsonFileRecorder,
    "safetensors": SafetensorsFileRecorder,
    "mpk.gz": CompactRecorder,
    "bin": BinFileRecorder,
}


def edit(data: bytes) -> bytes:
    """The rate 0.01 written as 0.91 where the format stores it readably (a float64 in
    MessagePack, text in JSON and in safetensors' header), else one byte flipped."""
    for old, new in (
        (struct.pack(">d", 0.01), struct.pack(">d", 0.91)),
        (b'"lr": 0.01', b'"lr": 0.91'),
        (b"0.01", b"0.91"),
    ):
        if old in data:
            return data.replace(old, new, 1)
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x40]) + data[middle + 1 :]


def fit(directory, extension: str, epochs: int, resume=None) -> tuple:
    ember.seed(2)
    stream = io.StringIO()
    builder = (
        LearnerBuilder(directory)
        .with_file_checkpointer(RECORDERS[extension]())
        .num_epochs(epochs)
        .renderer(PlainRenderer(interval=3600, stream=stream))
    )
    if resume is not None:
        builder = builder.checkpoint(resume)
    learner = builder.build(Classifier(), AdamConfig().init(), 0.01)
    train = DataLoaderBuilder(BlobBatcher()).batch_size(16).build(BlobDataset(64))
    learner.fit(train)
    return learner, stream.getvalue()


@pytest.mark.parametrize("extension", list(RECORDERS))
def test_a_damaged_scheduler_record_is_skipped_by_latest_and_refused_by_its_epoch(
    tmp_path, extension
):
    fit(tmp_path, extension, 2)
    record = tmp_path / "checkpoint" / f"scheduler-2.{extension}"
    original = record.read_bytes()
    record.write_bytes(edit(original))
    assert record.read_bytes() != original

    with pytest.raises(TrainingError) as refused:
        fit(tmp_path, extension, 3, resume=2)
    assert f"scheduler-2.{extension}" in str(refused.value)
    assert "Epochs that load: 1" in str(refused.value)

    learner, shown = fit(tmp_path, extension, 3, resume="latest")
    assert learner.outcome == "completed"
    warning = "The checkpoint of epoch 2 cannot be loaded"
    assert shown.count(warning) == 1, shown  # on the console, once
    assert f"scheduler-2.{extension}" in shown
    assert "falls back to the one before it" in shown
    log = (tmp_path / "experiment.log").read_text()
    assert warning in log and "Resumed from the checkpoint of epoch 1." in log
    assert [epoch for epoch, _ in learner.history] == [1, 2, 3]
