"""ember.Config as a user writes and reads experiment configs."""

from __future__ import annotations

import json

import pytest

from ember import Config, ConfigError
from ember.lr import (
    ConstantLrConfig,
    CosineAnnealingLrSchedulerConfig,
    LinearLrSchedulerConfig,
    LrSchedulerConfig,
    StepLrSchedulerConfig,
)
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


# The command line of an experiment whose config holds a learning-rate schedule.


class ExperimentConfig(Config):
    model: ModelConfig = ModelConfig(num_classes=10)
    layers: list[int] = [64, 64]
    lr: LrSchedulerConfig = CosineAnnealingLrSchedulerConfig(initial_lr=0.1, num_iters=100)
    seed: int | None = None
    amp: bool = False


def parse(*argv: str) -> ExperimentConfig:
    return ExperimentConfig().with_args(list(argv))


def error_of(*argv: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse(*argv)
    return str(info.value)


def test_a_dotted_option_sets_a_field_of_the_scheduler_the_config_holds():
    config = parse("--lr.min-lr", "0.001")
    assert config.lr == CosineAnnealingLrSchedulerConfig(
        initial_lr=0.1, num_iters=100, min_lr=0.001
    )
    assert ExperimentConfig().lr.min_lr == 0.0  # the original is unchanged


def test_a_dotted_type_chooses_the_scheduler_and_its_fields_start_from_defaults():
    config = parse(
        "--lr.type", "linear", "--lr.initial-lr", "0", "--lr.final-lr", "1e-3",
        "--lr.num-iters", "50",
    )  # fmt: skip
    assert config.lr == LinearLrSchedulerConfig(initial_lr=0.0, final_lr=1e-3, num_iters=50)
    step = parse("--lr.type", "step", "--lr.initial-lr", "0.5", "--lr.step-size", "10")
    assert step.lr == StepLrSchedulerConfig(initial_lr=0.5, step_size=10, gamma=0.1)
    constant = parse("--lr.type", "constant", "--lr.lr", "0.01")  # a type without a `type` field
    assert constant.lr == ConstantLrConfig(lr=0.01)


def test_the_same_type_keeps_the_current_fields():
    config = parse("--lr.num-iters", "7", "--lr.type", "cosine")
    assert config.lr == CosineAnnealingLrSchedulerConfig(initial_lr=0.1, num_iters=7)


def test_a_new_type_names_each_missing_field_and_its_option():
    message = error_of("--lr.type", "linear", "--lr.final-lr", "0.001")
    assert message.startswith("command line: invalid LinearLrSchedulerConfig for field 'lr'")
    assert "missing required field 'lr.initial_lr' (give --lr.initial-lr)" in message
    assert "missing required field 'lr.num_iters' (give --lr.num-iters)" in message
    assert "final_lr" not in message


def test_a_json_value_chooses_the_scheduler():
    config = parse("--lr", '{"type": "linear", "initial_lr": 0.1, "final_lr": 0, "num_iters": 3}')
    assert config.lr == LinearLrSchedulerConfig(initial_lr=0.1, final_lr=0.0, num_iters=3)
    assert parse("--lr", '{"lr": 0.3}').lr == ConstantLrConfig(lr=0.3)
    on_top = parse(
        "--lr.num-iters", "9", "--lr", '{"type": "cosine", "initial_lr": 1, "num_iters": 2}'
    )
    assert on_top.lr == CosineAnnealingLrSchedulerConfig(initial_lr=1.0, num_iters=9)
    assert parse('--lr={"lr": 0.2}').lr == ConstantLrConfig(lr=0.2)


def test_json_scheduler_errors_name_the_option_and_the_fix():
    assert "'nope' is not valid JSON" in error_of("--lr", "nope")
    assert "--lr expects a JSON object" in error_of("--lr", "[1]")
    message = error_of("--lr", '{"initial_lr": 1}')
    assert "names no 'type'" in message and "constant, noam, exponential, cosine" in message
    message = error_of("--lr", '{"type": "cosine", "initial_lr": 0.1}')
    assert "missing required field 'lr.num_iters' (give --lr.num-iters)" in message
    message = error_of("--lr", '{"type": "cosnie"}')
    assert "unknown type 'cosnie' for field 'lr'. Did you mean 'cosine'?" in message


def test_scheduler_option_errors_name_the_types_and_the_fix():
    message = error_of("--lr.type", "lnear")
    assert "--lr.type: unknown type 'lnear' for field 'lr'. Did you mean 'linear'?" in message
    assert "Accepted: constant, noam, exponential, cosine, linear, step, composed" in message
    message = error_of("--lr.final-lr", "0.001")
    assert "field 'lr' holds a 'cosine' config" in message
    assert (
        "no field 'final_lr'; the type 'linear' has it: choose it with --lr.type linear" in message
    )
    message = error_of("--lr.min-lrr", "0.001")
    assert "unknown field 'min_lrr' for CosineAnnealingLrSchedulerConfig" in message
    assert "Did you mean 'min_lr' (--lr.min-lr)?" in message
    message = error_of("--lr.min-lr", "0.5")
    assert "field 'lr.min_lr': Value error, min_lr must be at most initial_lr (0.1)" in message
    assert "set with --lr.min-lr" in message


def test_a_list_takes_its_values_one_after_another_or_as_json():
    assert parse("--layers", "128", "256", "512").layers == [128, 256, 512]
    assert parse("--layers", "[32, 16]").layers == [32, 16]
    assert parse("--layers=[]").layers == []
    assert parse("--layers=8").layers == [8]
    config = parse("--layers", "1", "2", "--seed", "3")
    assert (config.layers, config.seed) == ([1, 2], 3)
    assert "field 'layers.1'" in error_of("--layers", "1", "x")
    assert "--layers needs values" in error_of("--layers")
    assert "unexpected argument '2' after --layers=1" in error_of("--layers=1", "2")
    message = error_of("--seed", "1", "2")
    assert "--seed takes one value, got 2" in message and "Only a list field" in message


def test_bools_nulls_and_negative_numbers():
    config = parse("--amp", "--seed", "-1")
    assert (config.amp, config.seed) == (True, -1)
    assert parse("--amp", "false").amp is False
    assert parse("--seed", "7").with_args(["--seed", "null"]).seed is None


def test_a_nested_config_may_be_given_as_json_then_dotted_options():
    config = parse("--model", '{"num_classes": 3}', "--model.hidden-size", "7")
    assert config.model == ModelConfig(num_classes=3, hidden_size=7, dropout=0.5)
    message = error_of("--model.hiden-size", "1")
    assert "unknown field 'hiden_size' for ModelConfig (what field 'model' holds)" in message
    assert "Did you mean 'hidden_size' (--model.hidden-size)?" in message
    message = error_of("--seed.value", "1")
    assert "field 'seed' of ExperimentConfig is not a config" in message
    assert "--seed INT|null" in message


def test_help_prints_every_option_with_its_type_and_default_then_exits_0(capsys):
    with pytest.raises(SystemExit) as info:
        parse("--layers", "1", "--help")
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out == ExperimentConfig().args_help() + "\n"
    lines = [" ".join(line.split()) for line in out.splitlines()]
    for expected in [
        "--model JSON The whole ModelConfig as one JSON object; or its fields:",
        "--model.num-classes INT (default: 10)",
        "--model.dropout FLOAT (default: 0.5)",
        "--layers INT [INT ...] (default: [64, 64])",
        "--lr.type {constant,noam,exponential,cosine,linear,step,composed,sequential,warmup}",
        "(default: cosine)",
        "--lr.min-lr FLOAT Rate at the end of each cycle. (default: 0.0)",
        "--seed INT|null (default: null)",
        "--amp [BOOL] (default: false)",
        "with --lr.type linear (LinearLrSchedulerConfig):",
        "--lr.final-lr FLOAT Rate from step num_iters + 1 on. (required)",
        "--lr.reduction {prod,sum,avg} prod, sum or avg of their rates. (default: prod)",
    ]:
        assert expected in lines, expected
    with pytest.raises(SystemExit):
        parse("-h")
    assert capsys.readouterr().out.startswith("usage: ")
