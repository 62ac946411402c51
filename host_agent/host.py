"""One emulated host, sans-IO: the endpoint inside its Ethernet, IPv4 and UDP framing.

`Host` takes whole Ethernet frames in (`receive_frame`) and gives whole
frames out (`frames_to_send`, each as the scatter-gather parts of one frame),
so every engine that moves frames can drive it: the raw-socket agent, an
in-memory fabric in virtual time, a test. It adds what the endpoint leaves to
the link: next hops (static, a gateway or ARP, `host_agent.neighbors`), the
DSCP and ECN bits per traffic class, and the UDP source port as path entropy.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from common.frames import (
    UDP_LEN,
    UDP_STRUCT,
    FrameBuilder,
    MalformedFrame,
    ip_bytes,
    mac_bytes,
    parse,
)
from common.wire import ECN_ECT0, ECN_NOT_ECT, FORGIVE_UDP_PORT, Dscp
from host_agent.endpoint import Endpoint, EndpointConfig
from host_agent.events import Event
from host_agent.neighbors import Held, Neighbors
from host_agent.stats import StatsLog

Frame = tuple[bytes, ...]
"""One frame as the parts a scatter-gather send joins (headers, then the FTH packet)."""

SPORT_BASE: Final = 0xC000
"""UDP source ports of DATA start here; ACK, NACK and CNP use it as it is."""
_CONTROL: Final = int(Dscp.CONTROL)
PREFIX_CACHE: Final = 4096
"""Header prefixes kept; a flow's last, shorter packet adds one, so the cache is bounded."""
MALFORMED_NOTICES: Final = 10
"""Malformed frames described on the warning channel; later ones are only counted."""


class Application(Protocol):
    """What a driver runs beside the host: it hears every event and may keep one timer."""

    def handle_event(self, event: Event, now: float) -> None: ...

    def get_timer(self) -> float | None: ...

    def handle_timer(self, now: float) -> None: ...


@dataclass
class HostConfig:
    ip: str | None = None
    """This host's IPv4 address; None lets the driver take the interface's."""
    endpoint: EndpointConfig = field(default_factory=EndpointConfig)
    spray: bool = True
    """Per-packet UDP source ports (path entropy); False keeps one per flow."""
    neighbors: dict[str, str] = field(default_factory=dict)
    """Static IPv4 -> MAC entries; others resolve through ARP unless a gateway is set."""
    gateway_mac: str | None = None
    """Next hop for every destination without a static entry (a switch port)."""

    def validate(self) -> None:
        """Raise ValueError on the first bad setting, before any socket is opened."""
        if self.ip is not None:
            ip_bytes(self.ip)
        for ip, mac in self.neighbors.items():
            ip_bytes(ip)
            mac_bytes(mac)
        if self.gateway_mac is not None:
            mac_bytes(self.gateway_mac)
        self.endpoint.validate()


