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
from tui_script import MANY_METRICS, Blobs, blobs, many_metrics

from ember.errors import ConfigError
from ember.optim import AdamConfig
from ember.train import LearnerBuilder
from ember.train.metric import AccuracyMetric, LossInput, LossMetric, MetricMetadata, MetricValue
from ember.train.renderer import PlainRenderer, TuiRenderer, default_renderer
from ember.train.renderer.charts import Series, bar_chart, line_chart, tick_labels
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
    assert parse_keys(b"\x1b[5~\x1b[6~\x1b[3~x") == ["pageup", "pagedown", "x"]


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
    # The columns say which epoch their values belong to, and so does the chart's legend.
    assert "train last" in final and "train (epoch 3)" in final and "valid (epoch 3)" in final
    assert "● valid (epoch 3) " in final
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


# Every metric on a standard terminal, no label twice -------------------------------
def frame_text(renderer: TuiRenderer) -> list[str]:
    """The renderer's last drawn frame, as lines of text."""
    return ["".join(segment.text for segment in line) for line in renderer._frame.lines]


def metric_values(screen: str, name: str) -> list[str] | None:
    """The values on `name`'s row of the metrics table (None if the row is not shown)."""
    row = re.search(rf"^│ [▸ ] {re.escape(name)}(?![\w-])(.*?)││", screen, re.MULTILINE)
    if row is None:
        return None
    return re.findall(r"-?\d[\d.]*(?:e-?\d+)?|nan", row.group(1))


def test_every_metric_and_both_epoch_columns_fit_80_by_24(tmp_path):
    """Six metrics on an 80 x 24 terminal: every name whole, every value of both splits
    (the valid epoch column included, headed by the epoch it belongs to), nothing
    scrolled away."""
    names = [name for name in MANY_METRICS if name != "Entropy"]
    assert len(names) == 6 and "Learning Rate" in names
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80, height=24, color_system=None)
    renderer = TuiRenderer(console=console, keys=False)
    builder = LearnerBuilder(tmp_path / "run").num_epochs(2).renderer(renderer)
    for metric in many_metrics("train", names):
        builder = builder.metric_train_numeric(metric)
    for metric in many_metrics("valid", names):
        builder = builder.metric_valid_numeric(metric)
    builder.build(Blobs(sleep=0.0), AdamConfig().init(), 1e-2).fit(
        blobs(10, seed=1), blobs(3, seed=2)
    )
    lines = frame_text(renderer)
    screen = "\n".join(lines)
    assert len(lines) == 23 and all(len(line) == 80 for line in lines)
    assert re.search(r"╭─ metrics ─+ train ─+ valid ─+╮", screen), screen
    assert re.search(r"│   metric +last +epoch 2 +epoch 2 │", screen), screen
    for name in names:
        values = metric_values(screen, name)
        assert values is not None, f"{name} is not shown\n{screen}"
        assert len(values) == len(MANY_METRICS[name]) + 1, f"{name}: {values}\n{screen}"
    assert metric_values(screen, "Learning Rate") == ["0.01000", "0.01000"]
    assert "more" not in screen and "hidden" not in screen
    assert "Loss · full history" in screen  # the chart keeps its place


def test_a_long_metrics_table_scrolls_and_says_so():
    """More metrics than fit: the border says how many are below and which key shows
    them; PgDn and PgUp page through; choosing a metric scrolls to it."""
    from ember.train.renderer.base import MetricView, Progress, RunInfo

    names = [f"Metric {index}" for index in range(1, 10)]
    info = RunInfo(
        "/run",
        1,
        3,
        "Model",
        10,
        ("cpu",),
        metrics=tuple((split, name, "", True) for split in ("train", "valid") for name in names),
    )
    views = [
        MetricView(split, name, "", True, float(index), float(index) / 10)
        for split in ("train", "valid")
        for index, name in enumerate(names, 1)
    ]
    console = Console(file=io.StringIO(), force_terminal=True, width=80, height=24)
    renderer = TuiRenderer(console=console, keys=False)
    renderer.start(info)
    try:
        renderer.update(Progress("train", 1, 3, 1, 10, 16, 0.5), views, [])
        renderer._draw()
        screen = "\n".join(frame_text(renderer))
        shown = [name for name in names if metric_values(screen, name) is not None]
        assert shown == names[:6], screen
        assert "▾ 3 more · PgDn ─╯" in screen
        renderer.press("pagedown")
        renderer._draw()
        screen = "\n".join(frame_text(renderer))
        assert [n for n in names if metric_values(screen, n) is not None] == names[3:], screen
        assert metric_values(screen, "Metric 9") == ["9.000", "0.9000", "0.9000"]
        assert "▴ 3 above · PgUp ─╯" in screen
        renderer.press("pageup")
        renderer._draw()
        screen = "\n".join(frame_text(renderer))
        assert [n for n in names if metric_values(screen, n) is not None] == names[:6], screen
        renderer.press("left")  # the last metric: the table follows the choice
        renderer._draw()
        screen = "\n".join(frame_text(renderer))
        assert "│ ▸ Metric 9 " in screen and "▴ 3 above" in screen, screen
        renderer.press("right")  # back to the first
        renderer._draw()
        screen = "\n".join(frame_text(renderer))
        assert "│ ▸ Metric 1 " in screen and "▾ 3 more" in screen, screen
    finally:
        renderer.end("completed")


