"""A test fixture, not a product: forwards frames between veths and damages FORGIVE DATA on a schedule.

Run inside a hub namespace with one `IFACE=IP=MAC` per attached host. Every
IPv4 frame goes out of the port whose host owns the destination address. Of
the untrimmed DATA frames it forwards, counted from one, every `--drop-every`th
is dropped whole (the sender must time out), every `--trim-every`th is cut to
its 58-byte header with TRIMMED set as a switch would (the receiver must ask
for it again or forgive it), and every `--ce-every`th is marked CE. Counters go
to `--stats` as one JSON object on exit.
"""

from __future__ import annotations

import argparse
import json
import select
import signal
import socket
import sys

from common.frames import HEADERS_LEN, ip_bytes, mac_bytes, set_ipv4_checksum
from common.wire import FORGIVE_UDP_PORT, FTH_LEN, Flag, Opcode
from host_agent.link import ETH_P_ALL, PACKET_IGNORE_OUTGOING, SOL_PACKET

TRIMMED_TOTAL = 20 + 8 + FTH_LEN


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("ports", nargs="+", metavar="IFACE=IP=MAC")
    parser.add_argument("--drop-every", type=int, default=0)
    parser.add_argument("--trim-every", type=int, default=0)
    parser.add_argument("--ce-every", type=int, default=0)
    parser.add_argument("--stats", required=True)
    args = parser.parse_args(argv)
    routes: dict[bytes, tuple[socket.socket, bytes, bytes]] = {}
    socks = []
    for spec in args.ports:
        iface, ip, mac = spec.split("=")
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        sock.bind((iface, ETH_P_ALL))
        routes[ip_bytes(ip)] = (sock, sock.getsockname()[4], mac_bytes(mac))
        socks.append(sock)
    counts = dict.fromkeys(("forwarded", "data", "dropped", "trimmed", "ce", "unroutable"), 0)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            ready, _, _ = select.select(socks, [], [])
            for sock in ready:
                frame = bytearray(sock.recv(65536))
                if len(frame) < HEADERS_LEN or frame[12:14] != b"\x08\x00":
                    continue
                route = routes.get(bytes(frame[30:34]))
                if route is None:
                    counts["unroutable"] += 1
                    continue
                out, src_mac, dst_mac = route
                is_data = (
                    frame[23] == 17
                    and int.from_bytes(frame[36:38], "big") == FORGIVE_UDP_PORT
                    and len(frame) >= HEADERS_LEN + FTH_LEN
                    and frame[HEADERS_LEN] & 0x0F == Opcode.DATA
                    and not frame[HEADERS_LEN + 1] & Flag.TRIMMED
                )
                if is_data:
                    counts["data"] += 1
                    n = counts["data"]
                    if args.drop_every and n % args.drop_every == 0:
                        counts["dropped"] += 1
                        continue
                    if args.trim_every and n % args.trim_every == 0:
                        counts["trimmed"] += 1
                        del frame[HEADERS_LEN + FTH_LEN :]
                        frame[16:18] = TRIMMED_TOTAL.to_bytes(2, "big")
                        frame[38:40] = (8 + FTH_LEN).to_bytes(2, "big")
                        frame[HEADERS_LEN + 1] |= Flag.TRIMMED
                        set_ipv4_checksum(frame)
                    elif args.ce_every and n % args.ce_every == 0 and frame[15] & 3:
                        counts["ce"] += 1
                        frame[15] |= 3
                        set_ipv4_checksum(frame)
                frame[0:6] = dst_mac
                frame[6:12] = src_mac
                out.send(frame)
                counts["forwarded"] += 1
    finally:
        with open(args.stats, "w", encoding="utf-8") as f:
            json.dump(counts, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
