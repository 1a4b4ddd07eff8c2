"""Models from other libraries through `LossFromModel`, beside Hugging Face's:
torch_geometric (node classification on one graph with a mask per split, graph
classification), diffusers (noise prediction), a detection-style model (a dict of
losses in train mode, boxes in eval mode, a validation loss from a train-mode forward),
and timm and torchvision where they import. ember's runs end with the weights of a
hand-written loop with the same seed, and resume exactly."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from library_testing import (
    CUDA_WHEELS,
    assert_checkpoint_loads_into,
    assert_close_states,
    builder,
    hand_loop,
    library,
)
from torch import nn

import ember
from ember.data import DataLoaderBuilder
from ember.errors import TrainingError
from ember.record import load
from ember.train import EvaluatorBuilder, ForwardOutput, LossFromModel
from ember.train.metric import AccuracyMetric, LossMetric, TorchMetric

# --- torch_geometric ---------------------------------------------------------------------------


def test_node_classification_on_one_graph_uses_each_splits_mask(tmp_path, one_thread):
    library("torch_geometric")
    from torch_geometric.data import Data
    from torch_geometric.loader import DataLoader
    from torch_geometric.nn.models import GCN

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(40, 6, generator=generator)
    y = x[:, :3].argmax(dim=1)
    edges = torch.randint(0, 40, (2, 120), generator=generator)
    split = torch.arange(40) % 4
    graph = Data(x=x, edge_index=edges, y=y, train_mask=split < 2, val_mask=split == 2)
    graph.test_mask = split == 3
    loader = DataLoader([graph], batch_size=1)

    torch.manual_seed(0)
    initial = GCN(6, 16, num_layers=2, out_channels=3, dropout=0.2)
    hand, ours = copy.deepcopy(initial), copy.deepcopy(initial)
    torch.manual_seed(3)
    optimizer = torch.optim.Adam(hand.parameters(), lr=1e-2)
    for _ in range(4):  # each epoch reads the loader to train, then to validate
        hand.train()
        for g in loader:
            out = hand(g.x, g.edge_index)
            F.cross_entropy(out[g.train_mask], g.y[g.train_mask]).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        hand.eval()
        with torch.no_grad():
            for g in loader:
                hand(g.x, g.edge_index)

    steps = LossFromModel(
        "classification",
        call=lambda gnn, g: gnn(g.x, g.edge_index),
        loss=F.cross_entropy,
        targets="y",
        mask={"train": "train_mask", "valid": "val_mask", "test": "test_mask"},
    )
    ember.seed(3)
    learner = builder(
        tmp_path / "run", epochs=4, valid=(AccuracyMetric(),), checkpoints=True
    ).build(ours, torch.optim.Adam(ours.parameters(), lr=1e-2), steps=steps)
    learner.fit(loader, loader)
    assert_close_states(ours, hand)
    assert_checkpoint_loads_into(tmp_path / "run", 4, copy.deepcopy(initial), ours)

    ours.eval()
    with torch.no_grad():
        predicted = ours(graph.x, graph.edge_index).argmax(dim=1)
    right = (predicted == graph.y).float()
    accuracy = learner.history[-1][1]["valid"]["Accuracy"]
    assert accuracy == pytest.approx(100 * float(right[graph.val_mask].mean()))
    evaluator = EvaluatorBuilder(tmp_path / "run").metric(AccuracyMetric()).build(ours)
    tested = evaluator.eval("test", loader)
    assert tested["Accuracy"] == pytest.approx(100 * float(right[graph.test_mask].mean()))


class GraphClassifier(nn.Module):
    """A graph network of torch_geometric's layers: two graph convolutions, a mean over
    each graph's nodes, a linear layer (the model; nothing of ember in it)."""

    def __init__(self) -> None:
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.conv1, self.conv2 = GCNConv(5, 16), GCNConv(16, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, x, edge_index, batch):
        from torch_geometric.nn import global_mean_pool

        x = self.conv2(self.conv1(x, edge_index).relu(), edge_index).relu()
        return self.head(global_mean_pool(x, batch))


