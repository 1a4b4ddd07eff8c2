"""Damaged and foreign files: whatever the bytes, only a RecordError naming the file escapes,
and a damaged record never loads as different content."""

from __future__ import annotations

import gzip
import random
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from record_testing import RECORDERS, assert_same, checkpoint_state, make_model

import ember.record as er
from ember.errors import RecordError
from ember.record.gz import gzip_bytes

FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
CORRUPTIONS_PER_FORMAT = 150


def sample_state() -> dict[str, Any]:
    """A small but varied record: weights, optimizer, scheduler, position, RNG and scalars."""
    state: dict[str, Any] = {"weights": dict(make_model().state_dict()), **checkpoint_state()}
    state.update(step=3, loss=0.25, tag="x", ids=(1, 2))
    return state


def sample_bytes(cls: type) -> bytes:
    with tempfile.TemporaryDirectory() as directory:
        return cls().save(sample_state(), Path(directory) / "sample").read_bytes()


SAMPLES = {cls: sample_bytes(cls) for cls in RECORDERS}
ORIGINAL = sample_state()
TARGET = make_model(seed=1)


def outcome(cls: type, path: Path) -> list[str]:
    """Load `path` with the recorder, with `ember.record.load` and into a module.

    Each attempt must either fail with a RecordError naming the file or give back exactly
    the saved state (the sample never fits the module, so that attempt always fails).
    Returns the messages of the failures.
    """
    failures = []
    for reader in (
        lambda p: cls().load(None, p),
        lambda p: er.load(None, p),
        lambda p: er.load(TARGET, p),
    ):
        try:
            loaded = reader(path)
        except RecordError as exc:
            assert str(path) in str(exc), f"message does not name the file: {exc}"
            failures.append(str(exc))
        else:
            assert_same(loaded, ORIGINAL, "silently loaded")
    return failures


def write(directory: Path, cls: type, data: bytes) -> Path:
    path = directory / f"fuzzed.{cls.file_extension}"
    path.write_bytes(data)
    return path


@pytest.fixture(params=RECORDERS, ids=lambda c: c.file_extension)
def cls(request: pytest.FixtureRequest) -> type:
    return request.param


@FUZZ
@given(data=st.data())
def test_truncated_files_are_refused(cls, tmp_path, data):
    sample = SAMPLES[cls]
    cut = data.draw(st.integers(0, len(sample) - 1))
    assert len(outcome(cls, write(tmp_path, cls, sample[:cut]))) == 3


@FUZZ
@given(data=st.data())
def test_bit_flips_are_refused_or_change_nothing(cls, tmp_path, data):
    sample = bytearray(SAMPLES[cls])
    flips = data.draw(st.lists(st.integers(0, len(sample) * 8 - 1), min_size=1, max_size=3))
    for bit in flips:
        sample[bit // 8] ^= 1 << (bit % 8)
    outcome(cls, write(tmp_path, cls, bytes(sample)))


def corrupt(rng: random.Random, data: bytes) -> bytes:
    """One random corruption: flipped bits, replaced bytes or one decimal digit changed."""
    out = bytearray(data)
    kind = rng.choice(["bits", "bytes", "digit"])
    digits = [i for i, byte in enumerate(out) if 0x30 <= byte <= 0x39]
    if kind == "digit" and digits:
        at = rng.choice(digits)
        out[at] = rng.choice([d for d in b"0123456789" if d != out[at]])
    elif kind == "bytes":
        for _ in range(rng.randint(1, 3)):
            out[rng.randrange(len(out))] = rng.randrange(256)
    else:
        for _ in range(rng.randint(1, 3)):
            bit = rng.randrange(len(out) * 8)
            out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def test_random_corruptions_never_load_different_content(cls, tmp_path):
    """Corrupt the file, or for gzipped records the content (then gzip it again)."""
    rng = random.Random(f"corrupt {cls.file_extension}")
    sample = SAMPLES[cls]
    gzipped = cls.file_extension.endswith(".gz")
    inner = gzip.decompress(sample) if gzipped else sample
    refused = unchanged = 0
    for _ in range(CORRUPTIONS_PER_FORMAT):
        if gzipped and rng.random() < 0.5:
            data = gzip_bytes(corrupt(rng, inner))
        else:
            data = corrupt(rng, sample)
        if data == sample:
            continue
        path = write(tmp_path, cls, data)
        failures = []
        for reader in (lambda p: cls().load(None, p), lambda p: er.load(None, p)):
            try:
                loaded = reader(path)
            except RecordError as exc:
                assert str(path) in str(exc)
                failures.append(exc)
            else:
                assert_same(loaded, ORIGINAL, "silently loaded")
        refused += len(failures) == 2
        unchanged += not failures
    assert refused + unchanged > 0.9 * CORRUPTIONS_PER_FORMAT
    assert refused > 0.9 * CORRUPTIONS_PER_FORMAT  # harmless changes (gzip padding) are rare


@FUZZ
@given(noise=st.binary(max_size=400), keep=st.integers(0, 64))
def test_random_bytes_after_a_valid_start_are_refused(cls, tmp_path, noise, keep):
    sample = SAMPLES[cls]
    data = sample[:keep] + noise
    if data == sample:
        return
    assert len(outcome(cls, write(tmp_path, cls, data))) == 3


@pytest.mark.parametrize("data", [b"", b"\x00", b"\x1f\x8b", b"{}", b"[]", b"\x80\x04N."])
def test_tiny_and_empty_files_are_refused(cls, tmp_path, data):
    path = write(tmp_path, cls, data)
    failures = outcome(cls, path)
    assert len(failures) == 3
    if not data:
        assert all("empty" in message for message in failures)


def test_model_target_survives_a_damaged_file(tmp_path):
    model = make_model(seed=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    path = er.DefaultRecorder().save(make_model(seed=4), tmp_path / "m")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(RecordError, match="checksum"):
        er.load(model, path)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key])
