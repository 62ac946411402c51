"""`forgive-dissect`: print the FORGIVE packets of a pcap, one line each, or as JSON lines."""

from __future__ import annotations

import argparse
import json
import sys

from scapy.layers.inet import IP
from scapy.utils import PcapReader

from host_agent.scapy_layer import FTH


def rows(path: str):
    with PcapReader(path) as reader:
        for index, pkt in enumerate(reader):
            if FTH not in pkt:
                continue
            fth = pkt[FTH]
            ip = pkt[IP]
            yield {
                "index": index,
                "time": float(pkt.time),
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("pcap", help="capture file, e.g. from tcpdump -w")
    parser.add_argument("--json", action="store_true", help="one JSON object per packet")
    args = parser.parse_args(argv)
    try:
        for row in rows(args.pcap):
            if args.json:
                print(json.dumps(row))
            else:
                print(
                    f"{row['index']:6d} {row['time']:.6f} {row['src']}->{row['dst']} "
                    f"dscp={row['dscp']} ecn={row['ecn']} {row['opcode']} flow={row['flow_id']} "
                    f"seq={row['seq']} len={row['length']} aux={row['aux']} "
                    f"flags={row['flags'] or '-'} payload={row['payload']}"
                )
    except (OSError, ValueError) as exc:
        print(f"forgive-dissect: {args.pcap}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
