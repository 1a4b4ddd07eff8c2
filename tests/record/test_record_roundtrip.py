"""Every recorder, at every precision, gives back what was saved: modules, optimizers, state."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from record_testing import (
    PRECISIONS,
    RECORDERS,
    assert_same,
    make_model,
    make_optimizer,
    nested_state,
    rng_states,
)

import ember.record as er

TOLERANCE = {"full": 0.0, "double": 0.0, "half": 1e-3, "bf16": 8e-3}


def assert_module_close(loaded: torch.nn.Module, source: torch.nn.Module, precision: str) -> None:
    for (name, got), want in zip(loaded.state_dict().items(), source.state_dict().values()):
        if got.is_floating_point():
            tol = TOLERANCE[precision]
            torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol, msg=name)
        else:
            assert got.dtype == want.dtype and torch.equal(got, want), name


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("cls", RECORDERS, ids=lambda c: c.file_extension)
def test_module_round_trip(cls, precision, tmp_path):
    source = make_model(seed=1)
    recorder = cls(precision=precision)
    path = recorder.save(source, tmp_path / "model")
    assert path == tmp_path / f"model.{cls.file_extension}"

    target = make_model(seed=2)
    assert recorder.load(target, tmp_path / "model") is target
    assert_module_close(target, source, precision)
    assert target.seen.dtype == torch.int64
    assert target.seen.item() == 8

    wide = make_model(seed=3, dtype=torch.float64)
    recorder.load(wide, path)
    assert wide.fc1.weight.dtype == torch.float64
    assert_module_close(wide, source, precision)

    narrow = make_model(seed=4, dtype=torch.float16)
    recorder.load(narrow, path)
    assert narrow.fc1.weight.dtype == torch.float16
    assert_module_close(narrow, source.half(), "bf16" if precision == "bf16" else "half")


@pytest.mark.parametrize("cls", RECORDERS, ids=lambda c: c.file_extension)
def test_precision_sets_the_stored_dtype_of_module_weights(cls, tmp_path):
    source = make_model()
    for precision, dtype in [
        ("full", torch.float32),
        ("half", torch.float16),
        ("bf16", torch.bfloat16),
        ("double", torch.float64),
    ]:
        path = cls(precision=precision).save(source, tmp_path / precision)
        stored = er.load(None, path)
        assert stored["fc1.weight"].dtype == dtype
        assert stored["seen"].dtype == torch.int64


@pytest.mark.parametrize("cls", RECORDERS, ids=lambda c: c.file_extension)
def test_full_precision_never_narrows_a_weight(cls, tmp_path):
    """ "full" stores float32, but a float64 weight as float64: a double-precision
    model comes back bit for bit (what exact resume needs); a float16 one is widened
    to float32, which loses nothing either."""
    for dtype, stored in [(torch.float64, torch.float64), (torch.float16, torch.float32)]:
        source = make_model(seed=7, dtype=dtype)
        path = cls(precision="full").save(source, tmp_path / str(dtype))
        assert er.load(None, path)["fc1.weight"].dtype == stored
        target = make_model(seed=8, dtype=dtype)
        er.load(target, path)
        assert_same(target.state_dict(), source.state_dict())


def test_half_record_into_double_model_and_double_record_into_half_model(tmp_path):
    source = make_model(seed=5, dtype=torch.float64)
    half = er.CompactRecorder().save(source, tmp_path / "half")
    target = make_model(seed=6, dtype=torch.float64)
    er.load(target, half)
    assert target.fc1.weight.dtype == torch.float64
    torch.testing.assert_close(target.fc1.weight, source.fc1.weight, rtol=1e-3, atol=1e-3)

    double = er.DefaultRecorder(precision="double").save(source, tmp_path / "double")
    small = make_model(seed=7, dtype=torch.float16)
    er.load(small, double)
    assert torch.equal(small.fc1.weight, source.fc1.weight.half())


@pytest.mark.parametrize("precision", ["full", "half"])
@pytest.mark.parametrize("cls", RECORDERS, ids=lambda c: c.file_extension)
def test_optimizer_state_is_exact_and_training_resumes_identically(cls, precision, tmp_path):
    model = make_model(seed=8)
    optimizer = make_optimizer(model)
    recorder = cls(precision=precision)
    model_path = er.DefaultRecorder().save(model, tmp_path / "model")
    path = recorder.save(optimizer, tmp_path / "optim")

    stored = recorder.load(None, path)
    assert_same(stored, optimizer.state_dict())  # int keys, tuples, float32 moments: all exact

    twin = make_model(seed=9)
    er.load(twin, model_path)
    twin_optimizer = torch.optim.Adam(twin.parameters(), lr=0.5)
    assert recorder.load(twin_optimizer, path) is twin_optimizer
    assert twin_optimizer.param_groups[0]["lr"] == 1e-2
    assert twin_optimizer.param_groups[0]["betas"] == (0.8, 0.99)
    for original, copy in ((model, optimizer), (twin, twin_optimizer)):
        torch.manual_seed(42)
        copy.zero_grad()
        original(torch.randn(8, 6)).pow(2).mean().backward()
        copy.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def test_compact_recorder_keeps_tiny_adam_moments(tmp_path):
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 6)).sum().mul(1e-4).backward()  # small gradients, tiny second moments
    optimizer.step()
    state = optimizer.state_dict()["state"]
    tiny = min(v["exp_avg_sq"][v["exp_avg_sq"] > 0].min().item() for v in state.values())
    assert tiny < 6e-8  # below float16's smallest subnormal: half precision would zero it
    stored = er.CompactRecorder().load(None, er.CompactRecorder().save(optimizer, tmp_path / "o"))
    for key, value in state.items():
        assert stored["state"][key]["exp_avg_sq"].dtype == torch.float32
        assert torch.equal(stored["state"][key]["exp_avg_sq"], value["exp_avg_sq"])


@pytest.mark.parametrize("cls", RECORDERS, ids=lambda c: c.file_extension)
def test_scheduler_state_round_trip(cls, tmp_path):
    model = make_model()
    optimizer = make_optimizer(model, steps=1)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=20)
    for _ in range(4):
        optimizer.step()
        scheduler.step()
    path = cls(precision="half").save(scheduler, tmp_path / "sched")
    assert_same(er.load(None, path), scheduler.state_dict())

    fresh_optimizer = make_optimizer(make_model(), steps=1)
    fresh = torch.optim.lr_scheduler.OneCycleLR(fresh_optimizer, max_lr=0.1, total_steps=20)
    assert cls().load(fresh, path) is fresh
    optimizer.step()
    fresh_optimizer.step()
    scheduler.step()
    fresh.step()
    assert fresh.get_last_lr() == scheduler.get_last_lr()


@pytest.mark.parametrize("precision", ["full", "half"])
@pytest.mark.parametrize("cls", RECORDERS, ids=lambda c: c.file_extension)
def test_nested_state_round_trips_exactly(cls, precision, tmp_path):
    state = nested_state()
    path = cls(precision=precision).save(state, tmp_path / "state")
    assert_same(cls().load(None, path), state)
    assert_same(er.load({}, path), state)


@pytest.mark.parametrize("cls", RECORDERS, ids=lambda c: c.file_extension)
def test_rng_states_round_trip_and_resume_the_same_streams(cls, tmp_path):
    states = rng_states()
    expected = (random.random(), np.random.rand(), np.random.randn(), torch.rand(2))
    generator = torch.Generator()
    generator.set_state(states["generator"])
    expected_generator = torch.rand(3, generator=generator)

    path = cls(precision="half").save(states, tmp_path / "rng")
    loaded = er.load(None, path)
    assert_same(loaded, states)

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    random.setstate(loaded["python"])
    np.random.set_state(loaded["numpy"])
    torch.set_rng_state(loaded["torch"])
    assert random.random() == expected[0]
    assert np.random.rand() == expected[1]
    assert np.random.randn() == expected[2]  # the cached gaussian survived
    assert torch.equal(torch.rand(2), expected[3])
    restored = torch.Generator()
    restored.set_state(loaded["generator"])
    assert torch.equal(torch.rand(3, generator=restored), expected_generator)


@pytest.mark.parametrize("cls", RECORDERS, ids=lambda c: c.file_extension)
def test_kind_state_stores_module_weights_losslessly(cls, tmp_path):
    model = make_model(dtype=torch.float64)
    path = cls(precision="half").save(model, tmp_path / "m", kind="state")
    stored = er.load(None, path)
    assert stored["fc1.weight"].dtype == torch.float64
    target = make_model(seed=11, dtype=torch.float64)
    er.load(target, path)
    assert_same(target.state_dict(), model.state_dict())


def test_device_argument_places_loaded_tensors(tmp_path):
    path = er.DefaultRecorder().save({"w": torch.ones(2), "n": 3}, tmp_path / "s")
    loaded = er.load(None, path, device="meta")
    assert loaded["w"].device.type == "meta"
    assert loaded["n"] == 3
    assert er.load(None, path)["w"].device.type == "cpu"


def test_loading_into_an_object_with_load_state_dict(tmp_path):
    class Counter:
        def __init__(self) -> None:
            self.count = 0

        def state_dict(self) -> dict:
            return {"count": self.count}

        def load_state_dict(self, state: dict) -> None:
            self.count = state["count"]

    counter = Counter()
    counter.count = 12
    path = er.BinFileRecorder().save(counter, tmp_path / "counter")
    fresh = Counter()
    assert er.load(fresh, path) is fresh
    assert fresh.count == 12


@pytest.mark.parametrize("cls", RECORDERS, ids=lambda c: c.file_extension)
def test_views_shared_tensors_and_tied_weights(cls, tmp_path):
    base = torch.arange(24.0).reshape(4, 6)
    state = {
        "transposed": base.t(),
        "strided": base[1:3, ::2],
        "same": base,
        "again": base,
        "param": torch.nn.Parameter(torch.ones(2)),
    }
    loaded = er.load(None, cls().save(state, tmp_path / "views"))
    for key, value in state.items():
        assert_same(loaded[key], value.detach(), key)

    def tied() -> torch.nn.Module:
        model = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 5, bias=False))
        model[1].weight = model[0].weight
        return model

    source = tied()
    target = tied()
    er.load(target, cls().save(source, tmp_path / "tied"))
    assert torch.equal(target[1].weight, source[0].weight)
    assert target[1].weight is target[0].weight
