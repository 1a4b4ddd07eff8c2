"""Format details a user relies on: other tools can read the files, `load` sniffs the content."""

from __future__ import annotations

import gzip
import json

import msgpack
import pytest
import safetensors.torch
import torch
from record_testing import RECORDERS, assert_same, make_model, make_optimizer, nested_state

import ember
import ember.record as er


@pytest.mark.parametrize("cls", RECORDERS, ids=lambda c: c.file_extension)
def test_load_picks_the_reader_from_the_content_not_the_name(cls, tmp_path):
    model = make_model(seed=1)
    path = cls().save(model, tmp_path / "model")
    renamed = path.rename(tmp_path / "renamed.data")
    target = make_model(seed=2)
    assert er.load(target, renamed) is target
    assert_same(target.state_dict(), model.state_dict())

    state_path = cls().save(nested_state(), tmp_path / "state")
    assert_same(er.load(None, tmp_path / "state"), nested_state())  # extension left out
    assert_same(er.load(None, state_path), nested_state())


def test_safetensors_files_are_readable_by_safetensors(tmp_path):
    model = make_model(seed=3)
    path = er.SafetensorsFileRecorder().save(model, tmp_path / "model")
    tensors = safetensors.torch.load_file(path)
    assert sorted(tensors) == sorted(model.state_dict())
    for name, value in model.state_dict().items():
        assert_same(tensors[name], value, name)

    model = make_model(seed=4, dtype=torch.float64)
    half = er.SafetensorsFileRecorder(precision="half").save(model, tmp_path / "half")
    assert safetensors.torch.load_file(half)["fc1.weight"].dtype == torch.float16

    optimizer = make_optimizer(make_model())
    path = er.SafetensorsFileRecorder().save(optimizer, tmp_path / "optim")
    tensors = safetensors.torch.load_file(path)
    for index, entry in optimizer.state_dict()["state"].items():
        for name, value in entry.items():
            assert torch.equal(tensors[f"state.{index}.{name}"], value)


def test_safetensors_metadata_carries_the_header(tmp_path):
    path = er.SafetensorsFileRecorder().save(make_model(), tmp_path / "model")
    with safetensors.safe_open(path, "pt") as handle:
        metadata = handle.metadata()
    assert metadata["format"] == "pt"
    header = json.loads(metadata["ember"])
    assert header["format"] == "ember.safetensors" and header["kind"] == "module"
    assert header["ember_version"] == ember.__version__


def test_safetensors_written_by_other_tools_loads_as_a_state_dict(tmp_path):
    model = make_model(seed=5)
    path = tmp_path / "foreign.safetensors"
    safetensors.torch.save_file(dict(model.state_dict()), path)
    target = make_model(seed=6)
    er.load(target, path)
    assert_same(target.state_dict(), model.state_dict())


def test_safetensors_names_stay_unique_when_paths_collide(tmp_path):
    state = {
        "a.b": torch.ones(2),
        "a": {"b": torch.zeros(2)},
        "c": (torch.ones(1, dtype=torch.complex64),),  # no safetensors dtype: kept in metadata
    }
    path = er.SafetensorsFileRecorder().save(state, tmp_path / "s")
    assert sorted(safetensors.torch.load_file(path)) == ["a.b", "a.b#2"]
    assert_same(er.load(None, path), state)


def test_named_mpk_is_plain_msgpack_with_header_and_named_tensors(tmp_path):
    path = er.DefaultRecorder().save(make_model(), tmp_path / "model")
    document = msgpack.unpackb(path.read_bytes(), strict_map_key=False)
    assert list(document)[:5] == ["format", "version", "precision", "ember_version", "kind"]
    assert document["format"] == "ember.mpk" and document["version"] == 1
    assert document["precision"] == "full" and document["kind"] == "module"
    tensor = document["record"]["fc1.weight"]["$tensor"]
    assert tensor["dtype"] == "float32" and tensor["shape"] == [5, 6]
    assert len(tensor["data"]) == 5 * 6 * 4


def test_compressed_files_are_standard_gzip(tmp_path):
    path = er.CompactRecorder().save(make_model(), tmp_path / "model")
    assert path.name == "model.mpk.gz"
    inner = gzip.decompress(path.read_bytes())
    assert msgpack.unpackb(inner, strict_map_key=False)["precision"] == "half"


def test_pretty_json_is_indented_and_readable(tmp_path):
    state = {"step": 3, "lr": 0.5, "ids": {1: "one"}, "w": torch.ones(2)}
    path = er.PrettyJsonFileRecorder().save(state, tmp_path / "state")
    text = path.read_text()
    assert text.startswith('{\n  "format": "ember.json"')
    document = json.loads(text)
    assert document["record"]["step"] == 3 and document["record"]["lr"] == 0.5
    assert document["record"]["ids"] == {"$dict": [[1, "one"]]}
    assert document["record"]["w"]["$tensor"]["dtype"] == "float32"


def test_json_tensor_checksum_catches_edited_data(tmp_path):
    path = er.PrettyJsonFileRecorder().save({"w": torch.arange(4.0)}, tmp_path / "s")
    document = json.loads(path.read_text())
    document["record"]["w"]["$tensor"]["data"] = "AAAAAAAAAAAAAAAAAAAAAA=="
    path.write_text(json.dumps(document))
    with pytest.raises(ember.RecordError, match="checksum"):
        er.load(None, path)


def test_compact_recorder_shrinks_random_weights(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)
    )
    f32_bytes = sum(t.numel() * 4 for t in model.state_dict().values())
    ratios = {}
    for recorder in (
        er.CompactRecorder(),
        er.SensitiveCompactRecorder(),
        er.CompactRecorder(precision="bf16"),
    ):
        name = f"{type(recorder).__name__}-{recorder.precision.value}"
        path = recorder.save(model, tmp_path / name)
        ratios[recorder.precision.value, recorder.file_extension] = path.stat().st_size / f32_bytes
    # float16 alone is 0.5x; random float16 weights hold ~13 bits of entropy each (0.41x bound)
    assert ratios["half", "mpk.gz"] < 0.44
    assert ratios["half", "bin.gz"] < 0.44
    assert ratios["bf16", "mpk.gz"] < 0.37


def test_same_state_gives_identical_bytes(tmp_path):
    for cls in RECORDERS:
        if cls is er.SafetensorsFileRecorder:
            continue  # the safetensors library orders its header itself
        first = cls().save(nested_state(), tmp_path / "a").read_bytes()
        second = cls().save(nested_state(), tmp_path / "b").read_bytes()
        assert first == second, cls.__name__