def test_graph_classification_trains_as_a_hand_loop_and_resumes_exactly(tmp_path, one_thread):
    library("torch_geometric")
    from torch_geometric.data import Batch, Data

    generator = torch.Generator().manual_seed(1)
    graphs = []
    for i in range(30):
        nodes = 4 + i % 5
        x = torch.randn(nodes, 5, generator=generator)
        edges = torch.randint(0, nodes, (2, 2 * nodes), generator=generator)
        graphs.append(Data(x=x, edge_index=edges, y=torch.tensor([int(x[:, 0].mean() > 0)])))

    def loaders() -> tuple[Any, Any]:
        batcher = Batch.from_data_list
        return (
            DataLoaderBuilder(batcher).batch_size(6).shuffle(2).build(graphs[:24]),
            DataLoaderBuilder(batcher).batch_size(6).build(graphs[24:]),
        )

    steps = LossFromModel(
        "classification",
        call=lambda gnn, g: gnn(g.x, g.edge_index, g.batch),
        loss=F.cross_entropy,
        targets="y",
    )

    def fit(directory: Path, **options: Any) -> tuple[Any, Any]:
        torch.manual_seed(0)
        model = GraphClassifier()
        ember.seed(4)
        learner = builder(directory, valid=(AccuracyMetric(),), **options).build(
            model, torch.optim.Adam(model.parameters(), lr=1e-2), steps=steps
        )
        return learner.fit(*loaders()), learner

    torch.manual_seed(0)
    hand = GraphClassifier()
    torch.manual_seed(4)
    hand_loop(
        hand,
        torch.optim.Adam(hand.parameters(), lr=1e-2),
        loaders()[0],
        2,
        lambda m, g: F.cross_entropy(m(g.x, g.edge_index, g.batch), g.y),
    )
    straight, _ = fit(tmp_path / "straight", checkpoints=True)
    assert_close_states(straight, hand)
    fit(tmp_path / "resumed", stop=(1, 2))
    resumed, _ = fit(tmp_path / "resumed", resume=True)
    assert_close_states(resumed, straight)
    assert_checkpoint_loads_into(tmp_path / "resumed", 2, GraphClassifier(), resumed)


# --- diffusers: noise prediction ----------------------------------------------------------------


