"""On CUDA, with fp16 loss scaling or bf16 autocast: a run stopped inside an epoch
(with a mid-epoch checkpoint) and resumed ends with the same weights, bit for bit,
as one never stopped. Needs a CUDA device (`pytest -m cuda`, `make gpu-check`)."""

from __future__ import annotations

import io

import pytest
import torch
from ember_testing import BlobBatcher, BlobDataset, Classifier, StopAt

import ember
from ember.data import DataLoaderBuilder
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer

pytestmark = pytest.mark.cuda


def run(directory, precision: str, stop: bool = False, resume: bool = False):
    ember.seed(4)
    train = DataLoaderBuilder(BlobBatcher()).batch_size(16).shuffle(2).build(BlobDataset(320))
    valid = DataLoaderBuilder(BlobBatcher()).batch_size(32).build(BlobDataset(64, seed=1))
    builder = (
        LearnerBuilder(directory)
        .devices(["cuda:0"])
        .mixed_precision(precision)
        .metric_train_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .with_file_checkpointer(DefaultRecorder())
        .num_epochs(3)
        .renderer(PlainRenderer(interval=3600, stream=io.StringIO()))
    )
    if resume:
        builder = builder.checkpoint("latest")
    if stop:
        builder = builder.listener(StopAt(builder.interrupter(), 2, 7))
    learner = builder.build(Classifier(), AdamConfig().init(), 1e-2)
    model = learner.fit(train, valid)
    return learner, {name: t.detach().cpu() for name, t in model.state_dict().items()}


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_run_stopped_mid_epoch_on_cuda_resumes_bit_for_bit(tmp_path, precision):
    _, straight = run(tmp_path / "straight", precision)
    stopped, _ = run(tmp_path / "resumed", precision, stop=True)
    assert stopped.outcome == "stopped: test stop"
    resumed, weights = run(tmp_path / "resumed", precision, resume=True)
    assert resumed.outcome == "completed"
    for name, tensor in straight.items():
        assert torch.equal(tensor, weights[name]), name
    if precision == "fp16":  # the loss scale resumed too
        assert resumed.optim.scaler is not None and resumed.optim.scaler.get_scale() > 0
