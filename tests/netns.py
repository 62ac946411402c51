"""Network-namespace fixtures: hosts joined by veths, a hub namespace, and processes inside them.

Everything a `Lab` creates carries this run's tag, and `Lab.close` removes it on
success, failure and Ctrl-C alike (pytest tears fixtures down on all three).
Namespaces left by a run that was killed outright are reaped on the next start
because their tag names a process that no longer exists.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "fgt"
MTU = 9000
_TAG = re.compile(rf"^{PREFIX}(\d+)x")


def sh(*args: str, check: bool = True) -> str:
    result = subprocess.run(args, capture_output=True, text=True)
    if check and result.returncode:
        raise RuntimeError(f"{' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def netns_unavailable() -> str | None:
    """Why namespaces cannot be made here (one line), or None when they can."""
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip) for network namespaces"
    probe = f"{PREFIX}{os.getpid()}xprobe"
    result = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if result.returncode:
        return f"cannot create a network namespace: {result.stderr.strip()}"
    sh("ip", "netns", "del", probe, check=False)
    return None


def reap_stale() -> None:
    """Delete namespaces of earlier runs whose process is gone."""
    for line in sh("ip", "netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        match = _TAG.match(name)
        if match and not Path(f"/proc/{match[1]}").exists():
            sh("ip", "netns", "del", name, check=False)


@dataclass
class Host:
    name: str
    ns: str
    iface: str
    ip: str
    mac: str = ""


@dataclass
class Lab:
    """A set of namespaces for one test; hosts get 10.77.0.<i+1>/24 on interface `eth0`."""

    workdir: Path
    tag: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}x{os.urandom(2).hex()}")
    namespaces: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)
    hosts: list[Host] = field(default_factory=list)

    def namespace(self, name: str) -> str:
        ns = f"{self.tag}-{name}"
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        self.run(ns, "ip", "link", "set", "lo", "up")
        self.run(ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
        return ns

    def run(self, ns: str, *args: str) -> str:
        return sh("ip", "netns", "exec", ns, *args)

    def veth(self, ns_a: str, if_a: str, ns_b: str, if_b: str) -> None:
        tmp_a, tmp_b = f"v{os.urandom(5).hex()}", f"v{os.urandom(5).hex()}"
        sh("ip", "link", "add", tmp_a, "mtu", str(MTU), "type", "veth", "peer", tmp_b)
        for tmp, ns, name in ((tmp_a, ns_a, if_a), (tmp_b, ns_b, if_b)):
            sh("ip", "link", "set", tmp, "netns", ns)
            self.run(ns, "ip", "link", "set", tmp, "name", name)
            self.run(ns, "ip", "link", "set", name, "mtu", str(MTU), "up")

    def add_host(self, name: str) -> Host:
        host = Host(name, self.namespace(name), "eth0", f"10.77.0.{len(self.hosts) + 1}")
        self.hosts.append(host)
        return host

    def address(self, host: Host) -> None:
        self.run(host.ns, "ip", "addr", "add", f"{host.ip}/24", "dev", host.iface)
        host.mac = mac_of(self, host.ns, host.iface)

    def pair(self) -> tuple[Host, Host]:
        """Two hosts on one veth."""
        a, b = self.add_host("a"), self.add_host("b")
        self.veth(a.ns, a.iface, b.ns, b.iface)
        self.address(a)
        self.address(b)
        return a, b

    def star(self, n: int, hub: str) -> tuple[list[Host], str]:
        """`n` hosts each on a veth to a hub namespace (ports p0, p1, ...)."""
        hub_ns = self.namespace(hub)
        hosts = [self.add_host(chr(ord("a") + i)) for i in range(n)]
        for i, host in enumerate(hosts):
            self.veth(host.ns, host.iface, hub_ns, f"p{i}")
            self.address(host)
        return hosts, hub_ns

    def bridge(self, n: int) -> list[Host]:
        """`n` hosts on a Linux bridge: plain forwarding, ARP resolved by the agents."""
        hosts, hub_ns = self.star(n, "br")
        self.run(hub_ns, "ip", "link", "add", "br0", "mtu", str(MTU), "type", "bridge")
        for i in range(n):
            self.run(hub_ns, "ip", "link", "set", f"p{i}", "master", "br0")
        self.run(hub_ns, "ip", "link", "set", "br0", "up")
        return hosts

    def spawn(self, ns: str, *args: str, log: str) -> subprocess.Popen:
        out = open(self.workdir / log, "w")  # noqa: SIM115
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        self.procs.append(proc)
        return proc

    def python(self, ns: str, module_or_script: str, *args: str, log: str) -> subprocess.Popen:
        target = (
            ["-m", module_or_script] if not module_or_script.endswith(".py") else [module_or_script]
        )
        return self.spawn(ns, sys.executable, *target, *args, log=log)

    def log(self, name: str) -> str:
        path = self.workdir / name
        return path.read_text() if path.exists() else ""

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for ns in reversed(self.namespaces):
            sh("ip", "netns", "del", ns, check=False)
        self.namespaces.clear()


def mac_of(lab: Lab, ns: str, iface: str) -> str:
    return lab.run(ns, "cat", f"/sys/class/net/{iface}/address").strip()
