"""Writes made durable as one phase (`ember.durable.together`): the targets change
together at the end of the block, each file and directory is fsynced once, and a
failure inside the block changes nothing."""

from __future__ import annotations

import os

import pytest

from ember.durable import atomic_write_bytes, sync_later, together


def count_fsyncs(monkeypatch):
    synced: list[str] = []
    real = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def test_two_files_and_an_append_are_durable_together(tmp_path, monkeypatch):
    first, second, log = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "log.jsonl"
    first.write_bytes(b"old a")
    log.write_bytes(b"line 1\n")
    synced = count_fsyncs(monkeypatch)
    with together():
        atomic_write_bytes(first, b"new a")
        atomic_write_bytes(second, b"new b")
        with open(log, "ab") as handle:
            handle.write(b"line 2\n")
            handle.flush()
            sync_later(log, handle.fileno())
        assert first.read_bytes() == b"old a"  # nothing replaced before the end
        assert not second.exists()
    assert first.read_bytes() == b"new a"
    assert second.read_bytes() == b"new b"
    assert log.read_bytes() == b"line 1\nline 2\n"
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.json", "log.jsonl"]
    # each temporary file, the appended file, and the directory once
    assert len(synced) == 4
    assert synced.count(str(tmp_path)) == 1
    assert str(log) in synced


def test_without_a_phase_each_write_is_durable_on_its_own(tmp_path, monkeypatch):
    synced = count_fsyncs(monkeypatch)
    atomic_write_bytes(tmp_path / "a", b"1")
    atomic_write_bytes(tmp_path / "b", b"2")
    assert synced.count(str(tmp_path)) == 2
    assert len(synced) == 4


def test_a_failure_inside_the_phase_leaves_every_file_as_it_was(tmp_path):
    first = tmp_path / "a.json"
    first.write_bytes(b"old a")
    with pytest.raises(RuntimeError, match="the history could not be written"):
        with together():
            atomic_write_bytes(first, b"new a")
            atomic_write_bytes(tmp_path / "b.json", b"new b")
            raise RuntimeError("the history could not be written")
    assert first.read_bytes() == b"old a"
    assert os.listdir(tmp_path) == ["a.json"]


def test_a_failed_rename_at_the_end_leaves_no_temporary_behind(tmp_path, monkeypatch):
    real = os.replace
    calls = []

    def replace_once(src, dst):
        calls.append(dst)
        if len(calls) > 1:
            raise OSError("disk on fire")
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace_once)
    with pytest.raises(OSError, match="disk on fire"):
        with together():
            atomic_write_bytes(tmp_path / "a", b"1")
            atomic_write_bytes(tmp_path / "b", b"2")
    assert os.listdir(tmp_path) == ["a"]
    assert (tmp_path / "a").read_bytes() == b"1"


def test_writing_a_file_twice_in_a_phase_keeps_the_last(tmp_path):
    with together():
        atomic_write_bytes(tmp_path / "a", b"first")
        atomic_write_bytes(tmp_path / "a", b"second")
    assert (tmp_path / "a").read_bytes() == b"second"
    assert os.listdir(tmp_path) == ["a"]
