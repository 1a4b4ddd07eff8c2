"""What a user reads and sees is what happened: the lines of a resumed epoch and of a
stop inside one, the warning about a listener that decides after the checkpoint, the
evaluation's counts, `build()`'s refusal of a model the CPU cannot hold, `ember runs`
after damage and repair, the geometry of the comparison charts, the documentation's
tables, and the loss figure of a ported script that divides batch means by the
dataset's size."""

from __future__ import annotations

import io
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from ember_testing import BlobBatcher, Classifier, StopAt, blob_builder
from torch import nn

import ember
from ember.cli import main
from ember.data import DataLoaderBuilder
from ember.errors import ConfigError
from ember.optim import AdamConfig, SgdConfig
from ember.record import DefaultRecorder
from ember.train import EndEpoch, EvaluatorBuilder, LearnerBuilder, SequenceOutput, TrainOutput
from ember.train.logger import read_metric_log
from ember.train.metric import LossMetric
from ember.train.renderer import PlainRenderer

ROOT = Path(__file__).resolve().parents[1]


def plain(stream: io.StringIO | None = None) -> PlainRenderer:
    return PlainRenderer(interval=3600, stream=stream if stream is not None else io.StringIO())


# A resumed epoch, and a stop inside one ----------------------------------------------
def test_a_resumed_epoch_counts_its_items_as_the_files_do_and_a_stop_inside_names_the_iteration(
    tmp_path, loaders
):
    stream = io.StringIO()
    first = blob_builder(tmp_path, plain(stream)).num_epochs(2)
    first = first.with_file_checkpointer(DefaultRecorder())
    first.listener(StopAt(first.interrupter(), 2, 2))
    learner = first.build(Classifier(), AdamConfig().init(), 1e-2)
    learner.fit(*loaders)
    assert learner.outcome == "stopped: test stop"
    log = (tmp_path / "experiment.log").read_text().splitlines()
    written = next(i for i, line in enumerate(log) if "Checkpoint of epoch 2, iteration 2" in line)
    said = next(line for line in log[written:] if "Training stopped" in line)
    assert said.endswith("Training stopped: test stop after epoch 2, iteration 2.")

    stream = io.StringIO()
    second = blob_builder(tmp_path, plain(stream)).num_epochs(2)
    second = second.with_file_checkpointer(DefaultRecorder()).checkpoint("latest")
    second.build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    logged = read_metric_log(tmp_path / "train" / "epoch-2" / "Loss.log")
    assert (len(logged), sum(int(weight) for _, weight in logged)) == (7, 200)
    shown = stream.getvalue()
    assert "train epoch 2/2 done: 7 iterations, 200 items" in shown, shown  # the whole epoch
    log = (tmp_path / "experiment.log").read_text()
    assert "Training completed after epoch 2." in log


# The listener that decides after the checkpoint is the one named ---------------------
class Annealed:
    """A learning rate a rule divides (an ember schedule with a state)."""

    def __init__(self, lr: float) -> None:
        self.lr = lr

    def step(self) -> float:
        return self.lr

    def state_dict(self) -> dict:
        return {"lr": self.lr}

    def load_state_dict(self, state: dict) -> None:
        self.lr = float(state["lr"])


class Quiet:
    """A listener that only watches."""

    def __init__(self) -> None:
        self.seen = 0

    def on_event(self, event: Any) -> None:
        self.seen += isinstance(event, EndEpoch)

    def state_dict(self) -> dict:
        return {}


class AnnealListener:
    """Halves the schedule's rate at every epoch's end; has no state of its own."""

    def __init__(self, schedule: Annealed) -> None:
        self.schedule = schedule

    def on_event(self, event: Any) -> None:
        if isinstance(event, EndEpoch):
            self.schedule.lr /= 2


def test_the_warning_names_the_listener_that_changed_the_schedule(tmp_path, loaders):
    schedule, stream = Annealed(0.1), io.StringIO()
    learner = (
        blob_builder(tmp_path, plain(stream))
        .listener(Quiet())
        .listener(AnnealListener(schedule))
        .num_epochs(2)
        .build(Classifier(), SgdConfig().init(), schedule)
    )
    learner.fit(*loaders)
    shown = stream.getvalue()
    message = (
        "The listener AnnealListener changed the state of the learning-rate schedule "
        "Annealed (its state_dict) when the listeners received EndEpoch of epoch 1"
    )
    assert shown.count(message) == 1, shown
    assert "The listener Quiet" not in shown and "The learning-rate schedule" not in shown
    assert (tmp_path / "experiment.log").read_text().count(message) == 1


