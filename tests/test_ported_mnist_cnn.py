"""The ported MNIST CNN: ember's run does the arithmetic of the plain Adadelta loop
with StepLR stepped once per epoch, on the first images of MNIST."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from ember_testing import load_example

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    """An example of examples/ported as a module of its own name."""
    return load_example(ROOT / "examples" / "ported" / f"{name}.py", f"ported_{name}")


pytestmark = pytest.mark.usefixtures("one_thread")


def plain_loop(cnn, config):
    """The script's loop, written out over loaders built the same way, whose sampler is
    told the epoch as ember tells it."""
    torch.manual_seed(config.seed)
    train_loader, test_loader = cnn.loaders(config)
    model = cnn.Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=config.learning_rate)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=config.gamma)
    history = []
    for epoch in range(1, config.num_epochs + 1):
        train_loader.sampler.set_epoch(epoch)
        rate = optimizer.param_groups[0]["lr"]
        model.train()
        losses, correct, seen = [], 0, 0
        for batch in train_loader:
            optimizer.zero_grad()
            output = model(batch.images)
            loss = F.nll_loss(output, batch.targets)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()) * len(batch.targets))
            correct += int((output.argmax(dim=1) == batch.targets).sum())
            seen += len(batch.targets)
        train = {"Loss": math.fsum(losses) / seen, "Accuracy": 100 * correct / seen}
        model.eval()
        losses, correct, seen = [], 0, 0
        with torch.no_grad():
            for batch in test_loader:
                output = model(batch.images)
                losses.append(float(F.nll_loss(output, batch.targets)) * len(batch.targets))
                correct += int((output.argmax(dim=1) == batch.targets).sum())
                seen += len(batch.targets)
        valid = {"Loss": math.fsum(losses) / seen, "Accuracy": 100 * correct / seen}
        scheduler.step()  # once per epoch, after the test pass
        history.append((epoch, {"train": {**train, "Learning Rate": rate}, "valid": valid}))
    return model, history


def test_ember_trains_the_cnn_as_the_plain_loop_does(tmp_path):
    cnn = load("mnist_cnn")
    # 320 images in 5 batches of 64, 320 test images in 3 batches (the last of 64).
    config = cnn.TrainingConfig(limit=320, num_epochs=2, test_batch_size=128)
    model, learner = cnn.train(str(tmp_path / "run"), config)
    reference, expected = plain_loop(cnn, config)

    assert [values["train"]["Learning Rate"] for _, values in expected] == [1.0, 0.7]
    assert [epoch for epoch, _ in learner.history] == [1, 2]
    for (_, got), (_, want) in zip(learner.history, expected):
        for split in ("train", "valid"):
            for name, value in want[split].items():
                torch.testing.assert_close(got[split][name], value, rtol=1e-12, atol=0)
    for name, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