class Host:
    def __init__(
        self,
        config: HostConfig,
        mac: bytes,
        ip: str,
        log: StatsLog | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.endpoint = Endpoint(config.endpoint, log, warn)
        self._warn = self.endpoint.warn
        self.counters = self.endpoint.counters
        self.mac = mac
        self.ip = ip_bytes(ip)
        self.builder = FrameBuilder(mac, self.ip)
        self._frames: list[Frame] = []
        self.neighbors = Neighbors(
            mac,
            self.ip,
            lambda frame: self._frames.append((frame,)),
            self._release,
            {ip_bytes(k): mac_bytes(v) for k, v in config.neighbors.items()},
            mac_bytes(config.gateway_mac) if config.gateway_mac else None,
        )
        self._source_macs: dict[bytes, bytes] = {}
        """The MAC each peer's frames last came from: the next hop of last resort for replies."""
        self._prefixes: dict[tuple[bytes, int, int], bytes] = {}
        """(peer, DSCP, FTH length) -> Ethernet + IPv4 headers, for peers with a known next hop."""
        self._sport_rng = random.Random(config.endpoint.seed ^ int.from_bytes(self.ip, "big"))

    # ----- frames in and out ---------------------------------------------------------

    def receive_frame(self, frame: bytes | bytearray, now: float) -> None:
        try:
            arrival = parse(frame)
        except MalformedFrame as exc:
            self.counters["malformed_frames"] += 1
            self._note_malformed(exc)
            return
        if arrival is None:
            if self.neighbors.on_arp(frame):
                self._prefixes.clear()  # a next hop may have changed
            else:
                self.counters["ignored_frames"] += 1
            return
        if arrival.dst_ip != self.ip:
            self.counters["not_for_us"] += 1
            return
        macs = self._source_macs
        if macs.get(arrival.src_ip) != arrival.src_mac:
            macs[arrival.src_ip] = arrival.src_mac
        self.endpoint.receive(arrival.fth, arrival.src_ip, arrival.ce, now, arrival.dscp)

    def frames_to_send(self, now: float, data: bool = True) -> list[Frame]:
        """Every frame due by `now`: ARP, replies, then DATA (held back for unresolved peers).

        `data=False` leaves the sender alone and returns only what is made
        already (`receive_frames` asks so while frames back up).
        """
        frames, self._frames = self._frames, []
        prefixes = self._prefixes
        if len(prefixes) > PREFIX_CACHE:
            prefixes.clear()
        spray = self.config.spray
        getrandbits = self._sport_rng.getrandbits
        udp = UDP_STRUCT.pack
        for peer, dscp, flow_id, pkt in self.endpoint.datagrams_to_send(now, data):
            size = len(pkt)
            if dscp == _CONTROL:
                sport = SPORT_BASE
            else:
                sport = SPORT_BASE | (getrandbits(14) if spray else _flow_port(flow_id))
            key = (peer, dscp, size)
            prefix = prefixes.get(key)
            if prefix is None:
                mac = self._next_hop(peer, dscp, now)
                if mac is None:
                    self.neighbors.hold(peer, (dscp, sport, pkt))
                    continue
                ecn = ECN_NOT_ECT if dscp == _CONTROL else ECN_ECT0
                prefix = prefixes[key] = self.builder.ip_prefix(mac, peer, dscp << 2 | ecn, size)
            frames.append((prefix, udp(sport, FORGIVE_UDP_PORT, UDP_LEN + size, 0), pkt))
        if self._frames:  # ARP requests made while resolving
            frames += self._frames
            self._frames = []
        return frames

    def get_timer(self) -> float | None:
        return self.endpoint.get_timer()

    def handle_timer(self, now: float) -> None:
        self.endpoint.handle_timer(now)

    def next_event(self) -> Event | None:
        return self.endpoint.next_event()

    # ----- the pump: what every driver does with a host ---------------------------------

    def pump(
        self, apps: Sequence[Application], now: float, send: Callable[[list[Frame]], None]
    ) -> bool:
        """Send what is due (`send`), then hand every event to the applications; repeat
        until there is neither, since an application reacting to an event may give the host
        more to send. True if an event was handed on. A driver moves only the frames and
        the time around this."""
        return self._pump(apps, now, send, True)

    def receive_frames(
        self,
        frames: Sequence[bytes | bytearray],
        clock: Callable[[], float],
        apps: Sequence[Application],
        send: Callable[[list[Frame]], None],
    ) -> None:
        """A batch of frames read while more may be waiting behind it: each is taken in at
        `clock()`, then what they made is sent and their events handed on, but the sender
        does not run. Frames that backed up (ACKs queued while the driver was descheduled)
        must all be applied before the sender's timers decide that their segments were lost;
        the sender runs at the driver's next `pump`, once the backlog is read. A driver that
        takes in each frame as it arrives, with nothing backed up, calls `receive_frame`
        and `pump` instead."""
        if not frames:
            return
        receive = self.receive_frame
        for frame in frames:
            receive(frame, clock())
        self._pump(apps, clock(), send, False)

    def _pump(
        self,
        apps: Sequence[Application],
        now: float,
        send: Callable[[list[Frame]], None],
        data: bool,
    ) -> bool:
        handed = False
        while True:
            frames = self.frames_to_send(now, data)
            if frames:
                send(frames)
            event = self.next_event()
            if event is None:
                return handed
            handed = True
            while event is not None:
                for app in apps:
                    app.handle_event(event, now)
                event = self.next_event()

    def wakeup(self, apps: Sequence[Application]) -> float | None:
        """The earliest timer of the host and its applications: when to pump next."""
        due = self.get_timer()
        for app in apps:
            t = app.get_timer()
            if t is not None and (due is None or t < due):
                due = t
        return due

    # ----- next hops --------------------------------------------------------------------

    def _next_hop(self, peer: bytes, dscp: int, now: float) -> bytes | None:
        """DATA asks ARP for an unknown peer; a reply falls back to the MAC its DATA came from.

        That MAC is a fallback only: behind a switch it names the port the
        sender addressed, not necessarily the one facing this host.
        """
        if dscp == _CONTROL:
            return self.neighbors.known(peer) or self._source_macs.get(peer)
        return self.neighbors.resolve(peer, now)

    def _release(self, ip: bytes, mac: bytes, packets: list[Held]) -> None:
        for dscp, sport, pkt in packets:
            headers = self.builder.headers(mac, ip, dscp, ECN_ECT0, sport, len(pkt))
            self._frames.append((headers, pkt))

    def _note_malformed(self, exc: Exception) -> None:
        if self.counters["malformed_logged"] < MALFORMED_NOTICES:
            self.counters["malformed_logged"] += 1
            self._warn(f"dropped a malformed packet: {exc}")


def _flow_port(flow_id: int) -> int:
    """A flow's fixed source port without spraying: its id, spread by Knuth's multiplier."""
    return ((flow_id * 2654435761) >> 7) & 0x3FFF
