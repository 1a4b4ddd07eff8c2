"""Training throughput: samples per second, tokens per second and model FLOPs
utilisation (MFU).

Timing is host wall-clock from the start of the epoch, like `IterationSpeedMetric`: no
value waits for the accelerator. Token counts given as device tensors are summed on
the device and reach the host with the other metric values, in bulk.

MFU is the share of the device's peak FLOP/s the model's FLOPs use: the learner counts
the FLOPs of the first training batch (forward and backward, with
`torch.utils.flop_counter.FlopCounterMode`, during that batch itself: no extra step,
no change to the numbers or the random state) and hands the count per sample to the
metric (`set_flops`). The peak comes from `PEAK_FLOPS` for the device and compute
dtype, or from `peak_flops=`.
"""

from __future__ import annotations

import logging
import math
import re
import time
from typing import Any, Literal

import torch

from ember.errors import ConfigError, EmberError
from ember.train.metric.base import MetricMetadata, MetricValue
from ember.train.metric.inputs import LossInput

log = logging.getLogger(__name__)

Kind = Literal["samples", "tokens", "mfu"]
_KINDS = {
    "samples": ("Throughput", "sample/s"),
    "tokens": ("Token Throughput", "token/s"),
    "mfu": ("MFU", "%"),
}
UNAVAILABLE = "unavailable"

PEAK_FLOPS: dict[str, dict[str, float]] = {
    # Dense tensor-core FLOP/s from NVIDIA's data sheets (no structured sparsity).
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
    "H100 SXM": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},
    "H100 PCIe": {"bf16": 756.5e12, "fp16": 756.5e12, "tf32": 378e12, "fp32": 51.2e12},
    "H100 NVL": {"bf16": 835.5e12, "fp16": 835.5e12, "tf32": 417.5e12, "fp32": 60e12},
    "H200": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},
    "L4": {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12},
    "L40S": {"bf16": 362.05e12, "fp16": 362.05e12, "tf32": 183.2e12, "fp32": 91.6e12},
}
"""Peak FLOP/s per GPU model and compute dtype ("bf16", "fp16", "tf32", "fp32")."""


def gpu_model(device_name: str) -> str | None:
    """The `PEAK_FLOPS` key for a CUDA device name ("NVIDIA H100 80GB HBM3"), or None."""
    name = device_name.lower()
    if "h200" in name:
        return "H200"
    if "h100" in name:
        if "pcie" in name:
            return "H100 PCIe"
        return "H100 NVL" if "nvl" in name else "H100 SXM"
    if "a100" in name:
        return "A100"
    if "l40s" in name:
        return "L40S"
    if re.search(r"\bl4\b", name):
        return "L4"
    return None


