"""Models put together in ways torch lets through but training cannot work with are
refused (or warned about) when the learner is built, naming the attribute or the method
and the fix: layers in a plain Python list or dict, and a `train` method of the model's
own, as in the forward-forward algorithm's examples."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ember.errors import ConfigError
from ember.optim import AdamConfig
from ember.train import EvaluatorBuilder, LearnerBuilder, RegressionOutput, TrainOutput


class Steps(nn.Module):
    def forward(self, x):
        for layer in self.layers if isinstance(self.layers, list) else self.layers.values():
            x = layer(x)
        return x

    def train_step(self, batch):
        x, y = batch
        out = self(x)
        return TrainOutput(RegressionOutput(F.mse_loss(out, y), out, y))


class InAList(Steps):
    def __init__(self):
        super().__init__()
        self.layers = [nn.Linear(4, 4), nn.Linear(4, 1)]  # not registered


class InADict(Steps):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 4)  # registered: the model has parameters of its own
        self.layers = {"first": nn.Linear(4, 4), "second": nn.Linear(4, 1)}


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Module()
        self.encoder.blocks = ([nn.Linear(4, 4)], [nn.Linear(4, 4)])  # inside a submodule
        self.head = nn.Linear(4, 1)

    def train_step(self, batch):  # never called
        raise AssertionError


class ForwardForward(nn.Module):
    """The forward-forward algorithm's network: a `train` of its own, with data."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 1)])

    def train(self, x_pos, x_neg):
        for layer in self.layers:
            layer(x_pos), layer(x_neg)

    def train_step(self, batch):  # never called
        raise AssertionError


class Layer(nn.Linear):
    def train(self, x_pos, x_neg):  # the layers' own training loop
        pass


class WithLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(Layer(4, 4), Layer(4, 1))

    def train_step(self, batch):  # never called
        raise AssertionError


class KeepsTorchsTrain(nn.Module):
    """A `train` override with torch's signature is fine."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.switched: list[bool] = []

    def train(self, mode: bool = True):
        self.switched.append(mode)
        return super().train(mode)

    def train_step(self, batch):
        x, y = batch
        out = self.linear(x)
        return TrainOutput(RegressionOutput(F.mse_loss(out, y), out, y))


def build(tmp_path, model, optimizer=None, lr=1e-3):
    optimizer = AdamConfig().init() if optimizer is None else optimizer
    return LearnerBuilder(tmp_path).build(model, optimizer, lr)


def test_an_optimizer_over_layers_in_a_plain_list_names_the_list_and_module_list(tmp_path):
    model = InAList()
    optimizer = torch.optim.SGD([p for layer in model.layers for p in layer.parameters()], lr=0.1)
    with pytest.raises(ConfigError) as error:
        LearnerBuilder(tmp_path).build(model, optimizer)
    message = str(error.value)
    assert message.startswith("InAList.layers is a plain Python list of 2 modules (Linear, Linear)")
    assert "their 4 parameter tensors are not InAList's" in message
    assert "the optimizer given to build() updates them" in message
    assert "Wrap the list: self.layers = nn.ModuleList([...])." in message
    assert "created for another model" not in message


def test_layers_in_a_plain_list_that_are_all_the_model_has_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"InAList.layers is a plain Python list") as error:
        build(tmp_path, InAList())
    assert "so they are not trained" in str(error.value)
    assert "nn.ModuleList([...])" in str(error.value)


def test_layers_in_a_plain_dict_beside_registered_ones_are_warned_of(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        learner = build(tmp_path, InADict())
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    (message,) = [m for m in messages if "InADict.layers" in m]
    assert message.startswith("InADict.layers is a plain Python dict of 2 modules")
    assert "so they are not trained (the optimizer is bound to the model's parameters)" in message
    assert "Wrap the dict: self.layers = nn.ModuleDict({...})." in message
    assert "requires_grad=False" in message
    assert caught[0].filename == __file__  # points at the build() call
    assert message in learner.optim.notes  # and goes to the run's log


def test_a_frozen_module_kept_out_of_the_model_is_left_alone(tmp_path):
    model = InADict()
    for layer in model.layers.values():
        layer.requires_grad_(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build(tmp_path, model)


def test_layers_in_lists_inside_a_submodule_are_found(tmp_path):
    model = Nested()
    optimizer = torch.optim.SGD(model.encoder.blocks[1][0].parameters(), lr=0.1)
    with pytest.raises(ConfigError, match=r"^Nested\.encoder\.blocks is a plain Python tuple"):
        LearnerBuilder(tmp_path).build(model, optimizer)


def test_a_train_method_with_data_arguments_names_it_and_the_rename(tmp_path):
    with pytest.raises(ConfigError) as error:
        build(tmp_path, ForwardForward())
    message = str(error.value)
    assert message.startswith(
        "ForwardForward defines train(self, x_pos, x_neg), which replaces torch's "
        "nn.Module.train(mode=True): ember calls model.train() and model.eval()"
    )
    assert "Rename the method (e.g. to fit_layers, and its calls)" in message


def test_a_submodule_with_its_own_train_is_named_with_its_path(tmp_path):
    with pytest.raises(ConfigError) as error:
        build(tmp_path, WithLayers())
    message = str(error.value)
    assert message.startswith(
        "Layer (the submodule 'layers.0' of WithLayers) defines train(self, x_pos, x_neg)"
    )
    assert "call it on every submodule" in message
    with pytest.raises(ConfigError, match=r"^Layer \(the submodule 'layers.0'"):
        EvaluatorBuilder(tmp_path).build(WithLayers())


def test_a_train_override_with_torchs_signature_builds(tmp_path):
    model = KeepsTorchsTrain()
    build(tmp_path, model)
    model.eval()
    assert model.switched[-1] is False
