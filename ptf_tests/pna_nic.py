"""The PTF target for p4src/pna/forgive_nic.p4: BMv2's pna_nic.

pna_nic loads the program's BMv2 JSON at start and serves BMv2's Thrift
runtime on the endpoint's second port; it has no P4Runtime server, so the
suite drives it through controller.nic. Harness port 1 is the NIC's network
port, port 2 its host port. It runs the NIC's own PTF module (forgive_nic),
not the switch suite.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from controller import nic
from ptf_tests.target import OneProcess, PtfTarget

NETWORK_PORT = 1
HOST_PORT = 2


class PnaNicTarget(OneProcess, PtfTarget):
    """BMv2 pna_nic running forgive_nic.p4 from the start."""

    name = "pna_nic"
    arch = "pna"
    ptf_specs: ClassVar[tuple[str, ...]] = ("forgive_nic",)
    BINARY = "pna_nic"

    @classmethod
    def pipeline(cls) -> tuple[Path, Path]:
        return nic.NIC_P4INFO, nic.NIC_JSON

    @classmethod
    def missing(cls) -> str | None:
        return nic.missing()

    def start(self, timeout: float = 30.0) -> None:
        ep = self.endpoint
        cmd = ["ip", "netns", "exec", ep.netns, self.BINARY, "--device-id", "0"]
        for port, ifname in sorted(ep.ports.items()):
            cmd += ["-i", f"{port}@{ifname}"]
        cmd += ["--thrift-port", str(ep.aux_port), "--log-level", "debug"]
        cmd += ["--log-file", str(ep.log_dir / "pna_nic"), "--log-flush", str(nic.NIC_JSON)]
        self._launch(cmd, "pna_nic.stdout", (ep.aux_port,), timeout)