def compute_dtype(dtype: torch.dtype, mixed_precision: str | None = None) -> str:
    """The dtype matrix products run in: the autocast dtype, else the parameters' dtype
    (float32 counted as TF32 when PyTorch lets float32 matmuls use it)."""
    if mixed_precision in ("bf16", "fp16"):
        return mixed_precision
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16"
    # allow_tf32 = True sets this precision to "high" too
    return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def peak_flops(device: torch.device, dtype: str) -> float | None:
    """The peak FLOP/s of `device` for `dtype` from `PEAK_FLOPS`; None when unknown
    (the CPU, another GPU)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    model = gpu_model(torch.cuda.get_device_name(device))
    return None if model is None else PEAK_FLOPS[model].get(dtype)


class ThroughputMetric:
    """`kind="samples"`: samples per second; `"tokens"`: tokens per second, counted from
    the `tokens` the step's output reports (`ClassificationOutput(..., tokens=n)`,
    an int or a tensor); `"mfu"`: model FLOPs utilisation in percent, the FLOPs of a
    sample (counted on the first training batch) times samples per second over the
    device's peak (`peak_flops=` FLOP/s overrides the table; without either the value
    is the text "unavailable", as on the CPU).

    The iteration value is the rate since the epoch started (weight 1); the epoch value
    is the rate over the whole epoch (all processes together under several processes;
    MFU then is their mean). Rates are host wall-clock and never wait for the device.
    """

    higher_is_better = True
    input_type = LossInput

    def __init__(
        self, kind: Kind = "samples", *, peak_flops: float | None = None, name: str | None = None
    ) -> None:
        if kind not in _KINDS:
            raise ConfigError(
                f"ThroughputMetric: kind must be one of {sorted(_KINDS)}, got {kind!r}."
            )
        if peak_flops is not None and (
            isinstance(peak_flops, bool)
            or not isinstance(peak_flops, (int, float))
            or not peak_flops > 0
        ):
            raise ConfigError(
                f"ThroughputMetric: peak_flops must be FLOP/s > 0 (e.g. 989e12), got {peak_flops!r}."
            )
        label, self.unit = _KINDS[kind]
        self.kind = kind
        self.name = name if name is not None else label
        self.peak_override = None if peak_flops is None else float(peak_flops)
        self.flops_per_sample: float | None = None
        """FLOPs of one sample's forward and backward, once counted."""
        self.peak: float | None = self.peak_override
        """The peak FLOP/s MFU is taken against, once known."""
        self.unavailable_reason: str | None = None
        self._batch_flops: float | None = None
        self._dtype = ""
        self._start = time.perf_counter()
        self._samples = 0
        self._tokens: int | torch.Tensor = 0
        self._elapsed = math.nan
        self._merged: float | None = None

    # The learner's FLOP count ------------------------------------------------------
    def set_flops(self, batch_flops: int | None, device: torch.device, dtype: str) -> None:
        """The FLOPs of the first training batch, forward and backward (0 or None: none
        could be counted), on `device`, computed in `dtype` ("bf16", "fp16", "tf32",
        "fp32"). The next update, that batch's, divides them by its samples."""
        if self.kind != "mfu":
            return
        if self.peak is None:
            self.peak = peak_flops(device, dtype)
        if not batch_flops:
            reason = "no FLOPs were counted: the first batch ran no matrix product, convolution or attention"
        elif self.peak is None:
            reason = f"no known peak FLOP/s for {device} in {dtype}: pass peak_flops="
        else:
            self._batch_flops, self._dtype = float(batch_flops), dtype
            return
        self.unavailable_reason = reason
        log.info("%s is unavailable: %s.", self.name, reason)

    def _per_sample(self, batch_flops: float, samples: int) -> None:
        """The counted batch's FLOPs over its samples, as this metric counts them."""
        self.flops_per_sample = batch_flops / samples if samples else None
        self._batch_flops = None
        if self.flops_per_sample is not None:
            log.info(
                "%s: %.6g FLOPs per sample (forward and backward), peak %.4g FLOP/s (%s).",
                self.name,
                self.flops_per_sample,
                self.peak,
                self._dtype,
            )

    # Metric protocol ---------------------------------------------------------------
    def update(self, input: LossInput, meta: MetricMetadata) -> MetricValue:
        if self._batch_flops is not None:
            self._per_sample(self._batch_flops, int(input.batch_size))
        self._samples += int(input.batch_size)
        elapsed = time.perf_counter() - self._start
        self._elapsed = elapsed
        rate = 1.0 / elapsed if elapsed > 0 else math.nan
        if self.kind == "samples":
            return MetricValue(self._samples * rate, 1)
        if self.kind == "tokens":
            if input.tokens is None:
                raise EmberError(
                    "ThroughputMetric('tokens') needs the number of tokens of each step: "
                    "give the output its count, e.g. SequenceOutput(..., tokens=n)."
                )
            tokens = input.tokens
            if isinstance(tokens, torch.Tensor):
                tokens = tokens.detach().sum()
            self._tokens = self._tokens + tokens
            return MetricValue(self._tokens, 1, scale=rate)
        if self.flops_per_sample is None or self.peak is None:
            return MetricValue(UNAVAILABLE, 1)
        return MetricValue(self._samples * rate * self.flops_per_sample / self.peak * 100.0, 1)

    def epoch_value(self) -> float | None:
        """The rate over the epoch so far (this process, or every process once merged);
        None for an unavailable MFU."""
        if self._merged is not None:
            return self._merged
        return self._rate(self._samples, self._tokens, self._elapsed, 1)

    def _rate(self, samples: int, tokens: Any, elapsed: float, processes: int) -> float | None:
        if self.kind == "mfu" and (self.flops_per_sample is None or self.peak is None):
            return None
        if not elapsed > 0:
            return math.nan
        if self.kind == "samples":
            return samples / elapsed
        if self.kind == "tokens":
            count = float(tokens.item()) if isinstance(tokens, torch.Tensor) else float(tokens)
            return count / elapsed
        assert self.flops_per_sample is not None and self.peak is not None
        return samples / elapsed * self.flops_per_sample / (self.peak * processes) * 100.0

    def clear(self) -> None:
        self._start = time.perf_counter()
        self._samples = 0
        self._tokens = 0
        self._elapsed = math.nan
        self._merged = None

    def epoch_state(self) -> tuple[int, float, float]:
        """Samples, tokens and seconds of this process (exchanged across processes)."""
        tokens = self._tokens
        count = float(tokens.item()) if isinstance(tokens, torch.Tensor) else float(tokens)
        return self._samples, count, time.perf_counter() - self._start

    def merge_epoch_states(self, states: list[tuple[int, float, float]]) -> None:
        """Every process's samples and tokens over the slowest one's time."""
        samples, tokens, elapsed = self.epoch_state()
        for other_samples, other_tokens, other_elapsed in states:
            samples += other_samples
            tokens += other_tokens
            elapsed = max(elapsed, other_elapsed)
        self._merged = self._rate(samples, tokens, elapsed, len(states) + 1)
