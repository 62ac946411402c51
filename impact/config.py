"""The settings of `forgive impact`, kept free of PyTorch so the CLI can offer them without it."""

from __future__ import annotations

from dataclasses import dataclass, field

from host_agent.policies import P_HIGH


@dataclass(frozen=True)
class ModelSpec:
    hidden: int = 480
    """Width of the MLP's two hidden layers."""
    batch: int = 64
    """Images per replica per step."""
    lr: float = 2e-3
    """Adam's learning rate."""

    def validate(self) -> None:
        if self.hidden < 1 or self.batch < 1:
            raise ValueError("hidden width and batch must be >= 1")
        if not 0 < self.lr < 1:
            raise ValueError(f"learning rate must lie in (0, 1), got {self.lr}")


@dataclass(frozen=True)
class ImpactConfig:
    spec: ModelSpec = field(default_factory=ModelSpec)
    seeds: tuple[int, ...] = (1, 2, 3, 4, 5)
    """Training seeds (weights, minibatches, uniform draws); each replays one recorded run."""
    drift_steps: int = 200
    """Steps of the drift experiment under independent drops."""
    drift_p: float = P_HIGH
    burn_in: int = 50
    """Steps of the drift experiment left out of its averages: Adam's updates shrink
    several-fold early on, which a trailing sigma^2 follows only roughly."""
    threads: int = 1

    def validate(self) -> None:
        self.spec.validate()
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError("need at least one seed, each once")
        if self.drift_steps <= self.burn_in:
            raise ValueError(f"drift steps must exceed the burn-in of {self.burn_in}")
        if not 0 < self.drift_p < 1:
            raise ValueError(f"drift p must lie in (0, 1), got {self.drift_p}")
        if self.threads < 1:
            raise ValueError("threads must be >= 1")
