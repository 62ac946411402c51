"""What a run tells the person who started it, whichever engine runs it: one status line
per run, and one line per event on stderr."""

from __future__ import annotations

import sys
import time


def say(line: str) -> None:
    """One progress or status line on stderr, at once (the commands' one way to talk)."""
    print(line, file=sys.stderr, flush=True)


class Progress:
    """One status line per run, rewritten in place on a terminal, one line per step elsewhere."""

    def __init__(self, label: str, steps: int, stream=sys.stderr) -> None:
        self.label, self.steps, self.stream = label, steps, stream
        self.tty = stream.isatty()
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
