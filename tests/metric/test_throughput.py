"""ThroughputMetric: samples/s, tokens/s and MFU, with the FLOPs counted on the first
training batch (checked against a hand count) without changing the training."""

from __future__ import annotations

import itertools

import pytest
import torch
from ember_testing import Classifier

import ember
from ember.errors import ConfigError, TrainingError
from ember.optim import AdamConfig
from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.history import RunHistory
from ember.train.metric import LossMetric, ThroughputMetric
from ember.train.metric.base import MetricMetadata
from ember.train.metric.inputs import LossInput
from ember.train.metric.throughput import PEAK_FLOPS, compute_dtype, gpu_model, peak_flops

META = MetricMetadata("train", 1, 1, 1, 1, None)


def mlp_flops_per_sample(widths):
    """A hand count for an MLP of Linear layers (widths[0] -> ... -> widths[-1]): a
    matrix product of [n, a] by [a, b] costs 2*n*a*b FLOPs; the forward takes one per
    layer, the backward two (input and weight gradients), except the first layer,
    whose input needs no gradient."""
    weights = [a * b for a, b in itertools.pairwise(widths)]
    return 2 * sum(weights) + 4 * sum(weights) - 2 * weights[0]


class Clock:
    """A stand-in for time.perf_counter: the test says how much time passes."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr("ember.train.metric.throughput.time.perf_counter", fake)
    return fake


def test_the_flops_counted_on_the_first_batch_match_a_hand_count(tmp_path, quiet, loaders):
    mfu = ThroughputMetric("mfu", peak_flops=1e12)
    learner = (
        LearnerBuilder(tmp_path)
        .metric_train_numeric(mfu)
        .renderer(quiet)
        .build(Classifier(hidden=(16, 32)), AdamConfig().init(), 1e-2)
    )
    learner.fit(*loaders)
    per_sample = mlp_flops_per_sample([8, 16, 32, 3])
    parameters = sum(p.numel() for p in learner.model.parameters() if p.dim() == 2)
    assert per_sample == 6 * parameters - 2 * 8 * 16  # the usual 6 x params, less one product
    assert mfu.flops_per_sample == per_sample
    log = (tmp_path / "experiment.log").read_text()
    assert f"MFU: {per_sample} FLOPs per sample (forward and backward), peak 1e+12" in log


def test_counting_changes_nothing_in_the_training(tmp_path, quiet, loaders):
    def train(directory, metrics):
        ember.seed(3)
        builder = LearnerBuilder(directory).renderer(quiet).num_epochs(2)
        for metric in metrics:
            builder = builder.metric_train_numeric(metric)
        learner = builder.build(Classifier(dropout=0.3), AdamConfig().init(), 1e-2)
        return learner.fit(*loaders)

    counted = train(tmp_path / "a", [ThroughputMetric("mfu", peak_flops=1e12), LossMetric()])
    plain = train(tmp_path / "b", [LossMetric()])
    for a, b in zip(counted.state_dict().values(), plain.state_dict().values()):
        assert torch.equal(a, b)
    for name in ("a", "b"):
        assert (tmp_path / name / "train" / "epoch-2" / "Loss.log").exists()
    loss = [(tmp_path / name / "train" / "epoch-2" / "Loss.log").read_text() for name in ("a", "b")]
    assert loss[0] == loss[1]


def test_rates_from_samples_tokens_and_flops(clock):
    samples, tokens, mfu = (
        ThroughputMetric("samples"),
        ThroughputMetric("tokens"),
        ThroughputMetric("mfu", peak_flops=2e9),
    )
    mfu.set_flops(32_000_000, torch.device("cpu"), "fp32")  # the first batch: 32 samples
    clock.now += 2.0
    loss = torch.tensor(0.5)
    assert samples.update(LossInput(loss, 32), META).resolve() == (16.0, 1.0)
    value = tokens.update(LossInput(loss, 32, tokens=torch.tensor([100, 140])), META)
    assert isinstance(value.value, torch.Tensor)  # stays a tensor: no host sync per step
    assert value.resolve() == (120.0, 1.0)
    # 16 samples/s x 1e6 FLOPs over 2e9 FLOP/s = 0.8 %
    assert mfu.update(LossInput(loss, 32), META).resolve() == (pytest.approx(0.8), 1.0)
    clock.now += 2.0
    tokens.update(LossInput(loss, 32, tokens=60), META)
    assert tokens.epoch_value() == 300 / 4.0
    samples.update(LossInput(loss, 32), META)
    assert samples.epoch_value() == 64 / 4.0
    samples.clear()
    assert samples.epoch_value() is not None and samples._samples == 0


def test_processes_merge_into_the_run_rate(clock):
    metric = ThroughputMetric("mfu", peak_flops=1e9)
    metric.set_flops(40_000_000, torch.device("cpu"), "fp32")
    clock.now += 4.0
    metric.update(LossInput(torch.tensor(1.0), 40), META)
    metric.merge_epoch_states([(40, 0.0, 5.0)])  # another process, slower
    # 80 samples in 5 s on two devices: 16 x 1e6 / (2 x 1e9) = 0.8 %
    assert metric.epoch_value() == pytest.approx(0.8)


def test_mfu_is_unavailable_on_the_cpu_without_a_peak(tmp_path, quiet, loaders):
    mfu = ThroughputMetric("mfu")
    learner = (
        LearnerBuilder(tmp_path)
        .metric_train(mfu)
        .metric_train_numeric(ThroughputMetric())
        .renderer(quiet)
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    learner.fit(*loaders)
    assert "MFU unavailable" in quiet.stream_text.getvalue()
    assert (
        "MFU is unavailable: no known peak FLOP/s for cpu in fp32"
        in (tmp_path / "experiment.log").read_text()
    )
    epoch = RunHistory.load(tmp_path / "history.jsonl").to_json()["epochs"][0]["train"]
    assert "MFU" not in epoch and epoch["Throughput"] > 0


class TokenClassifier(Classifier):
    def __init__(self, report_tokens):
        super().__init__()
        self.report_tokens = report_tokens

    def train_step(self, batch):
        output = self.classify(batch)
        tokens = batch.inputs.shape[0] * 10 if self.report_tokens else None
        return TrainOutput(
            ClassificationOutput(output.loss, output.output, output.targets, tokens=tokens)
        )


def test_token_throughput_counts_what_the_steps_report(tmp_path, quiet, loaders):
    tokens = ThroughputMetric("tokens")
    learner = (
        LearnerBuilder(tmp_path)
        .metric_train_numeric(tokens)
        .renderer(quiet)
        .build(TokenClassifier(True), AdamConfig().init(), 1e-2)
    )
    learner.fit(*loaders)
    samples, counted, _ = tokens.epoch_state()
    assert (samples, counted) == (200, 2000)  # 10 tokens a sample, 200 samples
    assert learner.history[0][1]["train"]["Token Throughput"] > 0
    lines = (tmp_path / "train" / "epoch-1" / "Token_Throughput.log").read_text().splitlines()
    assert len(lines) == 7 and all(float(line.split(",")[0]) > 0 for line in lines)


def test_token_throughput_without_a_token_count_fails_on_the_first_batch(tmp_path, quiet, loaders):
    learner = (
        LearnerBuilder(tmp_path)
        .metric_train_numeric(ThroughputMetric("tokens"))
        .renderer(quiet)
        .build(TokenClassifier(False), AdamConfig().init(), 1e-2)
    )
    with pytest.raises(TrainingError, match=r"Token Throughput.*tokens=n"):
        learner.fit(*loaders)


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L40", None),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_gpu_names_map_to_the_peak_table(name, model):
    assert gpu_model(name) == model


def test_the_peak_of_a_gpu_for_its_compute_dtype(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert peak_flops(torch.device("cuda", 0), "bf16") == PEAK_FLOPS["H100 SXM"]["bf16"]
    assert peak_flops(torch.device("cpu"), "bf16") is None
    assert compute_dtype(torch.float32, "bf16") == "bf16"
    assert compute_dtype(torch.float16) == "fp16"
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert compute_dtype(torch.float32) == "fp32"
        torch.set_float32_matmul_precision("high")
        assert compute_dtype(torch.float32) == "tf32"
    finally:
        torch.set_float32_matmul_precision(previous)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "flops"}, "kind must be one of"),
        ({"peak_flops": 0}, "peak_flops must be FLOP/s > 0"),
        ({"peak_flops": "989T"}, "peak_flops must be FLOP/s > 0"),
    ],
)
def test_bad_options_fail_at_once(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ThroughputMetric(**kwargs)


@pytest.mark.cuda
def test_mfu_on_a_gpu_from_the_table(tmp_path, quiet, blobs):
    from ember_testing import BlobBatcher

    from ember.data import DataLoaderBuilder

    loader = DataLoaderBuilder(BlobBatcher()).batch_size(64).build(blobs[0])
    mfu = ThroughputMetric("mfu")
    learner = (
        LearnerBuilder(tmp_path)
        .metric_train_numeric(mfu)
        .mixed_precision("bf16")
        .renderer(quiet)
        .build(Classifier(hidden=(512, 512)).cuda(), AdamConfig().init(), 1e-3)
    )
    learner.fit(loader)
    assert mfu.flops_per_sample == mlp_flops_per_sample([8, 512, 512, 3])
    if gpu_model(torch.cuda.get_device_name()) is not None:
        assert 0 < learner.history[0][1]["train"]["MFU"] < 100
