"""Predict a few test images with a trained model: `python examples/mnist/inference.py`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from ember.data.datasets import MnistDataset
from ember.record import CompactRecorder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data import MnistBatcher
from training import TrainingConfig


def infer(artifact_dir: str, device: str, count: int) -> float:
    config = TrainingConfig.load(f"{artifact_dir}/config.json")
    model = CompactRecorder().load(config.model.init(), f"{artifact_dir}/model").to(device)
    model.eval()
    dataset = MnistDataset.test()
    items = [dataset[i] for i in range(count)]
    batch = MnistBatcher().batch(items)
    with torch.inference_mode():
        predicted = model(batch.images.to(device)).argmax(dim=-1).cpu()
    for index, (guess, (_, label)) in enumerate(zip(predicted.tolist(), items)):
        mark = "ok" if guess == label else "WRONG"
        print(f"test image {index:>3}: predicted {guess}, label {label}  {mark}")
    correct = sum(int(g == label) for g, (_, label) in zip(predicted.tolist(), items))
    print(f"{correct}/{count} correct")
    return correct / count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--artifact-dir", default="artifacts/mnist")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--count", type=int, default=10)
    args = parser.parse_args(argv)
    infer(args.artifact_dir, args.device, args.count)


if __name__ == "__main__":
    main()
