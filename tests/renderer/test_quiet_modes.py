"""Where a dashboard would not be read (a pipe, CI, a dumb terminal), the run prints
short plain lines: no escape codes, a bounded number of lines."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "tui_script.py"
ARGS = ["--renderer", "default", "--epochs", "2", "--batches", "30", "--sleep", "0.01"]


def spawn_in_pty(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    """Start `args` with stdin, stdout and stderr on a new pseudo-terminal."""
    master, slave = pty.openpty()
    process = subprocess.Popen(
        args, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True
    )
    os.close(slave)
    return process, master


def read_pty(process: subprocess.Popen, master: int, timeout: float = 90.0) -> str:
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    process.wait(timeout=max(1.0, deadline - time.monotonic()))
    return b"".join(chunks).decode("utf-8", errors="replace")


def check_plain(output: str, seconds: float, interval: float) -> list[str]:
    """Plain lines only: a header and the model summary, one line per split per epoch,
    an end line, and progress lines no more often than `interval`."""
    lines = output.replace("\r\n", "\n").splitlines()
    assert "\x1b" not in output, output
    assert lines[0] == "renderer PlainRenderer", output
    assert any(line.startswith("training epoch 1/2:") for line in lines), output
    assert sum(" done: " in line for line in lines) == 4, output
    assert "training completed" in lines, output
    progress = [line for line in lines if " iter " in line and " items/s" in line]
    assert len(progress) <= seconds / interval + 2, output
    # the model summary table, shown by the renderer (and by the script's log handler)
    summary = [line for line in lines if line.startswith("|") or line.endswith("Model Blobs:")]
    assert "Model Blobs:" in lines and any(line.startswith("| Total") for line in lines), output
    assert len(lines) <= 20 + len(progress) + len(summary), output
    return progress


def test_pipe_ci_and_dumb_terminal_get_plain_lines(tmp_path):
    base = {k: v for k, v in os.environ.items() if k not in ("CI", "EMBER_PROGRESS_INTERVAL")}
    base.update(PYTHONUNBUFFERED="1", TERM="xterm-256color")
    command = [sys.executable, str(SCRIPT)]
    started = time.monotonic()
    # Started together: the three runs overlap their start-up.
    piped = subprocess.Popen(
        [*command, str(tmp_path / "pipe"), *ARGS],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**base, "EMBER_PROGRESS_INTERVAL": "0.25"},
    )
    ci = spawn_in_pty([*command, str(tmp_path / "ci"), *ARGS], {**base, "CI": "1"})
    dumb = spawn_in_pty([*command, str(tmp_path / "dumb"), *ARGS], {**base, "TERM": "dumb"})

    out, _ = piped.communicate(timeout=90)
    ci_output, dumb_output = read_pty(*ci), read_pty(*dumb)
    seconds = time.monotonic() - started
    assert piped.returncode == 0 and ci[0].returncode == 0 and dumb[0].returncode == 0

    # EMBER_PROGRESS_INTERVAL=0.25 adds progress lines, at most four a second.
    assert check_plain(out.decode(), seconds, 0.25)
    for output in (ci_output, dumb_output):
        check_plain(output, seconds, 10.0)  # the default interval
