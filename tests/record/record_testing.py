"""Helpers for the ember.record tests: small items to record and an exact comparison."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import torch
from torch import nn

import ember.record as er

RECORDERS = [
    er.NamedMpkFileRecorder,
    er.NamedMpkGzFileRecorder,
    er.BinFileRecorder,
    er.BinGzFileRecorder,
    er.PrettyJsonFileRecorder,
    er.JsonGzFileRecorder,
    er.SafetensorsFileRecorder,
]
PRECISIONS = ["full", "half", "bf16", "double"]


class Small(nn.Module):
    """Two linear layers, a float buffer and an int64 counter buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 5)
        self.fc2 = nn.Linear(5, 3)
        self.register_buffer("scale", torch.ones(5))
        self.register_buffer("seen", torch.zeros((), dtype=torch.int64))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(inputs)) * self.scale)


def make_model(seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A `Small` model with seeded random weights and buffers, in `dtype`."""
    torch.manual_seed(seed)
    model = Small()
    model.scale.uniform_(0.5, 2.0)
    model.seen.fill_(seed + 7)
    return model.to(dtype)


def make_optimizer(model: nn.Module, steps: int = 3) -> torch.optim.Optimizer:
    """Adam after a few steps on random data (tiny second moments included)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.8, 0.99))
    for i in range(steps):
        torch.manual_seed(100 + i)
        loss = model(torch.randn(8, 6, dtype=next(model.parameters()).dtype)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return optimizer


def nested_state() -> dict[Any, Any]:
    """A tree with every supported kind of value and key."""
    return {
        "weights": torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7,
        "half": torch.tensor([1.5, -2.25, 65504.0], dtype=torch.float16),
        "brain": torch.tensor([1.0, 3.0e38, -1.0e-20], dtype=torch.bfloat16),
        "counts": torch.tensor([1, 2**40, -3], dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 3),
        "complex": torch.tensor([1 + 2j, -3j], dtype=torch.complex64),
        "small_ints": [
            torch.tensor([-128, 127], dtype=torch.int8),
            torch.tensor([255, 0], dtype=torch.uint8),
            torch.tensor([65535, 1], dtype=torch.uint16),
            torch.tensor([2**32 - 1], dtype=torch.uint32),
        ],
        0: "int key zero",
        "0": "str key zero",
        7: {"nested": [1, [2, (3, "four")], {"deep": None}]},
        "floats": [0.1, -0.0, math.inf, -math.inf, math.nan, 5e-324, 1.7976931348623157e308],
        "ints": [0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 2**100, -(2**90)],
        "flags": (True, False),
        "text": "héllo ✓",
        "raw": b"\x00\x01\xffbytes",
        "none": None,
        "tuple": (1, 2.0, "three", (4,), []),
        "array": np.arange(6, dtype=np.uint32).reshape(2, 3),
        "farray": np.array([1.5, np.nan], dtype=">f8"),
        "npscalar": np.float64(0.25),
        "npint": np.int16(-7),
        "$tensor": "a key that looks like a tag",
        "tagged": {"$tuple": [1, 2]},
        (1, "a"): "tuple key",
        True: "bool key",
        "empty_dict": {},
        "empty_list": [],
    }


def rng_states() -> dict[str, Any]:
    """Every RNG state exact resume depends on, advanced away from their seeds."""
    random.seed(3)
    random.random()
    np.random.seed(4)
    np.random.rand(3)
    np.random.randn()  # leaves a cached gaussian in the numpy state
    torch.manual_seed(5)
    torch.rand(3)
    generator = torch.Generator().manual_seed(6)
    torch.rand(2, generator=generator)
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "generator": generator.get_state(),
    }


def assert_same(actual: Any, expected: Any, where: str = "state") -> None:
    """Exact equality including types: tuples stay tuples, key types and dtypes are kept."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{where}: {type(actual)}"
        assert actual.dtype == expected.dtype, f"{where}: {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, where
        assert torch.equal(actual.cpu(), expected.cpu()), where
        return
    if isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray), where
        assert actual.dtype.newbyteorder("=") == expected.dtype.newbyteorder("="), where
        np.testing.assert_array_equal(actual, expected, err_msg=where)
        return
    assert type(actual) is type(expected), f"{where}: {type(actual)} != {type(expected)}"
    if isinstance(expected, dict):
        assert list(actual) == list(expected), f"{where}: keys {list(actual)} != {list(expected)}"
        for key in expected:
            assert type(next(k for k in actual if k == key)) is type(key), f"{where}[{key!r}]"
            assert_same(actual[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{where}[{i}]")
    elif isinstance(expected, float) and math.isnan(expected):
        assert math.isnan(actual), where
    elif isinstance(expected, float):
        assert actual == expected and math.copysign(1, actual) == math.copysign(1, expected), where
    else:
        assert actual == expected, where


def checkpoint_state() -> dict[str, Any]:
    """Fixed values (no randomness) of every kind a checkpoint holds: weights, an optimizer's
    moments and hyperparameters, a scheduler, the position in the loop and an RNG state."""
    weight = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 8
    return {
        "model": {"fc.weight": weight, "fc.bias": torch.tensor([0.5, -0.25])},
        "optimizer": {
            "state": {
                0: {
                    "step": torch.tensor(3.0),
                    "exp_avg": weight / 10,
                    "exp_avg_sq": weight / 1000,
                }
            },
            "param_groups": [
                {
                    "lr": 0.01,
                    "betas": (0.9, 0.999),
                    "eps": 1e-08,
                    "weight_decay": 0.0,
                    "amsgrad": False,
                    "params": [0],
                }
            ],
        },
        "scheduler": {"last_epoch": 4, "_last_lr": [0.01]},
        "position": {"epoch": 2, "iteration": 17},
        "rng": random.Random(7).getstate(),
        "half": torch.tensor([1.5, -2.0], dtype=torch.float16),
    }