def test_a_diffusion_unet_learns_the_noise_as_a_hand_loop(tmp_path, one_thread):
    diffusers = library("diffusers")
    scheduler = diffusers.DDPMScheduler(num_train_timesteps=50)
    images = [torch.randn(1, 8, 8, generator=torch.Generator().manual_seed(i)) for i in range(24)]

    def noisy(items: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """The collator: noise and time steps drawn for each batch (torch's generator)."""
        clean = torch.stack(items)
        noise = torch.randn_like(clean)
        steps = torch.randint(0, 50, (len(items),))
        return {
            "sample": scheduler.add_noise(clean, noise, steps),
            "timestep": steps,
            "labels": noise,
        }

    def unet() -> Any:
        torch.manual_seed(0)
        return diffusers.UNet2DModel(
            sample_size=8,
            in_channels=1,
            out_channels=1,
            layers_per_block=1,
            block_out_channels=(8, 16),
            down_block_types=("DownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "UpBlock2D"),
            norm_num_groups=4,
        )

    def loaders() -> tuple[Any, Any]:
        return (
            DataLoaderBuilder(noisy).batch_size(8).shuffle(1).build(images[:16]),
            DataLoaderBuilder(noisy).batch_size(8).build(images[16:]),
        )

    hand = unet()
    torch.manual_seed(9)
    train, valid = loaders()
    optimizer = torch.optim.Adam(hand.parameters(), lr=1e-3)
    valid_losses = []
    for epoch in (1, 2):  # trains, then validates, as the Learner does
        hand.train()
        train.sampler.set_epoch(epoch)
        for batch in train:
            prediction = hand(batch["sample"], batch["timestep"]).sample
            F.mse_loss(prediction, batch["labels"]).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        hand.eval()
        with torch.no_grad():
            batch = next(iter(valid))
            prediction = hand(batch["sample"], batch["timestep"]).sample
            valid_losses.append(float(F.mse_loss(prediction, batch["labels"])))

    ours = unet()
    ember.seed(9)
    learner = builder(tmp_path / "run", valid=(LossMetric(),)).build(
        ours,
        torch.optim.Adam(ours.parameters(), lr=1e-3),
        steps=LossFromModel("regression", loss=F.mse_loss),
    )
    learner.fit(*loaders())
    assert_close_states(ours, hand)
    assert [values["valid"]["Loss"] for _, values in learner.history] == pytest.approx(
        valid_losses, rel=1e-6
    )


# --- a detection-style model: a dict of losses in train mode, boxes in eval mode ---------------


class Detector(nn.Module):
    """A stand-in for torchvision's detection models: `forward(images, targets)` returns a
    dict of losses in train mode (drawing random numbers, as their samplers do) and one
    dict of predictions per image in eval mode. A BatchNorm layer keeps running
    statistics."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
        self.boxes = nn.Linear(4, 4)
        self.scores = nn.Linear(4, 1)

    def forward(self, images: list[torch.Tensor], targets: list[dict[str, Any]] | None = None):
        pooled = torch.stack([self.features(image[None]).mean(dim=(0, 2, 3)) for image in images])
        boxes, scores = self.boxes(pooled), self.scores(pooled).squeeze(-1)
        if not self.training:
            return [{"boxes": b[None], "scores": s[None]} for b, s in zip(boxes, scores)]
        assert targets is not None
        sampled = torch.rand(len(images))  # a sampler's random draws
        wanted = torch.stack([t["boxes"][0] for t in targets])
        return {
            "loss_box": ((boxes - wanted) ** 2).mean(),
            "loss_score": ((scores - sampled) ** 2).mean(),
        }


class BoxError:
    """A torchmetrics-like metric over lists of dicts (what TorchMetric wraps)."""

    higher_is_better = False

    def __init__(self) -> None:
        self.total, self.count = 0.0, 0

    def to(self, device: torch.device) -> BoxError:
        return self

    def __call__(self, preds: list[dict], targets: list[dict]) -> torch.Tensor:
        errors = [float((p["boxes"] - t["boxes"]).abs().mean()) for p, t in zip(preds, targets)]
        self.total, self.count = self.total + sum(errors), self.count + len(errors)
        return torch.tensor(sum(errors) / len(errors))

    def compute(self) -> torch.Tensor:
        return torch.tensor(self.total / self.count)

    def reset(self) -> None:
        self.total, self.count = 0.0, 0


def detection_loaders() -> tuple[Any, Any]:
    generator = torch.Generator().manual_seed(0)
    items = [
        (
            torch.randn(3, 6, 6, generator=generator),
            {"boxes": torch.rand(1, 4, generator=generator)},
        )
        for _ in range(20)
    ]

    def collate(batch: list[Any]) -> tuple[list[Any], list[Any]]:
        return [image for image, _ in batch], [target for _, target in batch]

    return (
        DataLoaderBuilder(collate).batch_size(4).shuffle(0).build(items[:12]),
        DataLoaderBuilder(collate).batch_size(4).build(items[12:]),
    )


def test_a_validation_loss_in_train_mode_leaves_training_and_running_statistics_alone(tmp_path):
    def fit(directory: Path, steps: LossFromModel, metrics: tuple[Any, ...]) -> tuple[Any, Any]:
        torch.manual_seed(0)
        model = Detector()
        ember.seed(1)
        learner = builder(directory, valid=metrics).build(
            model, torch.optim.SGD(model.parameters(), lr=0.1), steps=steps
        )
        return learner.fit(*detection_loaders()), learner

    box_error = TorchMetric(BoxError(), name="Box error", input_type=ForwardOutput)
    plain, _ = fit(tmp_path / "plain", LossFromModel(), (box_error,))
    box_error = TorchMetric(BoxError(), name="Box error", input_type=ForwardOutput)
    with_loss, learner = fit(
        tmp_path / "loss", LossFromModel(valid_loss="train_mode"), (LossMetric(), box_error)
    )
    # The extra forward drew its random numbers from a fork and updated no statistics.
    assert_close_states(with_loss, plain)
    values = learner.history[-1][1]["valid"]
    assert math.isfinite(values["Loss"]) and values["Loss"] > 0
    assert with_loss.training is True  # every module's mode put back after validation
    assert all(module.training for module in with_loss.modules())

    with_loss.eval()
    with torch.no_grad():
        _, valid = detection_loaders()
        errors = [
            float((p["boxes"] - t["boxes"]).abs().mean())
            for images, targets in valid
            for p, t in zip(with_loss(images), targets)
        ]
    assert values["Box error"] == pytest.approx(sum(errors) / len(errors), rel=1e-6)


def test_a_validation_loss_of_a_model_without_one_in_eval_mode_names_the_option(tmp_path):
    torch.manual_seed(0)
    model = Detector()
    learner = builder(tmp_path / "run", valid=(LossMetric(),)).build(
        model, torch.optim.SGD(model.parameters(), lr=0.1), steps=LossFromModel()
    )
    with pytest.raises(TrainingError, match=r"valid_loss='train_mode'"):
        learner.fit(*detection_loaders())


# --- timm and torchvision, where they import ---------------------------------------------------


def test_timm_and_torchvision_classifiers_train_with_a_loss_function(tmp_path):
    timm = library("timm", CUDA_WHEELS.format(name="timm"))
    torchvision = library("torchvision", CUDA_WHEELS.format(name="torchvision"))
    images = [(torch.randn(3, 32, 32), i % 3) for i in range(12)]
    loader = DataLoaderBuilder().batch_size(4).build(images)
    models = (
        timm.create_model("resnet18", num_classes=3),
        torchvision.models.resnet18(num_classes=3),
    )
    for index, model in enumerate(models):
        keys = list(model.state_dict())
        learner = builder(tmp_path / f"run-{index}", epochs=1, checkpoints=True).build(
            model,
            torch.optim.SGD(model.parameters(), lr=0.01),
            steps=LossFromModel("classification", loss=F.cross_entropy),
        )
        learner.fit(loader, loader)
        directory = Path(learner.artifact_dir)
        assert sorted(load(None, directory / "checkpoint" / "model-1")) == sorted(keys)


def test_a_torchvision_detection_model_validates_with_a_train_mode_loss(tmp_path):
    torchvision = library("torchvision", CUDA_WHEELS.format(name="torchvision"))
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3
    )
    items = [
        (
            torch.rand(3, 64, 64),
            {"boxes": torch.tensor([[4.0, 4.0, 40.0, 40.0]]), "labels": torch.tensor([1])},
        )
        for _ in range(4)
    ]

    def collate(batch: list[Any]) -> tuple[list[Any], list[Any]]:
        return [image for image, _ in batch], [target for _, target in batch]

    loader = DataLoaderBuilder(collate).batch_size(2).build(items)
    learner = builder(tmp_path / "run", epochs=1, valid=(LossMetric(),)).build(
        model,
        torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.001),
        steps=LossFromModel(valid_loss="train_mode"),
    )
    learner.fit(loader, loader)
    assert math.isfinite(learner.history[-1][1]["valid"]["Loss"])