# An evaluation on tokens counts the tokens its metrics weigh --------------------------
PAD = -100


class TokenGru(nn.Module):
    """A GRU that predicts the next token; its loss is the mean over the real tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.gru, self.out = (
            nn.Embedding(10, 8),
            nn.GRU(8, 8, batch_first=True),
            nn.Linear(8, 10),
        )

    def test_step(self, batch: Any) -> SequenceOutput:
        inputs, targets = batch
        hidden, _ = self.gru(self.embed(inputs))
        logits = self.out(hidden)
        loss = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=PAD)
        tokens = (targets != PAD).sum()
        return SequenceOutput(
            loss, logits, targets, PAD, loss_reduction="token_mean", tokens=tokens
        )


class Padded:
    def batch(self, rows: list) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = nn.utils.rnn.pad_sequence([x for x, _ in rows], batch_first=True)
        targets = nn.utils.rnn.pad_sequence(
            [y for _, y in rows], batch_first=True, padding_value=PAD
        )
        return inputs, targets


def test_an_evaluation_on_tokens_counts_the_tokens_its_loss_is_weighted_by(tmp_path, capsys):
    import json

    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 30, (49,), generator=generator).tolist()
    data = [
        (x, (x + 1) % 10)
        for x in (torch.randint(0, 10, (n,), generator=generator) for n in lengths)
    ]
    stream = io.StringIO()
    evaluator = (
        EvaluatorBuilder(tmp_path)
        .metric_numeric(LossMetric())
        .renderer(plain(stream))
        .summary()
        .build(TokenGru())
    )
    values = evaluator.eval("test", DataLoaderBuilder(Padded()).batch_size(16).build(data))
    tokens = sum(lengths)
    shown = stream.getvalue()
    assert f"evaluation 'test' done: 4 iterations, 49 items, {tokens:,} tokens" in shown, shown
    assert f"Evaluation 'test' (49 items, {tokens:,} tokens)" in capsys.readouterr().out
    saved = json.loads((tmp_path / "test" / "test" / "values.json").read_text())
    assert (saved["items"], saved["tokens"]) == (49, tokens)
    # The loss is the mean over those tokens: each batch's line weighs its tokens.
    text = (tmp_path / "test" / "test" / "Loss.log").read_text().splitlines()
    lines = [(float(line.split(",")[0]), float(line.split(",")[1])) for line in text]
    assert sum(weight for _, weight in lines) == tokens
    assert values["Loss"] == pytest.approx(math.fsum(v * w for v, w in lines) / tokens)
    log = (tmp_path / "evaluation.log").read_text()
    assert f"Evaluation 'test' (49 items, {tokens:,} tokens): Loss" in log


@pytest.mark.cuda
def test_tokens_counted_on_the_device_are_read_once_the_evaluation_ends(tmp_path):
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 30, (40,), generator=generator).tolist()
    data = [
        (x, (x + 1) % 10)
        for x in (torch.randint(0, 10, (n,), generator=generator) for n in lengths)
    ]
    stream = io.StringIO()
    evaluator = (
        EvaluatorBuilder(tmp_path)
        .metric_numeric(LossMetric())
        .renderer(plain(stream))
        .devices(["cuda"])
        .build(TokenGru())
    )
    evaluator.eval("test", DataLoaderBuilder(Padded()).batch_size(16).build(data))
    assert f"3 iterations, 40 items, {sum(lengths):,} tokens" in stream.getvalue()


def test_an_evaluation_whose_batches_tell_no_tokens_counts_items_alone(tmp_path, blobs):
    stream = io.StringIO()
    evaluator = EvaluatorBuilder(tmp_path).metric_numeric(LossMetric()).renderer(plain(stream))
    evaluator.build(Classifier()).eval(
        "holdout", DataLoaderBuilder(BlobBatcher()).batch_size(32).build(blobs[1])
    )
    assert "evaluation 'holdout' done: 3 iterations, 90 items in" in stream.getvalue()


# build() on the CPU refuses a model the machine cannot hold ---------------------------
class Wide(nn.Sequential):
    def train_step(self, batch: Any) -> TrainOutput:
        out = self(batch[0])
        from ember.train import RegressionOutput

        return TrainOutput(RegressionOutput(F.mse_loss(out, batch[1]), out, batch[1]))


def test_build_on_the_cpu_refuses_a_model_larger_than_the_machine_before_moving_it(tmp_path):
    from ember.train import memory

    found = memory.host_memory()
    if found is None or found[0] > 596 * 2**30:
        pytest.skip("this machine could hold it")
    with torch.device("meta"):  # 160 GB of float32 weights, made without memory
        model = Wide(nn.Linear(200_000, 200_000))
    builder = LearnerBuilder(tmp_path).renderer(plain()).devices(["cpu"])
    with pytest.raises(ConfigError) as refused:
        builder.build(model, torch.optim.Adam(model.parameters()), 1e-3)
    message = str(refused.value)
    assert message.startswith("Wide does not fit in the CPU's memory: its parameters (149.01 GiB)")
    assert "their gradients (149.01 GiB) and the optimizer state (298.02 GiB)" in message
    assert "take 596.05 GiB before any activation, and the machine has" in message
    assert "What would fit:" in message and "FSDP over" in message
    assert all(p.device.type == "meta" for p in model.parameters())  # never moved


def test_the_cpu_refusal_names_the_figures_and_what_would_fit(tmp_path, monkeypatch):
    from ember.train import memory

    model = Wide(nn.Linear(256, 256), nn.Linear(256, 256))  # 526,336 bytes, in memory already
    params = sum(p.numel() * 4 for p in model.parameters())
    monkeypatch.setattr(memory, "host_memory", lambda: (2 * params, 1 << 30))
    builder = LearnerBuilder(tmp_path).renderer(plain())
    with pytest.raises(ConfigError) as refused:
        builder.build(model, torch.optim.Adam(model.parameters()), 1e-3)
    assert str(refused.value) == (
        "Wide does not fit in the CPU's memory: its parameters (514.00 KiB), their gradients "
        "(514.00 KiB) and the optimizer state (1.00 MiB) take 2.01 MiB before any activation, "
        "514.00 KiB of it in memory already, and the machine has 1.00 MiB available (of 1.00 "
        "GiB). What would fit:\n"
        "  - the weights in bfloat16 (model.to(torch.bfloat16)): 1.00 MiB (mixed_precision("
        "'bf16') alone keeps float32 weights: it halves the activations, not these)\n"
        "  - an optimizer that keeps no state (SgdConfig() without momentum): 1.00 MiB\n"
        "  - FSDP over 3 machines like this one (one process each, devices(['cpu'], "
        "strategy='fsdp') under torchrun --nnodes 3): 685.34 KiB per machine\n"
        "A smaller batch does not help here: none of these depend on it (it shrinks the "
        "activations, once these fit)."
    )
    builder.build(model, torch.optim.SGD(model.parameters(), lr=0.1), 0.1)  # it fits


# The comparison charts: every run shows, every marker whole ---------------------------
def history_of(directory: Path, losses: list[tuple[float, float]]) -> Path:
    """A run directory whose history holds these (train, valid) losses, one an epoch."""
    from ember.train.history import RunHistory

    history = RunHistory(directory / "history.jsonl")
    for epoch, (train, valid) in enumerate(losses, start=1):
        history.add_epoch(epoch, {"train": {"Loss": train}, "valid": {"Loss": valid}})
    history.finish("completed")
    return directory


def drawn(figure: Any) -> Any:
    """The figure as the PNG a user opens: an array of RGB pixels, top row first."""
    from matplotlib.image import imread

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    buffer.seek(0)
    return imread(buffer, format="png")[:, :, :3]


def pixels_of(image: Any, box: Any, colour: str) -> int:
    """How many pixels inside `box` (display coordinates) have `colour`."""
    from matplotlib.colors import to_rgb

    height = image.shape[0]
    inside = image[
        int(height - box.y1) + 1 : int(height - box.y0) - 1, int(box.x0) + 1 : int(box.x1) - 1
    ]
    distance = abs(inside - torch.tensor(to_rgb(colour)).numpy()).max(axis=2)
    return int((distance < 0.08).sum())


def cut_markers(figure: Any) -> list[str]:
    """Every marker of the figure's plots that is not drawn whole inside its frame."""
    cut = []
    for ax in figure.axes:
        box = ax.get_window_extent()
        for line in ax.get_lines():
            if line.get_marker() in (None, "None", "none", "", " "):
                continue
            radius = (line.get_markersize() / 2 + line.get_markeredgewidth()) * figure.dpi / 72
            points = ax.transData.transform(list(zip(line.get_xdata(), line.get_ydata())))
            for (x, y), (xd, yd) in zip(points, zip(line.get_xdata(), line.get_ydata())):
                whole = box.x0 <= x - radius and x + radius <= box.x1
                whole = whole and box.y0 <= y - radius and y + radius <= box.y1
                if not whole:
                    cut.append(f"{line.get_label()} at ({xd}, {yd})")
    return cut


