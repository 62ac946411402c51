"""What a run tells the person who started it, whichever engine runs it: one status line
per run, and one line per event on stderr."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def say(line: str) -> None:
    """One progress or status line on stderr, at once (the commands' one way to talk)."""
    print(line, file=sys.stderr, flush=True)


class Progress:
    """One status line per run, rewritten in place on a terminal, one line per step elsewhere."""

    def __init__(self, label: str, steps: int, stream: TextIO | None = None) -> None:
        # stderr as it is now, not as it was when this module was imported (a default
        # argument would keep a stream that was swapped since, and is closed by then)
        self.stream = sys.stderr if stream is None else stream
        self.label, self.steps = label, steps
        self.tty = self.stream.isatty()
        self.last = -1
        self.started = time.monotonic()

    def update(self, done: int, trims: int) -> None:
        if done == self.last and not self.tty:
            return
        self.last = done
        text = (
            f"{self.label}: step {done}/{self.steps}, {trims} trims, "
            f"{time.monotonic() - self.started:.1f} s"
        )
        if self.tty:
            self.stream.write("\r\033[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
