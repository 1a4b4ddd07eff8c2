"""Host and device resource metrics: CPU use, memory and temperature, CUDA memory.

They read no output (`input_type = object`), weigh every iteration 1, and query the
host only (never the accelerator's stream), so they add no synchronisation. CPU
readings are refreshed at most every `interval` seconds and cached in between.
`psutil` is optional: without it Linux readings come from /proc (and the process
CPU time from `os.times()`); elsewhere the metric asks for `pip install psutil`.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Callable, Literal

import torch

from ember.errors import ConfigError, EmberError
from ember.train.metric.base import MetricMetadata, MetricValue

Scope = Literal["process", "system"]
_GB = 1e9


def _psutil() -> Any:
    try:
        import psutil
    except ImportError:
        return None
    return psutil


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read()
    except OSError:
        return None


def _missing(metric: str) -> EmberError:
    return EmberError(
        f"{metric} cannot read this platform's counters without psutil: pip install psutil"
    )


def _check_scope(metric: str, scope: str, interval: float) -> None:
    if scope not in ("process", "system"):
        raise ConfigError(f"{metric}: scope must be 'process' or 'system', got {scope!r}.")
    if not isinstance(interval, (int, float)) or not interval >= 0:
        raise ConfigError(f"{metric}: interval must be a number >= 0, got {interval!r}.")


# -- CPU time samplers: cumulative (busy seconds, elapsed seconds) ------------------


def _process_cpu() -> tuple[float, float]:
    times = os.times()
    return times.user + times.system, time.perf_counter()


def _proc_stat_cpu() -> tuple[float, float] | None:
    text = _read("/proc/stat")
    if text is None or not text.startswith("cpu "):
        return None
    fields = [float(x) for x in text.split("\n", 1)[0].split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is in user)
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return total - idle, total


def _psutil_system_cpu(psutil: Any) -> Callable[[], tuple[float, float]]:
    def sample() -> tuple[float, float]:
        times = psutil.cpu_times()
        total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
        idle = times.idle + getattr(times, "iowait", 0.0)
        return total - idle, total

    return sample


class CpuUseMetric:
    """CPU use in percent. scope="process" (default): this process's CPU time over wall
    time, as `top` shows it (100 = one core busy; may exceed 100 with several threads).
    scope="system": the busy share of all cores, 0 to 100."""

    unit = "%"
    higher_is_better = None
    input_type = object

    def __init__(self, scope: Scope = "process", interval: float = 1.0) -> None:
        _check_scope("CpuUseMetric", scope, interval)
        self.name = "CPU Usage"
        self.scope: Scope = scope
        self.interval = float(interval)
        self._sampler: Callable[[], tuple[float, float]]
        if scope == "process":
            self._sampler = _process_cpu
        elif _proc_stat_cpu() is not None:
            self._sampler = _proc_stat_cpu  # type: ignore[assignment]
        else:
            psutil = _psutil()
            if psutil is None:
                raise _missing("CpuUseMetric(scope='system')")
            self._sampler = _psutil_system_cpu(psutil)
        self._sample = self._sampler()
        self._checked = time.perf_counter()
        self._value = math.nan

    def update(self, input: Any, meta: MetricMetadata) -> MetricValue:
        now = time.perf_counter()
        if now - self._checked >= self.interval or math.isnan(self._value):
            busy, total = self._sampler()
            d_busy, d_total = busy - self._sample[0], total - self._sample[1]
            if d_total <= 0 and self.scope == "system" and math.isnan(self._value):
                d_busy, d_total = busy, total  # no tick yet: the average since boot
            if d_total > 0:
                self._value = max(0.0, 100.0 * d_busy / d_total)
                self._sample, self._checked = (busy, total), now
        return MetricValue(self._value, 1)

    def clear(self) -> None:
        pass  # a continuous reading: nothing to forget between epochs


# -- memory readers: bytes -------------------------------------------------------


def _proc_rss() -> float | None:
    text = _read("/proc/self/statm")
    if text is None:
        return None
    return float(text.split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _proc_used() -> float | None:
    text = _read("/proc/meminfo")
    if text is None:
        return None
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            values[key] = float(parts[0]) * 1024.0  # kB
    if "MemTotal" not in values or "MemAvailable" not in values:
        return None
    return values["MemTotal"] - values["MemAvailable"]


class CpuMemoryMetric:
    """Host memory in GB (10^9 bytes). scope="process" (default): this process's
    resident set size (RSS); scope="system": memory in use, total minus available."""

    unit = "GB"
    higher_is_better = None
    input_type = object

    def __init__(self, scope: Scope = "process", interval: float = 1.0) -> None:
        _check_scope("CpuMemoryMetric", scope, interval)
        self.name = "CPU Memory"
        self.scope: Scope = scope
        self.interval = float(interval)
        psutil = _psutil()
        self._reader: Callable[[], float | None]
        if psutil is not None:
            if scope == "process":
                process = psutil.Process()
                self._reader = lambda: float(process.memory_info().rss)
            else:

                def used() -> float:
                    memory = psutil.virtual_memory()
                    return float(memory.total - memory.available)

                self._reader = used
        else:
            self._reader = _proc_rss if scope == "process" else _proc_used
            if self._reader() is None:
                raise _missing(f"CpuMemoryMetric(scope={scope!r})")
        self._checked = -math.inf
        self._value = math.nan

    def update(self, input: Any, meta: MetricMetadata) -> MetricValue:
        now = time.perf_counter()
        if now - self._checked >= self.interval:
            read = self._reader()
            self._value = math.nan if read is None else read / _GB
            self._checked = now
        return MetricValue(self._value, 1)

    def clear(self) -> None:
        pass


class CudaMemoryMetric:
    """Memory of the current CUDA device held by PyTorch's allocator, in GB (10^9 bytes):
    kind="allocated" (tensors in use) or "reserved" (cached by the allocator too).

    Without CUDA the value is the text "unavailable" (a text-only metric). The reading
    comes from the allocator's own counters and never waits for the device.
    """

    unit = "GB"
    higher_is_better = None
    input_type = object

    def __init__(
        self,
        kind: Literal["allocated", "reserved"] = "allocated",
        device: torch.device | int | None = None,
        name: str | None = None,
    ) -> None:
        if kind not in ("allocated", "reserved"):
            raise ConfigError(
                f"CudaMemoryMetric: kind must be 'allocated' or 'reserved', got {kind!r}."
            )
        self.kind = kind
        self.device = device
        default = "CUDA Memory" if kind == "allocated" else "CUDA Reserved Memory"
        self.name = name if name is not None else default
        self._available: bool | None = None  # checked on first use: no CUDA init at import

    def update(self, input: Any, meta: MetricMetadata) -> MetricValue:
        if self._available is None:
            self._available = torch.cuda.is_available()
        if not self._available:
            return MetricValue("unavailable", 1)
        if self.kind == "allocated":
            used = torch.cuda.memory_allocated(self.device)
        else:
            used = torch.cuda.memory_reserved(self.device)
        return MetricValue(used / _GB, 1)

    def clear(self) -> None:
        pass


def _hottest_cpu_sensor(psutil: Any) -> float | None:
    """The highest current reading of the CPU's temperature sensors in °C (None when
    the platform reports none)."""
    read = getattr(psutil, "sensors_temperatures", None)  # Linux and FreeBSD only
    if read is None:
        return None
    try:
        sensors = read()
    except (OSError, RuntimeError):
        return None
    if not sensors:
        return None
    # CPU package sensors first (Intel coretemp, AMD k10temp, ARM cpu_thermal); any
    # other sensor only when the platform names none of these.
    cpu = [name for name in sensors if name in _CPU_SENSORS or "cpu" in name.lower()]
    readings = [
        entry.current
        for name in (cpu or list(sensors))
        for entry in sensors[name]
        if isinstance(entry.current, (int, float)) and math.isfinite(entry.current)
    ]
    return float(max(readings)) if readings else None


_CPU_SENSORS = ("coretemp", "k10temp", "zenpower", "cpu_thermal", "cpu-thermal", "acpitz")


class CpuTemperatureMetric:
    """The CPU's temperature in °C: the hottest of its sensors (`psutil`'s
    `sensors_temperatures()`), read at most every `interval` seconds.

    Where the platform reports no temperature (macOS, Windows, most containers and
    virtual machines) or psutil is not installed, the value is the text
    "unavailable" (a text-only metric), never an error.
    """

    unit = "°C"
    higher_is_better = None
    input_type = object

    def __init__(self, interval: float = 1.0, *, name: str | None = None) -> None:
        if not isinstance(interval, (int, float)) or not interval >= 0:
            raise ConfigError(
                f"CpuTemperatureMetric: interval must be a number >= 0, got {interval!r}."
            )
        self.name = name if name is not None else "CPU Temperature"
        self.interval = float(interval)
        self._checked = -math.inf
        self._value: float | None = None

    def read(self) -> float | None:
        """The current temperature (None when unavailable)."""
        psutil = _psutil()
        return None if psutil is None else _hottest_cpu_sensor(psutil)

    def update(self, input: Any, meta: MetricMetadata) -> MetricValue:
        now = time.perf_counter()
        if now - self._checked >= self.interval:
            self._value = self.read()
            self._checked = now
        if self._value is None:
            return MetricValue("unavailable", 1)
        return MetricValue(self._value, 1)

    def clear(self) -> None:
        pass
