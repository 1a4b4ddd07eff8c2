"""What a run keeps does not grow with its length: the history file is appended, a
metric's state is the same size at the last iteration as at the first, the sampler
holds no list of the epoch, the dashboard's state is bounded, and `ember plot` draws
a bounded number of artists however many epochs. (Timings are in bench/growth.py.)"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import sys
import tracemalloc

import numpy as np
import pytest
from ember_testing import Classifier

from ember.data.sampler import ResumableSampler
from ember.errors import EmberError
from ember.optim import AdamConfig
from ember.train import LearnerBuilder
from ember.train.events import EndEpoch
from ember.train.files.metric_files import read_metric_log
from ember.train.history import RunHistory
from ember.train.metric import LossMetric
from ember.train.metric.base import MetricValue, RegisteredMetric, weighted_mean
from ember.train.metric.state import ExactSum
from ember.train.processor import MetricsProcessor
from ember.train.renderer.history import EpochValues, History
from ember.train.renderer.state import RunTracker

# The history file ---------------------------------------------------------------------


class FileWatcher:
    """A listener that notes the history file's inode and bytes at every epoch end."""

    def __init__(self, path):
        self.path, self.seen = path, []

    def on_event(self, event):
        if isinstance(event, EndEpoch):
            self.seen.append((os.stat(self.path).st_ino, self.path.read_bytes()))


