"""The dashboard in a real terminal (tmux): what it shows, its keys, and a clean exit."""

from __future__ import annotations

import re

from tmux_session import TMUX, TmuxRun, wait_for
from tui_script import MANY_METRICS


def test_tmux_is_installed():
    """`make test` installs tmux when it is missing; without it these tests cannot drive a terminal."""
    assert TMUX is not None, "tmux is missing: apt-get install tmux (make test does it)"


START = 40.0  # python + torch start-up on a busy machine


def terminal_restored(stty: str) -> bool:
    """`stty -a` says the line discipline is back to canonical mode with echo."""
    words = set(re.split(r"[\s;]+", stty))
    return {"icanon", "echo"} <= words and not {"-icanon", "-echo"} & words


def test_dashboard_keys_and_graceful_stop(tmp_path):
    artifacts = tmp_path / "run"
    args = [str(artifacts), "--renderer", "default", "--epochs", "40", "--checkpoint"]
    with TmuxRun(tmp_path, args) as run:
        run.wait_screen("Loss · full history", timeout=START)
        screen = run.wait_match(r"epoch ━+ +[\d.]+%  train \d+/40 ")[0]
        screen = run.screen()
        # All four panels, side by side where they fit.
        assert "╭─ metrics" in screen and "╭─ status" in screen and "╭─ progress" in screen
        assert re.search(r"total ━+ +[\d.]+%  epoch \d+/40 ", screen), screen
        assert "▸ Loss" in screen and "Accuracy" in screen
        assert "mode      train" in screen or "mode      valid" in screen
        assert "◀ ▶ metric" in screen
        history = run.scrollback()
        assert "renderer TuiRenderer" in history  # default_renderer() on a terminal
        # The user's print and logging show above the dashboard, which stays whole.
        wait_for(lambda: "user print from train_step" in run.scrollback(), 10, "the user's print")
        history = run.scrollback()
        assert "WARNING user warning from train_step" in history
        assert history.index("user print from train_step") < history.rindex("╭─ metrics")
        assert run.screen().count("╭─ progress") == 1

        run.keys("Right")
        run.wait_screen("Accuracy (%) · full history")
        run.keys("Down")
        run.wait_screen("Accuracy (%) · last 300 iterations")
        run.keys("Down")
        screen = run.wait_screen("Accuracy (%) · per epoch")
        run.keys("Up")
        run.wait_screen("Accuracy (%) · last 300 iterations")
        run.keys("Left")
        screen = run.wait_screen("Loss · last 300 iterations")
        assert "▸ Loss" in screen

        run.keys("q")
        run.wait_screen("stop the run?")
        run.keys("c")
        wait_for(lambda: "stop the run?" not in run.screen(), 5, "the prompt to close", run.screen)
        assert run.rc_file.exists() is False  # cancel keeps training

        run.keys("q")
        run.wait_screen("stop the run?")
        run.keys("s")
        assert run.wait_exit() == 0
        screen = run.screen()
        assert "training stopped: stopped from the dashboard" in run.scrollback()
        assert run.cursor_visible()
        assert terminal_restored(run.stty_file.read_text())
    log = (artifacts / "experiment.log").read_text()
    assert "stopped: stopped from the dashboard" in log
    epoch = int(re.findall(r"Checkpoint of epoch (\d+)\b", log)[-1])
    assert epoch < 40
    assert (artifacts / "checkpoint" / f"model-{epoch}.mpk.gz").exists()
    assert (artifacts / "train" / f"epoch-{epoch}" / "Loss.log").exists()
    assert not (artifacts / "train" / f"epoch-{epoch + 1}").exists()


def test_kill_restores_the_terminal(tmp_path):
    args = [str(tmp_path / "run"), "--renderer", "tui", "--epochs", "40"]
    with TmuxRun(tmp_path, args) as run:
        run.wait_screen("Loss · full history", timeout=START)
        assert not run.cursor_visible()  # hidden while the dashboard draws
        run.keys("q")
        run.wait_screen("stop the run?")
        run.keys("k")
        code = run.wait_exit()
        assert code != 0
        assert "KeyboardInterrupt" in run.scrollback()
        assert run.cursor_visible()
        assert terminal_restored(run.stty_file.read_text())
    log = (tmp_path / "run" / "experiment.log").read_text()
    assert "interrupted" in log


