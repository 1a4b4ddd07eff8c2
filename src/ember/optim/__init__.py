"""Optimizer configs that ember binds to a model's parameters."""

from ember.optim.configs import AdamConfig, AdamWConfig, OptimizerFactory, SgdConfig

__all__ = ["AdamConfig", "AdamWConfig", "OptimizerFactory", "SgdConfig"]
