"""Protocol checks shared by all metrics: adapt errors, no host sync, lazy imports."""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from ember.errors import TrainingError
from ember.train.metric.accuracy import AccuracyMetric
from ember.train.metric.adapt import adapt
from ember.train.metric.auroc import AurocMetric
from ember.train.metric.base import Metric, MetricMetadata
from ember.train.metric.hamming import HammingScoreMetric
from ember.train.metric.learning_rate import LearningRateMetric
from ember.train.metric.loss import LossMetric
from ember.train.metric.perplexity import PerplexityMetric
from ember.train.metric.precision_recall import FBetaScoreMetric, PrecisionMetric, RecallMetric
from ember.train.metric.speed import IterationSpeedMetric
from ember.train.metric.system import CpuMemoryMetric, CpuUseMetric, CudaMemoryMetric
from ember.train.metric.topk import TopKAccuracyMetric
from ember.train.output import (
    ClassificationOutput,
    MultiLabelClassificationOutput,
    RegressionOutput,
    SequenceOutput,
)

META = MetricMetadata("train", 0, 1, 0, 3, 0.1)
REGRESSION = RegressionOutput(torch.tensor(0.0), torch.zeros(2), torch.zeros(2))
CLASSIFICATION = ClassificationOutput(torch.tensor(0.0), torch.zeros(2, 2), torch.zeros(2))
MULTILABEL = MultiLabelClassificationOutput(torch.tensor(0.0), torch.zeros(2, 2), torch.zeros(2, 2))


def _outputs(device: str = "cpu") -> dict[str, Any]:
    g = torch.Generator().manual_seed(50)
    n, c = 16, 4
    targets = torch.randint(0, c, (n,), generator=g)
    targets[:4] = torch.arange(4)
    sequence_targets = torch.randint(0, 6, (n, 5), generator=g)
    sequence_targets[:, -1] = 0
    outputs = {
        "multiclass": ClassificationOutput(
            torch.tensor(1.0), torch.randn(n, c, generator=g), targets
        ),
        "binary": ClassificationOutput(
            torch.tensor(1.0), torch.rand(n, generator=g), torch.arange(n) % 2
        ),
        "multilabel": MultiLabelClassificationOutput(
            torch.tensor(1.0),
            torch.rand(n, c, generator=g),
            (torch.arange(n * c) % 3 == 0).view(n, c).long(),
        ),
        "sequence": SequenceOutput(
            torch.tensor(1.0), torch.randn(n, 5, 6, generator=g), sequence_targets, pad_token=0
        ),
    }

    def move(value: Any) -> Any:
        return value.to(device) if isinstance(value, torch.Tensor) else value

    return {key: type(o)(*map(move, vars(o).values())) for key, o in outputs.items()}


def _device_metrics() -> list[tuple[Any, str]]:
    """Metrics whose values stay on the device, with the output each one reads."""
    return [
        (AccuracyMetric(), "multiclass"),
        (AccuracyMetric(), "sequence"),
        (AccuracyMetric(), "binary"),
        (AccuracyMetric(from_logits=True), "binary"),
        (LossMetric(), "multiclass"),
        (TopKAccuracyMetric(2), "multiclass"),
        (TopKAccuracyMetric(2), "sequence"),
        (PrecisionMetric.binary(), "binary"),
        (RecallMetric.multiclass(), "multiclass"),
        (RecallMetric.multiclass(top_k=2, reduction="micro"), "sequence"),
        (FBetaScoreMetric.multiclass(2.0, top_k=2), "multiclass"),
        (FBetaScoreMetric.multilabel(0.5, reduction="micro"), "multilabel"),
        (PrecisionMetric.multilabel(), "multilabel"),
        (RecallMetric.multilabel(from_logits=True), "multilabel"),
        (FBetaScoreMetric.binary(from_logits=True), "binary"),
        (AurocMetric(), "binary"),
        (AurocMetric(), "multiclass"),
        (AurocMetric(), "multilabel"),
        (AurocMetric(from_logits=True), "binary"),
        (AurocMetric(from_logits=True), "multiclass"),
        (HammingScoreMetric(), "multilabel"),
        (HammingScoreMetric(from_logits=True), "multilabel"),
        (PerplexityMetric(), "sequence"),
    ]


def _ids(cases: list[tuple[Any, str]]) -> list[str]:
    return [f"{m.name}-{kind}" for m, kind in cases]


