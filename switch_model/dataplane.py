"""The packet loop: raw AF_PACKET sockets on real interfaces, one thread, paced egress.

This is the wall-clock engine around the pure pipeline and port model: one
thread owns every socket and queue, so the hot path takes no lock. epoll wakes
it for received frames or when the earliest busy port may send again; it
drains each readable socket in a bounded batch through the pipeline, then
serves every busy port for as long as its port model lets frames leave.

Time is the kernel's: each frame goes through the pipeline at the moment the
kernel received it (its receive ring holds the time, `switch_model.rxring`),
after the departures that were due by then, so a loop that the operating
system schedules late still admits, trims and marks each frame against the
queue as it stood when the frame arrived, as a simulator driving the same
classes on its virtual clock would.

Frames the kernel drops because a port's receive ring is full never reach
the pipeline; the socket counts them (PACKET_STATISTICS) and `stats` reports
them among the refused frames, as it does frames too long for a ring slot.
"""

from __future__ import annotations

import logging
import math
import os
import select
import socket
import struct
import threading
import time
from collections import Counter

from switch_model.counters import NUM_PORTS, CounterArrays
from switch_model.pipeline import Pipeline
from switch_model.port import PRIO_HIGH, PRIO_LOW, EgressPort
from switch_model.rxring import RxRing

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_STATISTICS = 6
PACKET_IGNORE_OUTGOING = 23
_TPACKET_STATS = struct.Struct("II")
"""struct tpacket_stats: packets, drops since the last read (reading resets both)."""
RX_BATCH = 64
IDLE_WAKE_S = 0.05
SOCKET_BUFFER = 8 << 20
SOCKET_DROP = "socket buffer full"
OVERSIZED = "frame longer than a ring slot"

log = logging.getLogger(__name__)


