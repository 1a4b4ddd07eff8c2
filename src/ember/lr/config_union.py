"""`LrSchedulerConfig`: any scheduler config, told apart by its `type`, so configs nest and
round-trip through `Config.save`/`load`; with the configs that nest it (composed,
sequential, warm-up), whose schedulers are in `ember.lr.nesting`."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, ValidationInfo, field_validator

from ember.lr._common import SchedulerConfigBase
from ember.lr.constant import ConstantLrConfig
from ember.lr.cosine import CosineAnnealingLrSchedulerConfig
from ember.lr.exponential import ExponentialLrSchedulerConfig
from ember.lr.linear import LinearLrSchedulerConfig
from ember.lr.nesting import (
    ComposedLrScheduler,
    SchedulerReduction,
    SequentialLrScheduler,
    WarmupLrScheduler,
    milestone_problem,
)
from ember.lr.noam import NoamLrSchedulerConfig
from ember.lr.step import StepLrSchedulerConfig

_KINDS = "constant, noam, exponential, cosine, linear, step, composed, sequential, warmup"


def _kind(value: Any) -> str | None:
    """The `type` of a scheduler config or its dict; `ConstantLrConfig` has none: "constant"."""
    if isinstance(value, dict):
        if "type" in value:
            return value["type"] if isinstance(value["type"], str) else None
        return "constant" if "lr" in value else None
    if isinstance(value, ConstantLrConfig):
        return "constant"
    kind = getattr(value, "type", None)
    return kind if isinstance(kind, str) else None


class ComposedLrSchedulerConfig(SchedulerConfigBase):
    """Config of `ComposedLrScheduler`: every scheduler is stepped at each step and the rates
    are multiplied (`prod`, the default), added (`sum`) or averaged (`avg`)."""

    type: Literal["composed"] = "composed"
    schedulers: list[LrSchedulerConfig] = Field(min_length=1, description="Schedulers to combine.")
    reduction: SchedulerReduction = Field(
        default="prod", description="prod, sum or avg of their rates."
    )

    def init(self, total_steps: int | None = None) -> ComposedLrScheduler:
        """The scheduler; `total_steps` resolves the "auto" step counts inside."""
        return ComposedLrScheduler(
            [config.init(total_steps) for config in self.schedulers], self.reduction
        )


class SequentialLrSchedulerConfig(SchedulerConfigBase):
    """Config of `SequentialLrScheduler`: scheduler i gives the rates up to global step
    `milestones[i]`; the next one then starts from its own first step."""

    type: Literal["sequential"] = "sequential"
    schedulers: list[LrSchedulerConfig] = Field(min_length=1, description="Schedulers, in order.")
    milestones: list[int] = Field(
        default_factory=list, description="Global steps at which the next scheduler takes over."
    )

    @field_validator("milestones")
    @classmethod
    def _fit_schedulers(cls, value: list[int], info: ValidationInfo) -> list[int]:
        schedulers = info.data.get("schedulers")
        problem = milestone_problem(value, None if schedulers is None else len(schedulers))
        if problem is not None:
            raise ValueError(f"milestones {problem}")
        return value

    def init(self, total_steps: int | None = None) -> SequentialLrScheduler:
        """The scheduler; with `total_steps`, each scheduler's "auto" step count is the
        length of its segment (the last one ends with the run)."""
        starts = [0, *self.milestones]
        ends: list[int | None] = [*self.milestones, total_steps]
        schedulers = [
            config.init(None if end is None else end - start)
            for config, start, end in zip(self.schedulers, starts, ends)
        ]
        return SequentialLrScheduler(schedulers, self.milestones)


class WarmupLrSchedulerConfig(SchedulerConfigBase):
    """Config of `WarmupLrScheduler`: at step s (from 1) the rate is the wrapped scheduler's
    rate times `start_factor + (1 - start_factor) * min(s - 1, warmup_steps) / warmup_steps`."""

    type: Literal["warmup"] = "warmup"
    scheduler: LrSchedulerConfig = Field(description="The schedule to warm up into.")
    warmup_steps: int = Field(ge=1, description="Steps run below the full rate.")
    start_factor: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="Fraction of the rate at step 1.",
    )

    def init(self, total_steps: int | None = None) -> WarmupLrScheduler:
        """The scheduler; `total_steps` resolves an "auto" step count of the wrapped one
        (it is stepped from the first step, so it spans the whole run too)."""
        return WarmupLrScheduler(
            self.scheduler.init(total_steps), self.warmup_steps, self.start_factor
        )


LrSchedulerConfig = Annotated[
    Union[
        Annotated[ConstantLrConfig, Tag("constant")],
        Annotated[NoamLrSchedulerConfig, Tag("noam")],
        Annotated[ExponentialLrSchedulerConfig, Tag("exponential")],
        Annotated[CosineAnnealingLrSchedulerConfig, Tag("cosine")],
        Annotated[LinearLrSchedulerConfig, Tag("linear")],
        Annotated[StepLrSchedulerConfig, Tag("step")],
        Annotated[ComposedLrSchedulerConfig, Tag("composed")],
        Annotated[SequentialLrSchedulerConfig, Tag("sequential")],
        Annotated[WarmupLrSchedulerConfig, Tag("warmup")],
    ],
    Discriminator(
        _kind,
        custom_error_type="lr_scheduler_type",
        custom_error_message=f"expected a scheduler config whose 'type' is one of {_KINDS}",
    ),
]
"""Any ember scheduler config; use it as a field type to let a config hold any schedule."""

# The nesting configs name the union, defined after them: they are completed now.
for _nesting in (ComposedLrSchedulerConfig, SequentialLrSchedulerConfig, WarmupLrSchedulerConfig):
    _nesting.model_rebuild()
