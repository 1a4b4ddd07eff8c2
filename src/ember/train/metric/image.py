"""Image metrics: PSNR, SSIM and MS-SSIM for reconstructions, Dice for segmentation.

PSNR, SSIM and MS-SSIM are scored image by image; the iteration value is the mean
over the batch's images, weighted by their number, so the epoch value is the mean
over every image of the epoch. Dice counts, per class, the pixels of the batch
(true positives, predicted, actual) on the device, and scores the epoch from the
summed counts. Everything is computed in torch on the images' device.
"""

from __future__ import annotations

import math

import torch

from ember.errors import ConfigError, TrainingError
from ember.train.metric._common import Probabilities, dims, wide_float
from ember.train.metric.base import MetricMetadata, MetricValue
from ember.train.metric.inputs import ClassificationInput, ImageInput
from ember.train.metric.precision_recall import _ConfusionMetric

_IMAGES = "predictions and targets of one shape, [N, C, H, W]"


def _data_range(owner: str, data_range: float) -> float:
    if isinstance(data_range, bool) or not isinstance(data_range, (int, float)):
        raise ConfigError(f"{owner}: data_range must be a number, got {data_range!r}.")
    if not (math.isfinite(data_range) and data_range > 0):
        raise ConfigError(
            f"{owner}: data_range must be positive: the span of the pixel values (1.0 for "
            f"images in [0, 1], 255.0 for 8-bit images), got {data_range!r}."
        )
    return float(data_range)


def check_images(owner: str, output: torch.Tensor, targets: torch.Tensor, smallest: int) -> None:
    """Predictions and targets [N, C, H, W] of one shape, at least `smallest` pixels
    high and wide, floating point."""
    if output.shape != targets.shape or output.dim() != 4:
        raise TrainingError(
            f"{owner} reads {_IMAGES}; got predictions {dims(output.shape)} and targets "
            f"{dims(targets.shape)}. Add a channel dimension to grey images "
            "(images.unsqueeze(1))."
        )
    if min(output.shape[-2:]) < smallest:
        raise TrainingError(
            f"{owner} reads images of at least {smallest} x {smallest} pixels; got "
            f"{dims(output.shape)}."
        )
    if not output.is_floating_point():
        raise TrainingError(
            f"{owner} reads floating-point predictions; got {output.dtype}. Convert them "
            "with .float()."
        )


class PsnrMetric:
    """Peak signal-to-noise ratio in dB, 10 log10(data_range² / MSE), per image.

    `data_range` is the span of the pixel values (1.0 for images in [0, 1], 255.0
    for 8-bit images). Each image's MSE is over its channels and pixels; the epoch
    value is the mean PSNR over the epoch's images (an exact copy of its target
    scores +inf).
    """

    name = "PSNR"
    unit = "dB"
    higher_is_better = True
    input_type = ImageInput

    def __init__(self, data_range: float = 1.0, *, name: str | None = None) -> None:
        self.data_range = _data_range("PsnrMetric", data_range)
        if name is not None:
            self.name = name

    def update(self, input: ImageInput, meta: MetricMetadata) -> MetricValue:
        output, targets = input.output.detach(), input.targets.detach()
        check_images("PsnrMetric", output, targets, 1)
        dtype = wide_float(output.device)
        error = output.to(dtype) - targets.to(dtype)
        mse = (error * error).flatten(1).mean(dim=1)
        psnr = 10.0 * torch.log10(self.data_range**2 / mse)
        return MetricValue(psnr.mean(), int(output.shape[0]))

    def clear(self) -> None:
        pass


_WEIGHTS = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)  # Wang et al. 2003, five scales


def _window(
    dtype: torch.dtype, device: torch.device, size: int = 11, sigma: float = 1.5
) -> torch.Tensor:
    """The normalised 1-D Gaussian window."""
    offsets = torch.arange(size, dtype=dtype, device=device) - (size - 1) / 2
    window = torch.exp(-(offsets * offsets) / (2 * sigma * sigma))
    return window / window.sum()


