"""Several processes when things go wrong: a rank that fails, a rank that hangs, a
signal at any moment, a launch that cannot work. Real processes (gloo on the CPU),
started by ember or by torchrun; each test checks the time bound, the exit status, the
message, and that no process of the run is left."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import torch
from ember_testing import Batch, BlobBatcher, BlobDataset, Classifier, blob_builder

from ember.data import DataLoaderBuilder
from ember.errors import TrainingError
from ember.optim import SgdConfig
from ember.train import ClassificationOutput, TrainOutput, distributed
from ember.train.distributed import failures, launch, where

SCRIPT = Path(__file__).parent / "scripts" / "train_ddp.py"
RAISE = 'raise RuntimeError(f"deliberate failure on rank {rank}")'  # the failing line's source


@dataclass
class Run:
    process: subprocess.Popen[str]
    directory: Path
    events: Path
    started: float
    stdout: str = ""
    stderr: str = ""
    ended: float = 0.0

    def finish(self, timeout: float) -> Run:
        """Wait for the command and every process holding its output."""
        try:
            self.stdout, self.stderr = self.process.communicate(timeout=timeout)
        finally:
            self.ended = time.time()
            kill_group(self.process)
        return self

    def event(self, what: str, rank: int | None = None) -> float:
        """When the script noted `what` (on `rank`) first."""
        text = self.events.read_text() if self.events.exists() else ""
        for line in text.splitlines():
            name, on, at = line.split()
            if name == what and (rank is None or int(on) == rank):
                return float(at)
        raise AssertionError(f"no {what} event in {text!r}; the run printed:\n{self.stderr}")

    def wait_for(self, test: object, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not test():  # type: ignore[operator]
            assert self.process.poll() is None, self.finish(10).stderr
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.05)

    def log(self) -> str:
        return (self.directory / "experiment.log").read_text()

    def survivors(self, wait: float = 3.0) -> list[str]:
        """The processes of this run still alive `wait` seconds after it ended (killed
        then, so that none outlives the test)."""
        deadline = time.monotonic() + wait
        while True:
            found = []
            for process in psutil.process_iter(["cmdline", "status"]):
                try:
                    line = " ".join(process.info["cmdline"] or [])
                    if str(self.directory) in line and process.info["status"] != "zombie":
                        found.append(process)
                except psutil.Error:
                    pass
            if not found or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for process in found:
            try:
                process.kill()
            except psutil.Error:
                pass
        return [" ".join(p.info["cmdline"]) for p in found]


def kill_group(process: subprocess.Popen[str]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(tmp_path: Path, *args: str, torchrun: bool = False, processes: int = 2) -> Run:
    """train_ddp.py on two processes, in a session of its own."""
    directory, events = tmp_path / "run", tmp_path / "events"
    script = [str(SCRIPT), str(directory), "--events", str(events), *args]
    if torchrun:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            *script,
            "--processes",
            str(processes),
        ]
    else:
        command = [sys.executable, *script, "--processes", str(processes)]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return Run(process, directory, events, time.time())


PROMPT = 30
"""Seconds within which a run ends "promptly": well under the collective timeouts the
runs below are given (60 s and more), so a run that waited for one fails the test,
while a loaded machine starting Python processes slowly does not."""


# 1. A failing rank -------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)])
def test_a_failing_rank_ends_the_run_in_seconds_and_is_reported_once(tmp_path, strategy):
    run = start(tmp_path, "--fail-rank", "1", "--timeout", "60", "--strategy", strategy)
    run.finish(180)
    assert run.process.returncode == 1, run.stderr
    assert run.ended - run.event("fail") < PROMPT
    named = "Rank 1 failed at epoch 1, iteration 3: RuntimeError: deliberate failure on rank 1"
    assert named in run.stderr
    assert run.stderr.count(RAISE) == 1  # rank 1's traceback, once
    assert "Connection closed" not in run.stderr  # rank 0's own error is the one line above
    log = run.log()
    assert named in log
    assert log.count(RAISE) == 1
    assert log.count("Connection closed") <= 1
    assert run.survivors() == []


def test_a_failing_rank_under_torchrun_is_named_in_rank_0s_log(tmp_path):
    run = start(tmp_path, "--fail-rank", "1", "--timeout", "60", torchrun=True, processes=1)
    run.finish(180)
    assert run.process.returncode != 0, run.stderr
    assert run.ended - run.event("fail") < PROMPT
    assert run.stderr.count(RAISE) == 1  # printed by rank 1, not repeated by rank 0
    assert "Training stopped because another rank failed. Rank 1 failed at epoch 1" in run.stderr
    log = run.log()
    assert "Rank 1 failed at epoch 1, iteration 3: RuntimeError: deliberate failure" in log
    assert log.count(RAISE) == 1
    assert run.survivors() == []


# 2. A hung rank ----------------------------------------------------------------------
def test_a_hung_rank_is_named_with_where_the_others_waited(tmp_path):
    run = start(tmp_path, "--hang-rank", "1", "--timeout", "10").finish(180)
    assert run.process.returncode == 1, run.stderr
    waited = run.ended - run.event("hang")
    assert 10 <= waited < 10 + PROMPT
    report = (
        "Rank 1 did not reach the gradient synchronisation at epoch 1, iteration 3 within "
        "10 s (rank 0 waited there): rank 1 was at "
    )
    assert report in run.stderr
    assert "train_ddp.py" in run.stderr and "in train_step (time.sleep(3600))" in run.stderr
    assert report in run.log()
    assert "Timed out" not in run.stderr
    assert run.survivors() == []


# 3. Signals --------------------------------------------------------------------------
def started_ranks(run: Run) -> bool:
    try:
        return bool(psutil.Process(run.process.pid).children())
    except psutil.Error:
        return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_the_ranks_start_stops_every_process(tmp_path, signum):
    # Slow steps: a busy machine that delays this test's polling must not let the
    # whole run finish before the signal arrives.
    run = start(tmp_path, "--timeout", "120", "--slow", "0.5")
    run.wait_for(lambda: started_ranks(run))  # rank 1 imports; rank 0 waits to join
    sent = time.time()
    run.process.send_signal(signum)
    run.finish(60)
    status = run.process.returncode
    if status == 1 and signum == signal.SIGINT:
        # Ctrl-C while rank 0 still runs Python code (starting the ranks): Python ends
        # with the KeyboardInterrupt's traceback; a process that imported torch's
        # compiler (every torch optimizer does) then exits with 1, not by SIGINT
        assert run.stderr.rstrip().endswith("KeyboardInterrupt"), run.stderr
    else:
        assert status in (-signum, 128 + signum), run.stderr
    assert run.ended - sent < PROMPT
    assert run.survivors(wait=1.0) == []


def test_ctrl_c_between_two_ranks_starting_ends_the_rank_already_started(monkeypatch):
    command = [sys.executable, "-c", "import time; time.sleep(120)"]
    monkeypatch.setattr(launch, "_command", lambda: command)
    started: list[launch.Child] = []
    real_start = launch._start

    def start(rank: int, command: list[str], shared: dict[str, str]) -> launch.Child:
        if rank == 2:
            raise KeyboardInterrupt
        started.append(real_start(rank, command, shared))
        return started[-1]

    monkeypatch.setattr(launch, "_start", start)
    before = {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    with pytest.raises(KeyboardInterrupt):
        launch.launch_ranks(3)
    assert [child.rank for child in started] == [1]
    assert started[0].process.poll() == -signal.SIGKILL  # ended, and waited for
    assert {name: os.environ.get(name) for name in before} == before


def test_sigterm_during_training_stops_every_rank_after_a_checkpoint(tmp_path):
    run = start(tmp_path, "--timeout", "120", "--slow", "0.2")
    run.wait_for(lambda: run.events.exists() and "step 1" in run.events.read_text())
    sent = time.time()
    run.process.send_signal(signal.SIGTERM)
    run.finish(60)
    assert run.process.returncode == 128 + signal.SIGTERM, run.stderr
    assert run.ended - sent < PROMPT
    assert "Training stopped: terminated by SIGTERM" in run.log()
    assert list((run.directory / "checkpoint").glob("model-*.mpk"))
    assert run.survivors() == []


# 4. Launches that cannot work --------------------------------------------------------
STDIN_SCRIPT = """
import sys
import torch
from torch import nn
from ember.data import DataLoaderBuilder
from ember.optim import SgdConfig
from ember.train import LearnerBuilder, TrainOutput


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def train_step(self, batch):
        loss = self.linear(batch).pow(2).mean()
        return TrainOutput(loss, loss=loss)


