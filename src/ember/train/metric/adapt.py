"""Turning a model output into the input a metric reads."""

from __future__ import annotations

from typing import Any

from ember.errors import TrainingError


def adapt(item: Any, input_type: type, metric_name: str = "metric") -> Any:
    """Return `item` as `input_type`, or raise a `TrainingError` that says how to fix it.

    An item is accepted when it already is an `input_type`, or when it has a method
    `adapt(self, input_type)` that returns one (returning None means "not supported").
    """
    if isinstance(item, input_type):
        return item
    adapter = getattr(item, "adapt", None)
    if callable(adapter):
        converted = adapter(input_type)
        if converted is not None and converted is not NotImplemented:
            if not isinstance(converted, input_type):
                raise TrainingError(
                    f"{type(item).__name__}.adapt({input_type.__name__}) returned a "
                    f"{type(converted).__name__}; it must return a {input_type.__name__} or None."
                )
            return converted
    raise TrainingError(
        f"The metric {metric_name!r} cannot read the step output {type(item).__name__}: it "
        f"needs a {input_type.__name__}. Return an output type that supports it "
        "(ClassificationOutput, RegressionOutput, ...), or give "
        f"{type(item).__name__} a method `adapt(self, input_type)` that returns "
        f"{input_type.__name__}(...) when asked for it."
    )
