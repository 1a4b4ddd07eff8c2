"""The ported VAE: ember's run does the arithmetic of the plain loop, and its Loss is
the script's "average loss", the summed BCE + KLD divided by the number of images."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ember_testing import load_example

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    """An example of examples/ported as a module of its own name."""
    return load_example(ROOT / "examples" / "ported" / f"{name}.py", f"ported_{name}")


pytestmark = pytest.mark.usefixtures("one_thread")


def plain_loop(vae, config):
    """The script's loop, written out: summed losses added up, divided by the images.
    The model samples its code in training and in the test pass alike, so both loops
    must draw from the global generator in the same order."""
    torch.manual_seed(config.seed)
    train_loader, test_loader = vae.loaders(config)
    model = vae.Vae(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate)
    history = []
    for epoch in range(1, config.num_epochs + 1):
        train_loader.sampler.set_epoch(epoch)
        model.train()
        train_loss, seen = 0.0, 0
        for batch in train_loader:
            optimizer.zero_grad()
            reconstruction, mu, logvar = model(batch.images)
            loss = vae.vae_loss(reconstruction, batch.images, mu, logvar)
            loss.backward()
            optimizer.step()
            train_loss += float(loss.detach())
            seen += len(batch.images)
        model.eval()
        test_loss, tested = 0.0, 0
        with torch.no_grad():
            for batch in test_loader:
                reconstruction, mu, logvar = model(batch.images)
                test_loss += float(vae.vae_loss(reconstruction, batch.images, mu, logvar))
                tested += len(batch.images)
        history.append(
            (epoch, {"train": {"Loss": train_loss / seen}, "valid": {"Loss": test_loss / tested}})
        )
    return model, history


def test_ember_trains_the_vae_as_the_plain_loop_does(tmp_path):
    vae = load("vae")
    # 300 images: batches of 128, 128 and 44, so the per-image mean weighs them unevenly.
    config = vae.TrainingConfig(limit=300, num_epochs=2)
    model, learner = vae.train(str(tmp_path / "run"), config)
    reference, expected = plain_loop(vae, config)

    assert [epoch for epoch, _ in learner.history] == [1, 2]
    for (_, got), (_, want) in zip(learner.history, expected):
        for split in ("train", "valid"):
            # ember divides each batch's sum by its images and weighs it by them again.
            torch.testing.assert_close(got[split]["Loss"], want[split]["Loss"], rtol=1e-12, atol=0)
    # A per-image loss of MNIST's BCE, not a batch's sum: some hundreds.
    assert 50 < learner.history[-1][1]["valid"]["Loss"] < 600
    for name, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name

    log = (tmp_path / "run" / "experiment.log").read_text(encoding="utf-8")
    assert "looks summed" not in log  # the output said it was summed


def test_the_samples_are_a_grid_of_digits(tmp_path):
    vae = load("vae")
    torch.manual_seed(0)
    path = vae.save_samples(vae.Vae(vae.TrainingConfig()), tmp_path / "samples.pgm", count=10)
    data = path.read_bytes()
    header = b"P5 224 56 255\n"  # 8 per row: 2 rows of 28 pixels
    assert data.startswith(header) and len(data) == len(header) + 224 * 56
    assert len(set(data[len(header) :])) > 10  # decoded pixels, not a blank image
