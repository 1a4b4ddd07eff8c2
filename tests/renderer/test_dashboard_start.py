"""The dashboard's first frame: drawn at once when `fit` starts, saying that the run
is starting while the first batch loads."""

from __future__ import annotations

import io
import threading
import time

import torch
from rich.console import Console
from tui_script import Blobs, blobs

from ember.optim import AdamConfig
from ember.train import LearnerBuilder
from ember.train.metric import LossMetric
from ember.train.renderer import TuiRenderer

LOADING = 2.0
"""Seconds the first training batch takes to arrive."""


class SlowStart:
    """A training loader whose first batch takes `LOADING` seconds (workers starting,
    a dataset opening), then is as fast as a list."""

    def __init__(self, batches):
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        time.sleep(LOADING)
        return iter(self.batches)


def frame_text(renderer: TuiRenderer) -> str:
    return "\n".join("".join(s.text for s in line) for line in renderer._frame.lines)


def test_a_starting_frame_shows_within_a_second_while_the_first_batch_loads(tmp_path):
    torch.set_num_threads(1)
    console = Console(
        file=io.StringIO(), force_terminal=True, width=100, height=30, color_system=None
    )
    renderer = TuiRenderer(console=console, keys=False)
    learner = (
        LearnerBuilder(tmp_path / "run")
        .metric_train_numeric(LossMetric())
        .num_epochs(1)
        .renderer(renderer)
        .build(Blobs(sleep=0.0), AdamConfig().init(), 1e-2)
    )
    seen: list[tuple[float, str]] = []
    started = time.monotonic()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set() and time.monotonic() - started < LOADING:
            seen.append((time.monotonic() - started, frame_text(renderer)))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        learner.fit(SlowStart(blobs(5, seed=1)))
    finally:
        done.set()
        watcher.join()
    drawn = [(at, text) for at, text in seen if "╭─ metrics" in text]
    assert drawn and drawn[0][0] < 1.0, [at for at, _ in seen]
    first = drawn[0][1]
    assert "mode      starting" in first and "loading the first batch" in first, first
    # ... and it stays there until the first batch came
    waiting = [text for at, text in drawn if at < LOADING - 0.3]
    assert all("mode      starting" in text for text in waiting)
    assert "training completed" in frame_text(renderer)
