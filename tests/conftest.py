"""Fixtures shared by the suite (the task itself lives in ember_testing.py)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from ember_testing import BlobBatcher, BlobDataset, run_blobs_here


@pytest.fixture
def blobs():
    return BlobDataset(200), BlobDataset(90, seed=1)


@pytest.fixture
def loaders(blobs):
    from ember.data import DataLoaderBuilder

    train, valid = blobs
    return (
        DataLoaderBuilder(BlobBatcher()).batch_size(32).shuffle(7).build(train),
        DataLoaderBuilder(BlobBatcher()).batch_size(32).build(valid),
    )


@pytest.fixture
def quiet():
    """A plain renderer writing to a buffer, so tests can read what a user would see."""
    from ember.train.renderer import PlainRenderer

    stream = io.StringIO()
    renderer = PlainRenderer(interval=0.0, stream=stream)
    renderer.stream_text = stream  # type: ignore[attr-defined]
    return renderer


@pytest.fixture
def one_thread():
    """Tiny ops on one thread: a loop and its reference run alike either way, and on a
    busy machine intra-op threads only wait for each other."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def blob_straight(tmp_path_factory) -> Path:
    """The directory of one uninterrupted run of tests/scripts/train_blobs.py (default
    options, in this process): the reference that the script's stopped, killed and
    resumed runs must end like. Made once for the whole session."""
    directory = tmp_path_factory.mktemp("blob-straight")
    assert run_blobs_here(directory) == 0
    return directory
