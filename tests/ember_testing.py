"""A tiny classification task for the tests: trains in well under a second."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ember.train import ClassificationOutput, TrainOutput


@dataclass
class Batch:
    inputs: torch.Tensor
    targets: torch.Tensor


class BlobDataset(torch.utils.data.Dataset):
    """Gaussian blobs: `size` points in `features` dims, `classes` well separated classes."""

    def __init__(self, size: int = 200, features: int = 8, classes: int = 3, seed: int = 0):
        centers = torch.randn(classes, features, generator=torch.Generator().manual_seed(99)) * 3
        generator = torch.Generator().manual_seed(seed)
        self.targets = torch.randint(0, classes, (size,), generator=generator)
        self.inputs = centers[self.targets] + torch.randn(size, features, generator=generator)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        return self.inputs[index], int(self.targets[index])


class BlobBatcher:
    def batch(self, items: Sequence) -> Batch:
        return Batch(
            torch.stack([x for x, _ in items]),
            torch.tensor([y for _, y in items], dtype=torch.long),
        )


class Classifier(nn.Module):
    """A small MLP with the two step methods, and a record of the modes it ran in."""

    def __init__(self, features: int = 8, classes: int = 3, hidden: int = 16):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, classes)
        )
        self.seen: list[tuple[str, bool, bool]] = []

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.net(inputs)

    def classify(self, batch: Batch) -> ClassificationOutput:
        output = self(batch.inputs)
        return ClassificationOutput(F.cross_entropy(output, batch.targets), output, batch.targets)

    def train_step(self, batch: Batch) -> TrainOutput:
        self.seen.append(("train", self.training, torch.is_inference_mode_enabled()))
        return TrainOutput(self.classify(batch))

    def valid_step(self, batch: Batch) -> ClassificationOutput:
        self.seen.append(("valid", self.training, torch.is_inference_mode_enabled()))
        return self.classify(batch)
