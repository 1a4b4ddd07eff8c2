"""Shared pieces of the scheduler families: the config base, state checks, `lr_at_steps`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, Mapping, Union

from pydantic import PlainValidator, ValidationError

from ember.config import Config, _describe
from ember.errors import ConfigError
from ember.lr.base import LrScheduler, StepsUnknown


class SchedulerConfigBase(Config):
    """Config base whose constructor and assignments raise `ConfigError` naming the field,
    like `Config.load` does, instead of pydantic's `ValidationError`."""

    if not TYPE_CHECKING:  # keep the field-based signature that type checkers synthesise

        def __init__(self, **data: Any) -> None:
            try:
                super().__init__(**data)
            except ValidationError as error:
                cls = type(self)
                raise ConfigError(_describe(cls, error, f"{cls.__name__}(...)")) from None

        # Nested configs are validated by pydantic directly, not through this __init__, so
        # their errors keep the full field path of the outer config.
        __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

        def __setattr__(self, name: str, value: Any) -> None:
            try:
                super().__setattr__(name, value)
            except ValidationError as error:
                cls = type(self)
                raise ConfigError(_describe(cls, error, f"{cls.__name__}.{name} = ...")) from None


AUTO = "auto"
"""A step count the Learner fills in: the run's number of optimizer steps."""


def _check_steps(value: Any) -> int | str:
    if value == AUTO:
        return AUTO
    if isinstance(value, str) and value.strip().lstrip("+").isdigit():
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"must be an int >= 1 or 'auto', got {value!r}")
    return value


StepCount = Annotated[Union[int, Literal["auto"]], PlainValidator(_check_steps)]
"""A number of steps (an int >= 1), or "auto": the run's optimizer steps - 1."""


def resolve_steps(value: int | str, total_steps: int | None, owner: str, field: str) -> int:
    """`value`, or for `"auto"` the steps that end the schedule on the run's last
    optimizer step (`total_steps - 1`: the schedule's final rate is that of step
    `num_iters + 1`)."""
    if value != AUTO:
        return int(value)
    if total_steps is None:
        raise StepsUnknown(
            f"{owner}.{field}='auto' is the run's number of optimizer steps, which is not "
            "known here. Give the config to LearnerBuilder.build(...), which counts them "
            "(epochs x batches per process / gradient accumulation), or call "
            "init(total_steps=N)."
        )
    if total_steps < 2:
        raise ConfigError(
            f"{owner}.{field}='auto': the run has {total_steps} optimizer step(s); a schedule "
            "needs at least 2."
        )
    return total_steps - 1


def read_state(state: Any, owner: object, *keys: str) -> Mapping[str, Any]:
    """Check that `state` came from a scheduler of `owner`'s type and holds `keys`."""
    name = type(owner).__name__
    if not isinstance(state, Mapping):
        raise ConfigError(
            f"{name}.load_state_dict() expects the dict made by state_dict(), "
            f"got {type(state).__name__}."
        )
    if "type" not in state:
        raise ConfigError(
            f"The state given to {name}.load_state_dict() has no 'type' key: "
            "it was not made by an ember scheduler's state_dict()."
        )
    found = state["type"]
    if found != name:
        raise ConfigError(
            f"Cannot load the state of a {found} into a {name}: resume with the same "
            "kind of learning-rate scheduler the state was saved from."
        )
    for key in keys:
        if key not in state:
            raise ConfigError(f"The {name} state has no {key!r} key; it is incomplete.")
    return state


def read_count(state: Mapping[str, Any], owner: object, key: str = "step") -> int:
    """A step counter from a state: an integer >= 0 (integral floats are accepted)."""
    value = state[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(
            f"The {type(owner).__name__} state has {key!r} = {value!r}; expected an integer >= 0."
        )
    return value


def read_children(
    state: Mapping[str, Any], owner: object, children: list[LrScheduler], key: str = "schedulers"
) -> list[Any]:
    """The list of child states under `key`, checked to match the number of children."""
    value = state[key]
    if not isinstance(value, (list, tuple)) or len(value) != len(children):
        count = len(value) if isinstance(value, (list, tuple)) else type(value).__name__
        raise ConfigError(
            f"The {type(owner).__name__} state holds {count} scheduler states under {key!r}, "
            f"but this scheduler combines {len(children)}."
        )
    return list(value)


def lr_at_steps(scheduler: LrScheduler, n: int) -> list[float]:
    """Step `scheduler` `n` times and return the rates, e.g. to plot or check a schedule.

    The scheduler advances: build a fresh one (`config.init()`) to preview a run."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ConfigError(f"lr_at_steps() needs a step count >= 0, got {n!r}.")
    return [float(scheduler.step()) for _ in range(n)]
