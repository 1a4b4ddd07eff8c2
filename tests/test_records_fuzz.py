"""Seeded damage to every kind of file of a run, then a resume: it is refused with a
message naming the damaged file and a fix, or it ends exactly as the resume of the
undamaged run does. Following the fix (`ember repair`, an earlier checkpoint, removing
the lock) then ends exactly too, or `ember repair` says what cannot be rebuilt. A resume
that goes on from damaged records with other weights or other history is never allowed.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import re
import shutil
import socket
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from ember_testing import BlobBatcher, BlobDataset, Classifier, StopAt, blob_builder

import ember
from ember.cli import main
from ember.data import DataLoaderBuilder
from ember.errors import EmberError
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train.files.lock import LockOwner
from ember.train.renderer import PlainRenderer

pytestmark = pytest.mark.slow

SEEDS = 4
"""Places chosen for each pair of file and damage (a deleted file has one)."""

TALLY: Counter[str] = Counter()
"""How each case ended, reported when the module's tests are done."""


# The runs ----------------------------------------------------------------------------
def loaders() -> tuple[Any, Any]:
    train, valid = BlobDataset(200), BlobDataset(90, seed=1)
    return (
        DataLoaderBuilder(BlobBatcher()).batch_size(32).shuffle(7).build(train),
        DataLoaderBuilder(BlobBatcher()).batch_size(32).build(valid),
    )


def builder(run: Path, epochs: int) -> Any:
    quiet = PlainRenderer(interval=3600, stream=io.StringIO())
    made = blob_builder(run, quiet).num_epochs(epochs).hparams({"lr": 0.01, "width": 16})
    return made.with_file_checkpointer(DefaultRecorder())


def fit(made: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    learner = made.build(Classifier(), AdamConfig().init(), 1e-2)
    model = learner.fit(*loaders())
    return learner, model.state_dict()


@dataclass(frozen=True)
class Run:
    """A run left on disk, and what its resume without damage ends with."""

    directory: Path
    epochs: int  # the resume's num_epochs
    weights: dict[str, torch.Tensor]
    history: Any


def resume(run: Run, directory: Path, at: int | str = "latest") -> tuple[Any, dict]:
    """A new learner on `directory`, with the data and seed of `run`, from checkpoint `at`."""
    return fit(builder(directory, run.epochs).checkpoint(at))


def stale_lock(directory: Path) -> None:
    """The lock a killed run leaves: its process no longer runs, long ago."""
    ended = subprocess.Popen(["true"])
    ended.wait()
    owner = LockOwner(host=socket.gethostname(), pid=ended.pid, boot="a-boot-before-this-one")
    lock = directory / ".lock"
    lock.write_text(owner.dumps())
    old = lock.stat().st_mtime - 120
    os.utime(lock, (old, old))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Run]:
    """A run stopped inside epoch 2 (of 3) with a checkpoint, and a run of 2 epochs that
    completed (resumed for a third), each with the lock a kill would have left."""
    root = tmp_path_factory.mktemp("fuzz")
    ember.seed(0)
    made = builder(root / "stopped", 3)
    fit(made.listener(StopAt(made.interrupter(), 2, 4)))
    fit(builder(root / "completed", 2))
    found = {}
    for name, epochs in (("stopped", 3), ("completed", 3)):
        stale_lock(root / name)
        whole = root / f"{name}-whole"
        shutil.copytree(root / name, whole)
        learner, weights = fit(builder(whole, epochs).checkpoint("latest"))
        assert learner.outcome == "completed"
        found[name] = Run(root / name, epochs, weights, learner.history)
    yield found
    print(
        "\nrecords fuzz: " + ", ".join(f"{what} {count}" for what, count in sorted(TALLY.items()))
    )


# The files and the damage ------------------------------------------------------------
FILES = {
    "stopped": [
        "train/epoch-2/Loss.log",  # the epoch the checkpoint stopped inside
        "train/epoch-1/Loss.log",
        "valid/epoch-1/Loss.log",
        "valid/epoch-1/Accuracy.log",
        "history.jsonl",
        "sessions.json",
        "hparams.json",
        "checkpoint/model-2.mpk",
        "checkpoint/optim-2.mpk",
        "checkpoint/scheduler-2.mpk",
        "checkpoint/model-1.mpk",
        "checkpoint/optim-1.mpk",
        "checkpoint/scheduler-1.mpk",
        ".lock",
    ],
    "completed": [
        "train/epoch-2/Loss.log",
        "train/epoch-1/Loss.log",
        "valid/epoch-2/Accuracy.log",
        "history.jsonl",
        "sessions.json",
        "hparams.json",
        "checkpoint/model-2.mpk",
        "checkpoint/optim-2.mpk",
        "checkpoint/scheduler-2.mpk",
        ".lock",
    ],
}


def lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True) or [data]


def drop_line(data: bytes, rng: random.Random) -> bytes:
    parts = lines(data)
    del parts[rng.randrange(len(parts))]
    return b"".join(parts)


def duplicate_line(data: bytes, rng: random.Random) -> bytes:
    parts = lines(data)
    at = rng.randrange(len(parts))
    return b"".join([*parts[: at + 1], parts[at], *parts[at + 1 :]])


