"""One host's part of a run plan: what its agent and its rank run, and where they write.

`runplan.run.plan_run` makes one `HostEntry` per rank. The simulator
builds its hosts and ranks from the entries directly; the Mininet runner hands
each trainer process its entry as one JSON argument (`forgive-train --host`),
which `from_json` reads back as it was, so both engines run the same
configuration with no second encoding of it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from host_agent.endpoint import EndpointConfig
from workload.plan import TrainingConfig

_KINDS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "job": int,
    "endpoint": dict,
    "training": dict,
    "gateway_mac": str,
    "train_file": str,
    "stats_file": str,
    "timeout_s": (int, float),
    "spray": bool,
}
_KEYS = tuple(_KINDS)
"""The keys of an entry's JSON object, each with the JSON type its value must have."""


@dataclass(frozen=True)
class HostEntry:
    name: str
    """The host's name in the fabric plan (`h1`, ...); its interface is `<name>-eth0`."""
    job: int
    """Which training job of the run the rank belongs to (0, or 1 for a companion job)."""
    endpoint: EndpointConfig
    training: TrainingConfig
    """The rank's training configuration; `training.rank` is its index in the job."""
    gateway_mac: str
    """The MAC of the leaf port the host hangs off: the next hop of everything it sends."""
    train_file: str
    """The rank's JSON-lines training records."""
    stats_file: str
    """The host's JSON-lines statistics."""
    timeout_s: float
    """How long the rank may run before it gives up."""
    spray: bool = True
    """A new UDP source port per packet (HostConfig.spray); False: one per message."""

    @property
    def iface(self) -> str:
        return f"{self.name}-eth0"

    @property
    def ip(self) -> str:
        return self.training.ranks[self.training.rank]

    def to_json(self) -> str:
        return json.dumps(
            {
                "name": self.name,
                "job": self.job,
                "endpoint": self.endpoint.to_dict(),
                "training": asdict(self.training),
                "gateway_mac": self.gateway_mac,
                "train_file": self.train_file,
                "stats_file": self.stats_file,
                "timeout_s": self.timeout_s,
                "spray": self.spray,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> HostEntry:
        """The entry `to_json` wrote, validated; ValueError in one line where it is not one."""
        try:
            values: Any = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"host entry is not JSON: {exc}") from None
        if not isinstance(values, dict):
            raise ValueError("host entry must be a JSON object")
        if set(values) != set(_KEYS):
            raise ValueError(f"host entry must hold exactly {', '.join(_KEYS)}")
        for key, kind in _KINDS.items():
            if not isinstance(values[key], kind) or (
                kind is not bool and isinstance(values[key], bool)
            ):
                raise ValueError(f"host entry: {key} = {values[key]!r} is not {kind}")
        return cls(
            name=values["name"],
            job=values["job"],
            endpoint=EndpointConfig.from_dict(values["endpoint"]),
            training=TrainingConfig.from_dict(values["training"]),
            gateway_mac=values["gateway_mac"],
            train_file=values["train_file"],
            stats_file=values["stats_file"],
            timeout_s=float(values["timeout_s"]),
            spray=values["spray"],
        )
