"""InCriticalRegime: which steps get the small loss probability P_low.

The detector runs at the receiving rank before a step's gradient traffic
starts. Two implementations share one interface: a fixed schedule, for runs
with no model to read norms from, and Accordion's criterion over the gradient
norms the training side hands in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class CriticalRegimeDetector(Protocol):
    def classify(self, step: int, norm: float | None = None) -> bool:
        """True if `step` lies in a critical learning regime. `norm` is the gradient norm
        the training side measured for the previous step, when it has one."""
        ...


def _note_steps(steps: int) -> frozenset[int]:
    """The note's critical steps in a run of `steps`: 1, 2, 3 and the last, those that exist."""
    return frozenset({1, 2, 3, steps}) & frozenset(range(1, steps + 1))


@dataclass(frozen=True)
class StaticSchedule:
    """A fixed list of critical steps; by default the note's 1, 2, 3 and the last of 20.

    Build it from a run's configuration with `of`, which validates the steps and gives the
    note's schedule one form however it was named."""

    steps: int = 20
    critical: frozenset[int] | None = None
    """The critical steps; None: the note's (1, 2, 3 and the last)."""

    @classmethod
    def of(cls, steps: int, critical: Sequence[int]) -> StaticSchedule:
        """The schedule of a run of `steps` whose critical steps are `critical`, empty meaning
        the note's. A step outside 1..steps is a ValueError naming the first one. Naming the
        note's own steps gives the note's schedule (`critical` None, `setting()` empty), so
        that such a run is the note's run, under the note's cache key."""
        for step in critical:
            if not 1 <= step <= steps:
                raise ValueError(f"step {step} is outside 1..{steps}")
        given = frozenset(critical)
        return cls(steps, None if not given or given == _note_steps(steps) else given)

    def setting(self) -> tuple[int, ...]:
        """The critical steps as a configuration holds them (TrainingConfig.critical,
        Workload.critical): sorted, or empty on the note's schedule."""
        return () if self.critical is None else tuple(sorted(self.critical))

    def critical_steps(self) -> frozenset[int]:
        if self.critical is not None:
            return self.critical
        return _note_steps(self.steps)

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
