"""Drive a program inside a private tmux server, as a person at a terminal would."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "tui_script.py"
TMUX = shutil.which("tmux")


def wait_for(
    predicate: Callable[[], object], timeout: float, what: str, describe=lambda: ""
) -> object:
    """Poll `predicate` every 0.1 s until it is truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{describe()}")
        time.sleep(0.1)


class TmuxRun:
    """`python tests/renderer/tui_script.py ARGS` in a detached tmux session of the given
    size. When the program ends, `stty -a` of the pane goes to `stty.txt`, then its exit
    code to `rc.txt`; the pane stays open so its last screen can be read. With `shell`, the
    pane is an interactive bash instead, and the test types `self.command` itself."""

    def __init__(
        self,
        directory: Path,
        args: list[str],
        width: int = 120,
        height: int = 40,
        env: str = "unset CI",
        shell: bool = False,
    ) -> None:
        self.directory = directory
        self.socket = directory / "tmux.sock"
        self.rc_file = directory / "rc.txt"
        self.stty_file = directory / "stty.txt"
        command = " ".join(shlex.quote(a) for a in [sys.executable, str(SCRIPT), *args])
        script = directory / "run.sh"
        script.write_text(
            f"cd {shlex.quote(str(REPO))}\n"
            f"{env}\n"
            "export PYTHONUNBUFFERED=1\n"
            f"{command}\n"
            "code=$?\n"
            f"stty -a > {shlex.quote(str(self.stty_file))} 2>&1\n"
            f"echo $code > {shlex.quote(str(self.rc_file))}\n"
            "sleep 120\n"
        )
        if shell:  # an interactive shell (job control on): the test types the command
            script.write_text(
                f"cd {shlex.quote(str(REPO))}\n{env}\nexport PYTHONUNBUFFERED=1 PS1='$ '\n"
                "exec bash --noprofile --norc -i\n"
            )
        self.command = command
        self.width, self.height = width, height
        self.script = script

    def tmux(self, *args: str) -> str:
        assert TMUX is not None
        out = subprocess.run(
            [TMUX, "-S", str(self.socket), *args], capture_output=True, text=True, timeout=10
        )
        return out.stdout

    def __enter__(self) -> TmuxRun:
        assert TMUX is not None
        subprocess.run(
            [
                TMUX,
                "-S",
                str(self.socket),
                "-f",
                os.devnull,
                "new-session",
                "-d",
                "-x",
                str(self.width),
                "-y",
                str(self.height),
                "-s",
                "ember",
                f"bash --noprofile --norc {shlex.quote(str(self.script))}",
            ],
            check=True,
            timeout=10,
            env={**os.environ, "TERM": "xterm-256color"},
        )
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(
            [TMUX or "tmux", "-S", str(self.socket), "kill-server"], capture_output=True, timeout=10
        )

    def screen(self) -> str:
        """The visible pane, as text."""
        return self.tmux("capture-pane", "-p", "-t", "ember")

    def scrollback(self) -> str:
        """The pane with up to 500 lines of history above it."""
        return self.tmux("capture-pane", "-p", "-S", "-500", "-t", "ember")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "ember", *keys)

    def cursor_visible(self) -> bool:
        return self.tmux("display-message", "-p", "-t", "ember", "#{cursor_flag}").strip() == "1"

    def wait_screen(self, text: str, timeout: float = 10.0) -> str:
        def found() -> str | None:
            screen = self.screen()
            return screen if text in screen else None

        return wait_for(found, timeout, repr(text), self.screen)  # type: ignore[return-value]

    def wait_match(self, pattern: str, timeout: float = 10.0) -> re.Match[str]:
        def found() -> re.Match[str] | None:
            return re.search(pattern, self.screen())

        return wait_for(found, timeout, f"/{pattern}/", self.screen)  # type: ignore[return-value]

    def wait_exit(self, timeout: float = 30.0) -> int:
        wait_for(
            lambda: self.rc_file.exists() and self.rc_file.read_text().strip(),
            timeout,
            "the program to exit",
            self.screen,
        )
        return int(self.rc_file.read_text().strip())