def test_the_metrics_table_fits_any_width_and_says_what_it_leaves_out():
    from ember.train.renderer.base import MetricView, Progress, RunInfo
    from ember.train.renderer.panels import Snapshot, dashboard

    metrics = [("Loss", ""), ("Learning Rate", ""), ("Iteration Speed", "item/s")]
    metrics += [("A Rather Long Metric Name", "%")]
    info = RunInfo("/run", 1, 3, "Model", 10, ("cpu",))
    views = tuple(
        MetricView(split, name, unit, True, -1.2345e-5 * 10**index, 12345.678)
        for split in ("train", "valid")
        for index, (name, unit) in enumerate(metrics)
    )
    progress = Progress("train", 2, 3, 5, 10, 320, 1.0)
    snapshot = Snapshot(info, progress, views, (), "Loss", "history")
    for width in range(40, 201, 8):
        lines = ["".join(t for t, _ in line) for line in dashboard(snapshot, width, 30)]
        assert [len(line) for line in lines] == [width] * 30, width
        table = [line.split("││")[0] for line in lines if "││" in line]
        columns = len(re.findall(r"last|epoch", table[0]))
        for row in table[1:5]:
            assert len(re.findall(r"-?\d[\d.]*(?:e-?\d+)?", row)) == columns, row
        if columns < 3:
            assert f"{3 - columns} column" in lines[8] or f"+{3 - columns} col" in lines[8]
        if width >= 80:
            assert columns == 3, (width, table)
        if width >= 88:
            assert all(name in "\n".join(table) for name, _ in metrics[:3]), table
        if width < 60:
            assert "…" in "\n".join(table)  # a name cut shows that it is
    wide = "\n".join("".join(t for t, _ in line) for line in dashboard(snapshot, 200, 30))
    assert "train last" in wide and "-1.234e-5" in wide and "1.235e4 item/s" in wide


@pytest.mark.parametrize(
    "values",
    [
        (0.51236, 0.51235, 0.51234),  # a loss on a plateau
        (12.3518, 12.3486, 12.3454),  # memory in GB, drifting slowly
        (100.004, 99.999, 99.994),  # an accuracy at 100 %: "100.0" and "100"
        (1.04e-4, 1.0e-4, 0.96e-4),  # a loss late in training
        (124000.0, 123400.0, 122800.0),  # a throughput in items/s
        (1.26e-5, 1.24e-5, 1.22e-5),  # a learning rate near its floor
        (-124000.0, -123400.0, -122800.0),
        (1.72, 0.86, 0.0),
    ],
)
def test_axis_labels_are_never_alike(values):
    labels = tick_labels(values)
    assert all(0 < len(label) <= 7 for label in labels), labels
    assert len({float(label) for label in labels}) == len(labels), labels
    for label, value in zip(labels, values):
        assert math.isclose(float(label), value, rel_tol=0.01, abs_tol=1e-12), (label, value)


def test_axis_labels_too_close_to_tell_apart_are_left_out():
    assert tick_labels((12345.6701, 12345.67, 12345.6699)) == ["12345.7", "", ""]
    assert tick_labels((-1.2345e-5, -1.2355e-5, -1.2365e-5)) == ["-1.2e-5", "", ""]


class Throughput:
    """Items per second that hardly change: about 123,400, drifting by 2 a step."""

    name = "Throughput"
    unit = "item/s"
    input_type = LossInput

    def __init__(self) -> None:
        self.steps = 0

    def update(self, input, meta: MetricMetadata) -> MetricValue:
        self.steps += 1
        return MetricValue(123_400.0 + 2.0 * self.steps + (self.steps % 3), 1)

    def clear(self) -> None:
        pass


def y_labels(lines: list[str]) -> list[str]:
    """The y-axis labels of the chart in a frame."""
    return [m.group(1) for line in lines for m in [re.match(r"│ +(\S+) ┤", line)] if m]


def test_no_y_axis_label_is_drawn_twice_at_160_columns(tmp_path):
    """Values that differ in their fifth digit: with four digits the chart's top, middle
    and bottom labels all read "1.2e+05"; they get the digits that tell them apart."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160, height=40, color_system=None)
    renderer = TuiRenderer(console=console, keys=False)
    (
        LearnerBuilder(tmp_path / "run")
        .metric_train_numeric(Throughput())
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(Throughput())
        .num_epochs(3)
        .renderer(renderer)
        .build(Blobs(sleep=0.0), AdamConfig().init(), 1e-2)
        .fit(blobs(30, seed=1), blobs(5, seed=2))
    )
    for view in ("full history", "last 300 iterations", "per epoch"):
        lines = frame_text(renderer)
        assert all(len(line) == 160 for line in lines)
        assert any(f"Throughput (item/s) · {view}" in line for line in lines), lines
        labels = y_labels(lines)
        assert len(labels) == len(set(labels)) >= 2, (view, labels)
        assert len({float(label) for label in labels}) == len(labels), (view, labels)
        renderer.press("down")
        renderer._draw()


def test_the_model_summary_is_above_the_dashboard_and_the_stop_rule_in_its_footer(tmp_path):
    from ember.train import MetricEarlyStoppingStrategy

    console, out = fake_terminal()
    learner = (
        LearnerBuilder(tmp_path / "run")
        .metric_valid_numeric(LossMetric())
        .early_stopping(MetricEarlyStoppingStrategy(LossMetric(), stopping_threshold=1e9))
        .num_epochs(3)
        .renderer(TuiRenderer(console=console))
        .build(Blobs(sleep=0.0), AdamConfig().init(), 1e-2)
    )
    learner.fit(blobs(20, seed=1), blobs(5, seed=2))
    shown = out.getvalue()
    assert shown.index("Model Blobs:") < shown.index("╭─ metrics")  # printed before the first frame
    assert "| Total  | Blobs" in shown
    assert learner.outcome.startswith("stopped early: valid Loss reached the stopping threshold")
    assert f"training {learner.outcome}" in shown.split("\x1b[2K")[-1]  # the last frame
