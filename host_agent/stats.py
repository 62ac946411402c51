"""Statistics out of the agent as JSON lines, and the independent check of the note's bound.

The bound is recomputed here from the core's published step state rather than
trusted from the core, so a bug in the core's accounting shows up as a loud,
counted violation instead of a quiet number.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from typing import IO, Any

_RELATIVE_SLACK = 1e-9
"""Float rounding allowance when comparing forgiven * (1 - p) against p * received."""


def bound_violation(state: Mapping[str, Any], vesting: bool = True) -> str | None:
    """Describe how a step state breaks `forgiven <= budget` or `forgiven <= p/(1-p) * received`.

    The second form is checked as `forgiven * (1 - p) <= p * received`, which
    needs no division and stays meaningful at p = 0 (nothing may be forgiven).
    It is the vesting rule's bound, so a policy without vesting (the note's
    full-budget comparison) is held to the budget alone.
    """
    p = float(state["p"])
    forgiven = int(state["forgiven"])
    received = int(state["received"])
    budget = int(state["budget"])
    problems = []
    if forgiven > budget:
        problems.append(f"forgiven {forgiven} > budget {budget}")
    lhs = forgiven * (1.0 - p)
    rhs = p * received
    if vesting and forgiven and lhs > rhs + _RELATIVE_SLACK * max(1.0, rhs):
        problems.append(f"forgiven {forgiven} > p/(1-p)*received with p={p}, received={received}")
    return "; ".join(problems) or None


class StatsLog:
    """One JSON object per line, flushed per record so a killed agent loses nothing written."""

    def __init__(self, path: str | None, host: str) -> None:
        self.host = host
        self._out: IO[str] | None
        if path is None:
            self._out = None
        elif path == "-":
            self._out = sys.stdout
        else:
            self._out = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def write(self, kind: str, **fields: Any) -> None:
        if self._out is None:
            return
        record = {"type": kind, "host": self.host, "time": round(time.time(), 6), **fields}
        self._out.write(json.dumps(record, sort_keys=False) + "\n")

    def close(self) -> None:
        if self._out is not None and self._out is not sys.stdout:
            self._out.close()
        self._out = None
