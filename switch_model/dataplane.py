"""The packet loop: raw AF_PACKET sockets on real interfaces, one thread, paced egress.

One thread owns every socket and queue, so the hot path takes no lock: epoll
wakes it for received frames or when the earliest paced port may send again,
it drains each readable socket in a bounded batch through the pipeline, then
serves every busy port in strict priority up to its line rate.
"""

from __future__ import annotations

import errno
import logging
import select
import socket
import threading
import time

from switch_model.pipeline import Pipeline
from switch_model.queues import EgressPort, PortCounters

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_IGNORE_OUTGOING = 23
RX_BATCH = 64
MAX_FRAME = 65536
IDLE_WAKE_S = 0.05
SOCKET_BUFFER = 8 << 20

log = logging.getLogger(__name__)


def open_port_socket(ifname: str) -> socket.socket:
    """A non-blocking raw socket that sees only frames arriving on `ifname`, not its own sends."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    try:
        sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
        sock.bind((ifname, ETH_P_ALL))
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class Dataplane:
    def __init__(self, interfaces: dict[int, str], counter_size: int = 512, seed=None):
        self.ports = {n: EgressPort(n, name) for n, name in interfaces.items()}
        self.counters = PortCounters(counter_size)
        self.pipeline = Pipeline(self.ports, self.counters, seed)
        self.rx_frames = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self) -> None:
        """Bind every port's socket, failing on the first interface that does not exist."""
        try:
            for port in self.ports.values():
                port.sock = open_port_socket(port.ifname)
        except OSError as err:
            self.close()
            raise OSError(f"cannot open interface {port.ifname}: {err.strerror}") from err

    def close(self) -> None:
        for port in self.ports.values():
            if port.sock is not None:
                port.sock.close()
                port.sock = None

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
        for port in self.ports.values():
            poller.register(port.sock.fileno(), select.EPOLLIN)
            by_fd[port.sock.fileno()] = port.sock
        buf = bytearray(MAX_FRAME)
        process = self.pipeline.process
        busy: set[EgressPort] = set()
        monotonic = time.monotonic
        try:
            while not self._stop.is_set():
                timeout = IDLE_WAKE_S
                if busy:
                    due = min(p.next_due() for p in busy)
                    timeout = min(IDLE_WAKE_S, max(0.0, due - monotonic()))
                for fd, _ in poller.poll(timeout):
                    recv_into = by_fd[fd].recv_into
                    for _ in range(RX_BATCH):
                        try:
                            n = recv_into(buf)
                        except BlockingIOError:
                            break
                        except OSError as err:
                            self._receive_failed(poller, fd, err)
                            break
                        port = process(buf[:n])
                        self.rx_frames += 1
                        if port is not None:
                            busy.add(port)
                if busy:
                    self._transmit(busy, monotonic())
        finally:
            poller.close()

    def _receive_failed(self, poller: select.epoll, fd: int, err: OSError) -> None:
        """A link going down is transient; an interface that is gone stops being polled
        (it would wake the loop for ever) while the other ports go on."""
        name = next(p.ifname for p in self.ports.values() if p.sock and p.sock.fileno() == fd)
        if err.errno in (errno.ENODEV, errno.ENXIO):
            log.error("interface %s is gone: no longer receiving on it", name)
            poller.unregister(fd)
        else:
            log.warning("receive on %s failed: %s", name, err)

    def _transmit(self, busy: set[EgressPort], now: float) -> None:
        counters = self.counters
        for port in list(busy):
            send = port.sock.send
            number = port.number
            while (item := port.pop_due(now)) is not None:
                frame, received = item
                # counted before it leaves, as the egress pipeline counts on BMv2
                counters.tx_packets[number] += 1
                counters.tx_bytes[number] += received
                try:
                    send(frame)
                except OSError as err:
                    log.debug("send on %s failed: %s", port.ifname, err)
                    counters.tx_packets[number] -= 1
                    counters.tx_bytes[number] -= received
                    counters.drops[number] += 1
            if not port.high and not port.low:
                busy.discard(port)

    def stats(self) -> dict:
        """Occupancy and drop reasons for the control channel; the P4 counters go over P4Runtime."""
        return {
            "rx_frames": self.rx_frames,
            "dropped": dict(self.pipeline.dropped),
            "ports": {
                str(n): {
                    "ifname": p.ifname,
                    "rate_bps": p.rate_bps,
                    "queue_pps": {"low": p.pps[0], "high": p.pps[1]},
                    "low_capacity": p.low_capacity,
                    "high_capacity": p.high_capacity,
                    "low_bytes": p.low_bytes,
                    "high_bytes": p.high_bytes,
                }
                for n, p in self.ports.items()
            },
        }
