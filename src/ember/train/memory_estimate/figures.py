"""What the memory estimate reports: one step's peak bytes by category."""

from __future__ import annotations

import dataclasses

from ember.errors import TrainingError
from ember.train.memory import size_text


class MemoryEstimateError(TrainingError):
    """The step could not be run on fake tensors, so its memory is not estimated."""


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """The peak bytes of one training step on `device`, and what is live at that peak:
    the parameters (with the buffers), their gradients, the optimizer state, the
    activations (with the batch) and the temporaries (gradients of activations, the
    optimizer step's scratch). Under FSDP the figures are one process's."""

    peak: int
    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    temporaries: int
    device: str
    split: int = 1
    """The micro-batches each batch is cut into (`grads_accumulation("auto")`)."""
    processes: int = 1
    """The processes the model is sharded over (FSDP); 1 otherwise."""

    @property
    def resident(self) -> int:
        """What stays on the device between steps: parameters and optimizer state."""
        return self.parameters + self.optimizer_state

    def __str__(self) -> str:
        parts = [
            ("parameters", self.parameters),
            ("gradients", self.gradients),
            ("optimizer state", self.optimizer_state),
            ("activations", self.activations),
            ("temporaries", self.temporaries),
        ]
        where = [self.device]
        if self.split > 1:
            where.append(f"batch split into {self.split}")
        if self.processes > 1:
            where.append(f"per process of {self.processes}")
        listing = ", ".join(f"{name} {size_text(size)}" for name, size in parts)
        return f"peak {size_text(self.peak)} ({'; '.join(where)}): {listing}"
