"""The dashboard's parts, and a real training drawn into a console forced to terminal mode."""

from __future__ import annotations

import io
import itertools
import math
import re
import sys

import pytest
import torch
from rich.console import Console
from tui_script import Blobs, blobs

from ember.errors import ConfigError
from ember.optim import AdamConfig
from ember.train import LearnerBuilder
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer, TuiRenderer, default_renderer
from ember.train.renderer.charts import Series, bar_chart, line_chart
from ember.train.renderer.history import History
from ember.train.renderer.keys import parse_keys
from ember.train.renderer.select import wants_dashboard


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny tensors: a thread pool only adds contention (and noise on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def text(lines) -> list[str]:
    return ["".join(chunk for chunk, _ in line) for line in lines]


# History ---------------------------------------------------------------------------
def test_history_stays_bounded_and_keeps_the_mean():
    history = History(capacity=8, recent=5)
    values = [float(i) for i in range(1, 101)]
    for start in range(0, 100, 7):  # ticks of uneven sizes
        history.extend(1, 100, values[start : start + 7])
    assert len(history.sums) <= 8 and history.count == 100
    view = history.view()
    x, y = view.arrays()
    assert math.isclose(sum(history.sums) / sum(history.counts), 50.5)
    assert list(view.recent) == [96.0, 97.0, 98.0, 99.0, 100.0]
    assert all(0 < a < b <= 1.0 for a, b in itertools.pairwise(x))  # epoch 1 spans (0, 1]
    assert y[0] < y[-1]


def test_history_places_epochs_side_by_side_and_skips_nan():
    history = History()
    history.extend(1, 4, [1.0, 2.0, 3.0, 4.0])
    history.extend(2, 4, [float("nan"), 5.0])
    view = history.view()
    x, y = view.arrays()
    assert list(x) == [0.25, 0.5, 0.75, 1.0, 1.5]
    assert list(y) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert view.last_x == 1.5


def test_history_of_a_run_resumed_mid_epoch_starts_where_it_left_off():
    history = History()
    history.extend(3, 10, [1.0, 2.0], first_iteration=9)
    x, _ = history.view().arrays()
    assert list(x) == [2.9, 3.0]


def test_a_small_terminal_still_gets_a_frame_of_its_size():
    from ember.train.renderer.base import RunInfo
    from ember.train.renderer.panels import Snapshot, dashboard

    info = RunInfo(
        "/a/very/long/artifact/directory/name",
        1,
        3,
        "Model" * 20,
        10**9,
        ("cpu",),
        metrics=(("train", "Loss", "", True),),
    )
    for width, height in ((30, 16), (60, 16), (200, 50)):
        lines = dashboard(Snapshot(info, None, (), ("Loss",), "Loss", "history"), width, height)
        assert [sum(len(t) for t, _ in line) for line in lines] == [width] * height


# Charts ----------------------------------------------------------------------------
def test_line_chart_has_the_asked_size_and_draws_both_curves():
    train = Series([0, 1, 2, 3], [1.0, 0.5, 0.25, 0.1], "cyan")
    valid = Series([0, 3], [0.9, 0.3], "magenta")
    lines = line_chart([train, valid], 60, 12, (0.0, 3.0), [(1.5, "2")], caption="epoch")
    rows = text(lines)
    assert len(rows) == 12 and all(len(row) == 60 for row in rows)
    assert any(re.search("[\u2801-\u28ff]", row) for row in rows)
    styles = {style for line in lines for _, style in line}
    assert {"cyan", "magenta"} <= styles
    assert rows[-1].rstrip().endswith("epoch")
    assert rows[0].startswith("  1.045 ┤") and rows[-2].startswith("  0.055 ┤")


def test_bar_chart_shows_the_last_epochs_that_fit():
    groups = [(str(e), [(1.0 / e, "cyan"), (1.2 / e, "magenta")]) for e in range(1, 40)]
    rows = text(bar_chart(groups, 50, 10, caption="epoch"))
    assert len(rows) == 10 and all(len(row) == 50 for row in rows)
    assert "39" in rows[-1] and " 1 " not in rows[-1]
    assert "█" in "".join(rows)


def test_empty_charts_say_why():
    assert "waiting for values" in "".join(text(line_chart([], 40, 6, (0.0, 1.0))))
    assert "no epoch finished yet" in "".join(text(bar_chart([], 40, 6)))


def test_parse_keys_reads_arrows_and_letters():
    assert parse_keys(b"\x1b[A\x1b[B\x1b[C\x1b[Dq") == ["up", "down", "right", "left", "q"]
    assert parse_keys(b"\x1bOC\x1b[1;5D\x1b") == ["right", "left", "escape"]


# Choosing a renderer ---------------------------------------------------------------
class Stream(io.StringIO):
    def __init__(self, tty: bool, encoding: str = "utf-8") -> None:
        super().__init__()
        self.tty, self._encoding = tty, encoding

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize(
    ("tty", "environ", "dashboard"),
    [
        (True, {"TERM": "xterm-256color"}, True),
        (True, {}, True),
        (True, {"TERM": "xterm", "CI": "false"}, True),
        (False, {"TERM": "xterm-256color"}, False),
        (True, {"TERM": "xterm", "CI": "1"}, False),
        (True, {"TERM": "xterm", "CI": "true"}, False),
        (True, {"TERM": "dumb"}, False),
    ],
)
def test_the_dashboard_is_for_interactive_terminals_only(tty, environ, dashboard):
    assert wants_dashboard(Stream(tty), environ) is dashboard


def test_the_dashboard_needs_a_utf8_terminal():
    assert wants_dashboard(Stream(True, "UTF-8"), {"TERM": "xterm"})
    assert not wants_dashboard(Stream(True, "ascii"), {"TERM": "xterm"})


def test_default_renderer(monkeypatch):
    monkeypatch.setattr(sys, "stdout", Stream(True))
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("CI", raising=False)
    assert isinstance(default_renderer(), TuiRenderer)
    monkeypatch.setenv("CI", "1")
    assert isinstance(default_renderer(), PlainRenderer)


def test_plain_interval_from_the_environment(monkeypatch):
    monkeypatch.delenv("EMBER_PROGRESS_INTERVAL", raising=False)
    assert PlainRenderer().interval == 10.0
    monkeypatch.setenv("EMBER_PROGRESS_INTERVAL", "2.5")
    assert PlainRenderer().interval == 2.5
    assert PlainRenderer(interval=0.0).interval == 0.0  # an explicit value wins
    monkeypatch.setenv("EMBER_PROGRESS_INTERVAL", "soon")
    with pytest.raises(ConfigError, match="EMBER_PROGRESS_INTERVAL"):
        PlainRenderer()


# A real run ------------------------------------------------------------------------
class Pressing(Blobs):
    """Presses dashboard keys from inside train_step, as a person would mid-run."""

    def __init__(self, renderer: TuiRenderer, keys: dict[int, list[str]]) -> None:
        super().__init__(sleep=0.0)
        self.renderer, self.keys = renderer, keys

    def train_step(self, batch):
        for key in self.keys.get(self.steps + 1, []):
            self.renderer.press(key)
        return super().train_step(batch)


def train(tmp_path, renderer: TuiRenderer, model: Blobs, epochs: int = 3):
    learner = (
        LearnerBuilder(tmp_path / "run")
        .metric_train_numeric(LossMetric())
        .metric_train_numeric(AccuracyMetric())
        .metric_valid_numeric(LossMetric())
        .num_epochs(epochs)
        .renderer(renderer)
        .build(model, AdamConfig().init(), 1e-2)
    )
    learner.fit(blobs(20, seed=1), blobs(5, seed=2))
    return learner


def fake_terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=100, height=30, color_system=None), out


