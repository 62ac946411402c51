"""Next-hop MACs for the agent's destinations: static entries, a gateway, or ARP.

Behind a P4 switch every destination shares one next hop (the switch port,
`gateway`); on a plain segment each peer is resolved by ARP. DATA for a peer
still unresolved waits in a short queue instead of being lost, so the first
flow to a new peer does not start with a retransmission timeout.
"""

from __future__ import annotations

from collections.abc import Callable

from common.frames import (
    ARP_REPLY,
    ARP_REQUEST,
    BROADCAST_MAC,
    arp_frame,
    parse_arp,
)

ARP_RETRY = 0.05
"""Seconds between ARP requests for the same address."""
UNRESOLVED_QUEUE = 256
"""Packets held per unresolved destination; later ones are dropped and counted."""

Held = tuple[int, int, bytes]
"""A packet waiting for its destination's MAC: (DSCP, UDP source port, FTH bytes)."""


class Neighbors:
    def __init__(
        self,
        mac: bytes,
        ip: bytes,
        send_frame: Callable[[bytes], None],
        release: Callable[[bytes, bytes, list[Held]], None],
        static: dict[bytes, bytes],
        gateway: bytes | None,
    ) -> None:
        self.mac = mac
        self.ip = ip
        self._send_frame = send_frame
        self._release = release
        self._static = static
        self._gateway = gateway
        self._learned: dict[bytes, bytes] = {}
        self._asked: dict[bytes, float] = {}
        self._waiting: dict[bytes, list[Held]] = {}
        self.dropped = 0

    def known(self, ip: bytes) -> bytes | None:
        """The next hop for `ip` if one is configured or learned, without asking."""
        return self._static.get(ip) or self._gateway or self._learned.get(ip)

    def resolve(self, ip: bytes, now: float) -> bytes | None:
        """The next hop for `ip`, or None after asking ARP (at most every ARP_RETRY)."""
        mac = self.known(ip)
        if mac is None and now - self._asked.get(ip, -1.0) >= ARP_RETRY:
            self._asked[ip] = now
            self._send_frame(arp_frame(ARP_REQUEST, self.mac, self.ip, BROADCAST_MAC, bytes(6), ip))
        return mac

    def hold(self, ip: bytes, packet: Held) -> None:
        queue = self._waiting.setdefault(ip, [])
        if len(queue) < UNRESOLVED_QUEUE:
            queue.append(packet)
        else:
            self.dropped += 1

    def on_arp(self, frame: bytes | bytearray) -> bool:
        """Learn from an ARP frame, answer requests for our address, release waiting packets.

        False when the frame is not ARP at all.
        """
        msg = parse_arp(frame)
        if msg is None:
            return False
        if msg.op == ARP_REQUEST and msg.target_ip == self.ip:
            self._send_frame(
                arp_frame(
                    ARP_REPLY, self.mac, self.ip, msg.sender_mac, msg.sender_mac, msg.sender_ip
                )
            )
        if msg.sender_ip != bytes(4):
            self._learned[msg.sender_ip] = msg.sender_mac
            waiting = self._waiting.pop(msg.sender_ip, None)
            if waiting:
                self._release(msg.sender_ip, msg.sender_mac, waiting)
        return True