@pytest.mark.parametrize("margins", [None, 0.0])
def test_runs_with_the_same_values_both_show_and_no_marker_is_cut(tmp_path, margins):
    import matplotlib

    losses = [(0.9, 0.7), (0.5, 0.45), (0.3, 0.31)]
    runs = [
        history_of(tmp_path / "a", losses),
        history_of(tmp_path / "b", losses),  # the same numbers: seeded alike
        history_of(tmp_path / "c", [(1.0, 0.8), (0.7, 0.6), (0.6, 0.5)]),
    ]
    style = {} if margins is None else {"axes.xmargin": margins, "axes.ymargin": margins}
    with matplotlib.rc_context(style):  # a style without margins cuts nothing either
        chart = ember.compare(runs).chart("Loss")
        image = drawn(chart.figure)
    ax = chart.figure.axes[0]
    box = ax.get_window_extent()
    for colour in ("C0", "C1", "C2"):  # a, b and c, each seen in the plotting area
        assert pixels_of(image, box, colour) > 100, colour
    assert cut_markers(chart.figure) == []
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert labels == ["a (0.3100)", "b (0.3100; same values as a)", "c (0.5000)"]


def test_the_last_validation_of_an_iteration_chart_is_drawn_whole(tmp_path):
    from ember.plot import iterations_figure, read_run

    for epoch in (1, 2):  # 300 training lines an epoch: half an iteration is a pixel
        train, valid = tmp_path / "train" / f"epoch-{epoch}", tmp_path / "valid" / f"epoch-{epoch}"
        train.mkdir(parents=True)
        valid.mkdir(parents=True)
        (train / "Loss.log").write_text("".join(f"{1 / (i + 2)},32\n" for i in range(300)))
        (valid / "Loss.log").write_text("".join(f"{0.5 / epoch},32\n" for _ in range(3)))
    figure = iterations_figure(read_run(tmp_path)[0])
    drawn(figure)
    assert cut_markers(figure) == []


