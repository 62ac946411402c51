"""Statistics out of the agent as JSON lines, and the independent checks of the note's bound.

The bound is recomputed here from the core's published step state rather than
trusted from the core, and the budget and the step's completion are checked
against what the workload itself declared, so a bug in the core's accounting
shows up as a loud, counted violation instead of a quiet number.
"""

from __future__ import annotations

import json
from fractions import Fraction
from typing import IO, Any

from common import records
from host_agent.core.receiver import StepState

_RELATIVE_SLACK = 1e-9
"""Float rounding allowance when comparing forgiven * (1 - p) against p * received."""


def bound_violation(state: StepState, vesting: bool = True) -> str | None:
    """Describe how a step state breaks `forgiven <= budget` or `forgiven <= p/(1-p) * received`.

    The second form is checked as `forgiven * (1 - p) <= p * received`, which
    needs no division and stays meaningful at p = 0 (nothing may be forgiven).
    It is the vesting rule's bound, so a policy without vesting (the note's
    full-budget comparison) is held to the budget alone.
    """
    p, forgiven, received, budget = state.p, state.forgiven, state.received, state.budget
    problems = []
    if forgiven > budget:
        problems.append(f"forgiven {forgiven} > budget {budget}")
    lhs = forgiven * (1.0 - p)
    rhs = p * received
    if vesting and forgiven and lhs > rhs + _RELATIVE_SLACK * max(1.0, rhs):
        problems.append(f"forgiven {forgiven} > p/(1-p)*received with p={p}, received={received}")
    return "; ".join(problems) or None


def loss_budget(p: float, expected: int) -> int:
    """The note's budget, floor(p * expected), in exact arithmetic."""
    return int(Fraction(str(p)) * expected)


def budget_violation(state: StepState, p: float, expected: int, budget: int) -> str | None:
    """Describe how a step's p, expected bytes or budget differ from what the workload declared.

    `p` is the policy's probability for the step's regime, `expected` the
    workload's own count and `budget` what `loss_budget` makes of the two.
    """
    problems = []
    if state.p != p:
        problems.append(f"p {state.p} but the policy gives {p}")
    if state.expected != expected:
        problems.append(f"expected {state.expected} but the workload declared {expected}")
    if state.budget != budget:
        problems.append(f"budget {state.budget} != floor(p * expected) = {budget}")
    return "; ".join(problems) or None


def completion_violation(state: StepState, expected: int, shed: int) -> str | None:
    """At a step's end every expected gradient byte was received, forgiven or shed: none lost."""
    received, forgiven = state.received, state.forgiven
    if received + forgiven + shed == expected:
        return None
    return (
        f"received {received} + forgiven {forgiven} + shed {shed} != expected {expected}"
        " at step completion"
    )


class StatsLog:
    """One JSON object per line, flushed per record so a killed agent loses nothing written.

    Records carry the caller's clock plus `offset` (a driver on the monotonic
    clock passes the wall clock's offset; virtual time passes 0), so the same
    run gives the same records whatever engine drives it. `flush=False` leaves flushing to
    the stream (the simulator, whose run is lost whole if it is killed, writes two records
    per message and would pay a system call for each).
    """

    def __init__(
        self, out: IO[str] | None, host: str, offset: float = 0.0, flush: bool = True
    ) -> None:
        self.host = host
        self.offset = offset
        self._out = out
        self._flush = flush

    def write(self, kind: str, now: float, **fields: Any) -> None:
        if self._out is None:
            return
        record = {
            records.TYPE: kind,
            "host": self.host,
            "time": round(now + self.offset, 6),
            **fields,
        }
        self._out.write(json.dumps(record) + "\n")
        if self._flush:
            self._out.flush()
