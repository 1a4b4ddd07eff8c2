"""atomic_write_bytes: a failure at any point leaves the old file whole and no temp file."""

from __future__ import annotations

import os

import pytest

import ember.record as er
from ember.errors import RecordError


def test_writes_and_replaces(tmp_path):
    path = tmp_path / "file.bin"
    er.atomic_write_bytes(path, b"first")
    er.atomic_write_bytes(path, b"second")
    assert path.read_bytes() == b"second"
    assert os.listdir(tmp_path) == ["file.bin"]


def test_failing_replace_keeps_old_file_and_removes_temp(tmp_path, monkeypatch):
    path = tmp_path / "file.bin"
    path.write_bytes(b"old contents")

    def refuse(*args, **kwargs):
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk on fire"):
        er.atomic_write_bytes(path, b"new contents")
    assert path.read_bytes() == b"old contents"
    assert os.listdir(tmp_path) == ["file.bin"]


@pytest.mark.parametrize("error", [OSError("no space left"), KeyboardInterrupt()])
def test_write_failing_midway_keeps_old_file_and_removes_temp(tmp_path, monkeypatch, error):
    path = tmp_path / "file.bin"
    path.write_bytes(b"old contents")
    real_write = os.write
    calls = []

    def half_then_fail(fd, data):
        calls.append(len(data))
        if len(calls) > 1:
            raise error
        return real_write(fd, bytes(data[: len(data) // 2]))

    monkeypatch.setattr(os, "write", half_then_fail)
    with pytest.raises(type(error)):
        er.atomic_write_bytes(path, b"x" * 10_000)
    assert len(calls) == 2  # a partial write happened before the failure
    assert path.read_bytes() == b"old contents"
    assert os.listdir(tmp_path) == ["file.bin"]


def test_failing_fsync_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "file.bin"
    path.write_bytes(b"old")

    def refuse(fd):
        raise OSError("fsync failed")

    monkeypatch.setattr(os, "fsync", refuse)
    with pytest.raises(OSError):
        er.atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["file.bin"]


def test_recorder_save_failure_keeps_previous_record(tmp_path, monkeypatch):
    recorder = er.DefaultRecorder()
    path = recorder.save({"step": 1}, tmp_path / "state")

    def refuse(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(RecordError) as info:
        recorder.save({"step": 2}, tmp_path / "state")
    assert str(path) in str(info.value) and "No space left" in str(info.value)
    monkeypatch.undo()
    assert recorder.load(None, path) == {"step": 1}
    assert os.listdir(tmp_path) == ["state.mpk"]


def test_new_files_get_normal_permissions(tmp_path):
    if os.name == "nt":
        pytest.skip("POSIX permissions")
    umask = os.umask(0o022)
    os.umask(umask)
    path = tmp_path / "file.bin"
    er.atomic_write_bytes(path, b"data")
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