# ember runs says what a resume would find ----------------------------------------------
def trained(directory: Path, loaders: Any, epochs: int = 2, resume: bool = False) -> Any:
    made = (
        blob_builder(directory, plain())
        .num_epochs(epochs)
        .with_file_checkpointer(DefaultRecorder())
    )
    if resume:
        made = made.checkpoint("latest")
    learner = made.build(Classifier(), AdamConfig().init(), 1e-2)
    learner.fit(*loaders)
    return learner


def listed(root: Path, capsys: Any) -> tuple[dict[str, list[str]], list[str]]:
    """`ember runs ROOT`: each run's cells (Status, Epochs, Time, Details) by name, and
    the lines below the table."""
    assert main(["runs", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    table = [line for line in out[2:] if line.startswith("|")]
    cells = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:6]] for line in table
    }
    return cells, out[2 + len(table) :]


def test_ember_runs_agrees_with_the_resume_and_with_ember_repair(tmp_path, loaders, capsys):
    from ember.comparison import DETAIL_WIDTH
    from ember.errors import RunRecordError
    from ember.train.history import RunHistory

    cut, deleted = tmp_path / "runs" / "cut", tmp_path / "runs" / "deleted"
    trained(cut, loaders)
    shutil.copytree(cut, deleted)
    history = cut / "history.jsonl"
    history.write_text("".join(history.read_text().splitlines(keepends=True)[:-4]))
    (deleted / "history.jsonl").unlink()

    cells, below = listed(tmp_path / "runs", capsys)
    for run, problem in (
        (cut, "history.jsonl, line "),
        (deleted, "history.jsonl: the file is missing"),
    ):
        status, _, _, detail = cells[run.name]
        fix = f"; run `ember repair {run}`"
        assert status == "damaged" and detail.startswith(problem) and detail.endswith(fix), detail
        assert len(detail) <= DETAIL_WIDTH + len(fix)  # a cell, not a paragraph
        whole = next(line for line in below if line.startswith(f"{run.name}: "))
        assert whole.endswith(fix) and len(whole) > len(f"{run.name}: {detail}")
    assert "lines when the checkpoint of epoch 2 was written" in below[0] + below[1]
    with pytest.raises(RunRecordError, match="ember repair"):  # as `ember runs` said
        trained(cut, loaders, epochs=3, resume=True)

    for run in (cut, deleted):
        assert main(["repair", str(run)]) == 0
        assert (
            "the run's outcome (completed) taken back from sessions.json" in capsys.readouterr().out
        )
    cells, below = listed(tmp_path / "runs", capsys)
    assert cells["cut"][:2] == cells["deleted"][:2] == ["completed", "2"] and below == []

    assert trained(cut, loaders, epochs=3, resume=True).outcome == "completed"
    resumed = RunHistory.load(cut / "history.jsonl")
    assert len(resumed.repairs) == 1 and resumed.repairs[0]["rebuilt"] == [2]  # still said
    assert "repaired" in history.read_text()


