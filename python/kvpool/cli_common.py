"""What the ``kvpool`` subcommands share: :class:`CliError`, the :class:`Progress` bar and the
argparse types of their options."""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import TextIO

__all__ = ["CliError", "Progress", "block_size_int", "positive_float", "positive_int", "token_rate"]


class CliError(Exception):
    """A problem to report as ``kvpool CMD: error: ...`` with exit status 2."""


# --------------------------------------------------------------------------------------------
# Progress bar.
# --------------------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on a stream (stderr), for runs longer than ``delay`` seconds.

    Plain writes, redrawn at most every ``interval`` seconds; ``close`` erases it. Disabled
    (every call a no-op) when ``enabled`` is false, by default unless the stream is a tty.
    """

    WIDTH = 30

    def __init__(
        self,
        label: str,
        total: int,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        delay: float = 0.3,
        interval: float = 0.1,
    ) -> None:
        """A bar for ``total`` steps, labelled ``label``."""
        self.stream = sys.stderr if stream is None else stream
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label, self.total = label, max(total, 1)
        self.delay, self.interval = delay, interval
        self._start = time.monotonic()
        self._last_draw = float("-inf")
        self._drawn = 0

    def __call__(self, done: int) -> None:
        """Report ``done`` steps finished (drawn only when due)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._start < self.delay or now - self._last_draw < self.interval:
            return
        self._last_draw = now
        filled = self.WIDTH * min(done, self.total) // self.total
        text = f"\r{self.label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{self.total}"
        self.stream.write(text)
        self.stream.flush()
        self._drawn = len(text)

    def close(self) -> None:
        """Erase the bar if it was drawn."""
        if self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self.stream.flush()
            self._drawn = 0


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def block_size_int(text: str) -> int:
    """An argparse type: tokens per block, ``1..=2**32 - 1`` (what a pool takes)."""
    value = positive_int(text)
    if value >= 2**32:
        raise argparse.ArgumentTypeError(f"expected at most {2**32 - 1} tokens per block, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def token_rate(text: str) -> float:
    """An argparse type: tokens per second, a finite number of at least 0.001 (a slower rate
    makes times that overflow and rates that round to nothing in the JSON)."""
    value = positive_float(text)
    if value < 1e-3:
        raise argparse.ArgumentTypeError(f"expected at least 0.001 tokens per second, got {text}")
    return value
