"""Checkpoint cost: compressing a compact record before and now, and the wait at the end of fit.

    python bench/checkpoint.py [--reps 3] [--out bench/results/checkpoint.md]

State: a ResNet-18-sized network (11.2 M parameters: ResNet-18's convolution and linear
shapes, as linear layers so that a CPU can train it a step in a moment) and its Adam
state, after a few steps. Three measures, each the median of `--reps` runs, the old and
new ways alternating:

1. Compressing the compact records (`CompactRecorder`: model in float16 or bfloat16,
   optimizer exact) with the previous gzip writer (one zlib stream on one thread,
   bytes grouped by significance, no bit rotation) against the current one (256 KiB
   chunks on every core, ISA-L when `isal` is installed, else zlib; 16-bit floats
   rotated). Sizes are of the model file against its float32 bytes.
2. The same through `CompactRecorder.save` (encoding, compression and an atomic write).
3. The wait at the end of `fit`: one epoch of 2 batches with a compact checkpoint per
   epoch; the time `fit` blocks for the last checkpoint to reach the disk.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import zlib
from pathlib import Path

import torch
from torch import nn

# ResNet-18's weight shapes (convolutions flattened), 11.2 M parameters in all.
RESNET18_SHAPES = [
    (64, 3 * 7 * 7),
    *[(64, 64 * 9)] * 4,
    (128, 64 * 9),
    (128, 128 * 9),
    (128, 64),
    *[(128, 128 * 9)] * 2,
    (256, 128 * 9),
    (256, 256 * 9),
    (256, 128),
    *[(256, 256 * 9)] * 2,
    (512, 256 * 9),
    (512, 512 * 9),
    (512, 256),
    *[(512, 512 * 9)] * 2,
    (1000, 512),
]


class Resnet18Sized(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(cols, rows) for rows, cols in RESNET18_SHAPES)
        self.norms = nn.ModuleList(nn.BatchNorm1d(rows) for rows, _ in RESNET18_SHAPES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = x.new_zeros(())
        for layer in self.layers:  # each layer sees a slice of the input: cheap and trainable
            total = total + layer(x[:, : layer.in_features]).square().mean()
        return total


def trained_state() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = Resnet18Sized()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(3):
        model(torch.randn(8, 512 * 9)).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def old_gzip(data, level: int = 1) -> bytes:
    """The previous writer: one raw deflate stream by zlib on one thread, in ember's header."""
    from ember.record import gz

    view = memoryview(data).cast("B")
    compressor = zlib.compressobj(level, zlib.DEFLATED, -15)
    body = compressor.compress(view) + compressor.flush()
    header = gz._PREFIX + gz._SIZE.pack(view.nbytes)
    return header + body + gz._TRAILER.pack(zlib.crc32(view), view.nbytes & 0xFFFFFFFF)


def old_encoding():
    """Patch the msgpack encoder to the previous layout (no bit rotation)."""
    import ember.record.codec as codec

    saved = codec.ROTATED_DTYPES
    codec.ROTATED_DTYPES = ()
    return lambda: setattr(codec, "ROTATED_DTYPES", saved)


def encoded(model, optimizer, precision: str, rotate: bool) -> tuple[bytes, bytes]:
    from ember.record import CompactRecorder
    from ember.record.format import EncodeOptions
    from ember.record.header import Header

    recorder = CompactRecorder(precision)
    fmt = recorder.format
    restore = None if rotate else old_encoding()
    try:
        weights = fmt.encode(
            Header(fmt.name, fmt.version, recorder.precision, "module"),
            model.state_dict(),
            EncodeOptions(recorder.precision.dtype, compressed=True),
        )
        moments = fmt.encode(
            Header(fmt.name, fmt.version, recorder.precision, "optimizer"),
            optimizer.state_dict(),
            EncodeOptions(None, compressed=True),
        )
    finally:
        if restore is not None:
            restore()
    return bytes(weights), bytes(moments)


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def compression_rows(model, optimizer, reps: int, f32: int) -> list[str]:
    """Both parts compressed the old way and the new way (with each compressor at hand)."""
    from ember.record import gz

    compressors = ["zlib"] + (["isal"] if gz.deflate_module("auto") is not zlib else [])
    threads = gz.compress_threads()
    rows = []
    for precision in ("half", "bf16"):
        old_parts = encoded(model, optimizer, precision, rotate=False)
        new_parts = encoded(model, optimizer, precision, rotate=True)
        ways = {"old": (old_parts, old_gzip)}
        for name in compressors:
            ways[name] = (new_parts, lambda data, name=name: gz.gzip_bytes(data, compressor=name))
        times: dict[str, list[float]] = {way: [] for way in ways}
        sizes: dict[str, tuple[int, int]] = {}
        for _ in range(reps):
            for way, (parts, compress) in ways.items():
                seconds, outputs = timed(lambda c=compress, p=parts: [c(part) for part in p])
                times[way].append(seconds)
                sizes[way] = (len(outputs[0]), len(outputs[1]))
        old_s = statistics.median(times["old"])
        for way in ways:
            way_s = statistics.median(times[way])
            how = "old: zlib, 1 thread" if way == "old" else f"new: {way}, {threads} threads"
            rows.append(
                f"| {precision} | {how} | {way_s:.3f} | {old_s / way_s:.1f}x | "
                f"{sizes[way][0] / f32:.3f} | {sizes[way][1] / 2**20:.1f} |"
            )
    return rows


