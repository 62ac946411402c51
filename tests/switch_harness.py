"""Real veth pairs and a real `forgive-switch` process for tests, removed whatever happens.

Each pair has a switch end (handed to the switch as a port) and a test end
that tests read and write with raw sockets. IPv6 is off on both ends so the
kernel adds no frames of its own, and offloads are off so frames cross the
veth exactly as sent.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from google.protobuf import text_format
from p4.config.v1 import p4info_pb2

from controller import DEVICE_CONFIG, P4INFO
from switch_model import control
from switch_model.dataplane import Dataplane
from switch_model.p4runtime_server import SwitchService, serve
from topologies.ports import free_port as free_tcp_port
from topologies.processes import stop_process

REPO = Path(__file__).resolve().parent.parent

ETH_P_ALL = 0x0003


def p4info_path() -> Path:
    """The compiled P4Info of forgive.p4: the model must take exactly what BMv2 takes."""
    return P4INFO


def p4info() -> p4info_pb2.P4Info:
    return text_format.Parse(p4info_path().read_text(), p4info_pb2.P4Info())


def can_use_netns() -> str | None:
    """Why namespace tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root for veths and raw sockets"
    if shutil.which("ip") is None:
        return "needs iproute2"
    return None


NETNS = [
    pytest.mark.netns,
    pytest.mark.skipif(can_use_netns() is not None, reason=str(can_use_netns())),
]
"""The marks of a test on veths and raw sockets: it runs in the namespace queue
(tests/conftest.py) and is skipped, with the reason, where they cannot be made."""


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


@dataclass
class VethPair:
    switch_end: str
    test_end: str
    sock: socket.socket | None = None

    def send(self, frame: bytes) -> None:
        self.sock.send(frame)

    def receive(self, timeout: float = 1.0, count: int | None = None) -> list[bytes]:
        """IPv4 frames arriving within `timeout` (or until `count` arrived)."""
        frames = []
        deadline = time.monotonic() + timeout
        while count is None or len(frames) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.sock.settimeout(left)
            try:
                frame = self.sock.recv(65536)
            except TimeoutError:
                break
            if frame[12:14] == b"\x08\x00":
                frames.append(frame)
        return frames

    def drain(self) -> None:
        self.receive(timeout=0.05)


@dataclass
class VethSet:
    """`n` veth pairs named fg<tag>s<i> (switch end) and fg<tag>t<i> (test end), ports 1..n."""

    n: int
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    pairs: dict[int, VethPair] = field(default_factory=dict)

    def __enter__(self) -> VethSet:
        try:
            for i in range(1, self.n + 1):
                pair = VethPair(f"fg{self.tag}s{i}", f"fg{self.tag}t{i}")
                self.pairs[i] = pair
                sh(
                    "ip",
                    "link",
                    "add",
                    pair.switch_end,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    pair.test_end,
                )
                for end in (pair.switch_end, pair.test_end):
                    with contextlib.suppress(OSError):
                        Path(f"/proc/sys/net/ipv6/conf/{end}/disable_ipv6").write_text("1")
                    sh("ip", "link", "set", end, "mtu", "9000", "up")
                    if shutil.which("ethtool"):
                        subprocess.run(
                            [
                                "ethtool",
                                "-K",
                                end,
                                "tx",
                                "off",
                                "rx",
                                "off",
                                "tso",
                                "off",
                                "gso",
                                "off",
                                "gro",
                                "off",
                            ],
                            capture_output=True,
                            check=False,
                        )
                sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
                sock.setsockopt(263, 23, 1)  # PACKET_IGNORE_OUTGOING
                sock.bind((pair.test_end, ETH_P_ALL))
                pair.sock = sock
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for pair in self.pairs.values():
            if pair.sock is not None:
                pair.sock.close()
            subprocess.run(["ip", "link", "del", pair.switch_end], capture_output=True, check=False)

    def interfaces(self) -> dict[int, str]:
        return {i: p.switch_end for i, p in self.pairs.items()}


