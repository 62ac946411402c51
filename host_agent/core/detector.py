"""InCriticalRegime: which steps get the small loss probability P_low.

The detector runs at the receiving rank before a step's gradient traffic
starts. Two implementations share one interface: a fixed schedule, for runs
with no model to read norms from, and Accordion's criterion over the gradient
norms the training side hands in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class CriticalRegimeDetector(Protocol):
    def classify(self, step: int, norm: float | None = None) -> bool:
        """True if `step` lies in a critical learning regime. `norm` is the gradient norm
        the training side measured for the previous step, when it has one."""
        ...


@dataclass(frozen=True)
class StaticSchedule:
    """A fixed list of critical steps; by default the note's 1, 2, 3 and the last of 20."""

    steps: int = 20
    critical: frozenset[int] | None = None

    def critical_steps(self) -> frozenset[int]:
        if self.critical is not None:
            return self.critical
        return frozenset({1, 2, 3, self.steps}) & frozenset(range(1, self.steps + 1))

    def classify(self, step: int, norm: float | None = None) -> bool:
        return step in self.critical_steps()


@dataclass
class AccordionDetector:
    """Accordion's criterion: a step is critical while the norm of the gradient accumulated
    over an interval changes, relative to the previous interval, by at least `threshold`.

    Norms arrive one per step through `classify(step, norm)`; every `interval` steps the
    accumulated norm of that interval is compared with the previous one. Until two
    intervals exist, training is taken to be critical, as it is early on.
    """

    threshold: float = 0.5
    interval: int = 1
    _current: list[float] = field(default_factory=list)
    _previous: float | None = None
    _latest: float | None = None
    _critical: bool = True

    def __post_init__(self) -> None:
        if self.threshold <= 0:
            raise ValueError(f"threshold must be > 0, got {self.threshold}")
        if self.interval < 1:
            raise ValueError(f"interval must be >= 1, got {self.interval}")

    def classify(self, step: int, norm: float | None = None) -> bool:
        if norm is not None:
            if norm < 0:
                raise ValueError(f"gradient norm must be >= 0, got {norm}")
            self._current.append(norm)
            if len(self._current) == self.interval:
                total = sum(self._current)
                self._current.clear()
                if self._latest is not None:
                    self._previous = self._latest
                self._latest = total
                if self._previous is not None:
                    change = abs(self._previous - total) / max(self._previous, 1e-300)
                    self._critical = change >= self.threshold
        return self._critical


@dataclass(frozen=True)
class Misclassifying:
    """Another detector's verdicts, wrong on the given steps: the note leaves open what a real
    detector's mistakes cost, so a run can make them on purpose. On a step of `wrong` a
    critical step is taken as non-critical (its bytes forgiven at P_high) or the reverse
    (its time saving given up)."""

    inner: CriticalRegimeDetector
    wrong: frozenset[int]

    def classify(self, step: int, norm: float | None = None) -> bool:
        return self.inner.classify(step, norm) != (step in self.wrong)
