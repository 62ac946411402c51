"""Packets per second through the sans-IO core, against merely parsing the same FTH bytes.

Run: `make bench` or `.venv/bin/python benchmarks/bench_core.py [--packets N]`.
The ceiling is `struct` unpacking the identical packets in a bare loop: what this
machine's Python can do with these bytes before any protocol logic runs.
"""

from __future__ import annotations

import argparse
import json
import time

from common.wire import FTH_STRUCT, PACKET_BYTES, Flag, Fth, Opcode
from host_agent.core import DcqcnParams, ForgiveReceiver, ForgiveSender, ReceiverPolicy

TARGET_DATA_PPS = 150_000


def best_rate(fn, packets: int, repeats: int) -> float:
    """Packets per second of the fastest of `repeats` runs (fn builds fresh state each time)."""
    best = 0.0
    for _ in range(repeats):
        work = fn()
        start = time.perf_counter()
        work()
        best = max(best, packets / (time.perf_counter() - start))
    return best


def data_packets(n: int, trimmed: bool) -> list[bytes]:
    total = n * PACKET_BYTES
    flags = Flag.TRIMMED if trimmed else Flag(0)
    payload = b"" if trimmed else bytes(PACKET_BYTES)
    return [
        Fth(Opcode.DATA, flags, PACKET_BYTES, 1, i * PACKET_BYTES, total).encode(payload)
        for i in range(n)
    ]


def parse_only(packets: list[bytes]):
    unpack = FTH_STRUCT.unpack_from

    def run():
        for p in packets:
            unpack(p)

    return lambda: run


def receiver_run(packets: list[bytes], expected: int, keep_payload: bool):
    def build():
        rx = ForgiveReceiver(ReceiverPolicy(keep_payload=keep_payload, vesting=False, p_high=0.5))
        rx.begin_step(1, critical=False, expected_bytes=expected)
        rx.register_flow(1, step=1, gradient=True)
        receive = rx.receive

        def run():
            for p in packets:
                receive(p, False, 0.0)

        return run

    return build


def sender_run(n: int):
    acks = [
        Fth(
            Opcode.ACK, Flag.ELIGIBLE, PACKET_BYTES, 1, (i + 1) * PACKET_BYTES, i * PACKET_BYTES
        ).encode()
        for i in range(n)
    ]

    def build():
        tx = ForgiveSender(DcqcnParams(line_rate_bps=1e15), rto=10.0, rto_max=10.0)
        tx.open_flow(1, n * PACKET_BYTES, now=0.0)

        def run():
            now, sent, poll, receive = 0.0, 0, tx.poll, tx.receive
            while sent < n:
                now += 1e-9
                for _ in poll(now):
                    receive(acks[sent], now)
                    sent += 1

        return run

    return build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--packets", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    n = args.packets
    data, trims = data_packets(n, False), data_packets(n, True)
    ceiling = best_rate(parse_only(data), n, args.repeats)
    rows = [
        ("struct parse of FTH (ceiling)", ceiling),
        (
            "receiver DATA, payload kept",
            best_rate(receiver_run(data, n * PACKET_BYTES, True), n, args.repeats),
        ),
        (
            "receiver DATA, payload dropped",
            best_rate(receiver_run(data, n * PACKET_BYTES, False), n, args.repeats),
        ),
        (
            "receiver trimmed headers",
            best_rate(receiver_run(trims, n * PACKET_BYTES, False), n, args.repeats),
        ),
        ("sender DATA out + ACK in", best_rate(sender_run(n), n, args.repeats)),
    ]
    print(f"{'path':34} {'packets/s':>12} {'vs ceiling':>11}")
    for name, pps in rows:
        print(f"{name:34} {pps:12,.0f} {pps / ceiling:11.3f}")
    data_pps = rows[1][1]
    verdict = "meets" if data_pps >= TARGET_DATA_PPS else "misses"
    print(
        f"receiver DATA {data_pps:,.0f} pps {verdict} the {TARGET_DATA_PPS:,} pps target ({data_pps / TARGET_DATA_PPS:.2f}x)"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({name: pps for name, pps in rows}, fh, indent=2)


if __name__ == "__main__":
    main()
