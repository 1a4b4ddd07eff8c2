"""A tiny classification task for the tests (trains in well under a second), and
helpers that run Python in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ember.train import ClassificationOutput, TrainOutput


@dataclass
class Batch:
    inputs: torch.Tensor
    targets: torch.Tensor


class BlobDataset(torch.utils.data.Dataset):
    """Gaussian blobs: `size` points in `features` dims, `classes` well separated classes."""

    def __init__(self, size: int = 200, features: int = 8, classes: int = 3, seed: int = 0):
        centers = torch.randn(classes, features, generator=torch.Generator().manual_seed(99)) * 3
        generator = torch.Generator().manual_seed(seed)
        self.targets = torch.randint(0, classes, (size,), generator=generator)
        self.inputs = centers[self.targets] + torch.randn(size, features, generator=generator)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        return self.inputs[index], int(self.targets[index])


class BlobBatcher:
    def batch(self, items: Sequence) -> Batch:
        return Batch(
            torch.stack([x for x, _ in items]),
            torch.tensor([y for _, y in items], dtype=torch.long),
        )


class Classifier(nn.Module):
    """A small MLP with the two step methods, and a record of the modes it ran in.

    `hidden` is the width of the hidden layer, or of each one in turn (a sequence);
    each is followed by a ReLU. Dropout with probability `dropout` comes after the
    first ReLU, and is left out when `dropout` is 0. The defaults give
    Linear(8, 16), ReLU, Dropout(0.1), Linear(16, 3).
    """

    def __init__(
        self,
        features: int = 8,
        classes: int = 3,
        hidden: int | Sequence[int] = 16,
        dropout: float = 0.1,
    ):
        super().__init__()
        widths = [hidden] if isinstance(hidden, int) else list(hidden)
        layers: list[nn.Module] = []
        width_in = features
        for index, width in enumerate(widths):
            layers += [nn.Linear(width_in, width), nn.ReLU()]
            if index == 0 and dropout:
                layers.append(nn.Dropout(dropout))
            width_in = width
        layers.append(nn.Linear(width_in, classes))
        self.net = nn.Sequential(*layers)
        self.seen: list[tuple[str, bool, bool]] = []

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.net(inputs)

    def classify(self, batch: Batch) -> ClassificationOutput:
        output = self(batch.inputs)
        return ClassificationOutput(F.cross_entropy(output, batch.targets), output, batch.targets)

    def train_step(self, batch: Batch) -> TrainOutput:
        self.seen.append(("train", self.training, torch.is_inference_mode_enabled()))
        return TrainOutput(self.classify(batch))

    def valid_step(self, batch: Batch) -> ClassificationOutput:
        self.seen.append(("valid", self.training, torch.is_inference_mode_enabled()))
        return self.classify(batch)


def run_script(script: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """Run `python script ARGS` with this interpreter; its output is captured as text."""
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def fresh(code: str) -> Any:
    """What `code` prints as JSON, run in a fresh interpreter (which must exit with 0)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def load_example(path: Path, name: str) -> Any:
    """An example script loaded as a module of its own `name` (several examples share
    file names such as training.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def sigterm_when(
    script: Path,
    args: Sequence[str],
    log: Path,
    lines: int = 5,
    env: dict | None = None,
    signum: int | None = None,
    text: str | None = None,
) -> subprocess.CompletedProcess:
    """Run `python script ARGS` and send it SIGTERM (or `signum`) once `log` (a metric
    log of the run) has `lines` lines, or holds `text` when given: a run stopped in the
    middle of an epoch."""
    import signal
    import time

    process = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if log.exists():
            content = log.read_text()
            if (text in content) if text is not None else len(content.splitlines()) >= lines:
                break
        if process.poll() is not None:
            break
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM if signum is None else signum)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


class StopAt:
    """A listener that stops a run gracefully after one training iteration of one epoch
    (with the reason "test stop")."""

    def __init__(self, interrupter: Any, epoch: int, iteration: int) -> None:
        self.interrupter, self.at = interrupter, (epoch, iteration)

    def on_event(self, event: Any) -> None:
        from ember.train import ProcessedItem

        train = isinstance(event, ProcessedItem) and event.split == "train"
        if train and (event.epoch, event.iteration) == self.at:
            self.interrupter.stop("test stop")


def blob_builder(directory: Path, renderer: Any = None) -> Any:
    """A `LearnerBuilder` for the blob task: training loss, validation loss and accuracy,
    a plain renderer that stays quiet unless `renderer` is given."""
    from ember.train import LearnerBuilder
    from ember.train.metric import AccuracyMetric, LossMetric
    from ember.train.renderer import PlainRenderer

    return (
        LearnerBuilder(directory)
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .metric_valid(AccuracyMetric())
        .renderer(renderer or PlainRenderer(interval=3600))
    )


# The blob script stopped by SIGTERM mid-epoch, then resumed -------------------------
BLOBS_SCRIPT = Path(__file__).parent / "scripts" / "train_blobs.py"


def run_blobs(directory: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`tests/scripts/train_blobs.py DIRECTORY EXTRA` in a subprocess."""
    return run_script(BLOBS_SCRIPT, str(directory), *extra, timeout=timeout)


