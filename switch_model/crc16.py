"""BMv2's `crc16` hash, so the model picks the same ECMP member as BMv2 for every packet.

BMv2 computes CRC-16 with polynomial 0x8005, zero initial remainder, input and
output bit-reflected and no final XOR (the CRC-16/ARC parameters). Reflecting
both sides is the same as running the reflected polynomial 0xA001 LSB first,
which is what the table below does.
"""

from __future__ import annotations

from typing import Final


def _table() -> tuple[int, ...]:
    rows = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
        rows.append(crc)
    return tuple(rows)


_TABLE: Final = _table()


def crc16(data: bytes | bytearray | memoryview) -> int:
    crc = 0
    table = _TABLE
    for byte in data:
        crc = (crc >> 8) ^ table[(crc ^ byte) & 0xFF]
    return crc