learner = LearnerBuilder(sys.argv[1]).devices(["cpu", "cpu"], timeout=300).build(
    Tiny(), SgdConfig().init(), 0.1
)
learner.fit(DataLoaderBuilder().batch_size(4).build(list(torch.randn(16, 2))))
"""


def test_a_script_on_standard_input_is_refused_at_once(tmp_path):
    directory = tmp_path / "run"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-", str(directory)],
        input=STDIN_SCRIPT,
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )
    assert done.returncode == 1
    assert "not an interactive session, `python -c` or a script on standard input" in done.stderr
    assert time.monotonic() - started < 60  # far below the 300 s timeout: nothing waited
    assert not any(
        str(directory) in " ".join(p.info["cmdline"] or [])
        for p in psutil.process_iter(["cmdline"])
    )


def test_torchrun_refuses_a_device_list_of_another_size(tmp_path):
    run = start(tmp_path, "--timeout", "300", torchrun=True, processes=3).finish(120)
    assert run.process.returncode != 0
    assert (
        "devices() lists 3 devices, but the launcher started 2 processes on this machine "
        "(LOCAL_WORLD_SIZE=2)"
    ) in run.stderr
    assert run.ended - run.started < 60
    assert run.survivors() == []


# The pieces, in this process ---------------------------------------------------------
def test_standard_input_python_c_and_interactive_sessions_are_refused(monkeypatch):
    for argv0, orig in [
        ("-", ["python", "-", "x"]),
        ("-c", ["python", "-c", "pass"]),
        ("", ["python"]),
    ]:
        monkeypatch.setattr(sys, "argv", [argv0])
        monkeypatch.setattr(sys, "orig_argv", orig)
        with pytest.raises(TrainingError, match="script on standard input"):
            launch._command()
    monkeypatch.setattr(sys, "argv", ["train.py", "--epochs", "2"])
    monkeypatch.setattr(sys, "orig_argv", ["python", "-u", "train.py", "--epochs", "2"])
    assert launch._command() == [sys.executable, "-u", "train.py", "--epochs", "2"]


def test_a_device_list_must_match_the_launched_processes(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(TrainingError, match=r"lists 3 devices, but the launcher started 2"):
        distributed.process_device([cpu] * 3, 0)
    assert distributed.process_device([cpu] * 2, 1) == cpu
    assert distributed.process_device([cpu], 1) == cpu  # one name: every process uses it
    assert distributed.process_device([torch.device("cuda")], 1) == torch.device("cuda", 1)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert distributed.process_device([cpu] * 3, 0) == cpu  # no launcher: ember starts 3


def test_the_hang_report_names_who_did_not_arrive_and_who_did_not_answer():
    mine = {"waiting": "a barrier", "location": "x.py:1 in f", "position": "epoch 2, iteration 5"}
    busy = {"waiting": None, "location": "train.py:9 in load (next(it))", "position": None}
    failure = failures.missing_ranks(0, mine, {1: busy, 2: None, 3: dict(mine)}, 20.0)
    assert failure.kind == "hang" and failure.culprits == (1, 2)
    assert failure.summary == (
        "Ranks 1 and 2 did not reach a barrier at epoch 2, iteration 5 within 20 s (ranks 0 "
        "and 3 waited there): rank 1 was at train.py:9 in load (next(it)); rank 2 did not "
        "answer: it died, or is stuck outside Python"
    )
    other = {"waiting": "the vote on stopping", "location": "y.py:2 in g", "position": None}
    crossed = failures.missing_ranks(0, mine, {1: other}, 20.0)
    assert crossed.summary.startswith("The ranks waited for each other within 20 s in different")
    assert crossed.culprits == (1,)


def test_a_failure_record_travels_as_json_and_names_the_rank():
    try:
        raise ValueError("bad batch\nsecond line")
    except ValueError as error:
        failure = distributed.Failure.from_error(3, error)
    assert failure.summary == "Rank 3 failed: ValueError: bad batch"
    assert "Traceback (most recent call last)" in failure.details
    assert distributed.Failure.from_json(failure.to_json()) == failure
    assert failure.report().startswith("Rank 3 failed: ValueError: bad batch (its traceback")


def test_ctrl_c_after_the_ranks_started_but_before_the_group_ends_them(monkeypatch):
    from ember.train.distributed import joining

    monkeypatch.setattr(
        launch, "_command", lambda: [sys.executable, "-c", "import time; time.sleep(120)"]
    )
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    started: list[launch.Child] = []
    real_launch = joining.launch_ranks

    def launched(world: int):
        children, saved = real_launch(world)
        started.extend(children)
        return children, saved

    calls = []

    def device_of(devices, local_rank):  # the second call comes once the ranks started
        calls.append(local_rank)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return torch.device("cpu")

    monkeypatch.setattr(joining, "launch_ranks", launched)
    monkeypatch.setattr(joining, "process_device", device_of)
    before = {name: os.environ.get(name) for name in launch._VARIABLES}
    with pytest.raises(KeyboardInterrupt):
        joining.setup([torch.device("cpu")] * 3, timeout=30)
    assert [child.rank for child in started] == [1, 2]
    assert [child.process.poll() for child in started] == [-signal.SIGKILL] * 2
    assert {name: os.environ.get(name) for name in launch._VARIABLES} == before


def test_a_ranks_position_is_read_from_the_learner_on_its_stack(tmp_path):
    """What a hang or failure report says of where a rank was: its epoch and iteration
    while it trains, the validation of its epoch while it validates."""
    seen: list[tuple[str, str | None]] = []

    class Watched(Classifier):
        def train_step(self, batch: Batch) -> TrainOutput:
            seen.append(("train", where.learner_position(where.stack(sys._getframe()))))
            return super().train_step(batch)

        def valid_step(self, batch: Batch) -> ClassificationOutput:
            seen.append(("valid", where.learner_position(where.stack(sys._getframe()))))
            return super().valid_step(batch)

    loader = DataLoaderBuilder(BlobBatcher()).batch_size(50).build(BlobDataset(100))
    learner = blob_builder(tmp_path).num_epochs(1).build(Watched(), SgdConfig().init(), 0.1)
    learner.fit(loader, loader)
    assert seen == [
        ("valid", "the checks before training"),  # fit's check of valid_step, on a copy
        ("train", "epoch 1, iteration 1"),
        ("train", "epoch 1, iteration 2"),
        ("valid", "the validation of epoch 1"),
        ("valid", "the validation of epoch 1"),
    ]


def test_a_group_whose_watchdog_never_started_closes(monkeypatch):
    # A Ctrl-C inside the watchdog's Thread.start leaves a thread that never started.
    from ember.train.distributed.group import Distributed

    context = Distributed(0, 1, 0, torch.device("cpu"), "gloo", [], {})
    monkeypatch.setattr(threading.Thread, "start", lambda self: None)
    context.start_watchdog()
    context.close(failed=True)  # joining a thread never started would raise RuntimeError
    assert context.finished
