"""Learning rate, iteration speed, CPU and CUDA metrics: sanity checks."""

from __future__ import annotations

import math
import os
import resource
import time

import pytest
import torch

from ember.errors import EmberError
from ember.train.metric import system
from ember.train.metric.adapt import adapt
from ember.train.metric.base import MetricMetadata
from ember.train.metric.learning_rate import LearningRateMetric
from ember.train.metric.speed import IterationSpeedMetric
from ember.train.metric.system import CpuMemoryMetric, CpuUseMetric, CudaMemoryMetric
from ember.train.output import ClassificationOutput


def _meta(i: int = 0, lr: float | None = 0.01) -> MetricMetadata:
    return MetricMetadata("train", 0, 1, i, None, lr)


class _AnyOutput:
    """A custom step output that supports no input type at all."""


def test_learning_rate_reads_meta_from_any_output(drive):
    metric = LearningRateMetric()
    assert metric.name == "Learning Rate"
    item = adapt(_AnyOutput(), metric.input_type, metric.name)
    assert metric.update(item, _meta(lr=0.25)).value == 0.25
    assert math.isnan(metric.update(item, _meta(lr=None)).value)
    # Through the driver, lr = 1e-3 * (i + 1) for i in 0..3: the epoch mean is 2.5e-3.
    value, values = drive(metric, [_AnyOutput()] * 4)
    assert [v.value for v in values] == pytest.approx([1e-3, 2e-3, 3e-3, 4e-3])
    assert value == pytest.approx(2.5e-3)


def test_iteration_speed():
    metric = IterationSpeedMetric()
    assert (metric.name, metric.unit) == ("Iteration Speed", "item/s")
    output = ClassificationOutput(torch.tensor(0.0), torch.zeros(32, 3), torch.zeros(32))
    metric.clear()
    start = time.perf_counter()
    values = []
    for i in range(3):
        time.sleep(0.02)
        values.append(metric.update(adapt(output, metric.input_type, metric.name), _meta(i)))
    elapsed = time.perf_counter() - start
    assert all(v.weight == 1 for v in values)
    rate = metric.epoch_value()
    assert rate == values[-1].value
    assert 96 / elapsed * 0.9 <= rate <= 96 / 0.06 * 1.01
    metric.clear()
    assert math.isnan(metric.epoch_value())


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


@pytest.mark.parametrize("scope", ["process", "system"])
def test_cpu_use(scope):
    metric = CpuUseMetric(scope=scope, interval=0.05)
    assert (metric.name, metric.unit) == ("CPU Usage", "%")
    _spin(0.1)
    first = metric.update(object(), _meta()).value
    used, wall = _cpu_seconds(), time.monotonic()
    _spin(0.1)
    second = metric.update(object(), _meta()).value
    share = 100.0 * (_cpu_seconds() - used) / (time.monotonic() - wall)
    limit = 100.0 * (os.cpu_count() or 1) * 1.1 if scope == "process" else 100.0
    for value in (first, second):
        assert isinstance(value, float) and 0.0 <= value <= limit
    if scope == "process":  # the spin's share of a core, however busy the machine is
        assert second > 0.0 and abs(second - share) <= 0.25 * share + 5.0, (second, share)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def test_cpu_use_is_cached_between_refreshes():
    metric = CpuUseMetric(interval=3600.0)
    _spin(0.02)
    first = metric.update(object(), _meta()).value
    _spin(0.02)
    assert metric.update(object(), _meta()).value == first


@pytest.mark.parametrize("scope", ["process", "system"])
def test_cpu_memory(scope):
    metric = CpuMemoryMetric(scope=scope)
    assert (metric.name, metric.unit) == ("CPU Memory", "GB")
    value = metric.update(object(), _meta()).value
    assert 0.001 < value < 1e5


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
@pytest.mark.parametrize("scope", ["process", "system"])
def test_cpu_metrics_without_psutil_use_proc(monkeypatch, scope):
    monkeypatch.setattr(system, "_psutil", lambda: None)
    assert 0.001 < CpuMemoryMetric(scope=scope).update(object(), _meta()).value < 1e5
    value = CpuUseMetric(scope=scope).update(object(), _meta()).value
    assert 0.0 <= value <= (100.0 * (os.cpu_count() or 1) if scope == "process" else 100.0)


def test_cpu_metrics_without_psutil_or_proc_say_how_to_fix(monkeypatch):
    monkeypatch.setattr(system, "_psutil", lambda: None)
    monkeypatch.setattr(system, "_read", lambda path: None)
    with pytest.raises(EmberError, match="pip install psutil"):
        CpuMemoryMetric()
    with pytest.raises(EmberError, match="pip install psutil"):
        CpuUseMetric(scope="system")
    CpuUseMetric(scope="process")  # os.times() needs neither


def test_cuda_memory():
    metric = CudaMemoryMetric()
    assert (metric.name, metric.unit) == ("CUDA Memory", "GB")
    assert CudaMemoryMetric("reserved").name == "CUDA Reserved Memory"
    value = metric.update(_AnyOutput(), _meta()).value
    if torch.cuda.is_available():
        assert isinstance(value, float) and value >= 0.0
    else:
        assert value == "unavailable"


class _Sensors:
    """A stand-in for psutil whose temperature sensors report `readings`."""

    def __init__(self, readings):
        from collections import namedtuple

        entry = namedtuple("shwtemp", "label current high critical")
        self.readings = {
            name: [entry("", value, None, None) for value in values]
            for name, values in readings.items()
        }

    def sensors_temperatures(self):
        return self.readings


def test_cpu_temperature_reads_the_hottest_cpu_sensor(monkeypatch):
    sensors = _Sensors({"coretemp": [41.0, 57.5, 49.0], "nvme": [70.0]})
    monkeypatch.setattr(system, "_psutil", lambda: sensors)
    metric = system.CpuTemperatureMetric(interval=0)
    assert (metric.name, metric.unit) == ("CPU Temperature", "°C")
    assert metric.update(None, _meta()).resolve() == (57.5, 1.0)  # the disk is not the CPU
    sensors.readings = _Sensors({"acpitz": [38.0]}).readings
    assert metric.update(None, _meta()).value == 38.0


@pytest.mark.parametrize(
    "psutil", [None, _Sensors({}), type("NoSensors", (), {})()], ids=["absent", "empty", "none"]
)
def test_cpu_temperature_unavailable_is_a_value_not_an_error(monkeypatch, psutil):
    monkeypatch.setattr(system, "_psutil", lambda: psutil)
    metric = system.CpuTemperatureMetric()
    assert metric.update(None, _meta()).value == "unavailable"


def test_cpu_temperature_on_this_machine():
    value = system.CpuTemperatureMetric().update(None, _meta()).value
    assert value == "unavailable" or 0 < value < 130
