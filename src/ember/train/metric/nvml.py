"""GPU utilisation, memory and power as the driver reports them (NVML), read on a
background thread so the training loop never waits for the driver.

Needs `nvidia-ml-py` (`pip install ember[nvml]`), imported on first use. Without it,
without an NVIDIA driver or without the device, the value is the text "unavailable"
and `unavailable_reason` says why (it is also logged once).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any, Literal

from ember.errors import ConfigError
from ember.train.metric.base import MetricMetadata, MetricValue

log = logging.getLogger(__name__)

Kind = Literal["utilization", "memory", "memory_percent", "power"]
_KINDS: dict[str, tuple[str, str]] = {
    "utilization": ("GPU Utilization", "%"),
    "memory": ("GPU Memory", "GB"),
    "memory_percent": ("GPU Memory Used", "%"),
    "power": ("GPU Power", "W"),
}
_GB = 1e9
UNAVAILABLE = "unavailable"


def _pynvml() -> Any:
    import pynvml  # nvidia-ml-py

    return pynvml


def _visible(index: int) -> str | int:
    """The NVML index (or UUID) of CUDA device `index` as this process numbers it."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return index
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if index >= len(entries):
        raise IndexError(f"CUDA device {index} is not among CUDA_VISIBLE_DEVICES={visible!r}")
    entry = entries[index]
    return int(entry) if entry.isdigit() else entry


class _Sampler:
    """Reads one device every `interval` seconds on a daemon thread; the latest
    readings are plain attributes (a float write is atomic under the GIL)."""

    def __init__(self, nvml: Any, handle: Any, interval: float) -> None:
        self.nvml, self.handle, self.interval = nvml, handle, interval
        self.readings: dict[str, float | str] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ember-nvml", daemon=True)

    def sample(self) -> None:
        nvml, handle = self.nvml, self.handle
        readings: dict[str, float | str] = {}
        for kind, read in (
            ("utilization", lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)),
            ("memory", lambda: float(nvml.nvmlDeviceGetMemoryInfo(handle).used) / _GB),
            ("memory_percent", lambda: _percent(nvml.nvmlDeviceGetMemoryInfo(handle))),
            ("power", lambda: float(nvml.nvmlDeviceGetPowerUsage(handle)) / 1000.0),
        ):
            try:
                readings[kind] = read()
            except Exception:  # NVMLError_NotSupported (power on some boards), a lost GPU
                readings[kind] = UNAVAILABLE
        self.readings = readings

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            self.sample()


def _percent(memory: Any) -> float:
    return 100.0 * float(memory.used) / float(memory.total) if memory.total else float("nan")


class CudaMetric:
    """One GPU as NVML sees it: `kind="utilization"` (% of time a kernel ran),
    `"memory"` (GB used on the device, by every process), `"memory_percent"` (used over
    total) or `"power"` (W). `device` is a CUDA index as this process numbers it
    (CUDA_VISIBLE_DEVICES applied; default: the current device); register one metric
    per device to watch several. Readings are taken every `interval` seconds on a
    background thread; each iteration reports the latest (weight 1)."""

    higher_is_better = None
    input_type = object

    def __init__(
        self,
        kind: Kind = "utilization",
        device: int | None = None,
        interval: float = 1.0,
        name: str | None = None,
    ) -> None:
        if kind not in _KINDS:
            raise ConfigError(f"CudaMetric: kind must be one of {sorted(_KINDS)}, got {kind!r}.")
        if device is not None and (isinstance(device, bool) or not isinstance(device, int)):
            raise ConfigError(f"CudaMetric: device must be a CUDA index (int), got {device!r}.")
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0:
            raise ConfigError(
                f"CudaMetric: interval must be a number of seconds > 0, got {interval!r}."
            )
        label, self.unit = _KINDS[kind]
        self.kind = kind
        self.device = device
        self.interval = float(interval)
        self.name = name if name is not None else (label if device is None else f"{label} {device}")
        self.unavailable_reason: str | None = None
        self._sampler: _Sampler | None = None
        self._opened = False

    def _open(self) -> None:
        """Start the sampler, or say why there is none (once)."""
        self._opened = True
        try:
            nvml = _pynvml()
        except ImportError:
            self._unavailable("nvidia-ml-py is not installed (pip install ember[nvml])")
            return
        try:
            nvml.nvmlInit()
        except Exception as error:  # NVMLError_LibraryNotFound, _DriverNotLoaded...
            self._unavailable(f"NVML could not start ({error}): no NVIDIA driver here")
            return
        try:
            index = self.device
            if index is None:
                import torch

                index = torch.cuda.current_device() if torch.cuda.is_available() else 0
            target = _visible(index)
            if isinstance(target, int):
                handle = nvml.nvmlDeviceGetHandleByIndex(target)
            else:
                handle = nvml.nvmlDeviceGetHandleByUUID(target)
        except Exception as error:  # an index or UUID NVML does not know
            self._unavailable(f"no GPU {self.device if self.device is not None else 0} ({error})")
            return
        sampler = _Sampler(nvml, handle, self.interval)
        sampler.sample()  # the first value at once
        sampler.thread.start()
        weakref.finalize(self, sampler.stop.set)
        self._sampler = sampler

    def _unavailable(self, reason: str) -> None:
        self.unavailable_reason = reason
        log.info("%s is unavailable: %s.", self.name, reason)

    def update(self, input: Any, meta: MetricMetadata) -> MetricValue:
        if not self._opened:
            self._open()
        sampler = self._sampler
        if sampler is None:
            return MetricValue(UNAVAILABLE, 1)
        return MetricValue(sampler.readings.get(self.kind, UNAVAILABLE), 1)

    def clear(self) -> None:
        pass  # a continuous reading: nothing to forget between epochs

    def close(self) -> None:
        """Stop the background thread (it also stops when the metric is collected)."""
        if self._sampler is not None:
            self._sampler.stop.set()
