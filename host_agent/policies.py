"""The named per-run policies: each is one configuration of the same agent.

Receiver-side policies (`tight`, `forgive*`) forgive trimmed gradient ranges
within a per-step loss budget. Sender-side policies (`shed`, `loose`) instead
drop whole gradient messages before they are posted, DBLP-style, by a hash
draw that both ends compute from the shared seed, so the receiver knows which
messages will never come without any packet saying so. `dcqcn` tolerates no
loss at all.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

P_LOW = 0.005
"""Loss probability on critical steps (the note's P_low)."""
P_HIGH = 0.1
"""Loss probability on every other step (the note's P_high)."""


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    p_low: float
    p_high: float
    forgive_prob: float = 1.0
    vesting: bool = True
    exemption: bool = True
    shed: bool = False
    """True: the sender sheds whole gradient messages at p_low/p_high and the receiver forgives nothing."""

    def step_probability(self, critical: bool) -> float:
        return self.p_low if critical else self.p_high

    @property
    def receiver_probabilities(self) -> tuple[float, float]:
        """(p_low, p_high) for the receiver's loss budget: zero when the loss is taken by shedding."""
        return (0.0, 0.0) if self.shed else (self.p_low, self.p_high)


DEFAULT_POLICY = "forgive"
"""The policy a run or an agent uses unless told otherwise (`--policy`)."""

_FIXED = {
    "dcqcn": Policy("dcqcn", 0.0, 0.0),
    "tight": Policy("tight", P_LOW, P_LOW),
    "forgive": Policy("forgive", P_LOW, P_HIGH),
    "forgive-full-budget": Policy("forgive-full-budget", P_LOW, P_HIGH, vesting=False),
    "forgive-no-exemption": Policy("forgive-no-exemption", P_LOW, P_HIGH, exemption=False),
    "shed": Policy("shed", P_LOW, P_HIGH, shed=True),
    "loose": Policy("loose", P_HIGH, P_HIGH, shed=True),
}
_FORGIVE_P = re.compile(r"forgive-P(?P<p>[0-9]*\.?[0-9]+)")

POLICY_NAMES = (*_FIXED, "forgive-P<x>")


def parse_policy(name: str) -> Policy:
    """The policy called `name`; ValueError with one line naming the choices otherwise."""
    if name in _FIXED:
        return _FIXED[name]
    match = _FORGIVE_P.fullmatch(name)
    if match:
        prob = float(match["p"])
        if prob <= 1.0:
            return Policy(name, P_LOW, P_HIGH, forgive_prob=prob)
        raise ValueError(f"policy {name!r}: the forgiveness probability must be within [0, 1]")
    raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})")


def shed_draw(seed: int, step: int, flow_id: int) -> float:
    """A uniform draw in [0, 1) that sender and receiver compute alike for one message."""
    digest = hashlib.blake2b(f"{seed}:{step}:{flow_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def is_shed(policy: Policy, seed: int, step: int, flow_id: int, critical: bool) -> bool:
    """Whether a shedding policy drops this gradient message (never for other policies)."""
    return policy.shed and shed_draw(seed, step, flow_id) < policy.step_probability(critical)
