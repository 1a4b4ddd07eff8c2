"""Damaged and foreign files: whatever the bytes, only a RecordError naming the file escapes."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from record_testing import RECORDERS, make_model

import ember.record as er
from ember.errors import RecordError

FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
CHECKSUMMED = {"mpk", "bin"}  # every single-bit flip must be detected in these


def sample_bytes(cls: type) -> bytes:
    """A small but varied record: module weights plus scalars, written by `cls`."""
    model = make_model()
    state = {"model": model.state_dict(), "step": 3, "loss": 0.25, "tag": "x", "ids": (1, 2)}
    with tempfile.TemporaryDirectory() as directory:
        return cls().save(state, Path(directory) / "sample").read_bytes()


SAMPLES = {cls: sample_bytes(cls) for cls in RECORDERS}


TARGET = make_model(seed=1)


def outcome(cls: type, path: Path) -> list[str]:
    """Load `path` with the recorder and with `ember.record.load`; return what failed how."""
    failures = []
    for reader in (
        lambda p: cls().load(None, p),
        lambda p: er.load(None, p),
        lambda p: er.load(TARGET, p),
    ):
        try:
            reader(path)
        except RecordError as exc:
            assert str(path) in str(exc), f"message does not name the file: {exc}"
            failures.append(str(exc))
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
    failures = outcome(cls, write(tmp_path, cls, sample[:cut]))
    if sample[cut:].strip():  # losing only trailing whitespace leaves valid JSON
        assert len(failures) == 3


@FUZZ
@given(data=st.data())
def test_bit_flips_never_raise_anything_but_record_error(cls, tmp_path, data):
    sample = bytearray(SAMPLES[cls])
    flips = data.draw(st.lists(st.integers(0, len(sample) * 8 - 1), min_size=1, max_size=3))
    for bit in flips:
        sample[bit // 8] ^= 1 << (bit % 8)
    failures = outcome(cls, write(tmp_path, cls, bytes(sample)))
    if cls.file_extension in CHECKSUMMED and bytes(sample) != SAMPLES[cls]:
        assert len(failures) == 3


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
