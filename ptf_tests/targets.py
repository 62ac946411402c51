"""Targets the PTF suite runs against, behind one small interface.

A switch target is a process that forwards between the interfaces it is given
and takes its pipeline and entries over P4Runtime on a gRPC port. Everything
else the suite needs from a target that P4Runtime cannot express (queue drain
rates) goes through `set_queue_rate`. A NIC target (ptf_tests/pna_nic.py) runs
the NIC program and its own PTF module instead. Adding a target is writing one
subclass of ptf_tests.target's and naming it in TARGETS.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

from ptf_tests.pna_nic import PnaNicTarget
from ptf_tests.target import Endpoint, OneProcess, PtfTarget, SwitchTarget
from ptf_tests.tofino_model import TofinoModelTarget
from switch_model.port import PRIO_LOW


class Bmv2Target(OneProcess, SwitchTarget):
    """BMv2 simple_switch_grpc with two strict-priority queues per port."""

    name = "bmv2"
    BINARY = "simple_switch_grpc"
    CLI = "simple_switch_CLI"
    QUEUE_DEPTH_PKTS = 100_000
    """Far above what any port's data_queue_bytes admits, so BMv2 never drops
    what the program let in; the program's byte budget is the only limit."""

    def __init__(self, endpoint: Endpoint, log_level: str = "debug", binary: str = BINARY) -> None:
        """`log_level` "off" starts BMv2 without a log file; `binary` may name another
        build (benchmarks compare one built without logging)."""
        super().__init__(endpoint)
        self.log_level = log_level
        self.binary = binary

    @classmethod
    def missing(cls) -> str | None:
        for tool in (cls.BINARY, cls.CLI):
            if shutil.which(tool) is None:
                return f"{tool} not installed"
        return None

    def start(self, timeout: float = 30.0) -> None:
        ep = self.endpoint
        cmd = ["ip", "netns", "exec", ep.netns, self.binary, "--device-id", "0"]
        for port, ifname in sorted(ep.ports.items()):
            cmd += ["-i", f"{port}@{ifname}"]
        cmd += ["--thrift-port", str(ep.aux_port), "--log-level", self.log_level]
        if self.log_level != "off":
            cmd += ["--log-file", str(ep.log_dir / "bmv2"), "--log-flush"]
        cmd += [
            "--no-p4",
            "--",
            "--grpc-server-addr",
            ep.grpc_addr,
            "--priority-queues",
            "2",
        ]
        self._launch(cmd, "bmv2.stdout", (ep.grpc_port, ep.aux_port), timeout)
        bmv2_cli(ep, f"set_queue_depth {self.QUEUE_DEPTH_PKTS}")

    def set_queue_rate(self, port: int, pps: int, priority: int = PRIO_LOW) -> None:
        bmv2_cli(self.endpoint, f"set_queue_rate {pps} {port} {priority}")


def bmv2_cli(ep: Endpoint, command: str) -> None:
    """Run one simple_switch_CLI command against the BMv2 at `ep`. The CLI is a Python
    script: run it with this interpreter, which sees Debian's python3-thrift, not
    whichever python3 is first on PATH."""
    cli = shutil.which(Bmv2Target.CLI) or Bmv2Target.CLI
    res = subprocess.run(
        ["ip", "netns", "exec", ep.netns, sys.executable, cli, "--thrift-port", str(ep.aux_port)],
        input=command + "\n",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if res.returncode != 0 or "Error" in res.stdout or "Invalid" in res.stdout:
        raise RuntimeError(f"{Bmv2Target.CLI} {command!r} failed: {res.stdout}{res.stderr}".strip())


class ModelTarget(OneProcess, SwitchTarget):
    """The Python switch model (`forgive-switch`): same P4Runtime, queue rates on its socket.

    The control socket's path follows from the endpoint alone, so a target
    built inside the PTF process (which knows no log directory) reaches the
    switch the harness started.
    """

    name = "model"

    @property
    def control_path(self) -> str:
        ep = self.endpoint
        return f"/tmp/forgive-{ep.netns}-{ep.grpc_port}.sock"

    @classmethod
    def missing(cls) -> str | None:
        return None

    def start(self, timeout: float = 30.0) -> None:
        ep = self.endpoint
        cmd = ["ip", "netns", "exec", ep.netns, sys.executable, "-m", "commands.switch"]
        cmd += ["--name", ep.netns, "--device-id", "0", "--grpc", ep.grpc_addr]
        cmd += ["--control", self.control_path]
        for port, ifname in sorted(ep.ports.items()):
            cmd += ["-i", f"{port}={ifname}"]
        self._launch(cmd, "model.log", (ep.grpc_port,), timeout)

    def set_queue_rate(self, port: int, pps: int, priority: int = PRIO_LOW) -> None:
        from switch_model import control

        control.request(
            self.control_path,
            {"cmd": "set_queue_rate", "port": port, "priority": priority, "pps": pps},
        )


TARGETS: dict[str, type[PtfTarget]] = {
    cls.name: cls for cls in (ModelTarget, Bmv2Target, TofinoModelTarget, PnaNicTarget)
}
"""Every target the suite can run, by name."""


def switch_targets() -> list[str]:
    """The targets that are switches, by name."""
    return sorted(name for name, cls in TARGETS.items() if issubclass(cls, SwitchTarget))
