"""Mininet switches for the two FORGIVE targets: the switch model and BMv2.

Both run one process per switch in the root namespace on the switch's Mininet
interfaces, listen for P4Runtime on their own gRPC port and write a log file;
they differ only in the command line and in the side channel for queue rates
(the model's control socket, BMv2's Thrift port). `start` returns once the
switch answers and stops the process again if it never does; `stop` ends the
process before Mininet deletes the interfaces. `describe` turns a started
network into the description `forgive-ctl` and `FabricController` take, so a
runner configures either kind (or a mix) the same way.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mininet.node import Switch

from common.tls import ServerTls
from switch_model import control
from topologies.ports import free_port
from topologies.processes import stop_process

OFFLOADS = ("tx", "rx", "tso", "gso", "gro")
_devices = itertools.count(1)


def _listening(port: int) -> bool:
    out = subprocess.run(
        ["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=False
    ).stdout
    return bool(out.strip())


class ForgiveSwitch(Switch):
    """A P4Runtime switch process on this node's interfaces (abstract: see the two below)."""

    target = ""

    def __init__(
        self,
        name: str,
        grpc_port: int | None = None,
        device_id: int | None = None,
        log_dir: str = "/tmp",
        start_timeout: float = 30.0,
        tls: ServerTls | None = None,
        **params,
    ):
        """`tls`: serve P4Runtime over TLS with these files (mutual TLS with a client CA)."""
        super().__init__(name, **params)
        self.tls = tls
        self.grpc_port = grpc_port or free_port()
        self.device_id = device_id or next(_devices)
        self.log_dir = Path(log_dir)
        self.start_timeout = start_timeout
        self.process: subprocess.Popen | None = None

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def log_file(self) -> Path:
        return self.log_dir / f"{self.name}.{self.target}.log"

    def port_interfaces(self) -> dict[int, str]:
        return {self.ports[i]: i.name for i in self.intfList() if i.name != "lo"}

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def after_start(self) -> None:
        """Target set-up that needs the running process."""

    def spec(self) -> dict:
        """This switch as an entry of a fabric description's "switches"."""
        raise NotImplementedError

    def _offloads_off(self) -> None:
        """Checksum and segmentation offloads off on both ends of every link, so frames cross
        the switch as sent (a raw socket would otherwise see partial UDP checksums and
        super-frames from a host's kernel)."""
        args = " ".join(f"{o} off" for o in OFFLOADS)
        for intf in self.intfList():
            link = getattr(intf, "link", None)
            if link is None:
                continue
            for end in (link.intf1, link.intf2):
                end.node.cmd(f"ethtool -K {end.name} {args} >/dev/null 2>&1")

    def start(self, controllers) -> None:
        self._offloads_off()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout
        try:
            while not self.ready():
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"{self.name} ({self.target}) exited with status "
                        f"{self.process.returncode}; see {self.log_file}"
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} ({self.target}) did not come up in time")
                time.sleep(0.05)
            self.after_start()
        except BaseException:
            self._end_process()
            raise

    def _end_process(self) -> None:
        stop_process(self.process)
        self.process = None

    def stop(self, deleteIntfs: bool = True) -> None:
        self._end_process()
        super().stop(deleteIntfs)


UNIX_PATH_MAX = 107
"""Bytes of a Unix socket's path (sun_path less its terminating NUL) on Linux."""


class ModelSwitch(ForgiveSwitch):
    """The Python switch model, `forgive-switch`."""

    target = "model"

    def __init__(self, name: str, **params):
        super().__init__(name, **params)
        # The control socket sits beside the switch's log, unless the results folder is
        # too deep for a Unix socket's path (107 bytes): then in a short private directory.
        path = self.log_dir / f"{name}.model.sock"
        self._socket_dir: str | None = None
        if len(str(path).encode()) > UNIX_PATH_MAX:
            self._socket_dir = tempfile.mkdtemp(prefix="forgive-")
            path = Path(self._socket_dir) / f"{name}.sock"
        self.control_path = str(path)

    def stop(self, deleteIntfs: bool = True) -> None:
        super().stop(deleteIntfs)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "commands.switch", "--name", self.name]
        cmd += ["--grpc", self.grpc, "--device-id", str(self.device_id)]
        cmd += ["--control", self.control_path]
        for port, ifname in sorted(self.port_interfaces().items()):
            cmd += ["-i", f"{port}={ifname}"]
        if self.tls is not None:
            cmd += ["--tls-cert", str(self.tls.cert), "--tls-key", str(self.tls.key)]
            if self.tls.client_ca is not None:
                cmd += ["--tls-client-ca", str(self.tls.client_ca)]
        return cmd

    def ready(self) -> bool:
        try:
            control.request(self.control_path, {"cmd": "stats"}, timeout=1)
        except (OSError, ValueError):
            return False
        return _listening(self.grpc_port)

    def spec(self) -> dict:
        return {
            "target": "model",
            "grpc": self.grpc,
            "device_id": self.device_id,
            "control": self.control_path,
        }


