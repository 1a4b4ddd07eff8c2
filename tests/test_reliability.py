"""Full disks, read-only and busy directories, bad input and untrusted files."""

from __future__ import annotations

import contextlib
import gzip
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from ember_testing import Classifier

import ember
from ember.errors import ConfigError, DatasetError, RecordError, TrainingError
from ember.optim import AdamConfig
from ember.record import CompactRecorder, DefaultRecorder, PrettyJsonFileRecorder
from ember.train import LearnerBuilder, TrainOutput
from ember.train.metric import LossMetric, MetricValue

SRC = Path(ember.__file__).parent


@contextlib.contextmanager
def tmpfs(size: str, read_only: bool = False):
    """A small file system of its own, where this machine permits mounting one."""
    directory = Path(tempfile.mkdtemp())
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)], capture_output=True
    )
    try:
        yield directory if mounted.returncode == 0 else None
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", str(directory)], capture_output=True)


class Wide(Classifier):
    """About 70 kB of weights and 140 kB of Adam state: two checkpoints do not fit in 320 kB."""

    def __init__(self):
        super().__init__(hidden=1500)


def test_a_full_disk_keeps_the_previous_checkpoint_and_stops_clearly(
    tmp_path, loaders, quiet, monkeypatch
):
    with tmpfs("320k") as small:
        if small is None:  # no mount permission: simulate ENOSPC in the recorder instead
            small = tmp_path
            original, calls = DefaultRecorder.save, {"n": 0}

            def enospc(self, item, path, **kwargs):
                calls["n"] += 1
                if calls["n"] > 3:
                    raise OSError(28, "No space left on device")
                return original(self, item, path, **kwargs)

            monkeypatch.setattr(DefaultRecorder, "save", enospc)
        learner = (
            LearnerBuilder(small / "run")
            .metric_train_numeric(LossMetric())
            .with_file_checkpointer(DefaultRecorder())
            .num_epochs(3)
            .renderer(quiet)
            .build(Wide(), AdamConfig().init(), 1e-3)
        )
        # Whichever write meets the full disk first (a checkpoint in the background or a
        # metric log), the run stops with a message naming the disk error and the way on.
        with pytest.raises(
            ember.EmberError, match=r"No space left on device.*resume with checkpoint\('latest'\)"
        ):
            learner.fit(*loaders)
        files = sorted(p.name for p in (small / "run" / "checkpoint").iterdir())
        assert files == [
            "model-1.mpk",
            "optim-1.mpk",
            "scheduler-1.mpk",
        ]  # no temp file, no torn part
        DefaultRecorder().load(Wide(), small / "run" / "checkpoint" / "model-1")
        assert "No space left on device" in (small / "run" / "experiment.log").read_text()


def test_a_read_only_artifact_directory_fails_before_training(
    tmp_path, loaders, quiet, monkeypatch
):
    with tmpfs("64k", read_only=True) as read_only:
        if read_only is None:
            read_only = tmp_path
            real_access = os.access
            monkeypatch.setattr(
                os,
                "access",
                lambda path, mode: False if Path(path) == read_only else real_access(path, mode),
            )
        model = Classifier()
        learner = LearnerBuilder(read_only).renderer(quiet).build(model, AdamConfig().init(), 1e-3)
        with pytest.raises(
            TrainingError, match=r"is not writable: fix its permissions or choose another directory"
        ):
            learner.fit(*loaders)
        assert model.seen == []  # not a single step