def test_a_run_in_a_fake_terminal_draws_every_panel(tmp_path):
    console, out = fake_terminal()
    renderer = TuiRenderer(console=console)
    train(tmp_path, renderer, Blobs(sleep=0.0))
    final = out.getvalue().split("\x1b[2K")[-1]  # the last frame, drawn by end()
    for part in (
        "╭─ metrics",
        "╭─ status",
        "Loss · full history",
        "╭─ progress",
        "training completed",
        "100.0%",
        "epoch 3/3",
        "user print from train_step",
    ):
        assert part in out.getvalue(), part
    assert "train last" in final and "valid epoch" in final
    assert sys.stdout is not None and type(sys.stdout).__name__ != "FileProxy"


def test_keys_switch_the_chart_and_s_stops_the_run(tmp_path):
    console, out = fake_terminal()
    renderer = TuiRenderer(console=console)
    presses = {3: ["right"], 5: ["down"], 7: ["down"], 9: ["q"], 10: ["c"], 25: ["q", "s"]}
    learner = train(tmp_path, renderer, Pressing(renderer, presses), epochs=5)
    snapshot = renderer._snapshot()
    assert snapshot.selected == "Accuracy" and snapshot.view == "epochs"
    assert learner.interrupter.message == "stopped from the dashboard"
    assert snapshot.reason == "stopped: stopped from the dashboard"
    assert "training stopped: stopped from the dashboard" in out.getvalue()
    assert "Accuracy (%) · per epoch" in out.getvalue()


