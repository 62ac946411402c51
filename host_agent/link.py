"""One raw AF_PACKET socket on the host's interface.

A classic BPF filter admits only ARP and unfragmented option-less IPv4/UDP to
port 17991, so the kernel wakes the agent for nothing else; the agent's own
transmissions are not looped back to it. Socket buffers are forced large because
one receive loop serves every flow of the host and falls behind in bursts.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import socket
import struct
from collections.abc import Iterable
from pathlib import Path

from common.wire import (
    ETH_TYPE_AT,
    ETHERTYPE_ARP,
    ETHERTYPE_IPV4,
    FORGIVE_UDP_PORT,
    IPPROTO_UDP,
    IPV4_FLAGS_FRAG_AT,
    IPV4_FRAGMENT_OFFSET,
    IPV4_PROTOCOL_AT,
    UDP_DST_PORT_AT,
)

ETH_P_ALL = 0x0003
SO_ATTACH_FILTER = 26
SO_RCVBUFFORCE = 33
SO_SNDBUFFORCE = 32
SOL_PACKET = 263
PACKET_IGNORE_OUTGOING = 23
PACKET_STATISTICS = 6
SIOCGIFADDR = 0x8915
BUFFER_BYTES = 64 << 20
RECV_BYTES = 65536

# Classic BPF opcodes (linux/filter.h): load a half-word or byte at an absolute offset,
# jump on equal or on any bit set, return (the bytes to keep, 0 to drop).
_LDH_ABS, _LDB_ABS, _JEQ_K, _JSET_K, _RET_K = 0x28, 0x30, 0x15, 0x45, 0x06
_KEEP = 0x40000

# (code, jt, jf, k): accept ARP, or IPv4 + UDP + not a fragment + dport 17991 (IHL 5 assumed,
# so the UDP port sits at wire's offset for it).
_FILTER = (
    (_LDH_ABS, 0, 0, ETH_TYPE_AT),
    (_JEQ_K, 7, 0, ETHERTYPE_ARP),  # -> accept
    (_JEQ_K, 0, 7, ETHERTYPE_IPV4),  # else -> drop
    (_LDB_ABS, 0, 0, IPV4_PROTOCOL_AT),
    (_JEQ_K, 0, 5, IPPROTO_UDP),  # else -> drop
    (_LDH_ABS, 0, 0, IPV4_FLAGS_FRAG_AT),
    (_JSET_K, 3, 0, IPV4_FRAGMENT_OFFSET),  # a later fragment -> drop
    (_LDH_ABS, 0, 0, UDP_DST_PORT_AT),
    (_JEQ_K, 0, 1, FORGIVE_UDP_PORT),
    (_RET_K, 0, 0, _KEEP),  # accept
    (_RET_K, 0, 0, 0),  # drop
)


def _attach_filter(sock: socket.socket) -> None:
    code = b"".join(struct.pack("HBBI", *insn) for insn in _FILTER)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = struct.pack("HL", len(_FILTER), ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, prog)


def interface_mtu(iface: str) -> int | None:
    try:
        return int(Path(f"/sys/class/net/{iface}/mtu").read_text())
    except (OSError, ValueError):
        return None


def interface_ipv4(iface: str) -> str | None:
    """The interface's kernel IPv4 address, or None when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", iface.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(raw[20:24])


def hold_udp_port(ip: str) -> socket.socket | None:
    """Bind the FORGIVE port in the kernel so it does not answer our traffic with ICMP errors.

    The kernel sees every frame the raw socket sees; without a bound socket it
    would send a port-unreachable for each. Nothing reads this socket: its
    small buffer fills and the kernel then discards quietly. None when the
    kernel does not own `ip` (then it never delivers our packets locally).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
        sock.bind((ip, FORGIVE_UDP_PORT))
    except OSError:
        sock.close()
        return None
    return sock


class RawLink:
    """Frames in and out of one interface; send failures are counted, never raised."""

    def __init__(self, iface: str) -> None:
        self.iface = iface
        try:
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        except PermissionError:
            raise PermissionError("raw sockets need root (CAP_NET_RAW)") from None
        try:
            _attach_filter(self.sock)
            self.sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
            self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, BUFFER_BYTES)
            self.sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, BUFFER_BYTES)
            self.sock.bind((iface, ETH_P_ALL))
        except OSError as exc:
            self.sock.close()
            if exc.errno == errno.ENODEV:
                raise OSError(f"no interface named {iface!r}") from None
            raise
        self.sock.setblocking(False)
        self.mac: bytes = self.sock.getsockname()[4]
        self.tx_errors = 0
        self._kernel_drops = 0

    def fileno(self) -> int:
        return self.sock.fileno()

    def recv_batch(self, limit: int) -> list[bytes]:
        """Up to `limit` frames already queued, without waiting."""
        out: list[bytes] = []
        recv = self.sock.recv
        try:
            while len(out) < limit:
                out.append(recv(RECV_BYTES))
        except BlockingIOError:
            pass
        return out

    def send(self, headers: bytes, body: bytes) -> None:
        self.send_frames(((headers, body),))

    def send_frames(self, frames: Iterable[tuple[bytes, ...]]) -> None:
        """Each frame (its parts joined by a scatter-gather send); failures are counted."""
        sendmsg = self.sock.sendmsg
        for parts in frames:
            try:
                sendmsg(parts)
            except OSError:
                # A full device queue loses the frame exactly as a congested link would;
                # the transport above recovers it.
                self.tx_errors += 1

    def kernel_drops(self) -> int:
        """Frames the kernel dropped because the socket's receive buffer was full.

        Each read resets the kernel's counters, so this keeps the running sum.
        """
        _, drops = struct.unpack("II", self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
        self._kernel_drops += drops
        return self._kernel_drops

    def close(self) -> None:
        self.sock.close()
