"""PSNR and Dice against their formulas, SSIM against scikit-image, MS-SSIM against
the pytorch-msssim package, per iteration and per epoch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pytorch_msssim import ms_ssim
from skimage.metrics import structural_similarity

from ember.errors import ConfigError, TrainingError
from ember.train import ImageOutput, SequenceOutput
from ember.train.metric import DiceMetric, MsSsimMetric, PsnrMetric, SsimMetric

SIZES = [3, 3, 2]  # an uneven last batch


def _images(shape, seed, noise=0.1):
    g = torch.Generator().manual_seed(seed)
    targets = torch.rand(*shape, generator=g)
    targets = torch.nn.functional.avg_pool2d(targets, 3, 1, 1)  # some structure to keep
    output = (targets + noise * torch.randn(*shape, generator=g)).clamp(0, 1)
    return output, targets


def _batches(output, targets):
    return [ImageOutput(x, y) for x, y in zip(output.split(SIZES), targets.split(SIZES))]


def _check(values, value, per_image):
    """Epoch value: the mean over images; iteration values: the mean over the batch's."""
    assert value == pytest.approx(float(np.mean(per_image)), rel=1e-5)
    start = 0
    for size, iteration in zip(SIZES, values):
        expected = float(np.mean(per_image[start : start + size]))
        assert float(iteration.value) == pytest.approx(expected, rel=1e-5)
        assert iteration.weight == size
        start += size


@pytest.mark.parametrize("data_range", [1.0, 255.0])
def test_psnr_is_the_mean_over_images(drive, data_range):
    output, targets = _images((8, 3, 16, 16), seed=1)
    output, targets = output * data_range, targets * data_range
    value, values = drive(PsnrMetric(data_range), _batches(output, targets))
    mse = ((output.double() - targets.double()) ** 2).mean(dim=(1, 2, 3))
    _check(values, value, [10 * math.log10(data_range**2 / float(m)) for m in mse])


def test_ssim_against_scikit_image(drive):
    output, targets = _images((8, 3, 32, 32), seed=2)
    value, values = drive(SsimMetric(data_range=1.0), _batches(output, targets))
    per_image = [
        structural_similarity(
            t.numpy(),
            o.numpy(),
            channel_axis=0,
            data_range=1.0,
            gaussian_weights=True,
            sigma=1.5,
            use_sample_covariance=False,
        )
        for o, t in zip(output, targets)
    ]
    assert 0.3 < np.mean(per_image) < 0.95  # neither trivial nor identical images
    _check(values, value, per_image)


def test_ms_ssim_against_pytorch_msssim(drive):
    output, targets = _images((8, 1, 176, 176), seed=3, noise=0.2)
    value, values = drive(MsSsimMetric(data_range=1.0), _batches(output, targets))
    per_image = ms_ssim(output.double(), targets.double(), data_range=1.0, size_average=False)
    _check(values, value, per_image.tolist())


def test_images_too_small_for_ms_ssim(drive):
    with pytest.raises(TrainingError, match="at least 161 x 161 pixels"):
        drive(MsSsimMetric(), [ImageOutput(torch.rand(2, 1, 64, 64), torch.rand(2, 1, 64, 64))])


def _dice(predicted, targets, cls, ignore=None):
    keep = np.ones_like(targets, dtype=bool) if ignore is None else targets != ignore
    p, t = (predicted == cls) & keep, (targets == cls) & keep
    denominator = p.sum() + t.sum()
    return 2 * (p & t).sum() / denominator if denominator else math.nan


@pytest.mark.parametrize("ignore_index", [None, 255])
def test_dice_per_class_and_mean(drive, ignore_index):
    g = torch.Generator().manual_seed(4)
    classes = 3
    targets = torch.randint(0, classes, (8, 12, 12), generator=g)
    logits = torch.randn(8, classes, 12, 12, generator=g) + 1.5 * torch.nn.functional.one_hot(
        targets, classes
    ).permute(0, 3, 1, 2)
    if ignore_index is not None:
        targets[:, :3] = ignore_index  # an ignored band on every image
    predicted = logits.argmax(1).numpy()
    t = targets.numpy()
    batches = [ImageOutput(x, y) for x, y in zip(logits.split(SIZES), targets.split(SIZES))]
    for cls in range(classes):
        value, _ = drive(DiceMetric(cls, ignore_index=ignore_index), batches)
        assert value == pytest.approx(_dice(predicted, t, cls, ignore_index), rel=1e-9)
    value, values = drive(DiceMetric(ignore_index=ignore_index), batches)
    expected = np.mean([_dice(predicted, t, c, ignore_index) for c in range(classes)])
    assert value == pytest.approx(expected, rel=1e-9)
    first = np.mean([_dice(predicted[:3], t[:3], c, ignore_index) for c in range(classes)])
    assert float(values[0].value) == pytest.approx(first, rel=1e-6)
    kept = 12 * 12 if ignore_index is None else 9 * 12
    assert [int(v.weight) for v in values] == [size * kept for size in SIZES]


@pytest.mark.parametrize("from_logits", [False, True])
def test_binary_masks(drive, from_logits):
    g = torch.Generator().manual_seed(5)
    masks = (torch.rand(8, 1, 10, 10, generator=g) < 0.3).long()
    logits = torch.randn(8, 1, 10, 10, generator=g) + 2 * masks - 1
    output = logits if from_logits else logits.sigmoid()
    value, _ = drive(
        DiceMetric(from_logits=from_logits),
        [ImageOutput(x, y) for x, y in zip(output.split(SIZES), masks.split(SIZES))],
    )
    assert value == pytest.approx(_dice((logits > 0).numpy(), masks.numpy(), True), rel=1e-6)


def test_dice_reads_class_indices(drive):
    one_hot = torch.zeros(2, 3, 4, 4)
    with pytest.raises(TrainingError, match=r"targets.argmax\(dim=1\)"):
        drive(DiceMetric(), [ImageOutput(one_hot, one_hot)])
    with pytest.raises(TrainingError, match="hold 3 classes"):
        drive(DiceMetric(5), [ImageOutput(one_hot, torch.zeros(2, 4, 4, dtype=torch.long))])
    with pytest.raises(TrainingError, match="ImageInput"):
        drive(DiceMetric(), [SequenceOutput(torch.tensor(0.0), one_hot, one_hot)])


def test_bad_image_inputs_are_named(drive):
    with pytest.raises(TrainingError, match=r"unsqueeze\(1\)"):
        drive(PsnrMetric(), [ImageOutput(torch.rand(2, 8, 8), torch.rand(2, 8, 8))])
    with pytest.raises(ConfigError, match="data_range must be positive"):
        SsimMetric(data_range=0)
