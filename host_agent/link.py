"""Raw AF_PACKET sockets on the host's interface: one to receive, one to send through a ring.

A classic BPF filter admits only ARP and unfragmented option-less IPv4/UDP to
port 17991, so the kernel wakes the agent for nothing else; the agent's own
transmissions are not looped back to it. Socket buffers are forced large because
one receive loop serves every flow of the host and falls behind in bursts.

Frames go out through a memory-mapped transmit ring (PACKET_TX_RING,
TPACKET_V2): the loop writes a batch of frames into the ring's slots and one
`send` hands them all to the kernel, instead of one system call per frame.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import socket
import struct
from collections.abc import Iterable
from pathlib import Path

from host_agent.wire import FORGIVE_UDP_PORT

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
PACKET_VERSION = 10
PACKET_TX_RING = 13
PACKET_LOSS = 14
TPACKET_V2 = 1
TX_SLOT = 8192
"""Bytes per transmit slot: the TPACKET_V2 header (32) and one frame (a full DATA frame is 4154)."""
TX_SLOTS = 512
TX_DATA_AT = 32
"""Where a frame starts in its slot: TPACKET_ALIGN(sizeof(struct tpacket2_hdr))."""
TP_STATUS_AVAILABLE = 0
TP_STATUS_SEND_REQUEST = 1
TP_STATUS_WRONG_FORMAT = 4
_U32 = struct.Struct("I")
_SLOT_HEADER = struct.Struct("III")
"""tp_status, tp_len, tp_snaplen: the start of struct tpacket2_hdr."""

# (code, jt, jf, k): accept ARP, or IPv4 + UDP + not a fragment + dport 17991 (IHL 5 assumed).
_FILTER = (
    (0x28, 0, 0, 12),  # ldh [12]            ethertype
    (0x15, 7, 0, 0x0806),  # jeq ARP         -> accept
    (0x15, 0, 7, 0x0800),  # jeq IPv4, else  -> drop
    (0x30, 0, 0, 23),  # ldb [23]            protocol
    (0x15, 0, 5, 17),  # jeq UDP, else       -> drop
    (0x28, 0, 0, 20),  # ldh [20]            flags + fragment offset
    (0x45, 3, 0, 0x1FFF),  # jset offset     -> drop
    (0x28, 0, 0, 36),  # ldh [36]            UDP destination port
    (0x15, 0, 1, FORGIVE_UDP_PORT),
    (0x06, 0, 0, 0x40000),  # accept
    (0x06, 0, 0, 0),  # drop
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


class TxRing:
    """A PACKET_TX_RING on its own socket: frames are copied into slots, one `send` sends them.

    A slot is free again once the kernel has sent its frame; one still busy when
    the ring comes round to it is flushed first, and a frame that still finds no
    slot is counted as lost, as a full device queue would lose it.
    """

    def __init__(self, iface: str) -> None:
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        try:
            self.sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V2)
            self.sock.setsockopt(SOL_PACKET, PACKET_LOSS, 1)  # skip a bad frame, send the rest
            req = struct.pack("IIII", TX_SLOT * 16, TX_SLOTS // 16, TX_SLOT, TX_SLOTS)
            self.sock.setsockopt(SOL_PACKET, PACKET_TX_RING, req)
            self.sock.bind((iface, 0))
            self.ring = mmap.mmap(self.sock.fileno(), TX_SLOT * TX_SLOTS)
        except OSError:
            self.sock.close()
            raise
        self._next = 0
        self.lost = 0

    def send(self, frames: Iterable[tuple[bytes, ...]]) -> None:
        ring = self.ring
        status, header = _U32.unpack_from, _SLOT_HEADER.pack_into
        i = self._next
        pending = 0
        for parts in frames:
            off = i * TX_SLOT
            if status(ring, off)[0] != TP_STATUS_AVAILABLE:
                if pending:
                    self.flush()
                    pending = 0
                if status(ring, off)[0] != TP_STATUS_AVAILABLE:
                    self.lost += 1
                    continue
            at = start = off + TX_DATA_AT
            limit = off + TX_SLOT
            for part in parts:
                end = at + len(part)
                if end > limit:
                    break  # no frame the host builds is this long
                ring[at:end] = part
                at = end
            else:
                # The kernel reads a slot only inside `send`, so the order of these
                # stores does not matter.
                header(ring, off, TP_STATUS_SEND_REQUEST, at - start, at - start)
                pending += 1
                i = (i + 1) % TX_SLOTS
                continue
            self.lost += 1
        self._next = i
        if pending:
            self.flush()

    def flush(self) -> None:
        try:
            self.sock.send(b"", socket.MSG_DONTWAIT)
        except BlockingIOError:
            pass  # the kernel has the frames and sends them as the device takes them
        except OSError:
            self.lost += 1

    def close(self) -> None:
        self.ring.close()
        self.sock.close()


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
        try:
            self.tx = TxRing(iface)
        except OSError:
            self.sock.close()
            raise
        self._tx_errors = 0
        self._kernel_drops = 0

    @property
    def tx_errors(self) -> int:
        """Frames lost on the way out: a full ring or a failed send."""
        return self._tx_errors + self.tx.lost

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
        """One frame at once, with a system call of its own (tools and benchmarks)."""
        try:
            self.sock.sendmsg((headers, body))
        except OSError:
            # A full device queue loses the frame exactly as a congested link would;
            # the transport above recovers it.
            self._tx_errors += 1

    def send_frames(self, frames: Iterable[tuple[bytes, ...]]) -> None:
        """Every frame through the transmit ring, with one system call for the batch."""
        self.tx.send(frames)

    def kernel_drops(self) -> int:
        """Frames the kernel dropped because the socket's receive buffer was full.

        Each read resets the kernel's counters, so this keeps the running sum.
        """
        _, drops = struct.unpack("II", self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
        self._kernel_drops += drops
        return self._kernel_drops

    def close(self) -> None:
        self.tx.close()
        self.sock.close()
