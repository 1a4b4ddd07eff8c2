"""Batching MNIST items into normalised image and target tensors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

MNIST_MEAN = 0.1307
MNIST_STD = 0.3081


@dataclass
class MnistBatch:
    images: torch.Tensor  # [B, 28, 28] float32, normalised
    targets: torch.Tensor  # [B] int64


class MnistBatcher:
    """Stacks (image, label) items; pixels scaled to [0, 1] then standardised."""

    def batch(self, items: Sequence[tuple[np.ndarray, int]]) -> MnistBatch:
        images = torch.from_numpy(np.stack([image for image, _ in items]))
        images = (images.float() / 255.0 - MNIST_MEAN) / MNIST_STD
        targets = torch.tensor([label for _, label in items], dtype=torch.int64)
        return MnistBatch(images, targets)
