"""Packet builders and decoders shared by the core tests."""

from __future__ import annotations

from common.wire import Flag, Fth, Opcode, decode


def data(
    flow: int, seq: int, length: int, total: int, *, trimmed: bool = False, fill: int = 0xAB
) -> bytes:
    flags = Flag.TRIMMED if trimmed else Flag(0)
    payload = b"" if trimmed else bytes([fill]) * length
    return Fth(Opcode.DATA, flags, length, flow, seq, total).encode(payload)


def trim(flow: int, seq: int, length: int, total: int) -> bytes:
    return data(flow, seq, length, total, trimmed=True)


def ack(flow: int, rcv_nxt: int, lo: int, length: int, flags: int = 0) -> bytes:
    return Fth(Opcode.ACK, flags, length, flow, rcv_nxt, lo).encode()


def nack(flow: int, lo: int, length: int, rcv_nxt: int, flags: int = 0) -> bytes:
    return Fth(Opcode.NACK, flags, length, flow, lo, rcv_nxt).encode()


def cnp(flow: int) -> bytes:
    return Fth(Opcode.CNP, Flag(0), 0, flow, 0, 0).encode()


def parse(replies: list[bytes]) -> list[Fth]:
    return [decode(r)[0] for r in replies]


def only(replies: list[bytes]) -> Fth:
    (one,) = parse(replies)
    return one