def truncate_inside_line(data: bytes, rng: random.Random) -> bytes:
    inside = [n for n in range(1, len(data)) if data[n - 1] != ord("\n")]
    return data[: rng.choice(inside)] if inside else b""


def edit_digit(data: bytes, rng: random.Random) -> bytes:
    digits = [n for n, byte in enumerate(data) if ord("0") <= byte <= ord("9")]
    at = rng.choice(digits)
    other = rng.choice([d for d in b"0123456789" if d != data[at]])
    return data[:at] + bytes([other]) + data[at + 1 :]


def zero_bytes(data: bytes, rng: random.Random) -> bytes:
    at, size = rng.randrange(len(data)), rng.randint(1, 8)
    return data[:at] + b"\0" * len(data[at : at + size]) + data[at + size :]


def insert_non_utf8(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + bytes([rng.choice(b"\x80\xc0\xfe\xff")]) + data[at:]


DAMAGE: dict[str, Callable[[bytes, random.Random], bytes] | None] = {
    "drop a line": drop_line,
    "duplicate a line": duplicate_line,
    "truncate inside a line": truncate_inside_line,
    "edit a digit": edit_digit,
    "zero some bytes": zero_bytes,
    "insert a non-UTF-8 byte": insert_non_utf8,
    "delete the file": None,
}

CASES = [(run, name, kind) for run, names in FILES.items() for name in names for kind in DAMAGE]


# What a user may be told, and what they then do --------------------------------------
def snapshot(directory: Path) -> dict[str, str]:
    """Every path under `directory` but the lock (a stale one is taken over, then
    released) with the SHA-256 of its bytes."""
    return {
        str(path.relative_to(directory)): "dir"
        if path.is_dir()
        else hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.name != ".lock"
    }


def assert_exact(run: Run, learner: Any, weights: dict) -> None:
    """The resume ended as the undamaged one did: equal weights, equal history (also
    where `ember repair` rebuilt epochs from the logs: this task's metrics are means
    of their lines)."""
    assert learner.outcome == "completed"
    assert list(weights) == list(run.weights)
    for name in weights:
        assert torch.equal(weights[name], run.weights[name]), name
    assert learner.history == run.history


def assert_names_file_and_fix(message: str, path: Path, where: str) -> None:
    assert str(path) in message, f"{where}: the message does not name {path}: {message}"
    fixes = ("ember repair", "checkpoint(", "by hand", "overwrite=True")
    assert any(fix in message for fix in fixes), f"{where}: no fix named: {message}"


def follow_the_fix(
    run: Run, directory: Path, path: Path, refused: str, capsys: Any, where: str
) -> str:
    """Do what the refusal says, as a user would, until the run resumes; how it ended."""
    told, steps = refused, []
    for _ in range(4):
        at: int | str = "latest"
        earlier = re.search(r"checkpoint\((\d+)\)", told)
        if "ember repair" in told and "repair" not in steps:
            steps.append("repair")
            assert main(["repair", str(directory)]) == 0
            said = capsys.readouterr().out
            assert "Nothing to repair" not in said, f"{where}: {refused} / {said}"
            assert path.name in said, f"{where}: repair does not name {path.name}: {said}"
            if "cannot be rebuilt" in said:
                told = said
                continue
        elif "cannot be rebuilt" in told and "overwrite=True" in told and not earlier:
            return "repair says nothing is left to rebuild from"
        elif earlier:
            steps.append("earlier checkpoint")
            at = int(earlier[1])
        elif f"delete {path} by hand" in told:
            steps.append("lock removed")
            path.unlink()
        else:
            pytest.fail(f"{where}: no fix to follow in: {told}")
        try:
            learner, weights = resume(run, directory, at)
        except EmberError as error:
            told = str(error)
            assert_names_file_and_fix(told, path, where)
            continue
        assert_exact(run, learner, weights)
        return " then ".join(steps) + " then exact"
    pytest.fail(f"{where}: still refused after {steps}: {told}")


@pytest.mark.parametrize(("run_name", "name", "kind"), CASES)
def test_damage_is_refused_naming_the_file_and_fix_or_the_resume_is_exact(
    runs, tmp_path, capsys, run_name, name, kind
):
    run = runs[run_name]
    damage = DAMAGE[kind]
    for seed in range(1 if damage is None else SEEDS):
        where = f"{run_name} run, {name}, {kind}, seed {seed}"
        directory = tmp_path / f"case-{seed}"
        shutil.copytree(run.directory, directory)
        path = directory / name
        if damage is None:
            path.unlink()
        else:
            rng = random.Random(f"{run_name}/{name}/{kind}/{seed}")
            path.write_bytes(damage(path.read_bytes(), rng))
            if name == ".lock" and rng.random() < 0.5:
                os.utime(path)  # a lock written a moment ago: not yet taken over
        before = snapshot(directory)
        TALLY["cases"] += 1
        try:
            learner, weights = resume(run, directory)
        except EmberError as error:
            message = str(error)
            assert_names_file_and_fix(message, path, where)
            assert snapshot(directory) == before, f"{where}: the refused resume wrote"
            TALLY["refused naming file and fix"] += 1
            TALLY[follow_the_fix(run, directory, path, message, capsys, where)] += 1
        else:
            assert_exact(run, learner, weights)
            TALLY["exact resume"] += 1
        shutil.rmtree(directory)
