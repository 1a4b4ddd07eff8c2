"""The workloads of `bench/gpu.py` and `bench/gpu_oom.py`: their networks, batch sizes,
mixed precision and synthetic batches made on the device.

- `mlp`: MLP 784-128-10, batch 64, float32.
- `resnet18`: ResNet-18 on 3x32x32 images, 10 classes, batch 256, bf16 autocast
  (torchvision's when installed, else the same network defined here).
- `transformer`: 8 encoder layers, d=512, 8 heads, feed-forward 2048, 256 tokens,
  vocabulary 1,000, batch 32, bf16 autocast; a token-level classification loss.
- `lm8192`: the same with a vocabulary of 8,192, whose logits ([8192 tokens x 8192],
  128 MiB in bf16) dominate the step's memory, as a language model's do.
"""

from __future__ import annotations

WORKLOADS = ("mlp", "resnet18", "transformer", "lm8192")
VOCABS = {"transformer": 1000, "lm8192": 8192}
DISTINCT_BATCHES = 16
TOKENS, D_MODEL = 256, 512


def resnet18():
    """torchvision's ResNet-18 (10 classes), or the same network defined here."""
    try:
        import torchvision

        return torchvision.models.resnet18(num_classes=10)
    except ImportError:
        pass
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x):
            out = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))
            return (out + (x if self.down is None else self.down(x))).relu()

    layers = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]
    for cin, cout, stride in ((64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10)]
    return nn.Sequential(*layers)


def network(workload: str):
    import torch
    from torch import nn

    torch.manual_seed(0)
    if workload == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    if workload == "resnet18":
        return resnet18()

    vocab = VOCABS[workload]

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, D_MODEL)
            layer = nn.TransformerEncoderLayer(D_MODEL, 8, 2048, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 8, enable_nested_tensor=False)
            self.head = nn.Linear(D_MODEL, vocab)

        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens))).reshape(-1, vocab)

    return Encoder()


def settings(workload: str) -> tuple[int, str | None]:
    """Batch size and mixed precision of a workload."""
    return {"mlp": (64, None), "resnet18": (256, "bf16")}.get(workload, (32, "bf16"))


def make_batches(workload: str, device):
    """Distinct (inputs, targets) batches on the device; targets are per row of the
    network's output (per token for the transformer)."""
    import torch

    batch, _ = settings(workload)
    generator = torch.Generator(device=device).manual_seed(1)
    out = []
    for _ in range(DISTINCT_BATCHES):
        if workload == "mlp":
            inputs = torch.randn(batch, 28, 28, device=device, generator=generator)
            targets = torch.randint(0, 10, (batch,), device=device, generator=generator)
        elif workload == "resnet18":
            inputs = torch.randn(batch, 3, 32, 32, device=device, generator=generator)
            targets = torch.randint(0, 10, (batch,), device=device, generator=generator)
        else:
            vocab = VOCABS[workload]
            inputs = torch.randint(0, vocab, (batch, TOKENS), device=device, generator=generator)
            targets = torch.randint(0, vocab, (batch * TOKENS,), device=device, generator=generator)
        out.append((inputs, targets))
    return out


class Cycle:
    """`steps` batches per epoch, cycling through the distinct ones."""

    def __init__(self, batches, steps: int) -> None:
        self.batches, self.steps = batches, steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        return (self.batches[i % len(self.batches)] for i in range(self.steps))
