"""The guide's MNIST model: two convolutions, adaptive pooling, two linear layers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ember import Config
from ember.train import ClassificationOutput, TrainOutput


class ModelConfig(Config):
    num_classes: int = 10
    hidden_size: int = 512
    dropout: float = 0.5

    def init(self) -> Model:
        return Model(self)


class Model(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=3)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=3)
        self.pool = nn.AdaptiveAvgPool2d((8, 8))
        self.dropout = nn.Dropout(config.dropout)
        self.linear1 = nn.Linear(16 * 8 * 8, config.hidden_size)
        self.linear2 = nn.Linear(config.hidden_size, config.num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Images [B, 28, 28] -> logits [B, num_classes]."""
        x = images.unsqueeze(1)  # [B, 1, 28, 28]
        x = self.dropout(self.conv1(x))  # [B, 8, 26, 26]
        x = self.dropout(self.conv2(x))  # [B, 16, 24, 24]
        x = self.pool(F.relu(x))  # [B, 16, 8, 8]
        x = self.dropout(F.relu(self.linear1(x.flatten(1))))
        return self.linear2(x)

    def forward_classification(
        self, images: torch.Tensor, targets: torch.Tensor
    ) -> ClassificationOutput:
        output = self(images)
        loss = F.cross_entropy(output, targets)
        return ClassificationOutput(loss, output, targets)

    def train_step(self, batch) -> TrainOutput:
        return TrainOutput(self.forward_classification(batch.images, batch.targets))

    def valid_step(self, batch) -> ClassificationOutput:
        return self.forward_classification(batch.images, batch.targets)
