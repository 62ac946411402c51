"""How far an emulated run's ranks are, read from their training records while they write them."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from common import records
from runplan.run import RunError


class StepProgress:
    """The last step every rank has finished, from their training records as they grow.

    Each look reads only what was appended since the last one, up to the last complete
    line (a rank may be writing the next): the run's progress line and the soak's sampler
    look many times a second at records of hundreds of steps.
    """

    def __init__(self) -> None:
        self._read: dict[Path, tuple[int, int]] = {}
        """Per record: bytes read so far (whole lines), the last step finished in them."""

    def _last_step(self, path: Path) -> int:
        offset, step = self._read.get(path, (0, 0))
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size < offset:
                offset, step = 0, 0  # rewritten from the start: another run's record
            f.seek(offset)
            new = f.read()
        whole = new[: new.rfind(b"\n") + 1]
        for number, line in enumerate(whole.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise RunError(f"{path}: line {number} after byte {offset}: not JSON") from None
            if record.get(records.TYPE) == records.TRAIN_STEP:
                step = max(step, record["step"])
        self._read[path] = (offset + len(whole), step)
        return step

    def done(self, paths: Iterable[Path]) -> int:
        """The last step finished in every one of `paths`; 0 while one does not exist yet."""
        done = []
        for path in paths:
            try:
                done.append(self._last_step(path))
            except FileNotFoundError:
                return 0
            except OSError as err:
                raise RunError(f"cannot read {path}: {err.strerror}") from None
        return min(done, default=0)
