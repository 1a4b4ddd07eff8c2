"""Models from other libraries, trained without step methods of their own."""

from ember.train.adapters.output import ForwardOutput
from ember.train.adapters.steps import LossFromModel

__all__ = ["ForwardOutput", "LossFromModel"]
