"""The memory of a training step, estimated before it runs: its peak bytes on the run's
device, by category, from the step run on fake tensors (`fake.py`); what `fit` does with
it on an accelerator, and what `build()` checks with it (`fits.py`)."""

from ember.train.memory_estimate.figures import MemoryEstimate, MemoryEstimateError

__all__ = ["MemoryEstimate", "MemoryEstimateError"]
