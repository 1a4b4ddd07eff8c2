"""Training lengths and cadences in epochs, optimizer steps, samples and tokens
(`train_for`, `valid_every`, `checkpoint_every`, "auto" schedules): where a run ends,
what it leaves, how it resumes, and the counts over several processes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from ember_testing import Batch, BlobBatcher, Classifier, StopAt, run_script

import ember
from ember.data import DataLoaderBuilder
from ember.errors import ConfigError, TrainingError
from ember.lr import CosineAnnealingLrSchedulerConfig
from ember.optim import AdamConfig, SgdConfig
from ember.record import DefaultRecorder
from ember.train import ClassificationOutput, LearnerBuilder, ProcessedItem, TrainOutput
from ember.train.history import RunHistory
from ember.train.length.duration import Duration, short_count
from ember.train.logger import read_metric_log
from ember.train.metric import LossMetric
from ember.train.renderer import PlainRenderer

DDP_SCRIPT = Path(__file__).parent / "scripts" / "train_ddp.py"
# The loaders fixture: 200 training samples in batches of 32 (six of 32, one of 8 an
# epoch: 7 optimizer steps), 90 validation samples.


def builder(directory: Path, renderer=None) -> LearnerBuilder:
    return (
        LearnerBuilder(directory)
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .with_file_checkpointer(DefaultRecorder())
        .renderer(renderer or PlainRenderer(interval=3600))
    )


def history(directory: Path) -> dict:
    return RunHistory.load(directory / "history.jsonl").to_json()


def records(directory: Path) -> list[dict]:
    lines = (directory / "history.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def epoch_counters(directory: Path) -> dict[int, dict[str, int]]:
    return {r["epoch"]: r["counters"] for r in records(directory) if "epoch" in r}


# Parsing ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "unit", "value"),
    [
        ("10ep", "epochs", 10),
        ("1 epoch", "epochs", 1),
        ("5000steps", "steps", 5000),
        ("5000ba", "steps", 5000),
        ("5k steps", "steps", 5000),
        ("2M samples", "samples", 2_000_000),
        ("2000000sp", "samples", 2_000_000),
        ("2.5k samples", "samples", 2500),
        ("1e9tok", "tokens", 10**9),
        ("1B tokens", "tokens", 10**9),
        (" 1_000 TOKENS ", "tokens", 1000),
    ],
)
def test_duration_texts_parse(text, unit, value):
    duration = Duration.parse(text)
    assert (duration.unit, duration.value) == (unit, value)
    assert duration == Duration.of(unit, value)


@pytest.mark.parametrize("text", ["10", "ten epochs", "5 parsecs", "0 steps", "1.5 steps", "-3ep"])
def test_a_bad_duration_text_names_itself_and_the_accepted_forms(text):
    with pytest.raises(ConfigError) as error:
        Duration.parse(text, "train_for")
    message = str(error.value)
    assert repr(text) in message and "'10ep'" in message and "'1B tokens'" in message


def test_duration_keywords():
    assert Duration(samples=2_000_000) == Duration.parse("2M samples")
    assert str(Duration(tokens=1_000)) == "1,000 tokens" and str(Duration(epochs=1)) == "1 epoch"
    with pytest.raises(ConfigError, match="exactly one of epochs=, steps=, samples= or tokens="):
        Duration(samples=5, steps=2)
    with pytest.raises(ConfigError, match=r"Duration\(samples=...\) must be an int >= 1, got 0"):
        Duration(samples=0)


def test_progress_counts_are_short():
    assert [short_count(n) for n in (950, 1000, 1016, 12_500, 999_999, 2 * 10**9)] == [
        "950",
        "1k",
        "1.02k",
        "12.5k",
        "1M",
        "2B",
    ]


def test_builder_refuses_what_it_cannot_use(tmp_path):
    options = LearnerBuilder(tmp_path)
    with pytest.raises(ConfigError, match="train_for: cannot read 'soon' as a duration"):
        options.train_for("soon")
    with pytest.raises(ConfigError, match="every epoch end already does this"):
        options.valid_every("2ep")
    with pytest.raises(ConfigError, match="every epoch end already does this"):
        options.checkpoint_every("1 epoch")
    with pytest.raises(ConfigError, match="valid_every takes a number of optimizer steps"):
        options.valid_every("often")
    with pytest.raises(ConfigError, match="no checkpointer is set"):
        options.checkpoint_every("100 samples").build(Classifier(), AdamConfig().init(), 1e-2)


# Run lengths -----------------------------------------------------------------------
def test_a_length_in_steps_ends_inside_an_epoch_like_an_epoch_end(tmp_path, loaders, quiet):
    ember.seed(3)
    learner = (
        builder(tmp_path / "run", quiet)
        .train_for("10steps")
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    learner.fit(*loaders)
    run = tmp_path / "run"
    assert learner.outcome == "completed" and learner.exit_code == 0
    assert learner.counters.steps == 10 and (learner.epoch, learner.iteration) == (2, 3)
    # epoch 2 is the 3 batches trained, validated on the whole loader
    assert len(read_metric_log(run / "train" / "epoch-2" / "Loss.log")) == 3
    assert [w for _, w in read_metric_log(run / "valid" / "epoch-2" / "Loss.log")] == [32, 32, 26]
    saved = history(run)
    assert [entry["epoch"] for entry in saved["epochs"]] == [1, 2]
    assert saved["outcome"] == "completed" and saved["checkpoints"] == [1, 2]
    assert epoch_counters(run) == {
        1: {"steps": 7, "samples": 200, "tokens": 0},
        2: {"steps": 10, "samples": 296, "tokens": 0},
    }
    log = (run / "experiment.log").read_text()
    assert "reached train_for (10 steps) at epoch 2, iteration 3" in log
    assert "Progress after epoch 2: steps 10/10." in log
    assert "(steps 7/10)" in quiet.stream_text.getvalue()  # the end of epoch 1


def test_a_length_in_samples_ends_at_the_first_step_at_or_past_it(tmp_path, loaders):
    learner = (
        builder(tmp_path / "run")
        .train_for(Duration(samples=250))
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    learner.fit(*loaders)
    assert learner.outcome == "completed"
    assert epoch_counters(tmp_path / "run")[2] == {"steps": 9, "samples": 264, "tokens": 0}


def test_an_int_length_is_epochs_as_num_epochs(tmp_path, loaders):
    learner = builder(tmp_path / "run").train_for(2).build(Classifier(), AdamConfig().init(), 1e-2)
    learner.fit(*loaders)
    assert learner.num_epochs == 2 and learner.train_for is None
    assert epoch_counters(tmp_path / "run")[2] == {"steps": 14, "samples": 400, "tokens": 0}


@dataclass
class TokenBatch(Batch):
    num_tokens: int = 0


class TokenBatcher(BlobBatcher):
    """Each sample stands for 3 tokens, which the batch tells (`num_tokens`)."""

    def batch(self, items):
        batch = super().batch(items)
        return TokenBatch(batch.inputs, batch.targets, 3 * len(items))


class TokenClassifier(Classifier):
    """Tells its tokens (3 a sample) on the output, as a tensor."""

    def train_step(self, batch):
        output = self(batch.inputs)
        tokens = torch.full_like(batch.targets, 3).sum()
        return TrainOutput(
            ClassificationOutput(
                F.cross_entropy(output, batch.targets), output, batch.targets, tokens=tokens
            )
        )


@pytest.mark.parametrize("where", ["batch", "output"])
def test_a_length_in_tokens_counts_the_batch_or_output_tokens(tmp_path, blobs, where):
    model = Classifier() if where == "batch" else TokenClassifier()
    batcher = TokenBatcher() if where == "batch" else BlobBatcher()
    train = DataLoaderBuilder(batcher).batch_size(32).shuffle(7).build(blobs[0])
    learner = (
        builder(tmp_path / "run").train_for("1k tokens").build(model, AdamConfig().init(), 1e-2)
    )
    learner.fit(train)
    # 600 tokens an epoch; in epoch 2 the fifth step (96 tokens each) passes 1000
    assert (learner.epoch, learner.iteration) == (2, 5)
    assert epoch_counters(tmp_path / "run")[2] == {"steps": 12, "samples": 360, "tokens": 1080}


def test_a_length_in_tokens_needs_each_batch_to_tell_them(tmp_path, loaders):
    learner = (
        builder(tmp_path / "run")
        .train_for("1k tokens")
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    with pytest.raises(TrainingError, match="give the batch a num_tokens attribute"):
        learner.fit(*loaders)


# Cadences --------------------------------------------------------------------------
def test_valid_and_checkpoint_every_samples(tmp_path, loaders):
    learner = (
        builder(tmp_path / "run")
        .num_epochs(2)
        .valid_every("100 samples")
        .checkpoint_every("150sp")
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    learner.fit(*loaders)
    run = tmp_path / "run"
    # epoch 1: 32 .. 192, 200; epoch 2: 232 .. 392, 400. A multiple passed on an epoch's
    # last step is left to the epoch end's validation and checkpoint.
    points = [r["point"] for r in records(run) if "point" in r]
    assert [(p["epoch"], p["iteration"], p["counters"]["samples"]) for p in points] == [
        (1, 4, 128),
        (2, 4, 328),
    ]
    assert (run / "valid" / "epoch-2" / "iteration-4" / "Loss.log").exists()
    log = (run / "experiment.log").read_text()
    for where in ("epoch 1, iteration 5", "epoch 2, iteration 4"):
        assert f"Checkpoint of {where} written" in log  # at 160 and 328 samples
    assert "Checkpoint of epoch 1, iteration 4 written" not in log


def test_valid_every_steps_as_text_is_the_int_form(tmp_path, loaders):
    learner = (
        builder(tmp_path / "run")
        .valid_every("3steps")
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    assert learner.options.valid_every == 3


# Resume ----------------------------------------------------------------------------
def sample_run(directory: Path, blobs, batch: int, stop_at=None, resume=False):
    ember.seed(3)
    train = DataLoaderBuilder(BlobBatcher()).batch_size(batch).shuffle(7).build(blobs[0])
    valid = DataLoaderBuilder(BlobBatcher()).batch_size(32).build(blobs[1])
    options = builder(directory).train_for("300 samples").valid_every("100 samples")
    if resume:
        options = options.checkpoint("latest")
    if stop_at is not None:
        options = options.listener(StopAt(options.interrupter(), *stop_at))
    learner = options.build(Classifier(), AdamConfig().init(), 1e-2)
    learner.fit(train, valid)
    return learner


def test_resumed_with_another_batch_size_it_ends_at_the_same_samples(tmp_path, blobs):
    run = tmp_path / "run"
    stopped = sample_run(run, blobs, 32, stop_at=(1, 3))  # after 96 samples
    assert stopped.outcome.startswith("stopped") and stopped.counters.samples == 96
    resumed = sample_run(run, blobs, 16, resume=True)
    assert resumed.outcome == "completed"
    # 104 samples left in epoch 1 (batches of 16: 7 steps), then 7 more steps of 16
    assert epoch_counters(run) == {
        1: {"steps": 10, "samples": 200, "tokens": 0},
        2: {"steps": 17, "samples": 312, "tokens": 0},
    }
    points = [(p["epoch"], p["counters"]["samples"]) for p in history_points(run)]
    assert points == [(1, 112)]  # 100 passed at 112; 200 and 300 end an epoch and the run
    # a run at batch 16 from the start ends at the same count, as many steps later
    again = sample_run(tmp_path / "again", blobs, 16)
    assert epoch_counters(tmp_path / "again")[2]["samples"] == 312
    assert again.counters.steps == 20


def history_points(directory: Path) -> list[dict]:
    return [r["point"] for r in records(directory) if "point" in r]


def test_a_finished_run_resumed_trains_nothing_more(tmp_path, loaders):
    options = builder(tmp_path / "run").train_for("10steps")
    options.build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    again = (
        builder(tmp_path / "run")
        .train_for("10steps")
        .checkpoint("latest")
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    again.fit(*loaders)
    assert again.outcome == "completed" and again.counters.steps == 10
    saved = history(tmp_path / "run")
    assert [entry["epoch"] for entry in saved["epochs"]] == [1, 2]
    assert (
        "its checkpoint has 10 steps and train_for is 10 steps"
        in (tmp_path / "run" / "experiment.log").read_text()
    )
    longer = (
        builder(tmp_path / "run")
        .train_for("12steps")
        .checkpoint("latest")
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    longer.fit(*loaders)  # goes on inside epoch 2, exactly where the shorter run ended
    assert (longer.epoch, longer.iteration, longer.counters.steps) == (2, 5, 12)
    assert len(read_metric_log(tmp_path / "run" / "train" / "epoch-2" / "Loss.log")) == 5


# Schedules -------------------------------------------------------------------------
def test_an_auto_schedule_ends_on_the_last_step_of_a_sample_length(tmp_path, loaders):
    rates: list[float] = []

    class Rates:
        def on_event(self, event):
            if isinstance(event, ProcessedItem) and event.split == "train":
                rates.append(event.lr)

    schedule = CosineAnnealingLrSchedulerConfig(initial_lr=0.5, num_iters="auto", min_lr=0.01)
    learner = (
        builder(tmp_path / "run")
        .train_for("250 samples")
        .listener(Rates())
        .build(Classifier(), SgdConfig(), schedule)
    )
    assert learner.steps(loaders[0]) == (7, 9)  # 7 steps an epoch, 9 to pass 250 samples
    learner.fit(*loaders)
    assert learner.total_steps == 9 and len(rates) == 9
    assert rates[0] == 0.5 and rates[-1] == 0.01


def test_an_auto_schedule_needs_the_samples_of_each_step(tmp_path, loaders):
    batches = list(loaders[0])  # a list of batches tells no batch size
    schedule = CosineAnnealingLrSchedulerConfig(initial_lr=0.5, num_iters="auto")
    learner = (
        builder(tmp_path / "run").train_for("250sp").build(Classifier(), SgdConfig(), schedule)
    )
    with pytest.raises(TrainingError, match="does not tell its samples per step") as error:
        learner.fit(batches)
    assert "Give the schedule its step count instead" in str(error.value)


def test_an_auto_schedule_with_a_token_length_asks_for_its_steps(tmp_path):
    schedule = CosineAnnealingLrSchedulerConfig(initial_lr=0.5, num_iters="auto")
    options = builder(tmp_path / "run").train_for("1B tokens")
    with pytest.raises(ConfigError, match="Give the schedule an explicit step count"):
        options.build(Classifier(), SgdConfig(), schedule)


# Several processes ----------------------------------------------------------------
def test_tokens_are_summed_over_two_processes(tmp_path):
    # 203 samples of 1 to 5 tokens each; one process at batch 32 and two at batch 16
    # take the same samples in each step, so they count the same tokens and end together
    args = ("--token-mean", "--train-for", "700tok", "--epochs", "1")
    one = run_script(
        DDP_SCRIPT, str(tmp_path / "one"), "--processes", "1", "--batch", "32", *args, timeout=240
    )
    two = run_script(DDP_SCRIPT, str(tmp_path / "two"), "--processes", "2", *args, timeout=240)
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    counted = epoch_counters(tmp_path / "one")
    assert counted == epoch_counters(tmp_path / "two")
    last = counted[max(counted)]
    assert last["tokens"] >= 700 and last["steps"] > 7  # past the first epoch
    assert history(tmp_path / "two")["outcome"] == "completed"
    one_final = DefaultRecorder().load(None, tmp_path / "one" / "final")
    two_final = DefaultRecorder().load(None, tmp_path / "two" / "final")
    for name, value in one_final.items():
        torch.testing.assert_close(two_final[name], value, rtol=0, atol=1e-6)
