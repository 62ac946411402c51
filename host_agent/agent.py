"""The raw-socket driver of a host: one event loop between an AF_PACKET socket and a `Host`.

Everything the host does is in the sans-IO `host_agent.host.Host` (and the
endpoint and core below it); this loop only moves frames and time. It feeds
every arriving frame to the host, sends the frames the host returns, hands
the host's events to the applications (the local API server, a training
rank), and sleeps in `select` until the earliest timer of the host or an
application, or the next frame. `select` is used rather than epoll because
its timeout has microsecond resolution; epoll's is a millisecond, too coarse
to pace packets on a path whose round trip is itself well under a millisecond.
"""

from __future__ import annotations

import contextlib
import ctypes
import select
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from common import records
from common.wire import FTH_LEN, IPV4_LEN, PACKET_BYTES, UDP_LEN
from host_agent.host import Application, Host, HostConfig
from host_agent.link import RawLink, hold_udp_port, interface_ipv4, interface_mtu
from host_agent.stats import StatsLog

RECV_BATCH = 32
MAX_BATCHES = 64
"""Batches of RECV_BATCH frames per wake-up, so a flood cannot starve the sender for long."""
IDLE_WAIT = 0.5
"""Longest sleep with nothing scheduled; bounds how late `run`'s `until` is noticed."""
SPIN_BELOW = 30e-6
"""Deadlines closer than this are polled for, not slept on: a sleep and wake-up costs more."""
BUSY_CHECK = 20e-6
"""While packets are overdue, sockets are looked at this often rather than every iteration."""
MIN_MTU = IPV4_LEN + UDP_LEN + FTH_LEN + PACKET_BYTES
"""IPv4 bytes of a full DATA packet (4140): the smallest MTU that carries one unfragmented."""
PR_SET_TIMERSLACK = 29


@dataclass
class AgentConfig:
    iface: str
    host: HostConfig = field(default_factory=HostConfig)
    stats_path: str | None = None
    """JSON-lines statistics file; '-' is stdout, None writes none."""

    def validate(self) -> None:
        self.host.validate()


class HostAgent:
    """One emulated host's agent on a real interface; see the module docstring."""

    def __init__(self, config: AgentConfig) -> None:
        config.validate()
        self.config = config
        ip = config.host.ip or interface_ipv4(config.iface)
        if ip is None:
            raise ValueError(f"interface {config.iface!r} has no IPv4 address; pass one")
        mtu = interface_mtu(config.iface)
        if mtu is not None and mtu < MIN_MTU:
            raise ValueError(
                f"interface {config.iface!r} has MTU {mtu}; full DATA packets need {MIN_MTU} (use 9000)"
            )
        self.link = RawLink(config.iface)
        self._port_holder = hold_udp_port(ip)
        self._stats_file = _open_stats(config.stats_path)
        log = StatsLog(self._stats_file, ip, offset=time.time() - time.monotonic())
        self.host = Host(config.host, self.link.mac, ip, log)
        self.endpoint = self.host.endpoint
        self.apps: list[Application] = []
        self._readers: dict[int, Callable[[], None]] = {self.link.fileno(): self._on_frames}
        self._fds = list(self._readers)
        self._writers: dict[int, Callable[[], None]] = {}

    @staticmethod
    def now() -> float:
        """The clock every call into the host uses."""
        return time.monotonic()

    def add_reader(self, fd: int, fn: Callable[[], None]) -> None:
        self._readers[fd] = fn
        self._fds = list(self._readers)

    def remove_reader(self, fd: int) -> None:
        self._readers.pop(fd, None)
        self._fds = list(self._readers)

    def add_writer(self, fd: int, fn: Callable[[], None]) -> None:
        """Call `fn` whenever `fd` can take more bytes, until `remove_writer`."""
        self._writers[fd] = fn

    def remove_writer(self, fd: int) -> None:
        self._writers.pop(fd, None)

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Serve frames, timers and readers until `until()` turns true (forever without it)."""
        _tighten_timer_slack()
        host = self.host
        apps = self.apps
        checked = 0.0
        while not (until and until()):
            now = time.monotonic()
            host.handle_timer(now)
            for app in apps:
                due = app.get_timer()
                if due is not None and due <= now:
                    app.handle_timer(now)
            self._flush(now)
            now = time.monotonic()
            timeout = self._timeout(now)
            if timeout < SPIN_BELOW:
                if timeout == 0.0 and now - checked < BUSY_CHECK:
                    continue  # more is due already: keep sending, look at sockets shortly
                timeout = 0.0
            checked = now
            ready, writable, _ = select.select(self._fds, list(self._writers), [], timeout)
            for fd in ready:
                reader = self._readers.get(fd)
                if reader is not None:
                    reader()
            for fd in writable:
                writer = self._writers.get(fd)
                if writer is not None:
                    writer()

    def _flush(self, now: float) -> None:
        """Send what the host has due and hand its events to the applications (Host.pump)."""
        self.host.pump(self.apps, now, self.link.send_frames)

    def _timeout(self, now: float) -> float:
        due = self.host.wakeup(self.apps)
        deadline = now + IDLE_WAIT
        if due is not None and due < deadline:
            deadline = due
        return max(deadline - now, 0.0)

    def _on_frames(self) -> None:
        """Drain the socket before the sender runs again, batch by batch
        (Host.receive_frames: the replies go out, the sender waits for the next pump)."""
        receive = self.host.receive_frames
        recv_batch = self.link.recv_batch
        send = self.link.send_frames
        clock = time.monotonic
        apps = self.apps
        for _ in range(MAX_BATCHES):
            frames = recv_batch(RECV_BATCH)
            receive(frames, clock, apps, send)
            if len(frames) < RECV_BATCH:
                break

    def summary(self) -> dict:
        """Everything the agent counted: the host's summary plus the link's own counters."""
        return {
            **self.endpoint.summary(),
            "link_tx_errors": self.link.tx_errors,
            "unresolved_drops": self.host.neighbors.dropped,
            "socket_drops": self.link.kernel_drops(),
        }

    def close(self) -> None:
        """Write the run's summary record, then close the sockets and the statistics file."""
        self.endpoint.log.write(records.AGENT, time.monotonic(), **self.summary())
        if self._stats_file is not None and self._stats_file is not sys.stdout:
            self._stats_file.close()
        self.link.close()
        if self._port_holder is not None:
            self._port_holder.close()


def _open_stats(path: str | None) -> IO[str] | None:
    if path is None:
        return None
    if path == "-":
        return sys.stdout
    return open(path, "a", buffering=1, encoding="utf-8")


def _tighten_timer_slack() -> None:
    """Ask the kernel to wake us within a microsecond of a timeout, not its default 50 us.

    Pacing a 4 KiB packet at 1 Gbit/s leaves 33 us between packets, so the
    default slack alone would halve the rate. Best effort: without prctl
    (another OS) the loop still works, only with coarser pacing.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)
