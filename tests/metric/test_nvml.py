"""CudaMetric: NVML readings of a GPU, from a fake pynvml module; "unavailable" without it."""

from __future__ import annotations

import sys
import time
import types

import pytest

from ember.errors import ConfigError
from ember.optim import AdamConfig
from ember.train import LearnerBuilder
from ember.train.metric import CudaMetric
from ember.train.metric.base import MetricMetadata

META = MetricMetadata("train", 1, 1, 1, 1, None)


class NVMLError(Exception):
    pass


def fake_nvml(monkeypatch, devices, power=True):
    """A pynvml whose devices report the given readings (changeable while it runs)."""
    module = types.ModuleType("pynvml")
    module.NVMLError = NVMLError
    module.calls = []

    def handle(index):
        if index >= len(devices):
            raise NVMLError("Invalid Argument")
        return index

    def power_usage(h):
        if not power:
            raise NVMLError("Not Supported")
        return devices[h]["power_mw"]

    module.nvmlInit = lambda: module.calls.append("init")
    module.nvmlDeviceGetHandleByIndex = handle
    module.nvmlDeviceGetHandleByUUID = lambda uuid: handle(int(uuid.removeprefix("GPU-")))
    module.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(
        gpu=devices[h]["gpu"], memory=0
    )
    module.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        used=devices[h]["used"], total=devices[h]["total"], free=0
    )
    module.nvmlDeviceGetPowerUsage = power_usage
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


DEVICES = [
    {"gpu": 37, "used": 12_000_000_000, "total": 80_000_000_000, "power_mw": 312_500},
    {"gpu": 91, "used": 60_000_000_000, "total": 80_000_000_000, "power_mw": 650_000},
]


@pytest.mark.parametrize(
    ("kind", "device", "name", "unit", "value"),
    [
        ("utilization", None, "GPU Utilization", "%", 37.0),
        ("memory", None, "GPU Memory", "GB", 12.0),
        ("memory_percent", 1, "GPU Memory Used 1", "%", 75.0),
        ("power", 1, "GPU Power 1", "W", 650.0),
    ],
)
def test_readings_of_each_kind_and_device(monkeypatch, kind, device, name, unit, value):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_nvml(monkeypatch, DEVICES)
    metric = CudaMetric(kind, device=device)
    assert (metric.name, metric.unit) == (name, unit)
    assert metric.update(None, META).value == value
    metric.close()


def test_the_background_thread_follows_the_device(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    devices = [dict(DEVICES[0])]
    fake_nvml(monkeypatch, devices)
    metric = CudaMetric("utilization", interval=0.01)
    assert metric.update(None, META).value == 37.0
    devices[0]["gpu"] = 88
    deadline = time.monotonic() + 5.0
    while metric.update(None, META).value != 88.0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert metric.update(None, META).value == 88.0
    assert metric._sampler.thread.is_alive()
    metric.close()
    metric._sampler.thread.join(timeout=2.0)
    assert not metric._sampler.thread.is_alive()


def test_cuda_visible_devices_maps_to_the_physical_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    fake_nvml(monkeypatch, DEVICES)
    assert CudaMetric("utilization", device=0).update(None, META).value == 91.0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1")
    assert CudaMetric("utilization", device=0).update(None, META).value == 91.0


def test_power_not_supported_is_unavailable(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_nvml(monkeypatch, DEVICES, power=False)
    assert CudaMetric("power").update(None, META).value == "unavailable"
    assert CudaMetric("utilization").update(None, META).value == 37.0


def test_without_nvidia_ml_py_the_value_is_unavailable_and_says_why(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    metric = CudaMetric()
    with caplog.at_level("INFO"):
        assert metric.update(None, META).value == "unavailable"
        assert metric.update(None, META).value == "unavailable"
    assert metric.unavailable_reason == "nvidia-ml-py is not installed (pip install ember[nvml])"
    assert caplog.text.count("GPU Utilization is unavailable") == 1


def test_without_a_driver_the_value_is_unavailable(monkeypatch):
    module = fake_nvml(monkeypatch, DEVICES)

    def no_driver():
        raise NVMLError("NVML Shared Library Not Found")

    module.nvmlInit = no_driver
    metric = CudaMetric("memory")
    assert metric.update(None, META).value == "unavailable"
    assert "NVML could not start (NVML Shared Library Not Found)" in metric.unavailable_reason


def test_a_missing_device_is_unavailable(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_nvml(monkeypatch, DEVICES)
    metric = CudaMetric(device=5)
    assert metric.update(None, META).value == "unavailable"
    assert metric.unavailable_reason.startswith("no GPU 5")


def test_an_unavailable_reading_in_a_run_is_shown_and_logged(tmp_path, quiet, loaders, monkeypatch):
    from ember_testing import Classifier

    monkeypatch.setitem(sys.modules, "pynvml", None)

    (
        LearnerBuilder(tmp_path)
        .metric_train(CudaMetric("power"))
        .renderer(quiet)
        .build(Classifier(), AdamConfig().init(), 1e-2)
        .fit(*loaders)
    )
    assert "GPU Power unavailable" in quiet.stream_text.getvalue()
    assert "GPU Power is unavailable" in (tmp_path / "experiment.log").read_text()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "temperature"}, "kind must be one of"),
        ({"device": "cuda:0"}, "device must be a CUDA index"),
        ({"interval": 0}, "interval must be a number of seconds > 0"),
    ],
)
def test_bad_options_fail_at_once(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        CudaMetric(**kwargs)
