"""An in-memory fabric in virtual time: hosts and training ranks around one FORGIVE switch.

The engine of last resort for tests and quick experiments: no sockets, no
namespaces, no root, no wall clock. Every host is the same sans-IO
`host_agent.host.Host` the raw-socket agent drives, every rank the same
`workload.rank.Rank` that `forgive-train` runs, and the switch is the switch
model's own pipeline and egress ports (`switch_model.pipeline`,
`switch_model.port`), clocked by the fabric. The engine only moves frames
along links with a propagation delay and serialisation at each port's line
rate, and advances time to the next thing due. All randomness is seeded, so
one seed gives the same run, byte for byte.
"""

from __future__ import annotations

import heapq
import io
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from host_agent.events import Event
from host_agent.frames import ip_bytes
from host_agent.host import Host, HostConfig
from host_agent.stats import StatsLog
from switch_model.counters import CounterArrays
from switch_model.pipeline import Pipeline
from switch_model.port import EgressPort
from switch_model.surface import Thresholds
from switch_model.tables import Forwarding, NextHop
from workload.plan import TrainingConfig
from workload.rank import Rank

FULL_FRAME = 14 + 20 + 8 + 16 + 4096


@dataclass(frozen=True)
class StarFabric:
    """Hosts on one switch; the switch's ports may be slower than the hosts' links."""

    hosts: int = 4
    host_rate_bps: float = 10e9
    """Each host's NIC (its sender paces at this rate)."""
    port_rate_bps: float = 5e9
    """The switch's egress towards each host: slower than a host, so queues build."""
    delay_s: float = 2e-6
    """Propagation delay of every link, each way."""
    data_queue_bytes: int = 4 * FULL_FRAME
    """Trimming threshold of every port's data queue."""
    ecn_kmin: int = FULL_FRAME
    ecn_kmax: int = 4 * FULL_FRAME
    ecn_pmax: int = 1 << 14
    """Marking probability at kmax, out of 2**16 (the program's encoding)."""

    def ip(self, index: int) -> str:
        return f"10.0.0.{index + 1}"

    def mac(self, index: int) -> bytes:
        return bytes((2, 0, 0, 0, 0, index + 1))

    def port_mac(self, index: int) -> bytes:
        return bytes((2, 0, 0, 0, 0xFF, index + 1))


@dataclass(order=True)
class _Arrival:
    at: float
    order: int
    to_switch: bool = field(compare=False)
    index: int = field(compare=False)
    """The host that sent the frame (to_switch) or receives it."""
    frame: bytes = field(compare=False)