@dataclass
class ModelProcess:
    """One `forgive-switch` process on some veth switch ends."""

    interfaces: dict[int, str]
    name: str = "s1"
    device_id: int = 1
    grpc_port: int = field(default_factory=free_tcp_port)
    workdir: Path = field(default_factory=lambda: Path("/tmp"))
    extra: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def control(self) -> str:
        return str(self.workdir / f"forgive-{self.name}-{self.grpc_port}.sock")

    @property
    def log(self) -> Path:
        return self.workdir / f"forgive-{self.name}-{self.grpc_port}.log"

    def start(self, timeout: float = 10.0) -> ModelProcess:
        args = [sys.executable, "-m", "commands.switch", "--name", self.name]
        for port, ifname in self.interfaces.items():
            args += ["-i", f"{port}={ifname}"]
        args += ["--grpc", self.grpc, "--device-id", str(self.device_id), "--control", self.control]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(args + self.extra, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"forgive-switch exited: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(OSError, ValueError):
                control.request(self.control, {"cmd": "stats"}, timeout=1)
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("forgive-switch did not come up")

    def stop(self) -> None:
        stop_process(self.proc, timeout=5)
        self.proc = None

    def __enter__(self) -> ModelProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def stats(self) -> dict:
        return control.request(self.control, {"cmd": "stats"})["stats"]

    def set_port(self, port: int, **settings) -> None:
        control.request(self.control, {"cmd": "set_port", "port": port, **settings})

    def wait_received(self, frames: int, timeout: float = 5.0) -> None:
        """Block until the switch has taken in `frames` frames (its pipeline has seen them)."""
        deadline = time.monotonic() + timeout
        while self.stats()["rx_frames"] < frames:
            if time.monotonic() > deadline:
                raise TimeoutError(f"switch took in {self.stats()['rx_frames']} of {frames}")
            time.sleep(0.02)

    def queue_rate(self, port: int, priority: int, pps: float) -> None:
        control.request(
            self.control, {"cmd": "set_queue_rate", "port": port, "priority": priority, "pps": pps}
        )


def device_config() -> bytes:
    """forgive.p4's BMv2 JSON, the device config both targets take."""
    return DEVICE_CONFIG.read_bytes()


@dataclass
class Bmv2Process:
    """BMv2 `simple_switch_grpc` on veth switch ends in this namespace, logging off."""

    interfaces: dict[int, str]
    device_id: int = 1
    grpc_port: int = field(default_factory=free_tcp_port)
    thrift_port: int = field(default_factory=free_tcp_port)
    extra: list[str] = field(default_factory=list)
    """Target options after simple_switch_grpc's `--` (its gRPC server's, TLS among them)."""
    proc: subprocess.Popen | None = None

    @staticmethod
    def missing() -> str | None:
        return None if shutil.which("simple_switch_grpc") else "simple_switch_grpc not installed"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def __enter__(self) -> Bmv2Process:
        cmd = ["simple_switch_grpc", "--device-id", str(self.device_id), "--no-p4"]
        for port, ifname in sorted(self.interfaces.items()):
            cmd += ["-i", f"{port}@{ifname}"]
        cmd += ["--thrift-port", str(self.thrift_port), "--log-level", "off"]
        cmd += ["--", "--grpc-server-addr", self.grpc, "--priority-queues", "2", *self.extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"simple_switch_grpc exited with {self.proc.returncode}")
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.grpc_port)) == 0:
                    return self
            time.sleep(0.1)
        self.__exit__()
        raise RuntimeError("simple_switch_grpc did not listen in time")

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


@contextlib.contextmanager
def model_switch(device_id: int):
    """The switch model serving P4Runtime on a free local port, with no pipeline and two
    unused ports; yields its gRPC address and stops it after."""
    address = f"127.0.0.1:{free_tcp_port()}"
    server = serve(SwitchService(device_id, Dataplane({2: "unused2", 3: "unused3"})), address)
    try:
        yield address
    finally:
        server.stop(0).wait()
