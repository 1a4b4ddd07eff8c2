"""The dashboard of a run that validates inside its epochs (`valid_every`), captured in
a real terminal (tmux) at 80 x 24 and 120 x 40: what a person reads at a glance.

`fixtures/dashboard-80x24.txt` and `fixtures/dashboard-120x40.txt` are such captures,
kept for reference (made with `python tests/renderer/test_dashboard_captures.py`). The
tests take a fresh capture and check the same properties on it and on the reference,
and that both have the same layout; never byte equality (timings and values differ).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from tmux_session import TMUX, TmuxRun

FIXTURES = Path(__file__).resolve().parent / "fixtures"
START = 40.0  # python + torch start-up on a busy machine
ARGS = ["--renderer", "tui", "--epochs", "4", "--batches", "40", "--valid-every", "15"]
ARGS += ["--many-metrics", "--sleep", "0.03"]
POINT = r"● valid \(epoch 2, iteration 30\)"
"""The legend once the second validation inside epoch 2 ran: the moment captured."""


def capture(directory: Path, width: int, height: int) -> str:
    """The pane right after the second validation point of epoch 2."""
    with TmuxRun(directory, [str(directory / "run"), *ARGS], width, height) as run:
        run.wait_match(POINT, timeout=START + 30)
        return run.screen()


def fixture(width: int, height: int) -> str:
    return (FIXTURES / f"dashboard-{width}x{height}.txt").read_text(encoding="utf-8")


def significant_digits(number: str) -> int:
    mantissa = re.split(r"e", number)[0].lstrip("-")
    digits = mantissa.replace(".", "").lstrip("0")
    return len(digits if "." in mantissa else digits.rstrip("0"))


def table_rows(lines: list[str]) -> dict[str, list[str]]:
    """The metrics table: each shown metric's values, by name."""
    rows = {}
    for line in lines:
        match = re.match(r"│ [▸ ] (\S+(?: \S+)*?)(?: %| item/s)? {2,}(.*?) ││", line)
        if match and match.group(1) != "metric":
            rows[match.group(1)] = re.findall(r"-?\d[\d.]*(?:e-?\d+)?", match.group(2))
    return rows


def check_dashboard(screen: str, width: int, height: int) -> dict[str, object]:
    """The properties of a capture at `width` x `height`; returns what it found."""
    lines = screen.rstrip("\n").split("\n")
    lines += [""] * (height - len(lines))
    assert len(lines) == height and max(len(line) for line in lines) <= width, screen
    # A clean screen: nothing of the model summary printed before shows as cut rows.
    assert not any(line.startswith("|") for line in lines), screen
    # The dashboard whole, from its header to its footer (lines printed while it runs,
    # such as logging, show above it).
    header = next(i for i, line in enumerate(lines) if line.startswith(" ember "))
    footer = next(i for i, line in enumerate(lines) if line.startswith(" ◀ ▶ metric"))
    assert lines[header].rstrip().endswith("training"), screen
    assert footer - header + 1 == min(36, height - 1), screen
    # The validation column says which validation its values belong to, as the legend.
    legend = re.search(r"● valid \(epoch (\d+)(?:, iteration (\d+))?\) (\S+)", screen)
    assert legend is not None, screen
    epoch, iteration, value = legend.groups()
    if width >= 120:
        where = f"epoch {epoch}" + (f", iteration {iteration}" if iteration else "")
        assert f"valid ({where})" in lines[header + 2], screen
    else:
        where = f"ep {epoch} it {iteration}" if iteration else f"epoch {epoch}"
        assert lines[header + 2].split("││")[0].rstrip(" │").endswith(where), screen
    rows = table_rows(lines)
    assert rows["Loss"][-1] == value, (rows["Loss"], value, screen)
    # One format for every number of the table: 4 significant digits.
    for name, values in rows.items():
        for number in values:
            assert significant_digits(number) == 4 or float(number) == 0, (name, number, screen)
    # Each speed is named with its split, the split the progress bar shows.
    progress = re.search(
        r"epoch ━+ +[\d.]+%  (train|valid) \d+/\d+ +(train|valid) [\d,]+ items/s", screen
    )
    assert progress is not None and progress.group(1) == progress.group(2), screen
    # The validations are marked on the chart.
    chart = [line for line in lines if "┤" in line or line.startswith("│         │")]
    assert sum(line.count("●") for line in chart) >= 3, screen
    return {"epoch": epoch, "iteration": iteration, "rows": rows, "header": header}


def layout(screen: str) -> list[tuple[int, int]]:
    """Where the boxes' top-left corners are, relative to the dashboard's first line."""
    lines = screen.rstrip("\n").split("\n")
    first = next(i for i, line in enumerate(lines) if line.startswith(" ember "))
    return [
        (row - first, column)
        for row, line in enumerate(lines)
        for column, char in enumerate(line)
        if char == "╭"
    ]


@pytest.mark.parametrize(("width", "height"), [(80, 24), (120, 40)])
def test_the_reference_captures_read_as_they_should(width, height):
    found = check_dashboard(fixture(width, height), width, height)
    assert (found["epoch"], found["iteration"]) == ("2", "30")


@pytest.mark.skipif(TMUX is None, reason="tmux is missing: apt-get install tmux")
@pytest.mark.parametrize(("width", "height"), [(80, 24), (120, 40)])
def test_a_fresh_capture_reads_as_the_reference(tmp_path, width, height):
    screen = capture(tmp_path, width, height)
    found = check_dashboard(screen, width, height)
    assert found["epoch"] == "2" and found["iteration"] == "30", screen
    assert layout(screen) == layout(fixture(width, height)), screen
    shown = list(found["rows"])  # type: ignore[call-overload]
    assert shown == list(table_rows(fixture(width, height).split("\n")))


@pytest.mark.skipif(TMUX is None, reason="tmux is missing: apt-get install tmux")
def test_the_dashboard_starts_on_a_clean_screen(tmp_path):
    """The model summary printed before the dashboard scrolls up whole into the
    terminal's history: the dashboard draws from the top line, with no cut rows of
    the summary above it."""
    args = [str(tmp_path / "run"), "--renderer", "tui", "--epochs", "2", "--sleep", "0.5"]
    with TmuxRun(tmp_path, args, 120, 40) as run:
        screen = run.wait_screen("╭─ metrics", timeout=START)
        lines = screen.split("\n")
        assert lines[0].startswith(" ember "), screen
        assert not any(line.startswith("|") for line in lines), screen
        assert "| Total  | Blobs" in run.scrollback()  # in the history, whole


if __name__ == "__main__":  # write the reference captures
    import tempfile

    FIXTURES.mkdir(exist_ok=True)
    for width, height in ((80, 24), (120, 40)):
        with tempfile.TemporaryDirectory() as scratch:
            screen = capture(Path(scratch), width, height)
        check_dashboard(screen, width, height)
        (FIXTURES / f"dashboard-{width}x{height}.txt").write_text(screen, encoding="utf-8")
        print(screen)
    sys.exit(0)
