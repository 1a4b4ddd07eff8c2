"""Each process's own log, `rank-N.log` (`devices(..., rank_logs=True)`): the records
`experiment.log` gets on rank 0, of that process only, appended whole line by line, and
appended to by a resumed run; the console is not printed twice."""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import torch
from ember_testing import Classifier, run_script

from ember.train import LearnerBuilder
from ember.train.distributed.launch import COPIED_FROM
from ember.train.logger.application import FileApplicationLogger, RankLogFile

DDP = Path(__file__).parent / "scripts" / "train_ddp.py"
RECIPE = Path(__file__).parent / "scripts" / "train_recipe.py"


def record(message: str, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord("ember.test", logging.INFO, __file__, 1, message, None, None)
    made.__dict__.update(extra)
    return made


def test_lines_wait_for_the_directory_then_each_is_appended_whole(tmp_path):
    path = tmp_path / "rank-1.log"
    handler = RankLogFile(path, rank=1)
    handler.handle(record("before the directory is ready"))
    handler.handle(record("[rank 2] a copy of another process's output", **{COPIED_FROM: 2}))
    assert not path.exists()
    handler.open()
    handler.handle(record("after"))
    handler.close()
    lines = path.read_text().splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == ["before the directory is ready", "after"]
    path.write_text(path.read_text() + "2026-11-28 01:02:03,004 INFO ember.test: cut sh")
    again = RankLogFile(path, rank=1)  # a resumed run appends, after ending the cut line
    again.open()
    again.handle(record("resumed"))
    again.close()
    text = path.read_text()
    assert text.startswith("\n".join(lines) + "\n")
    assert text.endswith("cut sh\n" + text.splitlines()[-1] + "\n")
    assert text.splitlines()[-1].endswith("INFO ember.test: resumed")


def test_a_rank_log_never_writes_through_a_link(tmp_path, caplog):
    outside = tmp_path / "outside.log"
    outside.write_text("")
    link = tmp_path / "run" / "rank-0.log"
    link.parent.mkdir()
    link.symlink_to(outside)
    handler = RankLogFile(link, rank=0)
    with caplog.at_level(logging.WARNING, logger="ember"):
        logging.getLogger("ember").addHandler(handler)
        try:
            handler.open()
            logging.getLogger("ember.test").warning("not through the link")
        finally:
            logging.getLogger("ember").removeHandler(handler)
            handler.close()
    assert outside.read_text() == ""
    assert "Cannot write this process's log" in caplog.text


def test_the_application_logger_takes_the_rank_log_off_the_ember_logger_again(tmp_path):
    own = RankLogFile(tmp_path / "rank-1.log", rank=1)
    app_log = FileApplicationLogger(tmp_path / "experiment.log", rank_log=own)
    ember_log = logging.getLogger("ember")
    level = ember_log.level
    app_log.install(main=False)  # a rank other than 0: no experiment.log
    assert own in ember_log.handlers and ember_log.level == logging.INFO
    logging.getLogger("ember.test").info("an info line of rank 1")
    app_log.open_rank_log()
    app_log.uninstall()
    assert own not in ember_log.handlers and ember_log.level == level
    assert not (tmp_path / "experiment.log").exists()
    assert "an info line of rank 1" in (tmp_path / "rank-1.log").read_text()


def test_rank_logs_are_off_by_default(tmp_path):
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    plain = LearnerBuilder(tmp_path / "a").build(model, optimizer)
    assert plain.options.rank_logs is False
    asked = LearnerBuilder(tmp_path / "b").devices(["cpu"], rank_logs=True).build(model, optimizer)
    assert asked.options.rank_logs is True


def test_each_process_ember_starts_keeps_its_own_lines(tmp_path):
    """Rank 1 fails: its log holds its failure and traceback, rank 0's its account of
    it, without the copies of rank 1's output that experiment.log has; the console
    shows rank 1's lines once."""
    done = run_script(
        DDP, str(tmp_path), "--epochs", "1", "--fail-rank", "1", "--rank-logs", timeout=240
    )
    assert done.returncode == 1, done.stderr[-3000:]
    first, second = (tmp_path / "rank-0.log").read_text(), (tmp_path / "rank-1.log").read_text()
    experiment = (tmp_path / "experiment.log").read_text()
    assert "Training failed at epoch 1, iteration 3." in second
    assert "RuntimeError: deliberate failure on rank 1" in second
    assert "Rank 1 failed at epoch 1, iteration 3" not in second
    assert "Training stopped at epoch 1, iteration 3. Rank 1 failed at epoch 1" in first
    assert "Training failed at" not in first
    assert "[rank 1]" in experiment and "[rank 1]" not in first
    assert first.endswith("\n") and second.endswith("\n")
    assert done.stderr.count("Training failed at epoch 1, iteration 3.") == 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def two_processes(directory: Path, *args: str) -> list[subprocess.CompletedProcess]:
    """The recipe on two processes started as Kubeflow starts them (ember makes the group)."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    common = {k: v for k, v in os.environ.items() if k not in drop}
    common.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"})
    command = [sys.executable, str(RECIPE), str(directory), "--loader", "builder", "--no-group"]
    processes = [
        subprocess.Popen(
            [*command, "--rank-logs", "--auto", "--every", "4", "--epochs", "1", *args],
            env={**common, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    ended = []
    for process in processes:
        try:
            out, err = process.communicate(timeout=240)
        finally:
            if process.poll() is None:
                process.kill()
        ended.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
    return ended


def test_a_resumed_run_appends_to_each_processs_log(tmp_path):
    failed = two_processes(tmp_path, "--fail-at", "6")
    assert [done.returncode for done in failed] == [1, 1], failed[0].stderr[-2000:]
    before = {rank: (tmp_path / f"rank-{rank}.log").read_text() for rank in (0, 1)}
    assert "Training failed at epoch 1, iteration 6." in before[1]
    # rank 1 fails after its 6th step's gradients were shared: rank 0 is then at its 6th
    # or, nothing else holding it back after a step, already in its 7th
    assert re.search(r"Training stopped at epoch 1, iteration [67]\.", before[0]), before[0]
    resumed = two_processes(tmp_path)
    assert [done.returncode for done in resumed] == [0, 0], resumed[1].stderr[-2000:]
    for rank in (0, 1):
        text = (tmp_path / f"rank-{rank}.log").read_text()
        assert text.startswith(before[rank])  # appended to, never rewritten
        later = text[len(before[rank]) :]
        assert "Resumed from the checkpoint of epoch 1, iteration 4." in later
        assert later.rstrip().endswith("Training completed after epoch 1.")
    assert resumed[1].stderr.strip() == ""  # rank 1's info lines stay off the console
