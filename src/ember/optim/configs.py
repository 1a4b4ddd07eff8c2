"""Optimizer configs: serialisable settings that ember binds to a model's parameters.

The learning rate is not part of these configs: it comes from the learner's
scheduler and is written into the optimizer before every step.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from pydantic import Field

from ember.config import Config


class OptimizerFactory:
    """An optimizer not yet bound to parameters (what `XConfig.init()` returns)."""

    def __init__(self, name: str, build: Callable[[Iterable[Any], float], torch.optim.Optimizer]):
        self.name = name
        self._build = build

    def bind(self, parameters: Iterable[Any], lr: float) -> torch.optim.Optimizer:
        """A torch optimizer over `parameters` starting at learning rate `lr`."""
        return self._build(parameters, lr)

    def __repr__(self) -> str:
        return f"OptimizerFactory({self.name})"


def _adam_factory(config: Any, optimizer: Any) -> OptimizerFactory:
    """An Adam-family optimizer built from the config's betas, epsilon and decay."""

    def build(params: Iterable[Any], lr: float) -> torch.optim.Optimizer:
        return optimizer(
            params,
            lr=lr,
            betas=(config.beta_1, config.beta_2),
            eps=config.epsilon,
            weight_decay=config.weight_decay,
            amsgrad=config.amsgrad,
        )

    return OptimizerFactory(optimizer.__name__, build)


class AdamConfig(Config):
    """Adam (Kingma & Ba); `weight_decay` adds L2 to the gradients, as torch's Adam does.

    `epsilon` defaults to 1e-5, as in Burn, not torch's 1e-8: pass `epsilon=1e-8` to
    reproduce a script written with `torch.optim.Adam`'s defaults."""

    beta_1: float = Field(0.9, ge=0.0, lt=1.0)
    beta_2: float = Field(0.999, ge=0.0, lt=1.0)
    epsilon: float = Field(1e-5, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    amsgrad: bool = False

    def init(self) -> OptimizerFactory:
        return _adam_factory(self, torch.optim.Adam)


class AdamWConfig(AdamConfig):
    """AdamW: Adam with decoupled weight decay (default 1e-4)."""

    weight_decay: float = Field(1e-4, ge=0.0)

    def init(self) -> OptimizerFactory:
        return _adam_factory(self, torch.optim.AdamW)


class SgdConfig(Config):
    """Stochastic gradient descent with optional momentum, Nesterov and L2 weight decay."""

    momentum: float = Field(0.0, ge=0.0)
    dampening: float = Field(0.0, ge=0.0)
    nesterov: bool = False
    weight_decay: float = Field(0.0, ge=0.0)

    def init(self) -> OptimizerFactory:
        def build(params: Iterable[Any], lr: float) -> torch.optim.Optimizer:
            return torch.optim.SGD(
                params,
                lr=lr,
                momentum=self.momentum,
                dampening=self.dampening,
                nesterov=self.nesterov,
                weight_decay=self.weight_decay,
            )

        return OptimizerFactory("SGD", build)
