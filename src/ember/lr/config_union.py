"""`LrSchedulerConfig`: any scheduler config, told apart by its `type`, so configs nest and
round-trip through `Config.save`/`load`."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Discriminator, Tag

from ember.lr.composed import ComposedLrSchedulerConfig
from ember.lr.constant import ConstantLrConfig
from ember.lr.cosine import CosineAnnealingLrSchedulerConfig
from ember.lr.exponential import ExponentialLrSchedulerConfig
from ember.lr.linear import LinearLrSchedulerConfig
from ember.lr.noam import NoamLrSchedulerConfig
from ember.lr.sequential import SequentialLrSchedulerConfig
from ember.lr.step import StepLrSchedulerConfig
from ember.lr.warmup import WarmupLrSchedulerConfig

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

for _nesting in (ComposedLrSchedulerConfig, SequentialLrSchedulerConfig, WarmupLrSchedulerConfig):
    _nesting.model_rebuild(_types_namespace={"LrSchedulerConfig": LrSchedulerConfig})
