"""Data: the Batcher protocol and DataLoaderBuilder."""

from ember.data.batcher import Batcher
from ember.data.device import to_device
from ember.data.loader import DataLoaderBuilder
from ember.data.sampler import ResumableSampler

__all__ = ["Batcher", "DataLoaderBuilder", "ResumableSampler", "to_device"]
