"""The interface every PTF target implements: where it runs (`Endpoint`), what it does
(`PtfTarget`, `SwitchTarget`), how a one-process target starts and stops (`OneProcess`)
and how its start is awaited (`wait_for_listen`).

The targets themselves are in ptf_tests/targets.py (the switch model and BMv2),
ptf_tests/tofino_model.py and ptf_tests/pna_nic.py; targets.py names them all in
TARGETS, so no target module imports another's.
"""

from __future__ import annotations

import subprocess
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from controller import DEVICE_CONFIG, P4INFO
from switch_model.port import PRIO_LOW
from topologies.processes import stop_process


@dataclass(frozen=True)
class Endpoint:
    """Where a running switch lives: enough to reach it from another process."""

    netns: str
    ports: dict[int, str]
    """Switch port number -> interface name inside `netns`."""
    grpc_port: int
    aux_port: int
    """A second TCP port for a target's own management channel (BMv2: Thrift)."""
    log_dir: Path = field(default=Path("/tmp"))

    @property
    def grpc_addr(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


class PtfTarget(ABC):
    """One kind of device the PTF suite drives. Construct with an Endpoint; `start` only
    in the harness."""

    name: ClassVar[str]
    arch: ClassVar[str] = "v1model"
    """The P4 architecture of its program: "v1model" (p4src/forgive.p4), "tna"
    (p4src/tna/forgive.p4) or "pna" (p4src/pna/forgive_nic.p4). Tests branch on it
    where the targets differ."""
    ptf_specs: ClassVar[tuple[str, ...]] = ()
    """The PTF tests or groups it runs when none are named; () is PTF's standard
    group, which holds the switch suite."""

    @classmethod
    def pipeline(cls) -> tuple[Path, Path]:
        """The P4Info and device config the suite pushes to this target."""
        return P4INFO, DEVICE_CONFIG

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint

    @classmethod
    @abstractmethod
    def missing(cls) -> str | None:
        """Why this target cannot run on this machine, or None if it can."""

    @abstractmethod
    def start(self, timeout: float = 30.0) -> None:
        """Start the target on the endpoint's interfaces, return once its control channel
        (P4Runtime for a switch) listens."""

    @abstractmethod
    def stop(self) -> None:
        """Stop the target; safe to call twice or after a failed start."""


class SwitchTarget(PtfTarget):
    """One kind of switch: P4Runtime, plus paced queues."""

    @abstractmethod
    def set_queue_rate(self, port: int, pps: int, priority: int = PRIO_LOW) -> None:
        """Drain one priority queue of `port` at `pps` packets per second (0: unlimited)."""


class OneProcess:
    """A target that is one process in the endpoint's namespace: `_launch` starts it,
    `stop` ends it. Mixed in before PtfTarget (`class T(OneProcess, SwitchTarget)`)."""

    endpoint: Endpoint
    _proc: subprocess.Popen | None = None

    def _launch(self, cmd: list[str], log: str, ports: tuple[int, ...], timeout: float) -> None:
        """Start `cmd`, its output in `log` in the endpoint's log folder, and wait until it
        listens on every one of `ports` (a failed start leaves it for `stop`)."""
        ep = self.endpoint
        with open(ep.log_dir / log, "wb") as out:
            self._proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        for port in ports:
            wait_for_listen(ep.netns, port, deadline, self._proc)

    def stop(self) -> None:
        stop_process(self._proc)
        self._proc = None


def wait_for_listen(netns: str, port: int, deadline: float, proc: subprocess.Popen) -> None:
    """Block until something in `netns` listens on TCP `port`, or fail with the reason."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"switch exited with status {proc.returncode} before listening")
        out = subprocess.run(
            ["ip", "netns", "exec", netns, "ss", "-Hltn", f"sport = :{port}"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        if out.strip():
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listened on port {port} in {netns} in time")
