"""Scheduler configs: validation errors name the field; save/load round-trips, nested included."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from ember import Config, ConfigError
from ember.lr import (
    ComposedLrSchedulerConfig,
    ConstantLrConfig,
    CosineAnnealingLrSchedulerConfig,
    ExponentialLrSchedulerConfig,
    LinearLrSchedulerConfig,
    LrSchedulerConfig,
    NoamLrSchedulerConfig,
    SequentialLrSchedulerConfig,
    StepLrSchedulerConfig,
    WarmupLrSchedulerConfig,
    lr_at_steps,
)

NESTED = SequentialLrSchedulerConfig(
    schedulers=[
        WarmupLrSchedulerConfig(
            scheduler=CosineAnnealingLrSchedulerConfig(initial_lr=0.1, num_iters=10, min_lr=0.001),
            warmup_steps=3,
            start_factor=0.1,
        ),
        ComposedLrSchedulerConfig(
            schedulers=[
                StepLrSchedulerConfig(initial_lr=1.0, step_size=2, gamma=0.5),
                SequentialLrSchedulerConfig(
                    schedulers=[
                        ConstantLrConfig(lr=0.02),
                        ExponentialLrSchedulerConfig(initial_lr=0.02, gamma=0.9),
                    ],
                    milestones=[4],
                ),
            ],
            reduction="prod",
        ),
        NoamLrSchedulerConfig(init_lr=0.5, warmup_steps=5, model_size=64),
        LinearLrSchedulerConfig(initial_lr=0.01, final_lr=0.0, num_iters=4),
    ],
    milestones=[8, 20, 30],
)

ROUND_TRIP = [
    NoamLrSchedulerConfig(init_lr=0.5),
    ExponentialLrSchedulerConfig(initial_lr=0.1, gamma=0.99),
    CosineAnnealingLrSchedulerConfig(initial_lr=0.1, num_iters=100),
    LinearLrSchedulerConfig(initial_lr=1e-5, final_lr=1e-2, num_iters=100),
    StepLrSchedulerConfig(initial_lr=0.1, step_size=30),
    ComposedLrSchedulerConfig(
        schedulers=[
            ConstantLrConfig(lr=0.1),
            CosineAnnealingLrSchedulerConfig(initial_lr=1.0, num_iters=5),
        ]
    ),
    WarmupLrSchedulerConfig(scheduler=NESTED, warmup_steps=2),
    NESTED,
]


@pytest.mark.parametrize("config", ROUND_TRIP, ids=lambda c: type(c).__name__)
def test_save_and_load_round_trip(config, tmp_path):
    path = config.save(tmp_path / "lr.json")
    loaded = type(config).load(path)
    assert loaded == config
    assert loaded.to_json() == config.to_json()
    assert lr_at_steps(loaded.init(), 45) == lr_at_steps(config.init(), 45)


def test_nested_configs_keep_their_kind_in_the_file(tmp_path):
    data = json.loads(NESTED.save(tmp_path / "lr.json").read_text())
    assert data["type"] == "sequential"
    assert [child.get("type") for child in data["schedulers"]] == [
        "warmup",
        "composed",
        "noam",
        "linear",
    ]
    assert data["schedulers"][0]["scheduler"]["type"] == "cosine"
    inner = data["schedulers"][1]["schedulers"][1]["schedulers"]
    assert inner[0] == {"lr": 0.02}  # ConstantLrConfig has no `type`; it is told by its `lr`
    loaded = SequentialLrSchedulerConfig.load(tmp_path / "lr.json")
    assert isinstance(loaded.schedulers[1].schedulers[1].schedulers[0], ConstantLrConfig)


class RunConfig(Config):
    lr: LrSchedulerConfig
    num_epochs: int = 3


@pytest.mark.parametrize(
    "config", ROUND_TRIP + [ConstantLrConfig(lr=0.3)], ids=lambda c: type(c).__name__
)
def test_a_user_config_can_hold_any_scheduler(config, tmp_path):
    run = RunConfig(lr=config)
    loaded = RunConfig.load(run.save(tmp_path / "run.json"))
    assert loaded == run and type(loaded.lr) is type(config)


def test_nested_configs_may_be_given_as_dicts():
    config = WarmupLrSchedulerConfig(
        scheduler={"type": "step", "initial_lr": 0.1, "step_size": 3}, warmup_steps=2
    )
    assert isinstance(config.scheduler, StepLrSchedulerConfig)
    changed = config.with_(scheduler={"type": "exponential", "initial_lr": 0.2, "gamma": 0.5})
    assert isinstance(changed.scheduler, ExponentialLrSchedulerConfig)


BAD = [
    (ExponentialLrSchedulerConfig, dict(initial_lr=0.1, gamma=-0.5), "gamma"),
    (ExponentialLrSchedulerConfig, dict(initial_lr=math.nan, gamma=0.5), "initial_lr"),
    (StepLrSchedulerConfig, dict(initial_lr=0.1, step_size=3, gamma=-1.0), "gamma"),
    (StepLrSchedulerConfig, dict(initial_lr=0.1, step_size=0), "step_size"),
    (NoamLrSchedulerConfig, dict(init_lr=1.0, warmup_steps=0), "warmup_steps"),
    (NoamLrSchedulerConfig, dict(init_lr=-1.0), "init_lr"),
    (NoamLrSchedulerConfig, dict(init_lr=1.0, model_size=0), "model_size"),
    (CosineAnnealingLrSchedulerConfig, dict(initial_lr=0.1, num_iters=0), "num_iters"),
    (CosineAnnealingLrSchedulerConfig, dict(initial_lr=0.1, num_iters=5, min_lr=0.2), "min_lr"),
    (CosineAnnealingLrSchedulerConfig, dict(initial_lr=math.inf, num_iters=5), "initial_lr"),
    (LinearLrSchedulerConfig, dict(initial_lr=0.1, final_lr=-0.1, num_iters=5), "final_lr"),
    (LinearLrSchedulerConfig, dict(initial_lr=0.1, final_lr=0.0, num_iters=0), "num_iters"),
    (
        WarmupLrSchedulerConfig,
        dict(scheduler=ConstantLrConfig(lr=0.1), warmup_steps=0),
        "warmup_steps",
    ),
    (
        WarmupLrSchedulerConfig,
        dict(scheduler=ConstantLrConfig(lr=0.1), warmup_steps=2, start_factor=1.5),
        "start_factor",
    ),
    (ComposedLrSchedulerConfig, dict(schedulers=[]), "schedulers"),
    (
        ComposedLrSchedulerConfig,
        dict(schedulers=[ConstantLrConfig(lr=0.1)], reduction="max"),
        "reduction",
    ),
    (
        SequentialLrSchedulerConfig,
        dict(schedulers=[ConstantLrConfig(lr=0.1)] * 3, milestones=[5]),
        "milestones",
    ),
    (
        SequentialLrSchedulerConfig,
        dict(schedulers=[ConstantLrConfig(lr=0.1)] * 2, milestones=[0]),
        "milestones",
    ),
    (
        SequentialLrSchedulerConfig,
        dict(schedulers=[ConstantLrConfig(lr=0.1)] * 3, milestones=[5, 5]),
        "milestones",
    ),
    (
        SequentialLrSchedulerConfig,
        dict(schedulers=[{"type": "cosine", "initial_lr": 0.1, "num_iters": -1}]),
        "schedulers.0.cosine.num_iters",
    ),
    (
        SequentialLrSchedulerConfig,
        dict(schedulers=[{"type": "cosnie", "initial_lr": 0.1}]),
        "schedulers.0",
    ),
]


@pytest.mark.parametrize("cls, values, field", BAD, ids=lambda v: v if isinstance(v, str) else None)
def test_bad_values_raise_config_error_naming_the_field(cls, values, field):
    with pytest.raises(ConfigError, match=f"field '{field}'"):
        cls(**values)


def test_bad_value_in_a_file_names_file_and_field(tmp_path):
    path = tmp_path / "lr.json"
    path.write_text(json.dumps({"type": "step", "initial_lr": 0.1, "step_size": 5, "gamma": -0.1}))
    with pytest.raises(ConfigError) as info:
        StepLrSchedulerConfig.load(path)
    assert str(path) in str(info.value) and "field 'gamma'" in str(info.value)


def test_assignment_is_validated_too():
    config = ExponentialLrSchedulerConfig(initial_lr=0.1, gamma=0.5)
    with pytest.raises(ConfigError, match="field 'gamma'"):
        config.gamma = -2.0
    assert config.gamma == 0.5


def test_a_config_of_another_kind_is_refused():
    data = json.loads(StepLrSchedulerConfig(initial_lr=0.1, step_size=2).to_json())
    with pytest.raises(ConfigError, match="field 'type'"):
        CosineAnnealingLrSchedulerConfig.from_dict(data)


@pytest.mark.parametrize(
    "module, name, data",
    [
        (
            "sequential",
            "SequentialLrSchedulerConfig",
            {"schedulers": [{"lr": 0.1}, {"lr": 0.01}], "milestones": [5]},
        ),
        ("composed", "ComposedLrSchedulerConfig", {"schedulers": [{"lr": 0.1}, {"lr": 0.5}]}),
        ("warmup", "WarmupLrSchedulerConfig", {"scheduler": {"lr": 0.1}, "warmup_steps": 3}),
    ],
)
def test_a_nesting_config_imported_from_its_own_module_is_complete(module, name, data):
    # A fresh interpreter: nothing else of ember.lr has been imported before the module.
    code = (
        f"from ember.lr.{module} import {name} as C\n"
        f"print(type(C.model_validate({data!r}).init()).__name__)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == name.replace("Config", "")


def test_nested_schedulers_from_the_command_line():
    run = RunConfig(lr=ConstantLrConfig(lr=0.1))
    warm = run.with_args(
        ["--lr.type", "warmup", "--lr.warmup-steps", "2", "--lr.scheduler.type", "step"]
        + ["--lr.scheduler.initial-lr", "0.1", "--lr.scheduler.step-size", "3"]
    )
    assert warm.lr == WarmupLrSchedulerConfig(
        scheduler=StepLrSchedulerConfig(initial_lr=0.1, step_size=3), warmup_steps=2
    )
    # A field of the inner scheduler, which keeps its other values.
    assert warm.with_args(["--lr.scheduler.gamma", "0.5"]).lr.scheduler == StepLrSchedulerConfig(
        initial_lr=0.1, step_size=3, gamma=0.5
    )
    sequential = run.with_args(
        ["--lr.type", "sequential", "--lr.milestones", "5"]
        + [
            "--lr.schedulers",
            '{"lr": 0.1}',
            '{"type": "exponential", "initial_lr": 0.1, "gamma": 0.9}',
        ]
    )
    assert sequential.lr == SequentialLrSchedulerConfig(
        schedulers=[
            ConstantLrConfig(lr=0.1),
            ExponentialLrSchedulerConfig(initial_lr=0.1, gamma=0.9),
        ],
        milestones=[5],
    )


def test_nested_scheduler_errors_name_the_options():
    run = RunConfig(lr=ConstantLrConfig(lr=0.1))
    with pytest.raises(ConfigError) as info:
        run.with_args(["--lr.type", "warmup", "--lr.warmup-steps", "2"])
    assert (
        "missing required field 'lr.scheduler' (give --lr.scheduler.type (one of constant, noam"
        in str(info.value)
    )
    with pytest.raises(ConfigError, match=r"unknown type 'cosin' for field 'lr.scheduler'"):
        run.with_args(["--lr.type", "warmup", "--lr.scheduler.type", "cosin"])
    with pytest.raises(ConfigError, match=r"'lr.schedulers.0.cosine.num_iters'.*--lr.schedulers"):
        run.with_args(
            ["--lr.type", "composed", "--lr.schedulers"]
            + ['{"type": "cosine", "initial_lr": 0.1, "num_iters": 0}']
        )


def test_help_lists_the_fields_of_the_scheduler_held_and_of_the_others(capsys):
    run = RunConfig(
        lr=WarmupLrSchedulerConfig(
            scheduler=CosineAnnealingLrSchedulerConfig(initial_lr=0.1, num_iters=10),
            warmup_steps=3,
        )
    )
    with pytest.raises(SystemExit) as info:
        run.with_args(["--help"])
    assert info.value.code == 0
    lines = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
    for expected in [
        "--lr.warmup-steps INT Steps run below the full rate. (default: 3)",
        "(default: warmup)",
        "(default: cosine)",
        "--lr.scheduler.num-iters INT|auto",  # the description follows on the next line
        'Steps from initial_lr to min_lr; a cycle is num_iters + 1 steps. "auto": the run\'s '
        "optimizer steps - 1, so min_lr is the rate of the last step. (default: 10)",
        "with --lr.scheduler.type noam (NoamLrSchedulerConfig):",
        "--lr.scheduler.init-lr FLOAT Scale of the whole schedule. (required)",
        "with --lr.type noam (NoamLrSchedulerConfig):",
        "--lr.init-lr FLOAT Scale of the whole schedule. (required)",
        "--num-epochs INT (default: 3)",
    ]:
        assert expected in lines, expected