class VirtualFabric:
    """Drive hosts (and the applications on them) through the fabric until `until()` holds."""

    def __init__(self, fabric: StarFabric, host: HostConfig, seed: int = 0) -> None:
        self.fabric = fabric
        self.now = 0.0
        self.logs = [io.StringIO() for _ in range(fabric.hosts)]
        self.hosts: list[Host] = []
        for i in range(fabric.hosts):
            config = replace(
                host,
                ip=fabric.ip(i),
                gateway_mac=":".join(f"{b:02x}" for b in fabric.port_mac(i)),
                endpoint=replace(host.endpoint, line_rate_bps=fabric.host_rate_bps),
            )
            log = StatsLog(self.logs[i], fabric.ip(i))
            self.hosts.append(Host(config, fabric.mac(i), fabric.ip(i), log, warn=self.warn))
        self.warnings: list[str] = []
        self.apps: list[list] = [[] for _ in range(fabric.hosts)]
        self.counters = CounterArrays(fabric.hosts)
        self.ports = {
            i: EgressPort(i, rate_bps=int(fabric.port_rate_bps)) for i in range(fabric.hosts)
        }
        self.switch = Pipeline(self.ports, self.counters, seed=seed)
        thresholds = Thresholds(
            fabric.data_queue_bytes, fabric.ecn_kmin, fabric.ecn_kmax, fabric.ecn_pmax
        )
        routes = {
            int.from_bytes(ip_bytes(fabric.ip(i)), "big"): NextHop(fabric.mac(i), i)
            for i in range(fabric.hosts)
        }
        self.switch.forwarding = Forwarding(
            lpm=((0xFFFFFFFF, routes),), thresholds=dict.fromkeys(self.ports, thresholds)
        )
        self._arrivals: list[_Arrival] = []
        self._order = itertools.count()
        self._host_free = [0.0] * fabric.hosts
        """When each host's link is free again (frames leave it one after another)."""

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def _put(self, at: float, to_switch: bool, index: int, frame: bytes) -> None:
        heapq.heappush(self._arrivals, _Arrival(at, next(self._order), to_switch, index, frame))

    def run(self, until: Callable[[], bool], limit_s: float = 600.0) -> None:
        """Advance virtual time until `until()` holds; RuntimeError past `limit_s` of it.

        A host's timer (and its applications') can only change when something
        touched it, so each is recomputed only then.
        """
        fabric = self.fabric
        port_bit = 8.0 / fabric.port_rate_bps
        arrivals = self._arrivals
        ports = self.ports
        hosts = self.hosts
        timers: list[float | None] = [None] * len(hosts)
        touched = set(range(len(hosts)))
        while True:
            for i in sorted(touched):
                timers[i] = self._flush(i)
            touched.clear()
            if until():
                return
            due = [t for t in timers if t is not None]
            due += [t for p in ports.values() if (t := p.next_departure()) is not None]
            if arrivals:
                due.append(arrivals[0].at)
            if not due:
                raise RuntimeError(f"the fabric went idle at {self.now:.6f} s before the run ended")
            self.now = now = max(self.now, min(due))
            if now > limit_s:
                raise RuntimeError(f"the run did not end within {limit_s} s of virtual time")
            while arrivals and arrivals[0].at <= now:
                item = heapq.heappop(arrivals)
                if item.to_switch:
                    self.switch.process(bytearray(item.frame), now)
                else:
                    hosts[item.index].receive_frame(item.frame, now)
                    touched.add(item.index)
            for number, port in ports.items():
                while (popped := port.dequeue(now)) is not None:
                    frame, received = popped
                    self.switch.egress(number, received)
                    at = now + len(frame) * port_bit + fabric.delay_s
                    self._put(at, False, number, bytes(frame))
            for i, timer in enumerate(timers):
                if timer is not None and timer <= now:
                    hosts[i].handle_timer(now)
                    for app in self.apps[i]:
                        app_timer = app.get_timer()
                        if app_timer is not None and app_timer <= now:
                            app.handle_timer(now)
                    touched.add(i)

    def _flush(self, i: int) -> float | None:
        """Host `i` sends what is due and hands its events to its applications, until quiet;
        returns the earliest timer of the host and its applications."""
        now = self.now
        host = self.hosts[i]
        host_bit = 8.0 / self.fabric.host_rate_bps
        while True:
            for parts in host.frames_to_send(now):
                frame = b"".join(parts)
                start = max(now, self._host_free[i])
                self._host_free[i] = start + len(frame) * host_bit
                self._put(self._host_free[i] + self.fabric.delay_s, True, i, frame)
            event: Event | None = host.next_event()
            if event is None:
                break
            while event is not None:
                for app in self.apps[i]:
                    app.handle_event(event, now)
                event = host.next_event()
        due = [
            t for t in (host.get_timer(), *(a.get_timer() for a in self.apps[i])) if t is not None
        ]
        return min(due, default=None)


def train(
    cfg: TrainingConfig, fabric: StarFabric, host: HostConfig, limit_s: float = 600.0
) -> tuple[VirtualFabric, list[Rank], list[io.StringIO]]:
    """Run one training job on the fabric, one rank per host; returns the ranks' records."""
    ranks_cfg = replace(cfg, ranks=tuple(fabric.ip(i) for i in range(fabric.hosts)))
    ranks_cfg.validate()
    endpoint = replace(host.endpoint, seed=cfg.seed)
    sim = VirtualFabric(fabric, replace(host, endpoint=endpoint), cfg.seed)
    outs = [io.StringIO() for _ in range(fabric.hosts)]
    ranks = []
    for i in range(fabric.hosts):
        rank = Rank(replace(ranks_cfg, rank=i), sim.hosts[i].endpoint, outs[i], warn=sim.warn)
        sim.apps[i].append(rank)
        ranks.append(rank)
    for rank in ranks:
        rank.start(sim.now)
    sim.run(lambda: all(r.finished for r in ranks), limit_s)
    return sim, ranks, outs