def test_end_without_start_and_twice_is_harmless():
    renderer = TuiRenderer(console=fake_terminal()[0])
    renderer.end("failed")
    renderer.end("failed")


def test_one_renderer_serves_two_runs_in_turn(tmp_path):
    console, out = fake_terminal()
    renderer = TuiRenderer(console=console)
    train(tmp_path / "first", renderer, Blobs(sleep=0.0), epochs=1)
    train(tmp_path / "second", renderer, Blobs(sleep=0.0), epochs=2)
    assert renderer._snapshot().info.num_epochs == 2
    assert out.getvalue().count("training completed") >= 2
    assert not renderer._live.is_started


def test_a_chart_of_values_near_zero_does_not_dip_below_zero():
    rows = text(line_chart([Series([0, 1, 2], [0.9, 0.01, 0.0], "cyan")], 40, 8, (0.0, 2.0)))
    assert rows[-2].startswith("      0 ┤")


class Failing(Blobs):
    def train_step(self, batch):
        if self.steps == 6:
            raise RuntimeError("boom")
        return super().train_step(batch)


def test_a_failing_run_gives_the_terminal_back(tmp_path):
    console, out = fake_terminal()
    renderer = TuiRenderer(console=console)
    stdout, stderr = sys.stdout, sys.stderr
    with pytest.raises(RuntimeError, match="boom"):
        train(tmp_path, renderer, Failing(sleep=0.0))
    assert sys.stdout is stdout and sys.stderr is stderr
    assert not renderer._live.is_started
    assert "training failed" in out.getvalue()
    assert out.getvalue().endswith("\x1b[?25h")  # the cursor is shown again


def test_a_short_terminal_keeps_the_progress_and_the_stop_prompt():
    from ember.train.renderer.base import Progress, RunInfo
    from ember.train.renderer.panels import Snapshot, dashboard

    info = RunInfo("/run", 1, 3, "Model", 10, ("cpu",), metrics=(("train", "Loss", "", True),))
    progress = Progress("train", 2, 3, 5, 10, 320, 1.0)
    snapshot = Snapshot(info, progress, (), ("Loss",), "Loss", "history", prompt=True)
    for height in range(3, 17):
        lines = dashboard(snapshot, 80, height)
        text = ["".join(t for t, _ in line) for line in lines]
        assert [len(line) for line in text] == [80] * height, height
        assert text[0].startswith(" ember ") and "stop the run?" in text[-1], height
        assert any(line.lstrip("│ ").startswith("epoch ━") for line in text), height
        if height >= 4:
            assert any(line.lstrip("│ ").startswith("total ━") for line in text), height
        assert any("╭─ metrics" in line for line in text) == (height >= 10), height
        assert any("full history" in line for line in text) == (height >= 16), height