class Bmv2Switch(ForgiveSwitch):
    """BMv2 `simple_switch_grpc` with two strict-priority queues per port."""

    target = "bmv2"
    BINARY = "simple_switch_grpc"
    QUEUE_DEPTH_PKTS = 100_000
    """BMv2's own buffer, far above any data_queue_bytes, as the PTF harness sets it."""

    def __init__(
        self, name: str, thrift_port: int | None = None, log_level: str = "warn", **params
    ):
        """`log_level` is BMv2's; per-packet levels (debug, trace) cost most of its speed."""
        super().__init__(name, **params)
        self.thrift_port = thrift_port or free_port()
        self.log_level = log_level

    @classmethod
    def missing(cls) -> str | None:
        for tool in (cls.BINARY, "simple_switch_CLI"):
            if shutil.which(tool) is None:
                return f"{tool} not installed"
        return None

    def command(self) -> list[str]:
        cmd = [self.BINARY, "--device-id", str(self.device_id), "--no-p4"]
        for port, ifname in sorted(self.port_interfaces().items()):
            cmd += ["-i", f"{port}@{ifname}"]
        cmd += ["--thrift-port", str(self.thrift_port), "--log-level", self.log_level]
        cmd += ["--log-file", str(self.log_file)]
        cmd += ["--log-flush", "--", "--grpc-server-addr", self.grpc, "--priority-queues", "2"]
        return cmd + bmv2_tls_options(self.tls)

    def ready(self) -> bool:
        return _listening(self.grpc_port) and _listening(self.thrift_port)

    def after_start(self) -> None:
        cli = shutil.which("simple_switch_CLI") or "simple_switch_CLI"
        result = subprocess.run(
            [sys.executable, cli, "--thrift-port", str(self.thrift_port)],
            input=f"set_queue_depth {self.QUEUE_DEPTH_PKTS}\n",
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if result.returncode != 0 or "Error" in result.stdout:
            raise RuntimeError(f"{self.name}: set_queue_depth failed: {result.stderr.strip()}")

    def spec(self) -> dict:
        return {
            "target": "bmv2",
            "grpc": self.grpc,
            "device_id": self.device_id,
            "thrift_port": self.thrift_port,
        }


def bmv2_tls_options(tls: ServerTls | None) -> list[str]:
    """simple_switch_grpc's own options (after its `--`) for P4Runtime over TLS, client
    authentication with a client CA."""
    if tls is None:
        return []
    options = ["--grpc-server-ssl", "--grpc-server-cert", str(tls.cert)]
    options += ["--grpc-server-key", str(tls.key)]
    if tls.client_ca is not None:
        options += ["--grpc-server-cacert", str(tls.client_ca), "--grpc-server-with-client-auth"]
    return options


def describe(net, **settings) -> dict:
    """The fabric description of a started Mininet network of ForgiveSwitches.

    `settings` adds the description's "thresholds", "queues" and "ports" keys;
    a link's "bw" parameter (Mbit/s) becomes the line rate of its switch ends.
    """
    switches = {s.name: s.spec() for s in net.switches if isinstance(s, ForgiveSwitch)}
    hosts = {h.name: {"ip": h.IP(), "mac": h.MAC()} for h in net.hosts}
    links = []
    for link in net.links:
        ends = []
        for intf in (link.intf1, link.intf2):
            node = intf.node
            ends.append(node.name if node.name in hosts else f"{node.name}:{node.ports[intf]}")
        entry = {"a": ends[0], "b": ends[1]}
        with contextlib.suppress(AttributeError, KeyError, TypeError):
            entry["rate_bps"] = int(link.intf1.params["bw"] * 1_000_000)
        links.append(entry)
    return {"switches": switches, "hosts": hosts, "links": links, **settings}
