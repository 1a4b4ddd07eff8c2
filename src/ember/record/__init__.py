"""Saving and loading modules, optimizers and training state: `ember.record`."""

from ember.record.aliases import CompactRecorder, DefaultRecorder, SensitiveCompactRecorder
from ember.record.atomic import atomic_write_bytes
from ember.record.binary import BinFileRecorder, BinGzFileRecorder
from ember.record.file_recorder import load
from ember.record.json import JsonGzFileRecorder, PrettyJsonFileRecorder
from ember.record.mpk import NamedMpkFileRecorder, NamedMpkGzFileRecorder
from ember.record.precision import Precision
from ember.record.protocol import Recorder
from ember.record.safetensors import SafetensorsFileRecorder

__all__ = [
    "BinFileRecorder",
    "BinGzFileRecorder",
    "CompactRecorder",
    "DefaultRecorder",
    "JsonGzFileRecorder",
    "NamedMpkFileRecorder",
    "NamedMpkGzFileRecorder",
    "Precision",
    "PrettyJsonFileRecorder",
    "Recorder",
    "SafetensorsFileRecorder",
    "SensitiveCompactRecorder",
    "atomic_write_bytes",
    "load",
]