def test_the_history_file_is_appended_at_each_epoch_not_rewritten(
    tmp_path, loaders, quiet, one_thread
):
    watcher = FileWatcher(tmp_path / "history.jsonl")
    learner = (
        LearnerBuilder(tmp_path)
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .num_epochs(4)
        .renderer(quiet)
        .listener(watcher)
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    learner.fit(*loaders)
    final = (tmp_path / "history.jsonl").read_bytes()
    inodes = {inode for inode, _ in watcher.seen}
    assert inodes == {os.stat(tmp_path / "history.jsonl").st_ino}  # never replaced
    texts = [text for _, text in watcher.seen] + [final]
    for earlier, later in itertools.pairwise(texts):
        assert later.startswith(earlier)  # each epoch adds lines after the others
        added = later[len(earlier) :].decode().splitlines()
        assert 1 <= len(added) <= 2  # this epoch's record (and the outcome at the end)
    records = [json.loads(line) for line in final.decode().splitlines()]
    assert [r.pop("crc32") != "" for r in records] == [True] * len(records)  # each sealed
    assert records[0] == {"format": "ember-history", "version": 3, "id": records[0]["id"]}
    assert [r.pop("n") for r in records[1:]] == list(range(2, len(records) + 1))
    assert [r["epoch"] for r in records if "epoch" in r] == [1, 2, 3, 4]
    assert records[-1] == {"outcome": "completed", "stop_reason": {"reason": "completed"}}
    assert RunHistory.load(tmp_path / "history.jsonl").epochs == learner.history


def test_a_torn_last_line_is_ignored_and_the_next_writer_rewrites_the_file(tmp_path):
    path = tmp_path / "history.jsonl"
    history = RunHistory(path)
    history.describe_model("Net", 10)
    for epoch in (1, 2):
        history.add_epoch(epoch, {"train": {"Loss": 1.0 / epoch}})
    history.set_checkpoints([1, 2])
    history.set_checkpoints([2])
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"epoch": 3, "train": {"Lo')  # killed mid-append
    loaded = RunHistory.load(path)
    assert loaded.epochs == [(1, {"train": {"Loss": 1.0}}), (2, {"train": {"Loss": 0.5}})]
    assert loaded.checkpoints == [2]
    assert (loaded.model, loaded.num_parameters, loaded.outcome) == ("Net", 10, None)
    loaded.keep_before(2)  # a resumed run: the first write rewrites everything it holds
    text = path.read_text()
    assert text.endswith("\n") and '{"epoch": 3' not in text
    assert RunHistory.load(path).epochs == [(1, {"train": {"Loss": 1.0}})]
    path.write_text(text + "not json\n")
    with pytest.raises(EmberError, match="history.jsonl"):
        RunHistory.load(path)


def test_an_earlier_versions_history_json_is_still_read(tmp_path):
    old = {
        "format": "ember-history",
        "version": 1,
        "model": "Old",
        "num_parameters": 3,
        "epochs": [{"epoch": 1, "train": {"Loss": "nan"}, "valid": {"Loss": 0.25}}],
        "checkpoints": [1],
        "outcome": "completed",
    }
    (tmp_path / "history.json").write_text(json.dumps(old, indent=1))
    loaded = RunHistory.load(tmp_path / "history.json")
    assert loaded.epochs[0][0] == 1 and math.isnan(loaded.epochs[0][1]["train"]["Loss"])
    assert loaded.epochs[0][1]["valid"] == {"Loss": 0.25}
    assert (loaded.checkpoints, loaded.outcome, loaded.model) == ([1], "completed", "Old")
    assert loaded.to_json()["epochs"] == old["epochs"]


# Metric state -------------------------------------------------------------------------


class Noisy:
    """A weighted-mean metric whose values span many orders of magnitude."""

    name = "Noisy"
    unit = ""
    input_type = float

    def update(self, item, meta):
        return MetricValue(item, float(meta.iteration % 7 + 1))

    def clear(self):
        pass


def state_size(state) -> int:
    """The Python objects a metric state holds for its epoch."""
    return len(state.pending) + len(state.unshared) + len(state._products._terms)


def test_a_metric_state_stays_the_same_size_and_its_epoch_value_exact(tmp_path):
    from ember.train.logger.file import FileMetricLogger

    logger = FileMetricLogger(tmp_path)
    processor = MetricsProcessor(
        {"train": [RegisteredMetric(Noisy(), True)]}, {"train": [logger]}, None, 1, tick=0.0
    )
    processor.start_split("train", 1, None)
    state = processor.states["train"][0]
    rng = random.Random(5)
    sizes = []
    for iteration in range(1, 5001):
        value = rng.uniform(-1, 1) * 10.0 ** rng.randint(-12, 12)
        processor.update(value, iteration, 1, None)
        if iteration in (10, 5000):
            sizes.append((state_size(state), sys.getsizeof(state.__dict__)))
    assert sizes[0][0] <= 8 and sizes[1][0] <= 8  # a few exact-sum terms, no rows
    assert sizes[0][1] == sizes[1][1]
    assert processor.line_counts() == {"Noisy": 5000}
    value = processor.end_split()["Noisy"]
    rows = read_metric_log(tmp_path / "epoch-1" / "Noisy.log")  # streamed as produced
    assert len(rows) == 5000
    reference = math.fsum(v * w for v, w in rows) / math.fsum(w for _, w in rows)
    assert value == reference == weighted_mean(rows)


def test_exact_sum_equals_fsum_over_everything():
    rng = random.Random(11)
    numbers = [rng.uniform(-1, 1) * 10.0 ** rng.randint(-300, 300) for _ in range(3000)]
    total = ExactSum()
    for start in range(0, len(numbers), 37):
        total.add(numbers[start : start + 37])
    assert total.value() == math.fsum(numbers)
    assert len(total._terms) < 64
    for special, expected in ((math.inf, math.inf), (-math.inf, -math.inf)):
        one = ExactSum()
        one.add([1.0, special, 2.0])
        assert one.value() == expected
    both = ExactSum()
    both.add([math.inf])
    both.add([-math.inf])
    assert math.isnan(both.value())


def test_auroc_keeps_one_tensor_not_a_list_per_batch():
    import torch

    from ember.train.metric import AurocMetric
    from ember.train.metric.base import MetricMetadata
    from ember.train.metric.inputs import ScoresInput

    metric = AurocMetric()
    generator = torch.Generator().manual_seed(0)
    scores, targets = [], []
    for iteration in range(1, 301):
        score = torch.rand(8, generator=generator)
        target = torch.randint(0, 2, (8,), generator=generator)
        scores.append(score)
        targets.append(target)
        meta = MetricMetadata("valid", 1, 1, iteration, None, None)
        metric.update(ScoresInput(score, target), meta)
    kept = [v for v in vars(metric).values() if isinstance(v, list)]
    assert not kept  # no per-batch lists
    everything = torch.cat(scores)
    positive = torch.cat(targets).bool()
    pos, neg = everything[positive], everything[~positive]
    pairs = (pos[:, None] > neg[None, :]).double() + 0.5 * (pos[:, None] == neg[None, :]).double()
    assert float(metric.epoch_value()) == pytest.approx(float(pairs.mean()), abs=1e-12)


# The sampler ----------------------------------------------------------------------------


def test_the_sampler_holds_no_list_of_the_epoch_and_resumes_exactly():
    class Sized:
        def __len__(self):
            return 1_000_000

    sampler = ResumableSampler(Sized(), seed=3)
    sampler.set_epoch(2)
    tracemalloc.start()
    iterator = iter(sampler)
    first = [next(iterator) for _ in range(5)]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert not isinstance(iterator, (list, type(iter([]))))
    assert peak < 12_000_000  # the int64 order (8 MB), not 1M Python ints (~40 MB)
    order = np.random.default_rng([3, 2]).permutation(1_000_000)
    assert first == order[:5].tolist()
    sampler.set_epoch(2)
    sampler.skip(999_990)
    sampler.shard(1, 2)
    assert list(sampler) == order[999_990:][1::2].tolist()
    plain = ResumableSampler(Sized())
    plain.skip(10)
    assert isinstance(iter(plain), type(iter(range(0))))  # in order: a range, nothing held


# The dashboard and the notebook view --------------------------------------------------


def test_the_dashboard_state_is_bounded_after_100k_epochs():
    history = History(capacity=512, epochs=128)
    values = EpochValues()
    for epoch in range(1, 100_001):
        history.extend(epoch, 2, [1.0 / epoch, 2.0 / epoch])
        values.add(epoch, 1.0 / epoch)
    assert len(history.epochs) <= 128 and len(history.sums) <= 512
    assert len(values.recent) <= 2 * values.keep and len(values.buckets) <= values.capacity
    assert values.latest == (100_000, 1e-5)
    points = values.points()
    assert len(points) <= values.capacity + 2 * values.keep
    assert points[100_000] == 1e-5 and max(points) == 100_000 and min(points) <= 2048
    x, _y = history.view().arrays()
    assert x.size <= 512 and 0 < x.min() < 1000 and 99_000 < x.max() <= 100_000
    assert np.all(np.diff(x) > 0)  # in order along the epochs
    assert history.view().last_x == pytest.approx(100_000)


def test_a_tracker_keeps_the_last_epochs_exactly_and_bounds_the_rest():
    from ember.train.logger.base import MetricRecord
    from ember.train.renderer.base import MetricView, Progress, RunInfo

    tracker = RunTracker()
    tracker.start(RunInfo("run", 1, 3000, "Net", 1, ("cpu",), (("train", "Loss", "", True),)))
    for epoch in range(1, 3001):
        progress = Progress("train", epoch, 3000, 1, 1, 1, 0.0)
        view = MetricView("train", "Loss", "", True, 1.0, float(epoch))
        tracker.update(progress, [view], [MetricRecord("Loss", 1, float(epoch), 1.0)])
        tracker.end_split(progress, [view])
    snapshot = tracker.snapshot("Loss")
    epochs = snapshot.epoch_values["train"]
    assert len(epochs) <= 3 * 64
    assert all(epochs[e] == float(e) for e in range(2937, 3001))  # recent ones exact
    assert min(epochs) <= 64  # the oldest ones, in buckets
    assert snapshot.last_epoch_values[("train", "Loss")] == 3000.0
    assert len(snapshot.histories["train"].epochs) <= 128


# ember plot -------------------------------------------------------------------------------


def test_plot_marks_epoch_boundaries_with_a_bounded_number_of_artists():
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from ember.plot import EPOCH_LABELS, _epoch_axis

    for epochs in (3, 5000):
        figure = Figure()
        ax = figure.subplots()
        starts = [(epoch, 2 * epoch - 1) for epoch in range(1, epochs + 1)]
        _epoch_axis(ax, starts, 2 * epochs)
        assert len(ax.lines) == 0 and len(ax.collections) == 1
        (lines,) = ax.collections
        assert len(lines.get_segments()) == (epochs - 1 if epochs < 50 else EPOCH_LABELS - 1)
        (top,) = ax.child_axes
        labels = [t.get_text() for t in top.get_xticklabels()]
        assert labels[0] == "1" and len(labels) <= EPOCH_LABELS
