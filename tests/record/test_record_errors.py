"""Files that do not fit, are foreign or come from the future: clear RecordErrors, no code run."""

from __future__ import annotations

import dataclasses
import gzip
import pickle
from pathlib import Path

import pytest
import torch
from record_testing import RECORDERS, make_model, make_optimizer

import ember.record as er
from ember.errors import ConfigError, EmberError, RecordError


class CreatesFile:
    """Unpickling this object creates the file it names: the classic pickle attack."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_record_error_is_an_ember_error():
    assert issubclass(RecordError, EmberError)


@pytest.mark.parametrize("name, compress", [("x.mpk.gz", True), ("x.mpk", False)])
def test_malicious_pickle_is_refused_and_never_run(tmp_path, name, compress):
    marker = tmp_path / "pwned"
    payload = pickle.dumps(CreatesFile(marker))
    path = tmp_path / name
    path.write_bytes(gzip.compress(payload) if compress else payload)
    recorder = er.CompactRecorder() if compress else er.DefaultRecorder()
    for attempt in (
        lambda: recorder.load(None, path),
        lambda: er.load(None, path),
        lambda: er.load(make_model(), path),
    ):
        with pytest.raises(RecordError) as info:
            attempt()
        assert str(path) in str(info.value)
        assert "pickle" in str(info.value)
    assert not marker.exists()


def test_torch_save_archive_is_refused(tmp_path):
    path = tmp_path / "model.mpk.gz"
    torch.save(make_model().state_dict(), path)
    with pytest.raises(RecordError, match="zip"):
        er.load(make_model(), path)
    with pytest.raises(RecordError, match="gzip"):
        er.CompactRecorder().load(None, path)


def test_wrong_shape_names_file_key_and_both_shapes(tmp_path):
    path = er.DefaultRecorder().save(torch.nn.Linear(4, 3), tmp_path / "linear")
    with pytest.raises(RecordError) as info:
        er.load(torch.nn.Linear(5, 3), path)
    message = str(info.value)
    assert str(path) in message and "'weight'" in message
    assert "(3, 4)" in message and "(3, 5)" in message


def test_missing_and_unexpected_keys_are_named(tmp_path):
    path = er.BinFileRecorder().save(torch.nn.Linear(4, 3, bias=False), tmp_path / "nobias")
    with pytest.raises(RecordError) as info:
        er.load(torch.nn.Linear(4, 3), path)
    assert str(path) in str(info.value)
    assert "missing key 'bias'" in str(info.value)

    path = er.BinFileRecorder().save(torch.nn.Linear(4, 3), tmp_path / "bias")
    with pytest.raises(RecordError, match="unexpected key 'bias'"):
        er.load(torch.nn.Linear(4, 3, bias=False), path)


def test_failed_module_load_leaves_the_model_untouched(tmp_path):
    source = make_model(seed=1)
    source.fc2 = torch.nn.Linear(5, 4)
    path = er.DefaultRecorder().save(source, tmp_path / "m")
    target = make_model(seed=2)
    before = target.fc1.weight.clone()
    with pytest.raises(RecordError, match="shape mismatch"):
        er.load(target, path)
    assert torch.equal(target.fc1.weight, before)


@pytest.mark.parametrize("cls", RECORDERS, ids=lambda c: c.file_extension)
def test_future_format_version_says_a_newer_ember_wrote_it(cls, tmp_path, monkeypatch):
    future = dataclasses.replace(cls.format, version=99)
    monkeypatch.setattr(cls, "format", future)
    path = cls().save(make_model(), tmp_path / "future")
    monkeypatch.undo()
    for attempt in (lambda: cls().load(None, path), lambda: er.load(make_model(), path)):
        with pytest.raises(RecordError) as info:
            attempt()
        message = str(info.value)
        assert str(path) in message and "version 99" in message and "newer ember" in message


def test_kind_mismatch_is_refused(tmp_path):
    model = make_model()
    optimizer_path = er.DefaultRecorder().save(make_optimizer(model), tmp_path / "optim")
    with pytest.raises(RecordError, match="optimizer record"):
        er.load(make_model(), optimizer_path)
    model_path = er.DefaultRecorder().save(model, tmp_path / "model")
    with pytest.raises(RecordError, match="module record"):
        er.load(torch.optim.SGD(model.parameters(), lr=0.1), model_path)


def test_optimizer_record_that_does_not_fit(tmp_path):
    model = make_model()
    path = er.DefaultRecorder().save(make_optimizer(model), tmp_path / "optim")
    other = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))])
    with pytest.raises(RecordError) as info:
        er.load(other, path)
    assert str(path) in str(info.value)


def test_unloadable_target_type(tmp_path):
    path = er.DefaultRecorder().save({"a": 1}, tmp_path / "s")
    with pytest.raises(RecordError, match="cannot load"):
        er.load(42, path)


def test_each_recorder_reads_only_its_own_format(tmp_path):
    path = er.BinFileRecorder().save(make_model(), tmp_path / "model")
    with pytest.raises(RecordError, match="ember.record.load"):
        er.NamedMpkFileRecorder().load(None, path)
    with pytest.raises(RecordError, match="gzip"):
        er.BinGzFileRecorder().load(None, path)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(RecordError, match="no record at"):
        er.load(None, tmp_path / "absent")
    with pytest.raises(RecordError) as info:
        er.DefaultRecorder().load(None, tmp_path / "absent.mpk")
    assert str(tmp_path / "absent.mpk") in str(info.value)
    (tmp_path / "folder.mpk").mkdir()
    with pytest.raises(RecordError, match="not a regular file"):
        er.DefaultRecorder().load(None, tmp_path / "folder.mpk")


def test_unsupported_values_fail_at_save_and_write_nothing(tmp_path):
    with pytest.raises(RecordError) as info:
        er.DefaultRecorder().save({"ok": 1, "bad": {1, 2}}, tmp_path / "bad")
    assert "set" in str(info.value) and "'bad'" in str(info.value)
    assert str(tmp_path / "bad.mpk") in str(info.value)
    assert list(tmp_path.iterdir()) == []

    loop: dict = {}
    loop["self"] = loop
    with pytest.raises(RecordError, match="nested"):
        er.DefaultRecorder().save(loop, tmp_path / "loop")


def test_invalid_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="precision"):
        er.DefaultRecorder(precision="quarter")
    with pytest.raises(ConfigError, match="kind"):
        er.DefaultRecorder().save({}, "unused", kind="weights")  # type: ignore[arg-type]


def test_ambiguous_name_without_extension(tmp_path):
    er.DefaultRecorder().save({"a": 1}, tmp_path / "twin")
    er.BinFileRecorder().save({"a": 2}, tmp_path / "twin")
    with pytest.raises(RecordError, match="ambiguous"):
        er.load(None, tmp_path / "twin")
    assert er.BinFileRecorder().load(None, tmp_path / "twin") == {"a": 2}


def forged_mpk(record: bytes) -> bytes:
    """An .mpk file with a valid header and checksum around hand-made record bytes."""
    import struct
    import zlib

    import msgpack

    head = {"format": "ember.mpk", "version": 1, "precision": "full"}
    head.update(ember_version="0", kind="state")
    body = b"\x87" + b"".join(msgpack.packb(k) + msgpack.packb(v) for k, v in head.items())
    body += msgpack.packb("record") + record
    return body + msgpack.packb("crc32") + b"\xce" + struct.pack(">I", zlib.crc32(body))


def _many(count: int, item: bytes) -> bytes:
    return b"".join(item for _ in range(count))


FORGED = {
    "a map declaring a million keys": b"\xdf" + (10**6).to_bytes(4, "big"),
    "a map holding a million keys": b"\xdf"
    + (10**6).to_bytes(4, "big")
    + b"".join(b"\xce" + i.to_bytes(4, "big") + b"\xc0" for i in range(10**6)),
    "a million empty maps": b"\xdd" + (10**6).to_bytes(4, "big") + _many(10**6, b"\x80"),
    "eight full maps": b"\x98"
    + _many(
        8,
        b"\xde\xff\xff" + b"".join(b"\xcd" + i.to_bytes(2, "big") + b"\xc0" for i in range(65535)),
    ),
}


@pytest.mark.parametrize("shape", list(FORGED))
def test_a_forged_record_is_refused_at_once_in_one_line(tmp_path, shape):
    import time
    import tracemalloc

    path = tmp_path / "forged.mpk"
    path.write_bytes(forged_mpk(FORGED[shape]))
    elapsed = []
    for _ in range(3):
        start = time.perf_counter()
        with pytest.raises(RecordError) as info:
            er.load(None, path)
        elapsed.append(time.perf_counter() - start)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    assert min(elapsed) < 0.1, elapsed
    tracemalloc.start()
    try:
        with pytest.raises(RecordError):
            er.load(None, path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak - path.stat().st_size < 100 * 2**20
