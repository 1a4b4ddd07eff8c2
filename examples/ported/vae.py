"""A variational autoencoder on MNIST, with the summed reconstruction and KL loss.

Run `python examples/ported/vae.py [--num-epochs 10 --limit 6000 ...]`.

The classic recipe: a 784-400-20 encoder gives the mean and log-variance of the
latent code, a sample of it (the reparameterisation trick) goes through a 20-400-784
decoder, and the loss is the binary cross-entropy of the reconstruction plus the KL
divergence from the unit Gaussian, both summed over the batch (`reduction="sum"`).
The output says so (`loss_reduction="sum"`), and ember reports the loss per image,
as the script's "average loss" is. Adam at 1e-3. After training, 64 images decoded
from random codes are written to ARTIFACT_DIR/samples.pgm.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import ember
from ember import Config
from ember.data import DataLoaderBuilder
from ember.data.datasets import MnistDataset
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder, RegressionOutput, TrainOutput
from ember.train.metric import LossMetric


class TrainingConfig(Config):
    batch_size: int = 128
    num_epochs: int = 10
    learning_rate: float = 1e-3
    latent_size: int = 20
    hidden_size: int = 400
    seed: int = 1
    limit: int | None = None  # use only the first `limit` images of each set
    num_workers: int = 0


@dataclass
class ImageBatch:
    images: torch.Tensor  # [B, 784], pixels in [0, 1]


class ImageBatcher:
    """Flattens (image, label) items into pixels in [0, 1]; the labels are not used."""

    def batch(self, items: Sequence[tuple[np.ndarray, int]]) -> ImageBatch:
        images = torch.from_numpy(np.stack([image for image, _ in items]))
        return ImageBatch(images.reshape(len(items), 784).float() / 255.0)


def vae_loss(
    reconstruction: torch.Tensor, images: torch.Tensor, mu: torch.Tensor, logvar: torch.Tensor
) -> torch.Tensor:
    """Binary cross-entropy of the reconstruction plus the KL divergence of
    N(mu, exp(logvar)) from N(0, 1), both summed over the batch."""
    bce = F.binary_cross_entropy(reconstruction, images, reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


class Vae(nn.Module):
    def __init__(self, config: TrainingConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(784, config.hidden_size)
        self.fc21 = nn.Linear(config.hidden_size, config.latent_size)
        self.fc22 = nn.Linear(config.hidden_size, config.latent_size)
        self.fc3 = nn.Linear(config.latent_size, config.hidden_size)
        self.fc4 = nn.Linear(config.hidden_size, 784)

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = F.relu(self.fc1(x))
        return self.fc21(h), self.fc22(h)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pixels [B, 784] -> reconstruction [B, 784], mu and logvar [B, latent]."""
        mu, logvar = self.encode(x)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)  # a sample of the code
        return self.decode(z), mu, logvar

    def reconstruct(self, batch: ImageBatch) -> RegressionOutput:
        reconstruction, mu, logvar = self(batch.images)
        loss = vae_loss(reconstruction, batch.images, mu, logvar)
        # Summed over the batch: LossMetric divides by the batch size, a loss per image.
        return RegressionOutput(loss, reconstruction, batch.images, loss_reduction="sum")

    def train_step(self, batch: ImageBatch) -> TrainOutput[RegressionOutput]:
        return TrainOutput(self.reconstruct(batch))

    def valid_step(self, batch: ImageBatch) -> RegressionOutput:
        return self.reconstruct(batch)


def loaders(config: TrainingConfig) -> tuple[Any, Any]:
    """Training images shuffled every epoch, test images in order."""
    train_set, test_set = MnistDataset.train(), MnistDataset.test()
    if config.limit is not None:
        train_set = torch.utils.data.Subset(train_set, range(min(config.limit, len(train_set))))
        test_set = torch.utils.data.Subset(test_set, range(min(config.limit, len(test_set))))

    def builder() -> DataLoaderBuilder:
        return (
            DataLoaderBuilder(ImageBatcher())
            .batch_size(config.batch_size)
            .num_workers(config.num_workers)
        )

    return builder().shuffle(config.seed).build(train_set), builder().build(test_set)


def train(
    artifact_dir: str,
    config: TrainingConfig,
    device: str = "cpu",
    *,
    configure: Callable[[LearnerBuilder], LearnerBuilder] | None = None,
) -> tuple[Vae, Any]:
    """Train and return `(model, learner)`; `configure` may add options to the
    `LearnerBuilder` (listeners, loggers) before the learner is built."""
    Path(artifact_dir).mkdir(parents=True, exist_ok=True)
    config.save(f"{artifact_dir}/config.json")
    ember.seed(config.seed)
    train_loader, test_loader = loaders(config)
    model = Vae(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate)
    builder = (
        LearnerBuilder(artifact_dir, overwrite=True)
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .with_file_checkpointer(DefaultRecorder())
        .devices([device])
        .num_epochs(config.num_epochs)
    )
    if configure is not None:
        builder = configure(builder)
    learner = builder.build(model, optimizer, config.learning_rate)
    model = learner.fit(train_loader, test_loader)
    return model, learner


def save_samples(model: Vae, path: str | Path, count: int = 64, seed: int = 0) -> Path:
    """Decode `count` random codes and write them as one grid, a binary PGM image
    (8 per row; any image viewer opens it)."""
    generator = torch.Generator().manual_seed(seed)
    weight = model.fc3.weight
    z = torch.randn(count, weight.shape[1], generator=generator).to(weight.device)
    model.eval()
    with torch.inference_mode():
        images = model.decode(z).reshape(count, 28, 28).cpu()
    columns = 8
    rows = -(-count // columns)
    grid = torch.zeros(rows * 28, columns * 28)
    for index, image in enumerate(images):
        row, column = divmod(index, columns)
        grid[row * 28 : (row + 1) * 28, column * 28 : (column + 1) * 28] = image
    pixels = (grid * 255).round().to(torch.uint8).numpy()
    target = Path(path)
    header = f"P5 {pixels.shape[1]} {pixels.shape[0]} 255\n".encode("ascii")
    target.write_bytes(header + pixels.tobytes())
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=TrainingConfig().args_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--artifact-dir", default="artifacts/vae")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    known, overrides = parser.parse_known_args(argv)
    config = TrainingConfig().with_args(overrides)
    model, learner = train(known.artifact_dir, config, known.device)
    print(f"samples: {save_samples(model, f'{known.artifact_dir}/samples.pgm')}")
    return learner.exit_code


if __name__ == "__main__":
    sys.exit(main())