def open_port_socket(ifname: str) -> tuple[socket.socket, RxRing]:
    """A non-blocking raw socket that sees only frames arriving on `ifname`, not its own
    sends, and receives them into its ring."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    try:
        sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
        ring = RxRing(sock)
        sock.bind((ifname, ETH_P_ALL))
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock, ring


def socket_drops(sock: socket.socket) -> int:
    """Frames the kernel dropped for want of buffer on `sock` since the last call."""
    _, drops = _TPACKET_STATS.unpack(
        sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, _TPACKET_STATS.size)
    )
    return drops


class Dataplane:
    def __init__(self, interfaces: dict[int, str], counter_size: int = NUM_PORTS, seed=None):
        self.ifnames = dict(interfaces)
        self.ports = {n: EgressPort(n) for n in interfaces}
        self.sockets: dict[int, socket.socket] = {}
        self.rings: dict[int, RxRing] = {}
        self.counters = CounterArrays(counter_size)
        self.pipeline = Pipeline(self.ports, self.counters, seed)
        self.rx_frames = 0
        self.socket_drops: Counter[int] = Counter()
        """Per port, frames its socket dropped before the pipeline saw them."""
        self._stats_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self) -> None:
        """Bind every port's socket, failing on the first interface that does not exist."""
        try:
            for number, ifname in self.ifnames.items():
                self.sockets[number], self.rings[number] = open_port_socket(ifname)
        except OSError as err:
            self.close()
            raise OSError(f"cannot open interface {ifname}: {err.strerror}") from err

    def close(self) -> None:
        with self._stats_lock:
            for ring in self.rings.values():
                ring.close()
            for sock in self.sockets.values():
                sock.close()
            self.rings.clear()
            self.sockets.clear()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="dataplane", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.close()

    def set_shaping(
        self, port: int, rate_bps: int | None, low_bytes: int | None, high_bytes: int | None
    ) -> None:
        """Line rate and buffer sizes for one port (the model's stand-in for BMv2's queue CLI)."""
        egress = self.ports[port]
        if rate_bps is not None:
            egress.rate_bps = rate_bps
        if low_bytes is not None:
            egress.low_capacity = low_bytes
        if high_bytes is not None:
            egress.high_capacity = high_bytes

    def set_queue_rate(self, port: int, priority: int, pps: float) -> None:
        """Drain one priority queue at `pps` packets/s, 0 unpaced (BMv2's set_queue_rate)."""
        self.ports[port].pps[priority] = pps

    def run(self) -> None:
        poller = select.epoll()
        by_fd = {}
        for number, sock in self.sockets.items():
            poller.register(sock.fileno(), select.EPOLLIN)
            by_fd[sock.fileno()] = (number, self.rings[number].take)
        failed = select.EPOLLERR | select.EPOLLHUP
        process = self.pipeline.process
        transmit = self._transmit
        busy: set[EgressPort] = set()
        soonest = math.inf
        """The earliest departure any busy port is waiting for."""
        monotonic = time.monotonic
        wall = time.time
        try:
            while not self._stop.is_set():
                timeout = IDLE_WAKE_S
                if busy:
                    timeout = min(IDLE_WAKE_S, max(0.0, soonest - monotonic()))
                events = poller.poll(timeout)
                now = monotonic()
                skew = wall() - now
                for fd, mask in events:
                    number, take = by_fd[fd]
                    if mask & failed:
                        self._socket_error(poller, number)
                    for frame, stamp in take(RX_BATCH):
                        # The kernel's receive time, so that a frame is admitted against the
                        # queue as it stood when the frame arrived, however late this loop is.
                        arrived = min(now, stamp - skew)
                        if arrived >= soonest:
                            soonest = transmit(busy, arrived)
                        port = process(frame, arrived)
                        self.rx_frames += 1
                        if port is not None:
                            busy.add(port)
                            soonest = min(soonest, port.next_departure())
                if busy:
                    soonest = transmit(busy, monotonic())
        finally:
            poller.close()

    def _socket_error(self, poller: select.epoll, number: int) -> None:
        """A link going down is transient; an interface that is gone stops being polled
        (it would wake the loop for ever) while the other ports go on. The ring carries no
        errors: the socket holds the one pending, and reading it clears it."""
        sock = self.sockets[number]
        code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if not code:
            return
        name = self.ifnames[number]
        try:
            socket.if_nametoindex(name)
        except OSError:
            # Deleted, the kernel says only "network is down" (ENETDOWN), as for a link
            # set down: whether the interface still exists is what tells them apart.
            log.error("interface %s is gone: no longer receiving on it", name)
            poller.unregister(sock.fileno())
        else:
            log.warning("receive on %s failed: %s", name, os.strerror(code))

    def _transmit(self, busy: set[EgressPort], now: float) -> float:
        """Send what every busy port lets leave by `now`; the next departure after that."""
        egress = self.pipeline.egress
        soonest = math.inf
        for port in list(busy):
            number = port.number
            send = self.sockets[number].send
            while (item := port.dequeue(now)) is not None:
                frame, received = item
                # counted before it leaves, as the egress pipeline counts on BMv2
                egress(number, received)
                try:
                    send(frame)
                except OSError as err:
                    log.debug("send on %s failed: %s", self.ifnames[number], err)
                    self.pipeline.not_sent(number, received)
            due = port.next_departure()
            if due is None:
                busy.discard(port)
            elif due < soonest:
                soonest = due
        return soonest

    def _collect_socket_drops(self) -> None:
        with self._stats_lock:
            for number, sock in self.sockets.items():
                if sock.fileno() >= 0:
                    self.socket_drops[number] += socket_drops(sock)

    def stats(self) -> dict:
        """Occupancy and every refused frame by reason, for the control channel; the P4
        counters go over P4Runtime."""
        self._collect_socket_drops()
        dropped = dict(self.pipeline.dropped)
        lost = sum(self.socket_drops.values())
        if lost:
            dropped[SOCKET_DROP] = lost
        oversized = sum(ring.oversized for ring in self.rings.values())
        if oversized:
            dropped[OVERSIZED] = oversized
        return {
            "rx_frames": self.rx_frames,
            "dropped": dropped,
            "ports": {
                str(n): {
                    "ifname": self.ifnames[n],
                    "rate_bps": p.rate_bps,
                    "queue_pps": {"low": p.pps[PRIO_LOW], "high": p.pps[PRIO_HIGH]},
                    "low_capacity": p.low_capacity,
                    "high_capacity": p.high_capacity,
                    "low_bytes": p.low_bytes,
                    "high_bytes": p.high_bytes,
                    "socket_drops": self.socket_drops[n],
                }
                for n, p in self.ports.items()
            },
        }
