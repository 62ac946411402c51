"""The PTF target for p4src/pna/forgive_nic.p4: BMv2's pna_nic.

pna_nic loads the program's BMv2 JSON at start and serves BMv2's Thrift
runtime on the endpoint's second port; it has no P4Runtime server, so the
suite drives it through controller.nic. Harness port 1 is the NIC's network
port, port 2 its host port. It runs the NIC's own PTF module (forgive_nic),
not the switch suite.

A pna_nic binary being installed is not enough: the program's `Register`
reads and writes are BMv2 primitives (`register_read`, `register_write`) that
a stock pna_nic lacks, and such a pna_nic refuses the JSON at load
(docs/nic.md section "Status"). `missing` therefore loads the committed JSON
into the installed pna_nic once per process (`load_probe`) and skips, in one
line, on that refusal and on no other: any other failure to load is the
suite's to report.
"""

from __future__ import annotations

import functools
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import ClassVar

from controller import nic
from ptf_tests.target import OneProcess, PtfTarget
from topologies.ports import free_port
from topologies.processes import stop_process

NETWORK_PORT = 1
HOST_PORT = 2

ABSENT_PRIMITIVES = ("register_read", "register_write")
"""The primitives a stock pna_nic (BMv2 9674187) lacks and the program needs: the only
refusal `load_probe` takes for a missing capability rather than a failure."""
_UNKNOWN_PRIMITIVE = re.compile(r"Unknown primitive action: (\S+)")
PROBE_TIMEOUT = 20.0


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@functools.cache
def load_probe(binary: str, config: Path, timeout: float = PROBE_TIMEOUT) -> str | None:
    """Start `binary` on `config` with no ports until its Thrift server listens (it loaded
    the program) or it exits. One line naming the binary and the primitive when it exits
    refusing one of ABSENT_PRIMITIVES; None otherwise, failures included, so that a
    program the binary should load and does not is reported by the suite, not skipped.
    Cached: one start per process and binary."""
    path = shutil.which(binary) or binary
    port = free_port()
    with (
        tempfile.TemporaryDirectory(prefix="forgive-pna-probe-") as tmp,
        open(Path(tmp) / "out", "w+b") as out,
    ):
        # its own notification socket: BMv2's default one is per device id, in /tmp
        cmd = [path, "--device-id", "0", "--thrift-port", str(port)]
        cmd += ["--notifications-addr", f"ipc://{tmp}/notifications.ipc", str(config)]
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while proc.poll() is None and time.monotonic() < deadline:
                if _listening(port):
                    return None
                time.sleep(0.05)
            exited = proc.poll() is not None
        finally:
            stop_process(proc)
        out.seek(0)
        output = out.read().decode(errors="replace")
    found = _UNKNOWN_PRIMITIVE.search(output)
    if not exited or proc.returncode == 0 or found is None:
        return None
    if found.group(1) not in ABSENT_PRIMITIVES:
        return None
    return (
        f"{path} has no {found.group(1)} primitive, which {config.name} needs "
        '(stock BMv2 pna_nic; docs/nic.md section "Status" says how to add it)'
    )


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
        return nic.missing() or load_probe(cls.BINARY, nic.NIC_JSON)

    def start(self, timeout: float = 30.0) -> None:
        ep = self.endpoint
        cmd = ["ip", "netns", "exec", ep.netns, self.BINARY, "--device-id", "0"]
        for port, ifname in sorted(ep.ports.items()):
            cmd += ["-i", f"{port}@{ifname}"]
        cmd += ["--thrift-port", str(ep.aux_port), "--log-level", "debug"]
        cmd += ["--log-file", str(ep.log_dir / "pna_nic"), "--log-flush", str(nic.NIC_JSON)]
        self._launch(cmd, "pna_nic.stdout", (ep.aux_port,), timeout)
