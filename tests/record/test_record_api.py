"""The public surface: names, extensions, paths, precisions and the Recorder protocol."""

from __future__ import annotations

import pytest
import torch
from ember_testing import fresh
from record_testing import RECORDERS, make_model

import ember.record as er
from ember.record import Precision

EXTENSIONS = {
    er.NamedMpkFileRecorder: "mpk",
    er.NamedMpkGzFileRecorder: "mpk.gz",
    er.BinFileRecorder: "bin",
    er.BinGzFileRecorder: "bin.gz",
    er.PrettyJsonFileRecorder: "json",
    er.JsonGzFileRecorder: "json.gz",
    er.SafetensorsFileRecorder: "safetensors",
}


@pytest.mark.parametrize("cls", RECORDERS, ids=lambda c: c.file_extension)
def test_recorders_follow_the_protocol(cls):
    recorder = cls()
    assert isinstance(recorder, er.Recorder)
    assert recorder.file_extension == EXTENSIONS[cls]
    assert recorder.precision is Precision.FULL
    assert cls(precision="bf16").precision is Precision.BF16


@pytest.mark.parametrize("cls", RECORDERS, ids=lambda c: c.file_extension)
def test_save_appends_extension_and_creates_directories(cls, tmp_path):
    recorder = cls()
    path = recorder.save({"a": 1}, tmp_path / "out" / "deep" / "model")
    assert path == tmp_path / "out" / "deep" / f"model.{cls.file_extension}"
    assert path.is_file()
    again = recorder.save({"a": 2}, str(path))
    assert again == path
    assert recorder.load(None, str(tmp_path / "out" / "deep" / "model")) == {"a": 2}
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_aliases_fix_format_and_precision():
    assert isinstance(er.DefaultRecorder(), er.NamedMpkFileRecorder)
    assert er.DefaultRecorder().precision is Precision.FULL
    assert isinstance(er.CompactRecorder(), er.NamedMpkGzFileRecorder)
    assert er.CompactRecorder().precision is Precision.HALF
    assert er.CompactRecorder().file_extension == "mpk.gz"
    assert isinstance(er.SensitiveCompactRecorder(), er.BinGzFileRecorder)
    assert er.SensitiveCompactRecorder().precision is Precision.HALF
    assert er.CompactRecorder(precision="bf16").precision is Precision.BF16


def test_compact_save_of_a_model_goes_to_mpk_gz(tmp_path):
    path = er.CompactRecorder().save(make_model(), tmp_path / "out" / "model")
    assert path == tmp_path / "out" / "model.mpk.gz"


def test_precision_values_and_dtypes():
    assert [p.value for p in Precision] == ["full", "half", "bf16", "double"]
    assert Precision.HALF.dtype == torch.float16
    assert Precision.parse("double") is Precision.DOUBLE
    assert Precision.parse(torch.bfloat16) is Precision.BF16
    assert Precision.parse(Precision.FULL) is Precision.FULL


def test_public_names():
    assert sorted(er.__all__) == sorted(
        [
            "Recorder",
            "Precision",
            "NamedMpkFileRecorder",
            "NamedMpkGzFileRecorder",
            "BinFileRecorder",
            "BinGzFileRecorder",
            "PrettyJsonFileRecorder",
            "JsonGzFileRecorder",
            "SafetensorsFileRecorder",
            "DefaultRecorder",
            "CompactRecorder",
            "SensitiveCompactRecorder",
            "load",
            "atomic_write_bytes",
        ]
    )


def test_importing_ember_record_does_not_import_safetensors():
    code = "import sys, json, ember.record; print(json.dumps('safetensors' in sys.modules))"
    assert fresh(code) is False