def test_a_second_run_on_a_busy_directory_fails_at_once(tmp_path, loaders, quiet):
    script = Path(__file__).parent / "scripts" / "train_blobs.py"
    ready = tmp_path / "ready"
    process = subprocess.Popen(
        [
            sys.executable,
            str(script),
            str(tmp_path / "run"),
            "--sleep",
            "0.05",
            "--epochs",
            "50",
            "--ready",
            str(ready),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        learner = (
            LearnerBuilder(tmp_path / "run", overwrite=True)
            .renderer(quiet)
            .build(Classifier(), AdamConfig().init(), 1e-3)
        )
        with pytest.raises(
            TrainingError, match=rf"is in use by process {process.pid} on .*lock file"
        ):
            learner.fit(*loaders)
    finally:
        process.kill()
        process.wait()
    # the lock of the killed process is stale: the next run takes it over
    learner = (
        LearnerBuilder(tmp_path / "run", overwrite=True)
        .renderer(quiet)
        .build(Classifier(), AdamConfig().init(), 1e-3)
    )
    learner.fit(*loaders)
    assert not (tmp_path / "run" / ".lock").exists()


class NoLoss:
    """An output a user forgot to give a loss."""

    def __init__(self, output):
        self.output = output


class NoLossModel(Classifier):
    def train_step(self, batch):
        return TrainOutput(NoLoss(self(batch.inputs)))


class SlashMetric:
    name, unit, input_type = "../../escape/Loss per item", "", object

    def update(self, item, meta):
        return MetricValue(1.0, 1)

    def clear(self):
        pass


class VectorMetric:
    """A metric that returns one value per sample instead of one per iteration."""

    name, unit, input_type = "Per sample", "", object

    def update(self, item, meta):
        return MetricValue(torch.ones(4), 4)

    def clear(self):
        pass


def bad_inputs(tmp_path, loaders, quiet):
    """(what a user did, the call, the exception type, the exact message pattern)."""
    json_record = PrettyJsonFileRecorder().save(Classifier(), tmp_path / "weights")

    def builder():
        return LearnerBuilder(tmp_path / "run", overwrite=True).renderer(quiet)

    class TrainingConfig(ember.Config):
        num_epochs: int = 10

    config_path = tmp_path / "config.json"
    config_path.write_text('{"num_epochs": "many", "learning_rat": 0.1}')
    return [
        (
            "wrong type and unknown key in a config file",
            lambda: TrainingConfig.load(config_path),
            ConfigError,
            re.escape(
                f"{config_path}: invalid TrainingConfig: field 'num_epochs': Input should be a valid integer, "
                "unable to parse string as an integer (got 'many'); unknown field 'learning_rat' (remove it or check its spelling)."
            ),
        ),
        (
            "zero epochs",
            lambda: builder().num_epochs(0),
            ConfigError,
            re.escape("num_epochs must be an int >= 1, got 0."),
        ),
        (
            "an output without loss",
            lambda: builder().build(NoLossModel(), AdamConfig().init(), 1e-3).fit(*loaders),
            TrainingError,
            re.escape(
                "TrainOutput got a NoLoss without a `loss` attribute and no loss= argument. Return TrainOutput(item, loss=your_loss_tensor)."
            ),
        ),
        (
            "a recorder asked to load another format",
            lambda: CompactRecorder().load(Classifier(), json_record),
            RecordError,
            re.escape(str(json_record)) + r".*",
        ),
        (
            "an empty dataset",
            lambda: ember.data.DataLoaderBuilder().build(
                torch.utils.data.TensorDataset(torch.zeros(0))
            ),
            DatasetError,
            re.escape(
                "The dataset TensorDataset is empty (length 0): there is nothing to train on. Check the path or the filter that produced it."
            ),
        ),
        (
            "a checkpoint that does not exist",
            lambda: (
                builder()
                .with_file_checkpointer(CompactRecorder())
                .num_epochs(5)
                .checkpoint(3)
                .build(Classifier(), AdamConfig().init(), 1e-3)
            ),
            ConfigError,
            r"checkpoint\(3\): there is no checkpoint of epoch 3 in .* \(epochs saved: none\)\.",
        ),
        (
            "a metric returning a vector",
            lambda: (
                builder()
                .metric_train_numeric(VectorMetric())
                .build(Classifier(), AdamConfig().init(), 1e-3)
                .fit(*loaders)
            ),
            TrainingError,
            re.escape(
                "The metric 'Per sample' returned a tensor of shape (4,); a metric's value and weight must be single numbers (a 0-d tensor, a float or an int)."
            ),
        ),
        (
            "an optimizer for another model",
            lambda: builder().build(
                Classifier(), torch.optim.SGD(Classifier().parameters(), 0.1), 1e-3
            ),
            ConfigError,
            r"The optimizer updates 4 tensor\(s\) that are not parameters of Classifier",
        ),
    ]


def test_bad_input_gets_one_clear_message(tmp_path, loaders, quiet):
    cases = bad_inputs(tmp_path, loaders, quiet)
    for what, call, kind, pattern in cases:
        with pytest.raises(kind) as info:
            call()
        assert re.search(pattern, str(info.value)), (what, str(info.value))


def test_a_metric_name_cannot_escape_the_artifact_directory(tmp_path, loaders, quiet):
    (
        LearnerBuilder(tmp_path / "run")
        .metric_train(SlashMetric())
        .renderer(quiet)
        .build(Classifier(), AdamConfig().init(), 1e-3)
        .fit(*loaders)
    )
    files = [p.relative_to(tmp_path) for p in tmp_path.rglob("*.log")]
    assert Path("run/train/epoch-1/_.._escape_Loss_per_item.log") in files
    assert all(str(p).startswith("run") for p in files)


def test_no_code_path_unpickles():
    offenders = []
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        if re.search(
            # builtin eval/exec calls; a method named eval (Evaluator.eval) is no call
            r"\bpickle\.loads?\(|torch\.load\(|\bUnpickler\b|(?<![.\w])(?<!def )(eval|exec)\(",
            text,
        ):
            offenders.append(path.relative_to(SRC).as_posix())
    assert offenders == [
        "data/datasets/safe_unpickle.py"
    ]  # the MNIST reader, restricted to numpy arrays


class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {Path(tempfile.gettempdir()) / 'ember-pwned'}",))


def test_a_malicious_pickle_renamed_as_a_record_is_refused(tmp_path):
    marker = Path(tempfile.gettempdir()) / "ember-pwned"
    marker.unlink(missing_ok=True)
    evil = tmp_path / "model.mpk.gz"
    evil.write_bytes(gzip.compress(pickle.dumps(Payload())))
    with pytest.raises(RecordError, match=re.escape(str(evil))):
        CompactRecorder().load(Classifier(), evil)
    with pytest.raises(RecordError):
        ember.record.load(None, evil)
    assert not marker.exists()
