"""DDP: every process holds the whole model; gradients are averaged after each backward."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from torch import nn

from ember.train.distributed import name_wait
from ember.train.parallel.batchnorm import broadcast_buffers

if TYPE_CHECKING:
    from ember.train.distributed import Distributed


class StepRouter(nn.Module):
    """Routes DDP's forward to the model's `train_step`, so gradients are synchronised
    even though the loop calls a step method rather than `forward`. Each finished step
    counts as progress for the hang detection."""

    def __init__(
        self, module: nn.Module, context: Distributed | None = None, broadcast: bool = False
    ) -> None:
        super().__init__()
        self.module = module
        self._context = context
        self._broadcast = broadcast

    def forward(self, batch: Any) -> Any:
        output = self.module.train_step(batch)  # type: ignore[operator]
        if self._broadcast:  # sync_batchnorm() on the CPU: rank 0's running statistics
            broadcast_buffers(self.module)
        if self._context is not None:
            self._context.progress += 1
        return output


class DdpParallel:
    """The model behind DDP, with `train_step` as its forward."""

    def __init__(self, model: nn.Module, context: Distributed, broadcast: bool = False) -> None:
        ids = [context.device] if context.device.type == "cuda" else None
        context.progress += 1
        self.module = nn.parallel.DistributedDataParallel(
            StepRouter(model, context, broadcast), device_ids=ids
        )
        context.progress += 1

    def __call__(self, batch: Any) -> Any:
        return self.module(batch)

    def no_sync(self) -> contextlib.AbstractContextManager[Any]:
        """Skip the gradient reduction (all but the last batch of a group)."""
        return self.module.no_sync()

    def join(self) -> contextlib.AbstractContextManager[Any]:
        """Ranks with fewer batches keep answering the others' reductions."""
        from torch.distributed.algorithms.join import Join

        return Join([self.module])


name_wait(DdpParallel.__init__.__code__, "the setup of DDP (the first broadcast of the weights)")
