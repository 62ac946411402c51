"""Files written whole or not at all: into a temporary file beside the target, then renamed.

A results folder and the run cache are read later by other commands (`forgive impact`, a
study, the cache itself), which must never meet half a file: a run killed, or a disk
filling, in the middle of a write would otherwise leave a truncated runs.json that reads as
a bad file. A rename within one folder is atomic on POSIX file systems, so a reader finds
the old file or the new one. The data is flushed to the disk before the rename, so that a
machine that stops just after it does not keep the new name over missing data.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TEMPORARY = ".tmp"
"""How a temporary file's name ends (`.<name>.<pid>.tmp`, hidden, beside its target)."""


def temporary(path: Path) -> Path:
    """The temporary file this process writes `path` through."""
    return path.with_name(f".{path.name}.{os.getpid()}{TEMPORARY}")


def is_temporary(name: str) -> bool:
    """Whether a file name is one of `temporary`'s (left behind only by a killed process)."""
    return name.startswith(".") and name.endswith(TEMPORARY)


@contextmanager
def written_whole(path: Path) -> Iterator[Path]:
    """A temporary path for the block to write `path`'s content to; renamed to `path` when the
    block ends, removed if it raises (the error goes on), so `path` is never part-written."""
    tmp = temporary(path)
    try:
        yield tmp
        with open(tmp, "rb") as written:
            os.fsync(written.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_whole(path: Path, data: str | bytes) -> None:
    """Write `data` (text as UTF-8) to `path` whole or not at all."""
    with written_whole(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