def save_rows(model, optimizer, reps: int, scratch: Path) -> list[str]:
    """CompactRecorder.save of both parts, old writer (patched in) against the current."""
    import ember.record.file_recorder as file_recorder
    from ember.record import CompactRecorder

    current = file_recorder.gzip_bytes
    times: dict[str, list[float]] = {"old": [], "new": []}
    for rep in range(reps):
        for way in ("old", "new"):
            restore = old_encoding() if way == "old" else None
            file_recorder.gzip_bytes = old_gzip if way == "old" else current  # type: ignore[assignment]
            try:
                recorder = CompactRecorder()
                start = time.perf_counter()
                recorder.save(model, scratch / f"model-{way}-{rep}")
                recorder.save(optimizer, scratch / f"optim-{way}-{rep}")
                times[way].append(time.perf_counter() - start)
            finally:
                file_recorder.gzip_bytes = current  # type: ignore[assignment]
                if restore is not None:
                    restore()
    old_s, new_s = statistics.median(times["old"]), statistics.median(times["new"])
    return [
        f"| CompactRecorder.save, model + optimizer | {old_s:.3f} | {new_s:.3f} | "
        f"{old_s / new_s:.1f}x |"
    ]


def fit_wait(way: str, scratch: Path) -> float:
    """Seconds `fit` waits at its end for the last compact checkpoint."""
    import ember.record.file_recorder as file_recorder
    from ember.record import CompactRecorder
    from ember.train import LearnerBuilder, TrainOutput
    from ember.train.checkpoint.policy import CheckpointPolicy
    from ember.train.renderer.silent import SilentRenderer

    class Step(Resnet18Sized):
        def train_step(self, batch):
            loss = self(batch)
            return TrainOutput(loss, loss=loss)

    torch.manual_seed(0)
    model = Step()
    waits: list[float] = []
    finish = CheckpointPolicy.finish

    def timed_finish(self) -> None:
        start = time.perf_counter()
        finish(self)
        waits.append(time.perf_counter() - start)

    current = file_recorder.gzip_bytes
    restore = old_encoding() if way == "old" else None
    CheckpointPolicy.finish = timed_finish  # type: ignore[method-assign]
    file_recorder.gzip_bytes = old_gzip if way == "old" else current  # type: ignore[assignment]
    try:
        learner = (
            LearnerBuilder(scratch)
            .with_file_checkpointer(CompactRecorder())
            .renderer(SilentRenderer())
            .num_epochs(1)
            .build(model, torch.optim.Adam(model.parameters(), lr=1e-3), 1e-3)
        )
        learner.fit([torch.randn(8, 512 * 9) for _ in range(2)])
    finally:
        CheckpointPolicy.finish = finish  # type: ignore[method-assign]
        file_recorder.gzip_bytes = current  # type: ignore[assignment]
        if restore is not None:
            restore()
    return waits[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default="bench/results/checkpoint.md")
    args = parser.parse_args()

    model, optimizer = trained_state()
    params = sum(p.numel() for p in model.parameters())
    f32 = sum(t.numel() * 4 for t in model.state_dict().values())
    lines = [
        "# Checkpoint cost: compact records, before and now",
        "",
        f"State: a ResNet-18-sized network, {params / 1e6:.1f} M parameters ({f32 / 1e6:.1f} MB "
        f"in float32), with Adam's state. Medians of {args.reps} alternating runs on "
        f"{os.cpu_count()} cores. Command: `python bench/checkpoint.py --reps {args.reps}`",
        "",
        "| model precision | writer | compress s (model + optimizer) | speed-up | "
        "model file / f32 weights | optimizer file MiB |",
        "|---|---|---:|---:|---:|---:|",
        *compression_rows(model, optimizer, args.reps, f32),
        "",
        "| what | old s | new s | speed-up |",
        "|---|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory() as scratch:
        lines += save_rows(model, optimizer, args.reps, Path(scratch))
        waits: dict[str, list[float]] = {"old": [], "new": []}
        for rep in range(args.reps):
            for way in ("old", "new"):
                waits[way].append(fit_wait(way, Path(scratch) / f"fit-{way}-{rep}"))
    old_s, new_s = statistics.median(waits["old"]), statistics.median(waits["new"])
    lines.append(
        f"| wait for the final checkpoint at the end of fit | {old_s:.3f} | {new_s:.3f} | "
        f"{old_s / new_s:.1f}x |"
    )
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
