"""A sample run, a learning-rate range test and a family of runs to compare, for the
chart pictures: the picture test draws them, and the documentation shows them.

    python tests/renderer/picture_run.py docs/images

trains them in a temporary directory and writes the PNGs of `ember plot` and `ember
compare` that the documentation shows (`SHOWN`) into the given directory.
"""

from __future__ import annotations

import io
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ember_testing

from ember_testing import BlobBatcher, Classifier

import ember
from ember.data import DataLoaderBuilder
from ember.optim import AdamConfig, SgdConfig
from ember.train import LearnerBuilder
from ember.train.metric import AccuracyMetric, ConfusionMatrixMetric, LossMetric
from ember.train.renderer import PlainRenderer

SHOWN = (
    "Loss-iterations.png",
    "Loss-epochs.png",
    "Confusion_Matrix-valid-matrix.png",
    "lr-find.png",
)
"""The charts of the sample run in the documentation (with `compare-N-runs.png`)."""


def quiet() -> PlainRenderer:
    return PlainRenderer(interval=3600, stream=io.StringIO())


class Blobs(torch.utils.data.Dataset):
    """Three Gaussian blobs in 8 dimensions that overlap: a classifier learns them over
    a few epochs, to about 90 % accuracy."""

    def __init__(self, size: int, seed: int) -> None:
        centres = torch.randn(3, 8, generator=torch.Generator().manual_seed(99))
        generator = torch.Generator().manual_seed(seed)
        self.targets = torch.randint(0, 3, (size,), generator=generator)
        self.inputs = centres[self.targets] + torch.randn(size, 8, generator=generator)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.inputs[index], int(self.targets[index])


def sample_run(directory: Path) -> Path:
    """A classifier on Gaussian blobs with SGD: 4 epochs of 50 batches, validated every
    20 batches inside each epoch and at its end, with a learning-rate range test first
    (the rate then trained with is the range test's suggestion)."""
    ember.seed(0)
    train = DataLoaderBuilder(BlobBatcher()).batch_size(16).shuffle(1).build(Blobs(800, 0))
    valid = DataLoaderBuilder(BlobBatcher()).batch_size(64).build(Blobs(256, 1))
    builder = (
        LearnerBuilder(directory, overwrite=True)
        .metric_train_numeric(LossMetric())
        .metric_train_numeric(AccuracyMetric())
        .metric_valid_numeric(LossMetric())
        .metric_valid_numeric(AccuracyMetric())
        .metric_valid(ConfusionMatrixMetric())
        .valid_every(20)
        .num_epochs(4)
        .renderer(quiet())
    )
    model = Classifier(dropout=0.0)
    finder = builder.build(model, SgdConfig().init(), 0.1)
    rate = finder.lr_find(train).suggestion or 0.1
    builder.build(Classifier(dropout=0.0), SgdConfig().init(), rate).fit(train, valid)
    return directory


def family(root: Path, count: int) -> list[Path]:
    """`count` short runs of the blob classifier with Adam at learning rates from 1e-3
    up, each 15 % above the last (three epochs of four batches)."""
    runs = []
    train = DataLoaderBuilder(BlobBatcher()).batch_size(32).build(Blobs(128, 0))
    valid = DataLoaderBuilder(BlobBatcher()).batch_size(64).build(Blobs(64, 1))
    for index in range(count):
        lr = 1e-3 * 1.15**index
        directory = root / f"lr-{lr:.3g}"
        ember.seed(index)
        (
            LearnerBuilder(directory, overwrite=True)
            .hparams({"lr": float(f"{lr:.3g}")})
            .metric_train_numeric(LossMetric())
            .metric_valid_numeric(LossMetric())
            .num_epochs(3)
            .renderer(quiet())
            .build(Classifier(dropout=0.0), AdamConfig().init(), lr)
            .fit(train, valid)
        )
        runs.append(directory)
    return runs


def main(argv: list[str]) -> int:
    from ember.comparison import compare
    from ember.plot import plot_run

    target = Path(argv[0] if argv else "docs/images")
    target.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        run = sample_run(Path(scratch) / "sample")
        for path in plot_run(run, Path(scratch) / "plots"):
            if path.name in SHOWN:
                shutil.copy(path, target / path.name)
                print(target / path.name)
        runs = family(Path(scratch) / "family", 30)
        for count in (10, 30):
            path = target / f"compare-{count}-runs.png"
            compare(runs[:count]).chart("Loss").save(path)
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