def _filtered(images: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """Each channel of [N, C, H, W] filtered by the separable window, valid region only."""
    channels = images.shape[1]
    size = window.numel()
    rows = window.view(1, 1, 1, size).expand(channels, 1, 1, size)
    columns = window.view(1, 1, size, 1).expand(channels, 1, size, 1)
    images = torch.nn.functional.conv2d(images, rows, groups=channels)
    return torch.nn.functional.conv2d(images, columns, groups=channels)


def ssim_terms(
    x: torch.Tensor, y: torch.Tensor, data_range: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per image and channel [N, C]: the mean SSIM and the mean contrast-structure term
    over the window positions inside the image (Gaussian window 11, sigma 1.5,
    K1 = 0.01, K2 = 0.03)."""
    window = _window(x.dtype, x.device)
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    mu_x, mu_y = _filtered(x, window), _filtered(y, window)
    var_x = _filtered(x * x, window) - mu_x * mu_x
    var_y = _filtered(y * y, window) - mu_y * mu_y
    cov = _filtered(x * y, window) - mu_x * mu_y
    contrast = (2 * cov + c2) / (var_x + var_y + c2)
    luminance = (2 * mu_x * mu_y + c1) / (mu_x * mu_x + mu_y * mu_y + c1)
    return (luminance * contrast).flatten(2).mean(-1), contrast.flatten(2).mean(-1)


def _compute_dtype(images: torch.Tensor) -> torch.dtype:
    return torch.float64 if images.dtype == torch.float64 else torch.float32


class SsimMetric:
    """Structural similarity (Wang et al. 2004) per image, in [-1, 1] (1: identical).

    Gaussian window of 11 pixels with sigma 1.5, constants K1 = 0.01 and K2 = 0.03,
    `data_range` the span of the pixel values. An image's SSIM is the mean of its SSIM
    map over the window positions inside the image (no padding, as scikit-image's
    `structural_similarity` with `gaussian_weights=True`), then over its channels.
    The epoch value is the mean over the epoch's images. Computed in float32 (float64
    for float64 images) on the images' device.
    """

    name = "SSIM"
    unit = ""
    higher_is_better = True
    input_type = ImageInput
    _smallest = 11

    def __init__(self, data_range: float = 1.0, *, name: str | None = None) -> None:
        self.data_range = _data_range(type(self).__name__, data_range)
        if name is not None:
            self.name = name

    def update(self, input: ImageInput, meta: MetricMetadata) -> MetricValue:
        output, targets = input.output.detach(), input.targets.detach()
        check_images(type(self).__name__, output, targets, self._smallest)
        dtype = _compute_dtype(output)
        per_image = self.per_image(output.to(dtype), targets.to(dtype))
        return MetricValue(per_image.mean(), int(output.shape[0]))

    def per_image(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The score of each image [N]."""
        return ssim_terms(output, targets, self.data_range)[0].mean(dim=1)

    def clear(self) -> None:
        pass


class MsSsimMetric(SsimMetric):
    """Multi-scale structural similarity (Wang et al. 2003) per image, in [0, 1].

    Five scales, each halved by 2 x 2 average pooling (odd sizes padded), weighted
    (0.0448, 0.2856, 0.3001, 0.2363, 0.1333): the contrast-structure terms of the
    first four scales and the SSIM of the last, each clipped at 0, raised to their
    weights and multiplied, per channel, then averaged over channels. The window is
    `SsimMetric`'s, so images need at least 161 pixels in height and width (the
    window at the fifth scale). The epoch value is the mean over the epoch's images.
    """

    name = "MS-SSIM"
    _smallest = 161

    def per_image(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        terms = []
        for scale in range(len(_WEIGHTS)):
            ssim, contrast = ssim_terms(output, targets, self.data_range)
            if scale < len(_WEIGHTS) - 1:
                terms.append(contrast.clamp(min=0))
                padding = [size % 2 for size in output.shape[-2:]]
                output = torch.nn.functional.avg_pool2d(output, 2, padding=padding)
                targets = torch.nn.functional.avg_pool2d(targets, 2, padding=padding)
        terms.append(ssim.clamp(min=0))
        weights = torch.tensor(_WEIGHTS, dtype=output.dtype, device=output.device)
        stacked = torch.stack(terms) ** weights.view(-1, 1, 1)  # [scales, N, C]
        return stacked.prod(dim=0).mean(dim=1)


class DiceMetric(_ConfusionMetric):
    """Dice coefficient 2 |P ∩ T| / (|P| + |T|) of segmentation masks, over the whole
    epoch's pixels, unitless in [0, 1].

    Multiclass: class scores or logits [N, C, H, W] (the top class of each pixel)
    against class indices [N, H, W] (or [N, 1, H, W]). Binary: foreground scores
    [N, 1, H, W] above `threshold` (probabilities, or logits with `from_logits=True`)
    against 0/1 masks [N, H, W] (or [N, 1, H, W]). Pixels whose target is
    `ignore_index` are left out.

    `class_index=None` gives the mean Dice over the classes present in the targets or
    predictions; `class_index=k` gives class k's Dice (NaN while class k is neither
    predicted nor present). Per class, Dice equals the F1 score of the pixels: the
    epoch value comes from the epoch's summed pixel counts per class (merged across
    processes), the iteration value from the batch's.
    """

    input_type = ImageInput
    _label = "Dice"

    def __init__(
        self,
        class_index: int | None = None,
        *,
        ignore_index: int | None = None,
        threshold: float = 0.5,
        from_logits: bool = False,
        name: str | None = None,
    ) -> None:
        for field, value in (("class_index", class_index), ("ignore_index", ignore_index)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"DiceMetric: {field} must be an integer or None, got {value!r}.")
        if class_index is not None and class_index < 0:
            raise ConfigError(f"DiceMetric: class_index must be >= 0, got {class_index}.")
        if name is None:
            name = "Dice" if class_index is None else f"Dice (class {class_index})"
        super().__init__("multiclass", threshold=threshold, name=name, from_logits=from_logits)
        self.input_type = ImageInput
        self._probabilities = Probabilities(from_logits, "DiceMetric()")
        self.class_index = class_index
        self.ignore_index = ignore_index
        self._who = "DiceMetric" if name == "Dice" else f"DiceMetric ({name!r})"

    def update(self, input: ImageInput, meta: MetricMetadata) -> MetricValue:  # type: ignore[override]
        output, targets = input.output.detach(), input.targets
        if targets.dim() == 4 and targets.shape[1] == 1:
            targets = targets[:, 0]
        if output.dim() != 4 or targets.shape != output.shape[:1] + output.shape[2:]:
            raise TrainingError(
                f"{self._who} reads class scores [N, C, H, W] and class-index targets "
                f"[N, H, W] (or foreground scores [N, 1, H, W] and 0/1 masks); got outputs "
                f"{dims(output.shape)} and targets {dims(input.targets.shape)}. One-hot "
                "targets [N, C, H, W] become class indices with targets.argmax(dim=1)."
            )
        classes = int(output.shape[1])
        if self.class_index is not None and classes == 1 and self.class_index != 1:
            raise TrainingError(
                f"{self._who} scores class {self.class_index}, but the outputs "
                f"{dims(output.shape)} are binary masks (foreground scores, class 1): give "
                "two-class outputs [N, 2, H, W] to score the background."
            )
        if self.class_index is not None and classes > 1 and self.class_index >= classes:
            raise TrainingError(
                f"{self._who} scores class {self.class_index}, but the outputs "
                f"{dims(output.shape)} hold {classes} classes."
            )
        self.mode = "binary" if classes == 1 else "multiclass"
        rows = ClassificationInput(
            output.movedim(1, -1).reshape(-1, classes) if classes > 1 else output.reshape(-1),
            targets.reshape(-1),
            pad_token=self.ignore_index,
        )
        return super().update(rows, meta)

    def _score(self, counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if self.class_index is None:
            return super()._score(counts, dtype)
        # Binary masks keep the foreground's counts only (one column).
        column = counts[:, 0 if counts.shape[-1] == 1 else self.class_index].to(dtype)
        denominator = column[1] + column[2]
        return torch.where(denominator > 0, 2.0 * column[0] / denominator, math.nan)

    def _ratio(
        self, tp: torch.Tensor, predicted: torch.Tensor, actual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return 2.0 * tp, predicted + actual
