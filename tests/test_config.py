"""ember.Config as a user writes and reads experiment configs."""

from __future__ import annotations

import json

import pytest

from ember import Config, ConfigError
from ember.optim import AdamConfig


class ModelConfig(Config):
    num_classes: int
    hidden_size: int = 512
    dropout: float = 0.5


class TrainingConfig(Config):
    model: ModelConfig
    optimizer: AdamConfig = AdamConfig()
    num_epochs: int = 10
    learning_rate: float = 1.0e-4


def make() -> TrainingConfig:
    return TrainingConfig(model=ModelConfig(num_classes=10))


def test_save_writes_pretty_json_and_load_reads_it_back(tmp_path):
    config = make()
    path = config.save(tmp_path / "config.json")
    text = path.read_text()
    assert text.startswith('{\n  "model": {\n    "num_classes": 10,')
    assert json.loads(text)["optimizer"]["beta_1"] == 0.9
    assert TrainingConfig.load(path) == config
    assert str(config) == text.rstrip("\n")


def test_load_binary_reads_bytes():
    config = make().with_(num_epochs=3)
    assert TrainingConfig.load_binary(config.to_json().encode()) == config


def test_with_returns_a_validated_copy():
    config = make()
    changed = config.with_(num_epochs=2, model={"num_classes": 5, "hidden_size": 64})
    assert (changed.num_epochs, changed.model.hidden_size) == (2, 64)
    assert config.num_epochs == 10
    with pytest.raises(ConfigError, match=r"field 'num_epochs': .*integer.*'two'"):
        config.with_(num_epochs="two")
    with pytest.raises(ConfigError, match=r"unknown field 'num_epoch' .*Did you mean 'num_epochs'"):
        config.with_(num_epoch=2)


def test_unknown_key_in_file_names_the_field_and_the_file(tmp_path):
    path = tmp_path / "config.json"
    data = json.loads(make().to_json())
    data["model"]["hiden_size"] = 3
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as info:
        TrainingConfig.load(path)
    message = str(info.value)
    assert str(path) in message and "unknown field 'model.hiden_size'" in message


def test_wrong_type_and_missing_field_are_one_message(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model": {}, "num_epochs": "ten"}))
    with pytest.raises(ConfigError) as info:
        TrainingConfig.load(path)
    message = str(info.value)
    assert "missing required field 'model.num_classes'" in message
    assert "field 'num_epochs'" in message and "'ten'" in message
    assert message.startswith(str(path))


def test_not_json_and_missing_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ConfigError, match=r"bad.json: not valid JSON"):
        TrainingConfig.load(bad)
    with pytest.raises(ConfigError, match=r"no such config file"):
        TrainingConfig.load(tmp_path / "absent.json")


def test_command_line_overrides():
    config = make().with_args(
        ["--num-epochs", "2", "--learning-rate=3e-4", "--model.hidden-size", "64"]
    )
    assert (config.num_epochs, config.learning_rate, config.model.hidden_size) == (2, 3e-4, 64)
    with pytest.raises(ConfigError, match=r"unknown field 'num_epoch'.*Did you mean 'num_epochs'"):
        make().with_args(["--num-epoch", "2"])
    with pytest.raises(ConfigError, match=r"--num-epochs needs a value"):
        make().with_args(["--num-epochs"])
