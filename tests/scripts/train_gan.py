"""The GAN example (examples/gan/train.py), slowed down so that tests can stop it
with a signal in the middle of an epoch.

Usage: python train_gan.py DIR [--sleep SECONDS] [example options...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # ember_testing

from ember_testing import load_example  # noqa: E402

gan = load_example(ROOT / "examples" / "gan" / "train.py", "gan_train")


class Slow(gan.Gan):
    def __init__(self, sleep: float) -> None:
        super().__init__()
        self.sleep = sleep

    def train_step(self, real, ctx):
        time.sleep(self.sleep)
        return super().train_step(real, ctx)


if __name__ == "__main__":
    argv = sys.argv[1:]
    sleep = 0.0
    if "--sleep" in argv:
        at = argv.index("--sleep")
        sleep = float(argv[at + 1])
        del argv[at : at + 2]
    sys.exit(gan.main(argv, lambda: Slow(sleep)))
