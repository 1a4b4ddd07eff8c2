"""Batches and loaders as users bring them: image lists, batch objects with no tensor at
their top, torch DataLoaders (shuffled, augmenting, with workers), their subclasses,
torchdata's StatefulDataLoader, iterable datasets and collate functions. Items are
counted from the loader, accumulation weights each batch by its items, and a run
stopped inside an epoch resumes exactly where it can (and says so where it cannot)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from ember_testing import Batch, BlobDataset, Classifier, StopAt, assert_same_state
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

import ember
from ember.data import DataLoaderBuilder
from ember.errors import ConfigError, TrainingError
from ember.optim import AdamConfig, SgdConfig
from ember.record import DefaultRecorder
from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.history import RunHistory
from ember.train.logger import read_metric_log
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer

# --- data and models of the shapes users bring ----------------------------------------------------


class AugmentedBlobs(BlobDataset):
    """Blob points with noise drawn from torch's global generator in `__getitem__`, as a
    random augmentation does."""

    def __getitem__(self, index: int):
        x, y = super().__getitem__(index)
        return x + 0.3 * torch.randn_like(x), y


def blob_collate(items: list[Any]) -> Batch:
    return Batch(torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items]))


class Images(torch.utils.data.Dataset):
    """Images of different sizes, [3, H, W] with H and W from 5 to 8, and a class each;
    a random flip (torch's global generator) as augmentation."""

    def __init__(self, size: int = 40) -> None:
        generator = torch.Generator().manual_seed(3)
        self.images = [
            torch.randn(3, 5 + i % 4, 5 + (i * 7) % 4, generator=generator) for i in range(size)
        ]
        self.labels = [int(image.mean() > 0) for image in self.images]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        image = self.images[index]
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        return image, self.labels[index]


def image_lists(items: list[Any]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Detection style: a list of images (their sizes differ) and the targets."""
    return [image for image, _ in items], torch.tensor([label for _, label in items])


class ImageNet(nn.Module):
    """Classifies each image of a list on its own (global average pooling)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(4, 2)

    def forward(self, images: list[torch.Tensor]) -> torch.Tensor:
        features = torch.stack([self.conv(image[None]).relu().mean((2, 3))[0] for image in images])
        return self.head(self.drop(features))

    def classify(self, batch: Any) -> ClassificationOutput:
        images, targets = batch
        logits = self(images)
        return ClassificationOutput(F.cross_entropy(logits, targets), logits, targets)

    def train_step(self, batch: Any) -> TrainOutput:
        return TrainOutput(self.classify(batch))

    def valid_step(self, batch: Any) -> ClassificationOutput:
        return self.classify(batch)


class Graphs:
    """A batch object with no tensor at its top, as a graph library's batch is."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y


def graphs(items: list[Any]) -> Graphs:
    return Graphs(torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items]))


class GraphNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 3)

    def classify(self, batch: Graphs) -> ClassificationOutput:
        logits = self.net(batch.x)
        return ClassificationOutput(F.cross_entropy(logits, batch.y), logits, batch.y)

    def train_step(self, batch: Graphs) -> TrainOutput:
        return TrainOutput(self.classify(batch))

    def valid_step(self, batch: Graphs) -> ClassificationOutput:
        return self.classify(batch)


def builder(directory: Path, epochs: int = 3, stop: tuple[int, int] | None = None, **options):
    built = (
        LearnerBuilder(directory)
        .metric_train_numeric(LossMetric())
        .metric_train(AccuracyMetric())
        .metric_valid_numeric(LossMetric())
        .with_file_checkpointer(DefaultRecorder())
        .num_epochs(epochs)
        .renderer(PlainRenderer(interval=3600))
    )
    if options.get("resume"):
        built = built.checkpoint("latest")
    if options.get("accumulation"):
        built = built.grads_accumulation(options["accumulation"])
    if stop is not None:
        built = built.listener(StopAt(built.interrupter(), *stop))
    return built


def stopped_and_resumed(
    tmp_path: Path, fit: Any, stop: tuple[int, int], end: int | None = None
) -> tuple[Any, Any]:
    """`fit(directory, stop=..., resume=...)` straight, then stopped at `stop` (at the
    epoch's end when its iteration is `end`, the epoch's last) and resumed; the two
    final models, and the logs and histories checked equal on the way."""
    straight, _ = fit(tmp_path / "straight")
    _, stopped = fit(tmp_path / "resumed", stop=stop)
    assert stopped.outcome == "stopped: test stop"
    resumed, learner = fit(tmp_path / "resumed", resume=True)
    assert learner.outcome == "completed"
    log = (tmp_path / "resumed" / "experiment.log").read_text()
    where = f"epoch {stop[0]}" + ("" if stop[1] == end else f", iteration {stop[1]}")
    assert f"Resumed from the checkpoint of {where}." in log
    assert "read again and dropped" not in log
    for split in ("train", "valid"):
        for epoch_dir in sorted((tmp_path / "straight" / split).glob("epoch-*")):
            for path in epoch_dir.glob("*.log"):
                other = tmp_path / "resumed" / split / epoch_dir.name / path.name
                assert read_metric_log(path) == read_metric_log(other), (split, epoch_dir, path)
    histories = [epochs(tmp_path / name) for name in ("straight", "resumed")]
    assert histories[0] == histories[1]
    return straight, resumed


def epochs(directory: Path) -> list[tuple[int, dict[str, dict[str, float]]]]:
    """The epoch values of a run's history."""
    return RunHistory.load(directory / "history.jsonl").entries()


# --- counting --------------------------------------------------------------------------------------


def test_a_batch_of_image_lists_counts_its_images_and_resumes_exactly_inside_an_epoch(
    tmp_path, capsys
):
    """(list of [3, H, W] images, targets): 8 images are 8 items, not the 3 of the first
    image's first dimension; a shuffled, augmenting loader stopped at epoch 2, iteration
    2 resumes with every batch trained once, as the run never stopped."""

    def fit(directory: Path, **options):
        ember.seed(11)
        train = DataLoader(Images(40), batch_size=8, shuffle=True, collate_fn=image_lists)
        valid = DataLoader(Images(16), batch_size=8, collate_fn=image_lists)
        learner = builder(directory, **options).build(ImageNet(), AdamConfig().init(), 1e-2)
        return learner.fit(train, valid), learner

    straight, resumed = stopped_and_resumed(tmp_path, fit, (2, 2))
    assert_same_state(straight.state_dict(), resumed.state_dict())
    out = capsys.readouterr().out
    assert "train epoch 1/3 done: 5 iterations, 40 items" in out
    assert "valid epoch 1/3 done: 2 iterations, 16 items" in out
    lines = read_metric_log(tmp_path / "straight" / "train" / "epoch-1" / "Loss.log")
    assert [size for _, size in lines] == [8, 8, 8, 8, 8]


def sgd_graphs(directory: Path, accumulation: int = 1, **options):
    torch.manual_seed(0)
    model = GraphNet()
    start = {name: value.clone() for name, value in model.state_dict().items()}
    data = BlobDataset(18)  # batches of 4, 4, 4 | 4, 2
    train = DataLoader(data, batch_size=4, collate_fn=graphs)
    built = (
        LearnerBuilder(directory)
        .metric_train_numeric(LossMetric())
        .num_epochs(1)
        .renderer(PlainRenderer(interval=3600))
    )
    if accumulation != 1:
        built = built.grads_accumulation(accumulation)
    for key, value in options.items():
        built = getattr(built, key)(value)
    learner = built.build(model, SgdConfig().init(), 0.5)
    return learner.fit(train), learner, start, data


def test_accumulation_weights_each_batch_by_its_share_of_the_steps_items(tmp_path):
    """grads_accumulation(3) over batches of 4, 4, 4 | 4, 2 of a batch object with no
    tensor at its top: each step is the gradient of the mean loss over its samples,
    as a hand update weighting each batch by its share of the group's samples."""
    trained, learner, start, data = sgd_graphs(tmp_path, accumulation=3)
    hand = GraphNet()
    hand.load_state_dict(start)
    x, y = data.inputs, data.targets
    for group in ([(0, 4), (4, 8), (8, 12)], [(12, 16), (16, 18)]):
        samples = sum(end - begin for begin, end in group)
        hand.zero_grad()
        for begin, end in group:
            loss = F.cross_entropy(hand.net(x[begin:end]), y[begin:end])
            (loss * (end - begin) / samples).backward()
        with torch.no_grad():
            for parameter in hand.parameters():
                parameter -= 0.5 * parameter.grad
    for name, value in hand.state_dict().items():
        torch.testing.assert_close(trained.state_dict()[name], value, rtol=0, atol=1e-6)
    log = (tmp_path / "experiment.log").read_text()
    assert "handed 4 item(s) to make its first batch, which a Graphs counts as nothing" in log
    assert learner.outcome == "completed"


def test_a_duration_in_samples_ends_with_batch_objects_that_have_no_tensor_at_their_top(
    tmp_path,
):
    _, learner, *_ = sgd_graphs(tmp_path, train_for="36 samples")
    assert learner.outcome == "completed"
    assert [epoch for epoch, _ in epochs(tmp_path)] == [1, 2]  # 18 samples an epoch
    lines = read_metric_log(tmp_path / "train" / "epoch-2" / "Loss.log")
    assert [size for _, size in lines] == [4, 4, 4, 4, 2]


def test_a_loader_that_cannot_count_its_batches_is_refused_where_a_count_is_needed(tmp_path):
    """A plain list of batch objects without `num_items` or a leading tensor: a duration
    in samples cannot be reached, so the first batch refuses it, naming the fix; without
    such a need the run trains, saying once that it counts nothing."""
    data = BlobDataset(12)
    batches = [graphs([data[i] for i in range(begin, begin + 4)]) for begin in (0, 4, 8)]

    def built(directory: Path) -> Any:
        return (
            LearnerBuilder(directory)
            .metric_train_numeric(LossMetric())
            .renderer(PlainRenderer(interval=3600))
        )

    learner = (
        built(tmp_path / "samples")
        .train_for("24 samples")
        .build(GraphNet(), SgdConfig().init(), 0.1)
    )
    with pytest.raises(TrainingError) as error:
        learner.fit(batches)
    message = str(error.value)
    assert "cannot count the items of the training loader's batches: a Graphs" in message
    assert "train_for('24 samples') needs that count" in message
    assert "Give the batch an int attribute `num_items`" in message

    learner = built(tmp_path / "epochs").num_epochs(1).build(GraphNet(), SgdConfig().init(), 0.1)
    learner.fit(batches)
    assert learner.outcome == "completed"
    log = (tmp_path / "epochs" / "experiment.log").read_text()
    assert "cannot count the items" in log and "Progress shows 0 items" in log
    # a batch that says its count is counted by it
    for batch in batches:
        batch.num_items = 4  # type: ignore[attr-defined]
    learner = (
        built(tmp_path / "told").train_for("24 samples").build(GraphNet(), SgdConfig().init(), 0.1)
    )
    learner.fit(batches)
    assert [epoch for epoch, _ in epochs(tmp_path / "told")] == [1, 2]


# --- exact resumes inside an epoch -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("workers", "persistent", "stop"),
    [(0, False, (2, 3)), (2, False, (2, 3)), (2, True, (2, 4)), (2, True, (1, 10))],
    ids=["workers-0", "workers-2", "persistent-workers", "persistent-epoch-end"],
)
def test_a_shuffled_augmenting_torch_dataloader_resumes_exactly(
    tmp_path, workers, persistent, stop
):
    """A plain torch DataLoader, shuffled by torch's RandomSampler (its seed drawn from
    the global generator), whose dataset draws noise from the global generator: the
    rest of the epoch gets the same samples, in the same order, with the same draws."""

    def fit(directory: Path, **options):
        ember.seed(5)
        train = DataLoader(
            AugmentedBlobs(160),
            batch_size=16,
            shuffle=True,
            num_workers=workers,
            persistent_workers=persistent,
            collate_fn=blob_collate,
        )
        valid = DataLoader(BlobDataset(64, seed=1), batch_size=32, collate_fn=blob_collate)
        learner = builder(directory, **options).build(Classifier(), AdamConfig().init(), 1e-2)
        return learner.fit(train, valid), learner

    straight, resumed = stopped_and_resumed(tmp_path, fit, stop, end=10)
    assert_same_state(straight.state_dict(), resumed.state_dict())


def test_a_resume_with_accumulation_skips_indices_not_batches(tmp_path):
    def fit(directory: Path, **options):
        ember.seed(5)
        train = DataLoader(
            AugmentedBlobs(150), batch_size=16, shuffle=True, collate_fn=blob_collate
        )
        learner = builder(directory, accumulation=3, **options).build(
            Classifier(), AdamConfig().init(), 1e-2
        )
        return learner.fit(train), learner

    straight, resumed = stopped_and_resumed(tmp_path, fit, (2, 6))
    assert_same_state(straight.state_dict(), resumed.state_dict())


def test_torchdata_stateful_dataloader_resumes_from_its_own_state(tmp_path):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def fit(directory: Path, **options):
        ember.seed(7)
        train = stateful.StatefulDataLoader(
            AugmentedBlobs(160), batch_size=16, shuffle=True, collate_fn=blob_collate
        )
        learner = builder(directory, **options).build(Classifier(), AdamConfig().init(), 1e-2)
        return learner.fit(train), learner

    straight, resumed = stopped_and_resumed(tmp_path, fit, (2, 3))
    assert_same_state(straight.state_dict(), resumed.state_dict())


def test_torch_geometric_graphs_are_counted_and_resume_exactly(tmp_path):
    geometric = pytest.importorskip("torch_geometric")
    from torch_geometric.data import Data
    from torch_geometric.loader import DataLoader as GraphLoader
    from torch_geometric.nn import global_mean_pool

    class GraphClassifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.node = nn.Linear(4, 8)
            self.head = nn.Linear(8, 2)

        def classify(self, batch: Any) -> ClassificationOutput:
            nodes = F.dropout(self.node(batch.x).relu(), 0.2, self.training)
            logits = self.head(global_mean_pool(nodes, batch.batch))
            return ClassificationOutput(F.cross_entropy(logits, batch.y), logits, batch.y)

        def train_step(self, batch: Any) -> TrainOutput:
            return TrainOutput(self.classify(batch))

        def valid_step(self, batch: Any) -> ClassificationOutput:
            return self.classify(batch)

    generator = torch.Generator().manual_seed(2)
    data = []
    for index in range(30):
        nodes = 3 + index % 5
        x = torch.randn(nodes, 4, generator=generator)
        data.append(Data(x=x, y=torch.tensor([int(x.sum() > 0)]), num_nodes=nodes))

    def fit(directory: Path, **options):
        ember.seed(3)
        train = GraphLoader(data, batch_size=4, shuffle=True)
        learner = builder(directory, **options).build(GraphClassifier(), AdamConfig().init(), 1e-2)
        return learner.fit(train), learner

    straight, resumed = stopped_and_resumed(tmp_path, fit, (2, 5))
    assert_same_state(straight.state_dict(), resumed.state_dict())
    lines = read_metric_log(tmp_path / "straight" / "train" / "epoch-1" / "Loss.log")
    assert [size for _, size in lines] == [4] * 7 + [2]  # graphs, not nodes
    assert geometric.__version__


class Stream(IterableDataset):
    """An iterable dataset: no sampler to skip with."""

    def __iter__(self):
        data = BlobDataset(64)
        for index in range(len(data)):
            yield data[index]


def test_an_iterable_dataset_resumed_inside_an_epoch_says_what_will_differ(tmp_path, caplog):
    def fit(directory: Path, **options):
        ember.seed(5)
        train = DataLoader(Stream(), batch_size=16, collate_fn=blob_collate)
        learner = builder(directory, **options).build(Classifier(), AdamConfig().init(), 1e-2)
        return learner.fit(train), learner

    fit(tmp_path, stop=(2, 2))
    with caplog.at_level(logging.WARNING):
        _, learner = fit(tmp_path, resume=True)
    assert learner.outcome == "completed"
    log = (tmp_path / "experiment.log").read_text()
    expected = (
        "the training loader (a DataLoader) cannot skip to where the epoch stopped, so "
        "its 2 batch(es) already trained are read again and dropped"
    )
    assert expected in log
    assert "StatefulDataLoader" in log and expected in caplog.text


# --- collate functions where a batcher goes ------------------------------------------------------


def test_dataloaderbuilder_takes_a_collate_function_and_refuses_what_is_neither(tmp_path):
    loader = DataLoaderBuilder(blob_collate).batch_size(16).shuffle(1).build(BlobDataset(64))
    batch = next(iter(loader))
    assert isinstance(batch, Batch) and batch.inputs.shape == (16, 8)
    default = DataLoaderBuilder(torch.utils.data.default_collate).batch_size(8)
    inputs, targets = next(iter(default.build(BlobDataset(16))))
    assert inputs.shape == (8, 8) and targets.shape == (8,)
    learner = builder(tmp_path, epochs=1).build(Classifier(), AdamConfig().init(), 1e-2)
    learner.fit(loader)
    assert learner.outcome == "completed"
    with pytest.raises(ConfigError) as error:
        DataLoaderBuilder(42)  # type: ignore[arg-type]
    message = str(error.value)
    assert "a int is neither a Batcher" in message
    assert "Hugging Face data collator" in message and "Batch.from_data_list" in message