@pytest.mark.parametrize(
    "metric, output",
    [
        (AccuracyMetric(), REGRESSION),
        (TopKAccuracyMetric(3), MULTILABEL),
        (PrecisionMetric.multilabel(), CLASSIFICATION),
        (FBetaScoreMetric.multiclass(), MULTILABEL),
        (AurocMetric(), REGRESSION),
        (HammingScoreMetric(), CLASSIFICATION),
        (PerplexityMetric(), CLASSIFICATION),
        (IterationSpeedMetric(), object()),
    ],
    ids=lambda x: getattr(x, "name", type(x).__name__),
)
def test_wrong_output_fails_in_adapt_naming_metric_and_output(metric, output):
    with pytest.raises(TrainingError) as error:
        adapt(output, metric.input_type, metric.name)
    message = str(error.value)
    assert repr(metric.name) in message
    assert type(output).__name__ in message


def test_all_metrics_follow_the_protocol():
    metrics = [m for m, _ in _device_metrics()] + [
        LearningRateMetric(),
        IterationSpeedMetric(),
        CpuUseMetric(),
        CpuMemoryMetric(),
        CudaMemoryMetric(),
    ]
    for metric in metrics:
        assert isinstance(metric, Metric)
        assert getattr(metric, "unit", "") in ("", "%", "GB", "item/s")
        assert metric.higher_is_better in (True, False, None)


_HOST_READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__")


def _forbid_host_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every tensor-to-host conversion raise, as a CPU stand-in for a device sync."""

    def refuse(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("update moved a tensor value to the host")

    for attribute in _HOST_READS:
        monkeypatch.setattr(torch.Tensor, attribute, refuse)


def _count_host_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every tensor-to-host conversion (they still happen); returns the record."""
    reads: list[str] = []
    for attribute in _HOST_READS:
        original = getattr(torch.Tensor, attribute)

        def counted(self: Any, *args: Any, _name: str = attribute, _f: Any = original) -> Any:
            reads.append(_name)
            return _f(self, *args)

        monkeypatch.setattr(torch.Tensor, attribute, counted)
    return reads


@pytest.mark.parametrize("metric, kind", _device_metrics(), ids=_ids(_device_metrics()))
def test_update_keeps_values_on_device(monkeypatch, metric, kind):
    """The first update of an epoch reads its value checks (class ids in range,
    probabilities in [0, 1]...) from the device in one transfer; the others never move
    anything to the host."""
    output = _outputs()[kind]
    item = adapt(output, metric.input_type, metric.name)
    metric.clear()
    with monkeypatch.context() as patch:
        reads = _count_host_reads(patch)
        values = [metric.update(item, META)]
    assert reads == ([] if isinstance(metric, LossMetric) else ["tolist"])
    with monkeypatch.context() as patch:
        _forbid_host_sync(patch)
        values += [metric.update(item, META) for _ in range(2)]
        epoch = metric.epoch_value() if hasattr(metric, "epoch_value") else None
    for value in values:
        assert isinstance(value.value, torch.Tensor) and value.value.dim() == 0
    if epoch is not None:
        assert isinstance(epoch, torch.Tensor) and epoch.dim() == 0


@pytest.mark.cuda
@pytest.mark.parametrize("metric, kind", _device_metrics(), ids=_ids(_device_metrics()))
def test_update_does_not_synchronize_cuda(metric, kind):
    output = _outputs("cuda")[kind]
    item = adapt(output, metric.input_type, metric.name)
    metric.clear()
    metric.update(item, META)  # first call may allocate / initialise
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        values = [metric.update(item, META) for _ in range(3)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(v.value.device.type == "cuda" for v in values)


class _RecordImports(importlib.abc.MetaPathFinder):
    """Records (and refuses) imports of the optional dependencies."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names, self.seen = names, []

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname.split(".")[0] in self.names:
            self.seen.append(fullname)
            raise ImportError(f"{fullname} is blocked by the test")
        return None


def test_importing_the_metrics_imports_no_optional_dependency(monkeypatch):
    optional = ("torchmetrics", "sklearn", "psutil")
    for name in list(sys.modules):
        if name.split(".")[0] in optional + ("ember",):
            monkeypatch.delitem(sys.modules, name)  # restored after the test
    before = set(sys.modules)
    recorder = _RecordImports(optional)
    monkeypatch.setattr(sys, "meta_path", [recorder, *sys.meta_path])
    package = Path(__file__).resolve().parents[2] / "src" / "ember" / "train" / "metric"
    try:
        for module in sorted(p.stem for p in package.glob("*.py")):
            if module != "__init__":
                importlib.import_module(f"ember.train.metric.{module}")
        importlib.import_module("ember.train.output")
        system = importlib.import_module("ember.train.metric.system")
        system.CudaMemoryMetric()
    finally:
        for name in set(sys.modules) - before:  # fresh copies must not outlive the test
            del sys.modules[name]
    assert recorder.seen == []
