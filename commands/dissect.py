"""`forgive-dissect`: print the FORGIVE packets of a pcap, one line each, or as JSON lines.

The capture's records are read here rather than by scapy's reader, which answers a file
that is not a capture with a traceback and one cut inside a record with silence: a file
that is not a pcap is refused in one line, a capture that ends inside a record says where
after printing the packets before it, and packets cut short by the capture's snap length
are counted, not passed over (exit 2 when any is too short to show its FORGIVE header).
pcapng files (tcpdump writes pcap) are handed to scapy's own reader.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from scapy.config import conf
from scapy.error import Scapy_Exception
from scapy.layers.inet import IP
from scapy.utils import PcapNgReader

from common.wire import TRIMMED_FRAME_LEN
from host_agent.scapy_layer import FTH

PCAP_MAGICS = {
    b"\xd4\xc3\xb2\xa1": ("<", 1e-6),
    b"\xa1\xb2\xc3\xd4": (">", 1e-6),
    b"\x4d\x3c\xb2\xa1": ("<", 1e-9),
    b"\xa1\xb2\x3c\x4d": (">", 1e-9),
}
"""The classic pcap magic numbers: byte order and the unit of the sub-second field."""
PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"
FILE_HEADER = 24
RECORD_HEADER = 16
MAX_RECORD = 256 * 1024
"""No capture tool writes a record longer than this (tcpdump's largest snap length)."""


class CaptureError(ValueError):
    """A file that is not a capture, or one that ends inside a record; the message says where."""


@dataclass
class Cuts:
    """Packets that the capture's snap length cut short, and of those how many lost part of
    the headers a FORGIVE packet starts with (so whether they were FORGIVE is unknown)."""

    packets: int = 0
    headerless: int = 0
    snaplen: int = 0


def _records(f: BinaryIO, path: str, cuts: Cuts) -> Iterator[tuple[float, object]]:
    head = f.read(FILE_HEADER)
    if not head:
        raise CaptureError(f"{path}: empty, not a capture")
    if head[:4] == PCAPNG_MAGIC:
        yield from _pcapng(path, cuts)
        return
    if head[:4] not in PCAP_MAGICS:
        raise CaptureError(f"{path}: not a pcap capture (starts {head[:4].hex()})")
    if len(head) < FILE_HEADER:
        raise CaptureError(f"{path}: {len(head)} bytes, shorter than a pcap file header")
    endian, unit = PCAP_MAGICS[head[:4]]
    cuts.snaplen, linktype = struct.unpack(endian + "II", head[16:24])
    decode = conf.l2types.get(linktype & 0xFFFF, conf.raw_layer)
    offset, index = FILE_HEADER, 0
    while header := f.read(RECORD_HEADER):
        if len(header) < RECORD_HEADER:
            raise CaptureError(f"{path}: ends inside the header of record {index} (byte {offset})")
        sec, frac, caplen, wirelen = struct.unpack(endian + "IIII", header)
        if caplen > MAX_RECORD:
            raise CaptureError(
                f"{path}: record {index} (byte {offset}) claims {caplen} bytes: not a capture"
            )
        data = f.read(caplen)
        if len(data) < caplen:
            raise CaptureError(
                f"{path}: ends inside record {index} (byte {offset}: {len(data)} of its "
                f"{caplen} bytes)"
            )
        if caplen < wirelen:
            cuts.packets += 1
            cuts.headerless += caplen < TRIMMED_FRAME_LEN
        yield sec + frac * unit, decode(data)
        offset += RECORD_HEADER + caplen
        index += 1


def _pcapng(path: str, cuts: Cuts) -> Iterator[tuple[float, object]]:
    with PcapNgReader(path) as reader:
        for pkt in reader:
            wirelen = getattr(pkt, "wirelen", None) or len(pkt)
            if len(pkt) < wirelen:
                cuts.packets += 1
                cuts.headerless += len(pkt) < TRIMMED_FRAME_LEN
            yield float(pkt.time), pkt


def rows(path: str, cuts: Cuts | None = None) -> Iterator[dict]:
    cuts = cuts if cuts is not None else Cuts()
    with open(path, "rb") as f:
        for index, (time, pkt) in enumerate(_records(f, path, cuts)):
            if FTH not in pkt:
                continue
            fth = pkt[FTH]
            ip = pkt[IP]
            yield {
                "index": index,
                "time": time,
                "src": ip.src,
                "dst": ip.dst,
                "dscp": ip.tos >> 2,
                "ecn": ip.tos & 3,
                "opcode": fth.sprintf("%opcode%"),
                "flags": str(fth.flags),
                "flow_id": fth.flow_id,
                "seq": fth.seq,
                "length": fth.length,
                "aux": fth.aux,
                "payload": len(fth.payload),
            }


def _cut_note(path: str, cuts: Cuts) -> str:
    snap = f" of {cuts.snaplen} bytes" if cuts.snaplen else ""
    if cuts.headerless:
        return (
            f"forgive-dissect: {path}: {cuts.headerless} packets cut by the capture's snap "
            f"length{snap} before the end of a FORGIVE header ({TRIMMED_FRAME_LEN} bytes), so "
            f"not shown ({cuts.packets} cut in all); capture with tcpdump -s 0"
        )
    return (
        f"forgive-dissect: {path}: {cuts.packets} packets cut by the capture's snap "
        f"length{snap}: their payload counts only the bytes captured"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pcap", help="capture file, e.g. from tcpdump -w")
    parser.add_argument("--json", action="store_true", help="one JSON object per packet")
    args = parser.parse_args(argv)
    cuts = Cuts()
    try:
        for row in rows(args.pcap, cuts):
            if args.json:
                print(json.dumps(row))
            else:
                print(
                    f"{row['index']:6d} {row['time']:.6f} {row['src']}->{row['dst']} "
                    f"dscp={row['dscp']} ecn={row['ecn']} {row['opcode']} flow={row['flow_id']} "
                    f"seq={row['seq']} len={row['length']} aux={row['aux']} "
                    f"flags={row['flags'] or '-'} payload={row['payload']}"
                )
    except CaptureError as exc:
        print(f"forgive-dissect: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"forgive-dissect: {args.pcap}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except Scapy_Exception as exc:  # a pcapng file scapy cannot read
        print(
            f"forgive-dissect: {args.pcap}: not a readable pcapng capture ({exc})", file=sys.stderr
        )
        return 2
    if cuts.packets:
        print(_cut_note(args.pcap, cuts), file=sys.stderr)
        return 2 if cuts.headerless else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
