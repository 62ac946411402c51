"""The simulator's captures (`forgive run --engine sim --pcap LINKS`): the frames it moves over a
link, written as pcapng that Wireshark, tshark, scapy and forgive-dissect read.

The frames are the real bytes the hosts and switch pipelines made, so a capture is what a tap on
that link would have seen, both directions in one file. Each frame is stamped when its first
bit goes onto the link, in fabric time: the run's virtual clock divided by its time scale, the
clock the table's `fabric ms` figures are on (the emulation's captures keep the wall clock their
interfaces saw). Each file states in its own header what it is: the link, the time base, the
snap length and the frame cap; frames past the cap are counted, not written.

The engine calls a recorder only on the links named (`VirtualFabric`'s `captures`): a run
without `--pcap` pays one test of a local against None per frame and link.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

LINKTYPE_ETHERNET = 1
_SHB, _IDB, _EPB = 0x0A0D0D0A, 0x00000001, 0x00000006
_BYTE_ORDER_MAGIC = 0x1A2B3C4D
_OPT_END, _OPT_COMMENT = 0, 1
_SHB_USERAPPL = 4
_IF_NAME, _IF_DESCRIPTION, _IF_TSRESOL = 2, 3, 9
_EPB_FLAGS = 2
_INBOUND, _OUTBOUND = 1, 2
"""epb_flags' direction bits, relative to the interface: the link's first end."""
NANOSECONDS = 9
"""if_tsresol: timestamps in units of 10^-9 s."""


def _option(code: int, value: bytes) -> bytes:
    return struct.pack("<HH", code, len(value)) + value + bytes(-len(value) % 4)


def _block(kind: int, body: bytes) -> bytes:
    total = 12 + len(body)
    return struct.pack("<II", kind, total) + body + struct.pack("<I", total)


class Capture:
    """One link's pcapng file: a section header, one Ethernet interface (the link's first
    end, `a`), then every frame either way, cut to `snaplen` bytes, up to `max_frames`."""

    def __init__(
        self,
        path: Path,
        link: str,
        a: str,
        b: str,
        *,
        time_scale: float,
        snaplen: int,
        max_frames: int,
    ) -> None:
        self.path = path
        self.link = link
        self.a = a
        self.snaplen = snaplen
        self.max_frames = max_frames
        self.frames = 0
        """Frames written."""
        self.over_cap = 0
        """Frames the link carried after the cap was reached, not written."""
        self._per_second = 10**NANOSECONDS / time_scale
        """From the run's virtual seconds to fabric nanoseconds."""
        self._waiting: deque[tuple[float, bytes]] = deque()
        """A host's frames handed to its NIC ahead of their time on the wire (`recorder`)."""
        self._file: BinaryIO = open(path, "wb")  # noqa: SIM115 (closed by `close`)
        self._write = self._file.write
        about = (
            f"forgive simulator: link {link} ({a} <-> {b}), both directions; timestamps in "
            f"fabric time (the virtual clock / time scale {time_scale:g}); frames cut to "
            f"{snaplen} bytes; at most {max_frames} frames"
        )
        self._file.write(
            _block(
                _SHB,
                struct.pack("<IHHq", _BYTE_ORDER_MAGIC, 1, 0, -1)
                + _option(_SHB_USERAPPL, b"forgive simulator")
                + _option(_OPT_COMMENT, about.encode())
                + _option(_OPT_END, b""),
            )
        )
        self._file.write(
            _block(
                _IDB,
                struct.pack("<HHI", LINKTYPE_ETHERNET, 0, snaplen)
                + _option(_IF_NAME, f"{a}-{b}".encode())
                + _option(_IF_DESCRIPTION, f"{a}'s end of the link {a} <-> {b}".encode())
                + _option(_IF_TSRESOL, bytes([NANOSECONDS]))
                + _option(_OPT_END, b""),
            )
        )

    def recorder(self, sender: str, ahead: bool = False) -> Callable[[float, bytearray], None]:
        """The callback for frames `sender` puts on this link: (time its first bit goes out,
        frame). `ahead`: a host's NIC, which is handed frames before their time on the wire
        comes (it serialises them back to back), so they wait here until the other way's
        next frame, or the end, and the file stays in time order."""
        direction = _OUTBOUND if sender == self.a else _INBOUND
        options = _option(_EPB_FLAGS, struct.pack("<I", direction)) + _option(_OPT_END, b"")
        snaplen = self.snaplen
        per_second = self._per_second
        waiting = self._waiting

        def frame(at: float, data: bytearray) -> None:
            if self.frames >= self.max_frames:
                self.over_cap += 1
                return
            self.frames += 1
            kept = bytes(data[:snaplen])
            ns = round(at * per_second)
            body = (
                struct.pack("<IIIII", 0, ns >> 32, ns & 0xFFFFFFFF, len(kept), len(data))
                + kept
                + bytes(-len(kept) % 4)
                + options
            )
            block = _block(_EPB, body)
            if ahead:
                waiting.append((at, block))
                return
            while waiting and waiting[0][0] <= at:
                self._write(waiting.popleft()[1])
            self._write(block)

        return frame

    def close(self) -> None:
        while self._waiting:
            self._write(self._waiting.popleft()[1])
        self._file.close()

    def summary(self) -> dict:
        """What the run says of this capture when it ends (EngineResult.captures)."""
        return {
            "link": self.link,
            "path": str(self.path),
            "frames": self.frames,
            "over_cap": self.over_cap,
        }
