"""A packet socket's receive ring (PACKET_RX_RING, TPACKET_V2).

The kernel writes each received frame and its receive time into memory shared
with the packet loop, so taking a frame costs no system call and the time
comes with it. A recvmsg per frame for the same timestamp (SO_TIMESTAMPNS)
cost the model two fifths of its forwarding rate (docs/switch_model.md).
"""

from __future__ import annotations

import mmap
import socket
import struct

from switch_model.port import JUMBO_FRAME_BYTES

SOL_PACKET = 263
PACKET_RX_RING = 5
PACKET_VERSION = 10
TPACKET_V2 = 1
TP_STATUS_KERNEL = 0
TP_STATUS_USER = 1
_TPACKET_REQ = struct.Struct("IIII")
"""struct tpacket_req: block size, block count, frame size, frame count."""
_HEADER = struct.Struct("IIIHHII")
"""struct tpacket2_hdr up to tp_nsec: status, len, snaplen, mac, net, sec, nsec."""
_STATUS = struct.Struct("I")
FRAME_OFFSET = 66
"""Where the kernel puts an Ethernet frame in its slot: the 32-byte tpacket2_hdr and the
20-byte sockaddr_ll, then the network header 16-byte aligned (80) less 14 bytes of MAC."""
SLOT_BYTES = -(-(FRAME_OFFSET + JUMBO_FRAME_BYTES) // 16) * 16
BLOCK_BYTES = 1 << 16
SLOTS_PER_BLOCK = BLOCK_BYTES // SLOT_BYTES
BLOCKS = 64
SLOTS = SLOTS_PER_BLOCK * BLOCKS
"""448 jumbo frames, 4 MiB of kernel memory per port."""


class RxRing:
    """Frames in the order the kernel received them, each handed back to it once taken."""

    def __init__(self, sock: socket.socket) -> None:
        """Set up on `sock` before it is bound, so that no frame goes to its ordinary queue."""
        sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V2)
        sock.setsockopt(
            SOL_PACKET,
            PACKET_RX_RING,
            _TPACKET_REQ.pack(BLOCK_BYTES, BLOCKS, SLOT_BYTES, SLOTS),
        )
        self._map = mmap.mmap(sock.fileno(), BLOCK_BYTES * BLOCKS)
        self._view = memoryview(self._map)
        self._slot = 0
        self._offsets = [
            (i // SLOTS_PER_BLOCK) * BLOCK_BYTES + (i % SLOTS_PER_BLOCK) * SLOT_BYTES
            for i in range(SLOTS)
        ]
        self.oversized = 0
        """Frames longer than a slot holds: the kernel kept only their start; dropped."""

    def take(self, limit: int) -> list[tuple[bytearray, float]]:
        """Up to `limit` frames with their receive time (wall clock, seconds)."""
        out = []
        mem, view, slot, offsets = self._map, self._view, self._slot, self._offsets
        unpack, release = _HEADER.unpack_from, _STATUS.pack_into
        for _ in range(limit):
            at = offsets[slot]
            status, length, snaplen, mac, _, sec, nsec = unpack(mem, at)
            if not status & TP_STATUS_USER:
                break
            if snaplen < length:
                self.oversized += 1
            else:
                out.append((bytearray(view[at + mac : at + mac + snaplen]), sec + nsec * 1e-9))
            release(mem, at, TP_STATUS_KERNEL)
            slot = slot + 1 if slot + 1 < SLOTS else 0
        self._slot = slot
        return out

    def close(self) -> None:
        self._view.release()
        self._map.close()
