"""One progress line on stderr: done/total, units per second and time left."""

from __future__ import annotations

import sys
import time


class Progress:
    """Reports `what` every `every` seconds: counts, a rate of `unit` and the
    time left (from the rate since `initial`, where a resumed stage started)."""

    def __init__(self, what: str, total: int, unit: str = "items", every: float = 10.0, initial: int = 0):
        self.what, self.total, self.unit, self.every, self.initial = what, total, unit, every, initial
        self.start = time.monotonic()
        self.last = 0.0
        self.units = 0

    def update(self, done: int, units: int = 0, extra: str = "", force: bool = False) -> None:
        """Records `units` more work (tokens) and prints when due."""
        self.units += units
        now = time.monotonic()
        if not force and now - self.last < self.every:
            return
        self.last = now
        el = max(now - self.start, 1e-9)
        rate = self.units / el
        rate_done = done - self.initial
        left = (self.total - done) * el / rate_done if rate_done > 0 else float("nan")
        eta = f"{left / 60:.1f} min" if left == left else "?"
        print(f"{self.what}: {done}/{self.total} {rate:.0f} {self.unit}/s, {el / 60:.1f} min elapsed, {eta} left {extra}",
              file=sys.stderr, flush=True)