# A ported script that divides the sum of batch means by the dataset's size -------------
class Siamese(nn.Module):
    """pytorch/examples' siamese_network in small: two inputs through one embedding, the
    probability that they are alike, BCELoss (a mean over the batch's pairs)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, 1)

    def forward(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        distance = (self.embed(first) - self.embed(second)).abs()
        return torch.sigmoid(self.head(distance)).squeeze(1)

    def pairs(self, batch: Any) -> Any:
        from ember.train import RegressionOutput

        first, second, targets = batch
        outputs = self(first, second)
        return RegressionOutput(nn.BCELoss()(outputs, targets), outputs, targets)

    def train_step(self, batch: Any) -> TrainOutput:
        return TrainOutput(self.pairs(batch))

    def valid_step(self, batch: Any) -> Any:
        return self.pairs(batch)


def test_the_scripts_figure_of_summed_batch_means_comes_from_embers_log_as_documented(tmp_path):
    from torch.utils.data import DataLoader, TensorDataset

    ember.seed(0)
    first, second = torch.randn(456, 8), torch.randn(456, 8)
    alike = ((first - second).norm(dim=1) < 4.0).float()
    data = TensorDataset(first, second, alike)
    train = DataLoader(torch.utils.data.Subset(data, range(256)), batch_size=64)
    test_set = torch.utils.data.Subset(data, range(256, 456))  # 200 pairs: 64, 64, 64, 8
    test = DataLoader(test_set, batch_size=64)
    learner = (
        LearnerBuilder(tmp_path)
        .metric_valid_numeric(LossMetric())
        .renderer(plain())
        .build(Siamese(), SgdConfig().init(), 0.1)
    )
    model = learner.fit(train, test)

    # The script's test(): each batch's mean loss, summed, over the dataset's size.
    model.eval()
    script, summed = 0.0, 0.0
    with torch.no_grad():
        for images_1, images_2, targets in test:
            outputs = model(images_1, images_2)
            script += nn.BCELoss()(outputs, targets).sum().item()
            summed += nn.BCELoss(reduction="sum")(outputs, targets).item()
    script /= len(test.dataset)

    loss = learner.history[-1][1]["valid"]["Loss"]
    assert loss == pytest.approx(summed / len(test.dataset), rel=1e-6)  # the loss per pair
    assert 40 < loss / script < 64  # the script's figure: a batch size smaller, nearly
    rows = read_metric_log(tmp_path / "valid" / "epoch-1" / "Loss.log")  # docs/ported.md's way
    assert sum(value for value, _ in rows) / len(test.dataset) == pytest.approx(script, rel=1e-6)
    assert (
        "Batch means summed, then divided by the dataset's size"
        in (ROOT / "docs" / "ported.md").read_text()
    )


# The documentation's events are the code's ----------------------------------------------
def test_the_events_table_is_one_table_of_every_event_with_its_fields():
    import dataclasses

    from ember.train import events

    text = (ROOT / "docs" / "training-controls.md").read_text()
    lines = text.splitlines()
    start = lines.index("| Event | When | Fields |")
    table = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        table.append(line)
    documented = {}
    for line in table:
        name, _, fields = (cell.strip() for cell in line.strip("|").split(" | "))
        documented[name.strip("`")] = re.findall(r"(?:^|, )`(\w+)`", fields)
    classes = [
        item
        for item in vars(events).values()
        if dataclasses.is_dataclass(item) and item.__module__ == events.__name__
    ]
    assert documented == {c.__name__: [f.name for f in dataclasses.fields(c)] for c in classes}
    stray = [
        line for line in lines[start + 2 + len(table) :] if re.match(r"\| `[A-Z]\w+` \|", line)
    ]
    assert stray == []  # no row of it stands apart, below the prose


def test_every_event_the_docs_write_as_a_call_has_the_codes_fields():
    import dataclasses

    from ember.train import events

    fields = {
        name: [f.name for f in dataclasses.fields(item)]
        for name, item in vars(events).items()
        if dataclasses.is_dataclass(item)
    }
    pattern = re.compile(rf"`({'|'.join(fields)})\(([^`)]*)\)`")
    for page in sorted((ROOT / "docs").glob("*.md")):
        for name, arguments in pattern.findall(page.read_text()):
            given = [argument.strip() for argument in arguments.split(",") if argument.strip()]
            assert given == fields[name][: len(given)], (page.name, name, given)