class ScriptForks:
    """Runs of a script's `main(argv)` forked from one process that imported torch,
    ember and the script once: each run starts in milliseconds instead of paying for
    a fresh interpreter's imports. A run is a process of its own, so a signal (SIGKILL
    included) reaches it as it would a run started with `subprocess`; its stdout is
    discarded and its stderr goes to a file. Use as a context manager."""

    SERVER = r"""
import json, os, sys, traceback
sys.path.insert(0, sys.argv[2])
from ember_testing import load_example
script = load_example(__import__("pathlib").Path(sys.argv[1]), "forked_script")
requests, replies = sys.stdin, sys.stdout
for line in requests:
    request = json.loads(line)
    if request["op"] == "poll":
        pid, status = os.waitpid(request["pid"], os.WNOHANG)
        code = None if pid == 0 else os.waitstatus_to_exitcode(status)
        replies.write(json.dumps({"code": code}) + "\n")
        replies.flush()
        continue
    pid = os.fork()
    if pid == 0:
        null = os.open(os.devnull, os.O_RDWR)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(err, 2)
        sys.stdin = open(os.devnull)
        sys.stdout = open(os.devnull, "w")
        sys.stderr = open(2, "w", closefd=False)
        try:
            code = script.main(request["argv"])
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stderr.flush()
        os._exit(code or 0)
    replies.write(json.dumps({"pid": pid}) + "\n")
    replies.flush()
"""

    def __init__(self, script: Path) -> None:
        import threading

        self.lock = threading.Lock()
        self.server = subprocess.Popen(
            [sys.executable, "-c", self.SERVER, str(script), str(Path(__file__).parent)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def _ask(self, request: dict) -> dict:
        assert self.server.stdin is not None and self.server.stdout is not None
        with self.lock:
            self.server.stdin.write(json.dumps(request) + "\n")
            self.server.stdin.flush()
            reply = self.server.stdout.readline()
        assert reply, f"the fork server ended with {self.server.poll()}"
        return json.loads(reply)

    def start(self, argv: Sequence[str], stderr: Path) -> ForkedRun:
        """A run of `main(argv)`, its stderr written to the file `stderr`."""
        pid = self._ask({"op": "start", "argv": list(argv), "stderr": str(stderr)})["pid"]
        return ForkedRun(self, pid, stderr)

    def __enter__(self) -> ScriptForks:
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.server.stdin is not None
        self.server.stdin.close()
        self.server.wait(timeout=60)


class ForkedRun:
    """A run started by `ScriptForks.start`, with the part of `subprocess.Popen`'s
    interface that the tests use; its return code is negative for a signal."""

    def __init__(self, forks: ScriptForks, pid: int, stderr: Path) -> None:
        self.forks, self.pid, self.stderr_path = forks, pid, stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.forks._ask({"op": "poll", "pid": self.pid})["code"]
        return self.returncode

    def wait(self, timeout: float) -> int:
        import time

        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        import os

        if self.returncode is None:  # not yet reaped: the pid is still this run's
            os.kill(self.pid, signum)

    def stderr(self) -> str:
        return self.stderr_path.read_text()


def final_weights(directory: Path, name: str = "final") -> dict[str, torch.Tensor]:
    """The weights a blob run wrote as `name` (its final model, or "ema")."""
    from ember.record import DefaultRecorder

    return DefaultRecorder().load(Classifier(), directory / name).state_dict()


def sigterm_midway(directory: Path, *extra: str) -> subprocess.CompletedProcess:
    """Start a slow blob run and send it SIGTERM once it is inside epoch 2."""
    log = directory / "train" / "epoch-2" / "Loss.log"
    return sigterm_when(BLOBS_SCRIPT, [str(directory), "--sleep", "0.01", *extra], log)


def run_blobs_here(directory: Path, *extra: str) -> int:
    """The blob script's run in this process (no interpreter to start): the same code,
    seeds and thread count as `run_blobs`, for an uninterrupted reference run. Returns
    its exit code; this process's thread count is restored after."""
    script = sys.modules.get("train_blobs_here") or load_example(BLOBS_SCRIPT, "train_blobs_here")
    threads = torch.get_num_threads()
    try:
        return script.main([str(directory), *extra])
    finally:
        torch.set_num_threads(threads)


def stopped_and_resumed(
    root: Path, *options: str, straight: Path | None = None
) -> tuple[Path, Path]:
    """A blob run straight through, and the same run stopped by SIGTERM inside epoch 2
    and resumed from its latest checkpoint (`root/resumed`). The straight run is
    `straight` when given (one made with the same options), else `root/straight`, run
    in this process. Checked on the way: the exit codes (0; 143 then 0), the stop's
    message, its mid-epoch checkpoint and no final model, and the resumed run saying
    where it resumed."""
    if straight is None:
        straight = root / "straight"
        assert run_blobs_here(straight, *options) == 0
    resumed = root / "resumed"
    stopped = sigterm_midway(resumed, *options)
    assert stopped.returncode == 143, stopped.stderr  # 128 + SIGTERM: a scheduler sees it
    assert "training stopped: terminated by SIGTERM" in stopped.stdout
    assert not (resumed / "final.mpk").exists()
    assert "Checkpoint of epoch 2, iteration" in (resumed / "experiment.log").read_text()
    again = run_blobs(resumed, "--resume", *options)
    assert again.returncode == 0, again.stderr
    log = (resumed / "experiment.log").read_text()
    assert "Resumed from the checkpoint of epoch 2, iteration" in log
    return straight, resumed


def assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Two state dicts hold the same names and equal tensors."""
    assert list(a) == list(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars of a TensorBoard log directory, read with TensorBoard's own reader:
    tag -> [(step, value)]."""
    from tensorboard.backend.event_processing import event_accumulator

    reader = event_accumulator.EventAccumulator(
        str(log_dir), size_guidance={event_accumulator.SCALARS: 0}
    )
    reader.Reload()
    return {
        tag: [(event.step, event.value) for event in reader.Scalars(tag)]
        for tag in reader.Tags()["scalars"]
    }