def test_persistent_dashboard_waits_for_a_key(tmp_path):
    args = [
        str(tmp_path / "run"),
        "--renderer",
        "tui",
        "--epochs",
        "2",
        "--batches",
        "10",
        "--sleep",
        "0.01",
        "--persistent",
    ]
    with TmuxRun(tmp_path, args) as run:
        screen = run.wait_screen("press any key to close", timeout=START)
        assert "training completed" in screen
        assert "100.0%" in screen
        assert not run.rc_file.exists()
        run.keys("x")
        assert run.wait_exit(timeout=10) == 0
        assert "training script finished" in run.scrollback()
        assert terminal_restored(run.stty_file.read_text())


def test_keys_work_again_after_ctrl_z_and_fg(tmp_path):
    """The shell gives a resumed job its terminal back in line mode; the dashboard takes
    keys one by one again, and still restores the terminal at the end."""
    args = [str(tmp_path / "run"), "--renderer", "tui", "--epochs", "40"]
    stty = tmp_path / "after.txt"
    with TmuxRun(tmp_path, args, shell=True) as run:

        def prompt() -> bool:  # the shell waits for a command (typing earlier feeds the job)
            lines = [line for line in run.screen().splitlines() if line.strip()]
            return bool(lines) and lines[-1].strip() == "$"

        wait_for(prompt, START, "the shell's prompt", run.screen)
        run.keys(run.command, "Enter")
        run.wait_screen("Loss · full history", timeout=START)
        run.keys("C-z")
        run.wait_screen("Stopped")
        run.keys("fg", "Enter")
        run.wait_match(r"total ━+ +[\d.]+%  epoch \d+/40 ")
        run.keys("Right")
        run.wait_screen("Accuracy (%) · full history")
        run.keys("q")
        run.wait_screen("stop the run?")
        run.keys("s")
        wait_for(prompt, 30, "the run to stop and the shell's prompt", run.screen)
        assert "training stopped: stopped from the dashboard" in run.scrollback()
        run.keys(f"stty -a > {stty}", "Enter")
        wait_for(lambda: stty.exists() and stty.read_text(), 10, "stty", run.screen)
        assert terminal_restored(stty.read_text())


def metric_values(screen: str, name: str) -> list[str] | None:
    """The values on `name`'s row of the metrics table (None if the row is not shown)."""
    row = re.search(rf"^│ [▸ ] {re.escape(name)}(?![\w-])(.*?)││", screen, re.MULTILINE)
    if row is None:
        return None
    return re.findall(r"-?\d[\d.]*(?:e-?\d+)?|nan", row.group(1))


def test_every_metric_on_an_80_by_24_terminal(tmp_path):
    """Seven metrics, "Learning Rate" among them, on the standard terminal size: the
    table shows the training's last and epoch values and the validation's, each column
    headed by its epoch; the row that does not fit is announced in the table's border,
    and PgDn (or choosing that metric) shows it."""
    names = list(MANY_METRICS)
    args = [str(tmp_path / "run"), "--renderer", "tui", "--epochs", "40", "--many-metrics"]
    with TmuxRun(tmp_path, args, width=80, height=24) as run:
        run.wait_screen("Loss · full history", timeout=START)
        # After the first epoch every row has its values, the valid epoch ones included.
        run.wait_match(r"epoch +([2-9]|\d\d)/40")
        screen = run.screen()
        lines = screen.splitlines()
        assert len(lines) == 24 and max(len(line) for line in lines) <= 80, screen
        assert re.search(r"╭─ metrics ─+ train ─+ valid ─+╮", screen), screen
        assert re.search(r"│   metric +last +epoch \d+ +epoch \d+ │", screen), screen
        shown = [name for name in names if metric_values(screen, name) is not None]
        assert shown == names[:6], screen
        for name in shown:
            values = metric_values(screen, name)
            assert len(values) == len(MANY_METRICS[name]) + 1, (name, values, screen)
        assert metric_values(screen, "Learning Rate") == ["0.01000", "0.01000"], screen
        assert "▾ 1 more · PgDn ─╯" in screen
        assert "full history" in screen and "╭─ progress" in screen

        run.keys("PageDown")
        screen = run.wait_screen("▴ 1 above · PgUp")
        shown = [name for name in names if metric_values(screen, name) is not None]
        assert shown == names[1:], screen
        assert len(metric_values(screen, "Iteration Speed")) == 2, screen
        run.keys("PageUp")
        screen = run.wait_screen("▾ 1 more · PgDn")
        assert metric_values(screen, "Loss") is not None, screen

        run.keys("Left")  # from the first metric to the last: the table follows
        screen = run.wait_screen("Iteration Speed (item/s) · full history")
        assert "│ ▸ Iteration Speed " in screen and "▴ 1 above" in screen, screen

        run.keys("q")
        run.wait_screen("stop the run?")
        run.keys("s")
        assert run.wait_exit() == 0
