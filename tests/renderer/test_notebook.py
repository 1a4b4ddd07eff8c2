"""The notebook display: the quickstart notebook run headlessly in a real kernel, and the
renderer's parts in-process with a fake display."""

from __future__ import annotations

import html
import json
import os
import re
import sys
import time
import types
from pathlib import Path

import nbformat
import pytest
from ember_testing import Classifier
from jupyter_client.manager import start_new_kernel
from nbclient import NotebookClient

import ember
import ember.train.renderer.notebook as notebook
from ember.optim import AdamConfig
from ember.train import LearnerBuilder
from ember.train.history import RunHistory
from ember.train.logger import read_metric_log
from ember.train.logger.base import MetricRecord
from ember.train.logger.file import weighted_mean
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import (
    NotebookRenderer,
    PlainRenderer,
    TuiRenderer,
    default_renderer,
    in_notebook,
)
from ember.train.renderer.base import MetricView, Progress, RunInfo
from ember.train.renderer.format import format_number

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "notebooks" / "quickstart.ipynb"
UNITS = {metric.name: metric.unit for metric in (LossMetric(), AccuracyMetric())}


# The quickstart in a real kernel -------------------------------------------------------
class CountingClient(NotebookClient):
    """Keeps the first line of every display update the kernel sends, per display id
    (the saved notebook holds only the last)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.updates: dict[str, list[str]] = {}

    def process_message(self, msg, cell, cell_index):
        if msg["header"]["msg_type"] == "update_display_data":
            display_id = msg["content"].get("transient", {}).get("display_id", "")
            first = msg["content"]["data"].get("text/plain", "").split("\n")[0]
            self.updates.setdefault(display_id, []).append(first)
        return super().process_message(msg, cell, cell_index)


PROBE = """
import json, sys
print("PROBE " + json.dumps({
    "prefix": sys.prefix,
    "renderer": type(learner.renderer).__name__,
    "frames": learner.renderer.frames,
    "draw_seconds": learner.renderer.draw_seconds,
}))
"""


def kernel_environment(patch: pytest.MonkeyPatch, artifact_dir: Path) -> None:
    """What a kernel started from here inherits: the run's directory, ember's source."""
    patch.setenv("EMBER_NOTEBOOK_DIR", str(artifact_dir))
    paths = (str(ROOT / "src"), os.environ.get("PYTHONPATH"))
    patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))
    patch.setenv("OMP_NUM_THREADS", "1")  # a tiny model: threads only contend


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The quickstart executed headlessly (cwd and artifacts in a temporary directory),
    with a last cell added that reports on the kernel and the renderer."""
    workdir = tmp_path_factory.mktemp("notebook")
    artifact_dir = workdir / "run"
    nb = nbformat.read(QUICKSTART, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    client = CountingClient(
        nb, kernel_name="python3", timeout=120, resources={"metadata": {"path": str(workdir)}}
    )
    with pytest.MonkeyPatch.context() as patch:  # the kernel inherits this environment
        kernel_environment(patch, artifact_dir)
        started = time.perf_counter()
        client.execute()
        seconds = time.perf_counter() - started
    outputs = [
        (index, output) for index, cell in enumerate(nb.cells) for output in cell.get("outputs", [])
    ]
    probe_text = "".join(o.get("text", "") for _, o in outputs if o.output_type == "stream")
    probe = json.loads(re.search(r"^PROBE (.*)$", probe_text, re.M).group(1))
    return types.SimpleNamespace(
        nb=nb,
        outputs=outputs,
        updates=client.updates,
        artifact_dir=artifact_dir,
        probe=probe,
        seconds=seconds,
    )


def test_the_quickstart_notebook_is_stored_clean():
    nb = nbformat.read(QUICKSTART, as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)
    assert nb.cells[0].cell_type == "markdown"
    assert not any(".renderer(" in cell.source for cell in code)  # the default is exercised


def test_the_kernel_is_this_environment_and_picks_the_notebook_display(executed):
    assert Path(executed.probe["prefix"]).resolve() == Path(sys.prefix).resolve()
    assert executed.probe["renderer"] == "NotebookRenderer"
    assert executed.seconds < 60


def test_the_run_shows_as_one_display_updated_live(executed):
    displays = [(i, o) for i, o in executed.outputs if o.output_type == "display_data"]
    assert len(displays) == 1
    fit_cell, _ = displays[0]
    assert "learner.fit(" in executed.nb.cells[fit_cell].source
    assert not [o for _, o in executed.outputs if o.output_type == "error"]
    (display_id, states), *others = executed.updates.items()
    assert not others and display_id
    # Updated while training, not only at the end.
    assert len(states) >= 2 and states[-1].endswith(" · completed"), states
    assert any(state.endswith(" · training") for state in states[:-1]), states
    assert executed.probe["frames"] == len(states) + 1  # the opening view, then each update


def test_the_final_view_holds_the_run_as_logged(executed):
    (_, output) = next((i, o) for i, o in executed.outputs if o.output_type == "display_data")
    page, text = output.data["text/html"], output.data["text/plain"]
    root = executed.artifact_dir
    epochs = sorted(int(p.name.split("-")[1]) for p in (root / "valid").glob("epoch-*"))
    last = epochs[-1]
    names = sorted(p.stem for p in (root / "valid" / f"epoch-{last}").glob("*.log"))
    assert names == ["Accuracy", "Loss"] and epochs == list(range(1, 11))

    assert "Classifier" in page and "completed" in page and html.escape(str(root)) in page
    assert page.count("<svg") == len(names)
    assert "<script" not in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")
    assert text.splitlines()[0].startswith("ember · Classifier · ")
    assert text.splitlines()[0].endswith(" · completed")
    logged = dict(RunHistory.load(root / "history.jsonl").epochs)[last]
    for split in ("train", "valid"):
        for name in names:
            lines = read_metric_log(root / split / f"epoch-{last}" / f"{name}.log")
            epoch_value = weighted_mean(lines)
            assert logged[split][name] == pytest.approx(epoch_value, rel=1e-12)
            # the epoch value, and the training's last iteration value
            shown_values = (epoch_value, lines[-1][0]) if split == "train" else (epoch_value,)
            for value in shown_values:
                shown = format_number(value, UNITS[name])
                assert f">{html.escape(shown)}</td>" in page, (split, name, shown)
                assert shown in text, (split, name, shown)


def test_no_output_carries_terminal_control_codes(executed):
    for _, output in executed.outputs:
        if output.output_type == "stream":
            assert "\x1b[" not in output.text
        for value in output.get("data", {}).values():
            assert "\x1b[" not in str(value)


def test_the_artifact_directory_has_the_standard_layout(executed):
    root = executed.artifact_dir
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    expected = ["experiment.log", "history.jsonl", "sessions.json"] + [
        f"{split}/epoch-{epoch}/{name}.log"
        for split in ("train", "valid")
        for epoch in range(1, 11)
        for name in ("Accuracy", "Loss")
    ]
    assert files == sorted(expected)


def test_interrupting_the_kernel_stops_the_run_gracefully(tmp_path, monkeypatch):
    kernel_environment(monkeypatch, tmp_path / "run")
    nb = nbformat.read(QUICKSTART, as_version=4)
    cells = [cell.source for cell in nb.cells if cell.cell_type == "code"]
    at = next(index for index, source in enumerate(cells) if "learner.fit(" in source)
    setup = "\n".join(cells[:at])
    fit = re.sub(r"\.num_epochs\(\d+\)", ".num_epochs(100_000)", cells[at])
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    messages = []
    try:
        client.execute_interactive(setup, timeout=60, output_hook=lambda msg: None)
        msg_id = client.execute(fit + "\nprint('outcome:', learner.outcome)")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            msg = client.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            messages.append(msg)
            if msg["msg_type"] == "display_data":  # fit has started: Ctrl-C, as the stop button
                manager.interrupt_kernel()
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    kinds = [msg["msg_type"] for msg in messages]
    assert "error" not in kinds and kinds.count("display_data") == 1, kinds
    printed = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
    assert "outcome: stopped: interrupted from the notebook" in printed
    last = [m for m in messages if m["msg_type"] == "update_display_data"][-1]
    state = last["content"]["data"]["text/plain"].splitlines()[0]
    assert state.endswith(
        " · stopped: interrupted from the notebook (interrupt again to stop at once)"
    )


# The renderer in-process ---------------------------------------------------------------
class FakeHandle:
    """What `IPython.display.display(..., display_id=True)` returns, recording updates."""

    def __init__(self, bundle: dict, delay: float = 0.0, fail_after: int | None = None) -> None:
        self.bundles = [bundle]
        self.delay = delay
        self.fail_after = fail_after

    def update(self, bundle: dict, raw: bool = False) -> None:
        assert raw
        if self.fail_after is not None and len(self.bundles) > self.fail_after:
            raise RuntimeError("the front end went away")
        time.sleep(self.delay)
        self.bundles.append(bundle)


@pytest.fixture
def displays(monkeypatch):
    """Replaces the notebook's display with fake handles; returns the ones opened."""
    opened: list[FakeHandle] = []
    options: dict = {}

    def open_display(bundle):
        handle = FakeHandle(bundle, **options)
        opened.append(handle)
        return handle

    monkeypatch.setattr(notebook, "_open_display", open_display)
    return types.SimpleNamespace(handles=opened, options=options)


def run_info(tmp_path, name="Classifier", metrics=("Loss", "Accuracy"), epochs=3) -> RunInfo:
    registered = tuple(
        (split, metric, UNITS.get(metric, ""), True)
        for split in ("train", "valid")
        for metric in metrics
    )
    return RunInfo(str(tmp_path), 1, epochs, name, 1234, ("cpu",), registered)


def views(metrics=("Loss", "Accuracy"), value: float = 0.5) -> list[MetricView]:
    """Every metric's view, as the loop hands them to the renderer."""
    return [
        MetricView(split, metric, UNITS.get(metric, ""), True, value, value)
        for split in ("train", "valid")
        for metric in metrics
    ]


def progress(split="train", epoch=1, iteration=1, total=100, epochs=3) -> Progress:
    return Progress(split, epoch, epochs, iteration, total, iteration * 16, 0.01 * iteration)


def records(name: str, first: int, count: int, value: float = 0.5) -> list[MetricRecord]:
    return [MetricRecord(name, i, value, 16.0) for i in range(first, first + count)]


def test_many_updates_within_the_interval_draw_once_and_ends_always_draw(tmp_path, displays):
    renderer = NotebookRenderer(interval=0.5, render_budget=0)
    renderer.start(run_info(tmp_path))
    (handle,) = displays.handles
    assert len(handle.bundles) == 1 and "starting" in handle.bundles[0]["text/plain"]
    assert handle.bundles[0]["text/html"].count("waiting for values") == 2
    time.sleep(0.55)
    for iteration in range(1, 51):
        renderer.update(progress(iteration=iteration), views(), records("Loss", iteration, 1))
    assert len(handle.bundles) == 2  # the first update after the interval, then none
    renderer.end_split(progress(iteration=50, total=50), views())
    assert len(handle.bundles) == 3
    renderer.end("completed")
    assert len(handle.bundles) == 4
    assert handle.bundles[-1]["text/plain"].splitlines()[0].endswith("· completed")
    renderer.end("completed")  # a second end changes nothing
    assert len(handle.bundles) == 4 and renderer.frames == 4


def test_drawing_keeps_to_its_share_of_the_time(tmp_path, displays):
    displays.options["delay"] = 0.02  # a slow front end: each update costs 20 ms
    renderer = NotebookRenderer(interval=0.0, render_budget=0.05)
    renderer.start(run_info(tmp_path))
    started = time.perf_counter()
    iteration = 0
    while time.perf_counter() - started < 1.0:
        iteration += 1
        renderer.update(progress(iteration=iteration), views(), records("Loss", iteration, 1))
        renderer.end_split(progress(iteration=iteration), views())
        time.sleep(0.002)
    elapsed = time.perf_counter() - started
    (handle,) = displays.handles
    assert 2 <= len(handle.bundles) <= 5, len(handle.bundles)  # about one view per 0.4 s
    assert renderer.draw_seconds <= 0.05 * elapsed + 0.06
    renderer.end("completed")
    assert "completed" in handle.bundles[-1]["text/plain"]


def test_user_strings_are_escaped(tmp_path, displays):
    hostile = '<script>alert("x")</script>&'
    metric = '<img src=x onerror="alert(1)">'
    renderer = NotebookRenderer()
    info = run_info(tmp_path / "<b>dir</b>", name=hostile, metrics=(metric, "Loss"))
    renderer.start(info)
    renderer.update(progress(iteration=5), views((metric, "Loss")), records(metric, 1, 5))
    renderer.end_split(progress(iteration=5, total=5), views((metric, "Loss")))
    renderer.end("failed: <oops>")
    page = displays.handles[0].bundles[-1]["text/html"]
    for raw in (hostile, metric, "<b>dir</b>", "<oops>"):
        assert raw not in page
        assert html.escape(raw) in page
    assert "<script" not in page and "<img" not in page
    assert page.count("<svg") == 2
    assert hostile in displays.handles[0].bundles[-1]["text/plain"]


def test_a_long_run_keeps_the_view_the_same_size(tmp_path, displays):
    def final_page(epochs: int) -> str:
        renderer = NotebookRenderer(interval=3600, render_budget=1e-9)  # only `end` draws
        renderer.start(run_info(tmp_path, epochs=epochs))
        for epoch in range(1, epochs + 1):
            for split, total in (("train", 40), ("valid", 10)):
                for first in range(1, total + 1, 10):
                    at = progress(split, epoch, first + 9, total, epochs)
                    batch = records("Loss", first, 10, 1.0 / epoch) + records(
                        "Accuracy", first, 10, 100 - 50 / epoch
                    )
                    renderer.update(at, views(value=1.0 / epoch), batch)
                renderer.end_split(at, views(value=1.0 / epoch))
        renderer.end("completed")
        return displays.handles[-1].bundles[-1]["text/html"]

    short, long = final_page(10), final_page(1500)
    assert long.count("<svg") == short.count("<svg") == 2
    assert short.count("<circle") == 2 * 2 * 10  # two splits' epoch values per chart
    assert long.count("<circle") == 0 and long.count("stroke-dasharray") == 4
    assert len(long) < 1.5 * len(short) and len(long) < 25_000, (len(short), len(long))


def test_a_run_draws_every_iteration_and_the_logged_values(tmp_path, displays, loaders):
    ember.seed(0)
    renderer = NotebookRenderer()
    learner = (
        LearnerBuilder(tmp_path / "run")
        .metric_train_numeric(LossMetric())
        .metric_train_numeric(AccuracyMetric())
        .metric_valid_numeric(LossMetric())
        .num_epochs(2)
        .renderer(renderer)
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    learner.fit(*loaders)
    (handle,) = displays.handles
    final = handle.bundles[-1]
    # Every iteration is in the charts: the values after the last tick are read back.
    assert renderer._run.histories[("train", "Loss")].count == 2 * 7
    assert renderer._run.histories[("valid", "Loss")].count == 2 * 3
    assert final["text/html"].count("<svg") == 2
    value = weighted_mean(read_metric_log(tmp_path / "run" / "valid" / "epoch-2" / "Loss.log"))
    assert f">{format_number(value)}</td>" in final["text/html"]
    assert "completed" in final["text/plain"]
    assert renderer.frames == len(handle.bundles)


def test_a_drawing_error_stops_the_display_not_the_run(tmp_path, displays, loaders):
    displays.options["fail_after"] = 1
    renderer = NotebookRenderer(interval=0.0, render_budget=0)
    learner = (
        LearnerBuilder(tmp_path / "run")
        .metric_train_numeric(LossMetric())
        .num_epochs(2)
        .renderer(renderer)
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    with pytest.warns(RuntimeWarning, match="stopped updating") as warned:
        learner.fit(*loaders)
    assert len([w for w in warned if "stopped updating" in str(w.message)]) == 1
    assert learner.outcome == "completed"
    assert len(displays.handles[0].bundles) == 2  # the opening view and one update


def test_outside_ipython_the_summary_is_printed_at_the_end(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(notebook, "_open_display", lambda bundle: None)
    renderer = NotebookRenderer()
    renderer.start(run_info(tmp_path))
    renderer.update(progress(), views(), records("Loss", 1, 1))
    renderer.end("completed")
    out = capsys.readouterr().out
    assert out.startswith("ember · Classifier · 1,234 parameters") and "completed" in out
    assert "<" not in out


# Choosing the notebook display -----------------------------------------------------------
def fake_ipython(shell) -> types.ModuleType:
    module = types.ModuleType("IPython")
    module.get_ipython = lambda: shell  # type: ignore[attr-defined]
    return module


class KernelShell:
    kernel = object()


class TerminalShell:
    pass


class Terminal:
    encoding = "utf-8"

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def test_in_a_kernel_the_default_is_the_notebook_display(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setattr(sys, "stdout", Terminal())
    monkeypatch.setitem(sys.modules, "IPython", fake_ipython(KernelShell()))
    assert in_notebook()
    assert isinstance(default_renderer(), NotebookRenderer)
    monkeypatch.setenv("CI", "true")  # a notebook run by CI still gets the display
    assert isinstance(default_renderer(), NotebookRenderer)


def test_a_terminal_ipython_keeps_the_terminal_choice(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setattr(sys, "stdout", Terminal())
    monkeypatch.setitem(sys.modules, "IPython", fake_ipython(TerminalShell()))
    assert not in_notebook()
    assert isinstance(default_renderer(), TuiRenderer)
    monkeypatch.setitem(sys.modules, "IPython", fake_ipython(None))  # loaded, no shell
    assert not in_notebook()
    monkeypatch.setenv("CI", "1")
    assert isinstance(default_renderer(), PlainRenderer)


def test_without_ipython_loaded_nothing_is_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    assert not in_notebook()
    assert "IPython" not in sys.modules


def test_several_devices_from_a_notebook_get_a_clear_error(tmp_path, monkeypatch, loaders, quiet):
    monkeypatch.setitem(sys.modules, "IPython", fake_ipython(KernelShell()))
    learner = (
        LearnerBuilder(tmp_path / "run")
        .devices(["cpu", "cpu"])
        .renderer(quiet)
        .build(Classifier(), AdamConfig().init(), 1e-3)
    )
    with pytest.raises(ember.TrainingError, match=r"which a notebook cannot do\. Put the training"):
        learner.fit(*loaders)
    assert not (tmp_path / "run" / "train").exists()
