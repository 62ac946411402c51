"""A whole fabric in virtual time: the same hosts, ranks and switch pipelines, no sockets.

This is the project's one virtual-time engine (`forgive run --engine sim`,
the tests without root, the simulator benchmark). Every host is the sans-IO
`host_agent.host.Host` the raw-socket agent drives, with the applications on
it (a `workload.rank.Rank`, as `forgive-train` runs it); every switch is the
switch model's own `Pipeline` and `EgressPort`s, with the table entries the
controller would write to a real one (`controller.fabric_control.switch_entries`
applied through `switch_model.tables.TableStore`). The engine only moves
frames along links, with serialisation at each sender's line rate and a
propagation delay, and advances its clock (`Clock`) to the next thing due:

- a host sends what `frames_to_send` returns, one frame after another on its
  NIC, and is woken at `get_timer` (its own or an application's, whichever
  is first);
- a frame reaching a switch runs the pipeline at once; a port whose queue is
  not empty departs its head frame at `next_departure`, and the frame arrives
  at the far end of the link one serialisation time and one delay later.

Nothing here decides anything about a packet. All randomness is seeded
(each switch's marking draw, each host's ports and the protocol's draws, the
link jitter below), and the clock breaks ties between simultaneous events in the
order they were scheduled, so one seed gives the same run, byte for byte.

Exact timing has one artifact a real fabric lacks: senders paced at the same
rate keep the same phase against each other for as long as they run, so when
a full queue has room for one of two frames that arrive close together it is,
time after time, the same sender's frame that is trimmed or marked (the phase effect
of Floyd and Jacobson, "On Traffic Phase Effects in Packet-Switched
Gateways", 1992). `jitter_frames` breaks it: each frame a host sends reaches
its switch port up to that many full-frame times (at the host's line rate)
late, a uniform draw per frame from the host's own seeded generator, its
order behind the host's earlier frames kept. 0, the default, is exact timing
(docs/simulation.md, "Agreement with the emulation").
"""

from __future__ import annotations

import heapq
import io
import random
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import IO, Any, Final

from common.frames import mac_text
from common.wire import DATA_FRAME_LEN
from controller.p4info import P4InfoIndex, load_p4info
from controller.topology import Fabric, switch_port_mac
from controller.topology import parse as parse_description
from host_agent.host import Host, HostConfig
from host_agent.stats import StatsLog
from simulator.errors import SimulationError
from switch_model.counters import CounterArrays
from switch_model.pipeline import Pipeline
from switch_model.port import EgressPort
from switch_model.surface import load_pipeline
from switch_model.tables import Forwarding, TableStore
from workload.plan import Message, TrainingConfig
from workload.rank import LINGER_S, Rank

_FIRST: Final = 0
"""Priority of what must run before anything else due at the same instant (a process's
start, as SimPy's URGENT)."""
_NORMAL: Final = 1


class Clock:
    """The engine's event loop: a heap of (time, priority, order, callback, value), run in
    that order, so events due at the same instant run in the order they were scheduled.

    It keeps SimPy's order and arithmetic (an event `delay` after `now` is due at `now +
    delay`; a process starts before the other events of its instant) with one callback and
    no event object per event: the simulator schedules two to three per frame over a link.
    """

    def __init__(self) -> None:
        self.now = 0.0
        self.current = 0
        """The order of the event being run (each scheduled event gets the next)."""
        self.scheduled = 0
        """Events scheduled so far."""
        self._queue: list[tuple[float, int, int, Callable[[Any], None], Any]] = []
        self._stopped = False

    def at(self, delay: float, callback: Callable[[Any], None], value: Any = None) -> int:
        """Run `callback(value)` `delay` seconds from now; returns the event's order."""
        self.scheduled = order = self.scheduled + 1
        heapq.heappush(self._queue, (self.now + delay, _NORMAL, order, callback, value))
        return order

    def process(self, generator: Generator[float, None, None]) -> None:
        """Run `generator` from now on, sleeping for each delay it yields."""
        self.scheduled = order = self.scheduled + 1
        heapq.heappush(self._queue, (self.now, _FIRST, order, self._resume, generator))

    def _resume(self, generator: Generator[float, None, None]) -> None:
        try:
            delay = next(generator)
        except StopIteration:
            return
        self.at(delay, self._resume, generator)

    def stop(self) -> None:
        """End `run` after the callback running now."""
        self._stopped = True

    @property
    def pending(self) -> int:
        return len(self._queue)

    def run(self, until: float | None = None) -> bool:
        """Run events in order until `stop`, the queue is empty or (with `until`) the next
        is due at or after `until`, when the clock moves to `until`. True if stopped."""
        queue = self._queue
        pop = heapq.heappop
        self._stopped = False
        while queue:
            if until is not None and queue[0][0] >= until:
                self.now = until
                return False
            when, _, order, callback, value = pop(queue)
            self.now = when
            self.current = order
            callback(value)
            if self._stopped:
                return True
        if until is not None:
            self.now = until
        return False


@dataclass(frozen=True)
class HostPort:
    """Where a host plugs into the fabric."""

    name: str
    ip: str
    mac: bytes
    switch: str
    port: int


def _ip_text(ip: int) -> str:
    return ".".join(str(b) for b in ip.to_bytes(4, "big"))


def host_ports(fabric: Fabric) -> list[HostPort]:
    """Every host of the description with the switch port it is linked to, in host order."""
    attached = {
        peer: (switch, port)
        for switch, ports in fabric.neighbors.items()
        for port, peer in ports.items()
        if peer in fabric.hosts
    }
    out = []
    for name, (ip, mac) in fabric.hosts.items():
        if name not in attached:
            raise SimulationError(f"host {name} is on no link")
        switch, port = attached[name]
        out.append(HostPort(name, _ip_text(ip), mac.to_bytes(6, "big"), switch, port))
    return out


def forwarding(fabric: Fabric, switch: str, p4info) -> Forwarding:
    """The lookup snapshot of `switch` after the controller's entries and default entries, as
    P4Runtime writes them."""
    from p4.v1 import p4runtime_pb2

    from controller.fabric_control import switch_defaults, switch_entries

    index = P4InfoIndex(p4info)
    store = TableStore(load_pipeline(p4info))
    _Update = p4runtime_pb2.Update
    for kind, entries in (
        (_Update.INSERT, switch_entries(fabric, index, switch)),
        (_Update.MODIFY, switch_defaults(fabric, index, switch)),
    ):
        for entry in entries:
            update = _Update(type=kind)
            update.entity.table_entry.CopyFrom(entry)
            store.apply(update)
    return store.compile()


class VirtualFabric:
    """Hosts and switches of one fabric description, driven in virtual time by a `Clock`.

    `host` is every host's configuration, or one per host in host order; its
    endpoint's `line_rate_bps` is the NIC rate (each host's own address and
    gateway are filled in here). Switch
    ports take their rate and queue sizes from the description, as the
    controller shapes them; `delay_s` is every link's propagation delay; `jitter_frames`
    the most a host's frame is late at its switch port, in full frames at the host's
    line rate (see the module docstring).
    """

    def __init__(
        self,
        fabric: Fabric,
        host: HostConfig | Sequence[HostConfig],
        *,
        delay_s: float,
        seed: int = 0,
        p4info_path=None,
        logs: list[IO[str]] | None = None,
        jitter_frames: float = 0.0,
        captures: Mapping[tuple[str, str], Callable[[float, bytearray], None]] | None = None,
    ) -> None:
        from controller import P4INFO

        if not (0.0 <= jitter_frames < float("inf")):
            raise SimulationError(
                f"jitter_frames must be a finite number >= 0, got {jitter_frames}"
            )

        self.env = Clock()
        self.fabric = fabric
        self._captures = dict(captures or {})
        """Per directed link (sender, receiver), what records each frame put on it, with the
        time its first bit goes out (simulator.capture); the links not named have none."""
        self.delay_s = delay_s
        self.warnings: list[str] = []
        self.frames_moved = 0
        """Frames that crossed a link (host to switch, switch to switch or host)."""
        self.attachments = host_ports(fabric)
        self._host_of: dict[str, int] = {h.name: i for i, h in enumerate(self.attachments)}
        self.logs = logs if logs is not None else [io.StringIO() for _ in self.attachments]
        """Each host's statistics (JSON lines), in host order."""
        self.hosts: list[Host] = []
        configs = [host] * len(self.attachments) if isinstance(host, HostConfig) else list(host)
        if len(configs) != len(self.attachments):
            raise SimulationError(
                f"{len(configs)} host configurations for {len(self.attachments)} hosts"
            )
        for i, where in enumerate(self.attachments):
            config = replace(
                configs[i],
                ip=where.ip,
                gateway_mac=mac_text(switch_port_mac(where.switch, where.port)),
            )
            log = StatsLog(self.logs[i], where.ip, flush=False)
            self.hosts.append(Host(config, where.mac, where.ip, log, warn=self.warnings.append))
        self.apps: list[list] = [[] for _ in self.attachments]
        self._host_bit = [8.0 / h.config.endpoint.line_rate_bps for h in self.hosts]
        self._host_free = [0.0] * len(self.hosts)
        self._jitter = [jitter_frames * DATA_FRAME_LEN * bit for bit in self._host_bit]
        """Per host, the most a frame is late at its switch port (s); 0: exact."""
        self._jitter_rng = [random.Random(f"jitter {seed} {i}") for i in range(len(self.hosts))]
        self._host_last = [0.0] * len(self.hosts)
        """Per host, when its latest frame reaches its switch port (a late frame's successors
        are not earlier)."""
        self._wake: list[int] = [0] * len(self.hosts)
        """Per host, the order of its pending wake-up event (0: none); an earlier one
        supersedes it."""
        self._wake_at: list[float | None] = [None] * len(self.hosts)
        self.counters: dict[str, CounterArrays] = {}
        self.pipelines: dict[str, Pipeline] = {}
        self._ingress: dict[str, Callable] = {}
        self._busy: dict[str, set[int]] = {}
        """Per switch, the ports with a departure scheduled."""
        switches = sorted(fabric.switches)
        p4info = load_p4info(p4info_path or P4INFO)
        for number, name in enumerate(switches):
            ports = {}
            for port in sorted(fabric.neighbors[name]):
                spec = fabric.ports[name, port]
                if spec.rate_bps is None:
                    raise SimulationError(f"{name}:{port} has no rate: every link needs rate_bps")
                egress = ports[port] = EgressPort(port, rate_bps=spec.rate_bps)
                if spec.low_queue_bytes is not None:
                    egress.low_capacity = spec.low_queue_bytes
                if spec.high_queue_bytes is not None:
                    egress.high_capacity = spec.high_queue_bytes
            self.counters[name] = CounterArrays(max(ports, default=0) + 1)
            pipeline = Pipeline(ports, self.counters[name], seed=seed * len(switches) + number)
            pipeline.forwarding = forwarding(fabric, name, p4info)
            self.pipelines[name] = pipeline
        for name in switches:
            self._ingress[name] = self._make_ingress(name)
        self._send = [self._make_sender(i) for i in range(len(self.hosts))]
        """Per host, what Host.pump sends its frames with (`_make_sender`)."""
        self.tap: Callable[[int, bytearray], None] | None = None
        """If set, called with (host index, frame) for every frame a host receives, before the
        host takes it: a place to watch the fabric from (the class takes no patches when
        compiled)."""
        self._running = False
        """In `run`, which stops once the run's end holds."""
        self._runs = 0
        """Calls of `run` so far: a limit left from an earlier one does not stop a later one."""
        self._until: Callable[[], bool] = lambda: False

    # ----- switches -----------------------------------------------------------------------

    def _make_ingress(self, name: str) -> Callable:
        """The callback of a frame arriving at switch `name`: the pipeline, then the port."""
        env = self.env
        pipeline = self.pipelines[name]
        process = pipeline.process
        busy = self._busy[name] = set()
        departs = {
            number: self._make_departure(name, number, port)
            for number, port in pipeline.ports.items()
        }

        def arrive(frame: bytearray) -> None:
            port = process(frame, env.now)
            if port is not None and port.number not in busy:
                # An idle port starts on the frame at once, as a wire does.
                busy.add(port.number)
                departs[port.number](None)

        return arrive

    def _make_departure(self, name: str, number: int, port: EgressPort) -> Callable:
        """The callback of port `number` of `name` sending its head frame down its link."""
        env = self.env
        pipeline = self.pipelines[name]
        busy = self._busy[name]
        bit = 8.0 / port.rate_bps
        delay = self.delay_s
        peer = self.fabric.neighbors[name][number]
        capture = self._captures.get((name, peer))
        deliver: Callable[[bytearray], None] | None = None  # else the peer switch's ingress,
        if peer in self._host_of:  # made after this one
            i = self._host_of[peer]

            def to_host(frame: bytearray) -> None:
                self._host_arrival(i, frame)

            deliver = to_host

        def depart(_: object) -> None:
            now = env.now
            popped = port.dequeue(now)
            if popped is not None:
                frame, received = popped
                pipeline.egress(number, received)
                self.frames_moved += 1
                if capture is not None:
                    capture(now, frame)
                env.at(
                    len(frame) * bit + delay,
                    deliver if deliver is not None else self._ingress[peer],
                    frame,
                )
            at = port.next_departure()
            if at is None:
                busy.discard(number)
                return
            env.at(at - now if at > now else 0.0, depart)

        return depart

    # ----- hosts ----------------------------------------------------------------------------

    def _host_arrival(self, i: int, frame: bytearray) -> None:
        tap = self.tap
        if tap is not None:
            tap(i, frame)
        self.hosts[i].receive_frame(frame, self.env.now)
        self._flush(i)

    def _host_timer(self, i: int) -> None:
        if self._wake[i] != self.env.current:
            return  # superseded by an earlier wake-up
        self._wake[i] = 0
        self._wake_at[i] = None
        now = self.env.now
        self.hosts[i].handle_timer(now)
        woken = False
        for app in self.apps[i]:
            app_timer = app.get_timer()
            if app_timer is not None and app_timer <= now:
                app.handle_timer(now)
                woken = True
        self._flush(i, woken)

    def _make_sender(self, i: int) -> Callable[[list], None]:
        """Host `i`'s `send` for Host.pump: its frames onto its link, back to back from when
        the link is free, each reaching its switch port a link delay (and its jitter) after
        its last bit. Made once per host, so that a pump makes no callback of its own."""
        env = self.env
        bit = self._host_bit[i]
        delay = self.delay_s
        ingress = self._ingress[self.attachments[i].switch]
        jitter = self._jitter[i]
        rng = self._jitter_rng[i]
        where = self.attachments[i]
        capture = self._captures.get((where.name, where.switch))

        def transmit(frames: list) -> None:
            now = env.now
            free = self._host_free[i]
            for parts in frames:
                frame = bytearray().join(parts)
                start = free if free > now else now
                if capture is not None:
                    capture(start, frame)
                free = start + len(frame) * bit
                if jitter:
                    at = free + delay + rng.random() * jitter
                    last = self._host_last[i]
                    at = self._host_last[i] = at if at > last else last
                    env.at(at - now, ingress, frame)
                else:
                    env.at(free + delay - now, ingress, frame)
            self._host_free[i] = free
            self.frames_moved += len(frames)

        return transmit

    def _flush(self, i: int, woken: bool = False) -> None:
        """Host `i` sends what is due and hands its events to its applications until quiet
        (Host.pump), then sleeps until the earliest timer of the host and its applications.
        The run's end is checked when an application was `woken` or handed an event: nothing
        else moves it."""
        env = self.env
        now = env.now
        host = self.hosts[i]
        apps = self.apps[i]
        if host.pump(apps, now, self._send[i]):
            woken = True
        due = host.wakeup(apps)
        wake_at = self._wake_at[i]
        if due is not None and (wake_at is None or due < wake_at):
            self._wake_at[i] = due
            self._wake[i] = env.at(due - now if due > now else 0.0, self._host_timer, i)
        if woken and self._running and self._until():
            env.stop()
            self._running = False

    def poke(self, i: int) -> None:
        """Have host `i` and its applications run at the current instant, after what runs
        now: an application was handed news from outside its host's own events."""
        self.env.at(0.0, self._poked, i)

    def _poked(self, i: int) -> None:
        self._flush(i, True)

    # ----- running ----------------------------------------------------------------------------

    @property
    def now(self) -> float:
        return self.env.now

    @property
    def events(self) -> int:
        """Events scheduled so far."""
        return self.env.scheduled

    def start(self) -> None:
        """Let every host send what it has and arm its first timer (after its apps started)."""
        for i in range(len(self.hosts)):
            self._flush(i)

    def run(self, until: Callable[[], bool], limit_s: float = 600.0) -> None:
        """Advance virtual time until `until()` holds (checked after each host's activity);
        SimulationError if the fabric goes idle first or `limit_s` of virtual time pass."""
        if until():
            return
        self._until = until
        self._running = True
        self._runs += 1
        env = self.env
        env.at(limit_s - env.now, self._limit, self._runs)
        env.run()
        if not self._running:
            return  # the run's end held
        self._running = False
        if not env.pending:
            raise SimulationError(f"the fabric went idle before {limit_s} s of virtual time")
        raise SimulationError(f"the run did not end within {limit_s} s of virtual time")

    def _limit(self, run: int) -> None:
        """The time limit of `run`'s call number `run`: it ends without the run's end holding."""
        if run == self._runs and self._running:
            self.env.stop()

    def switch_totals(self) -> dict[str, dict[str, int]]:
        """Per switch, its counters summed over its ports (as the runner reads real ones)."""
        return {name: c.totals() for name, c in self.counters.items()}

    def fabric_total(self, counter: str) -> int:
        """One counter (a CounterArrays field) summed over every port of every switch: what a
        timeline samples, without summing the others."""
        return sum(sum(getattr(c, counter)) for c in self.counters.values())


def sim_endpoints(switches) -> dict[str, dict]:
    """Control endpoints for a description the simulator alone reads: it installs the entries
    itself, so nothing ever connects to these."""
    return {
        name: {"target": "model", "grpc": f"sim:{i + 1}", "device_id": i + 1, "control": name}
        for i, name in enumerate(switches)
    }


def star(
    hosts: int = 4,
    port_rate_bps: int = 5_000_000_000,
    data_queue_bytes: int = 4 * DATA_FRAME_LEN,
    ecn_kmin: int = DATA_FRAME_LEN,
    ecn_kmax: int = 4 * DATA_FRAME_LEN,
    ecn_pmax: int = 1 << 14,
) -> Fabric:
    """Hosts on one switch whose ports may be slower than the hosts' NICs, so queues build."""
    names = [f"h{i + 1}" for i in range(hosts)]
    return parse_description(
        {
            "switches": sim_endpoints(["s1"]),
            "hosts": {
                name: {"ip": f"10.0.0.{i + 1}", "mac": f"02:00:00:00:00:{i + 1:02x}"}
                for i, name in enumerate(names)
            },
            "links": [
                {"a": name, "b": f"s1:{i + 1}", "rate_bps": port_rate_bps}
                for i, name in enumerate(names)
            ],
            "thresholds": {
                "data_queue_bytes": data_queue_bytes,
                "ecn_kmin": ecn_kmin,
                "ecn_kmax": ecn_kmax,
                "ecn_pmax": ecn_pmax,
            },
        }
    )


@dataclass(frozen=True)
class Job:
    """One training job of a run: its configuration, the host of each rank, its hosts' agents."""

    cfg: TrainingConfig
    placement: list[int]
    """Rank r runs on host placement[r]."""
    host: HostConfig


def train_jobs(
    jobs: Sequence[Job],
    fabric: Fabric,
    *,
    delay_s: float = 2e-6,
    limit_s: float = 600.0,
    logs: list[IO[str]] | None = None,
    outs: list[IO[str]] | None = None,
    watch: Callable[[VirtualFabric, list[Rank]], Generator] | None = None,
    jitter_frames: float = 0.0,
    captures: Mapping[tuple[str, str], Callable[[float, bytearray], None]] | None = None,
) -> tuple[VirtualFabric, list[Rank], list[IO[str]]]:
    """Run training jobs side by side on one fabric, each on its own hosts, until all end;
    `limit_s` of virtual time bounds their training, not the ranks' linger after it.

    Ranks come back job after job, in rank order, and so do `outs`; a host no job uses
    runs the first job's agent configuration and stays idle. The fabric's randomness
    (its jitter too, `jitter_frames`: VirtualFabric) is seeded by the first job's seed;
    `captures` record the frames of the links they name (VirtualFabric)."""
    where = host_ports(fabric)
    owner: dict[int, Job] = {}
    for job in jobs:
        for i in job.placement:
            if i in owner:
                raise SimulationError(f"host {where[i].name} is in two jobs")
            owner[i] = job
    configs = [
        replace(j.host, endpoint=replace(j.host.endpoint, seed=j.cfg.seed))
        for j in (owner.get(i, jobs[0]) for i in range(len(where)))
    ]
    sim = VirtualFabric(
        fabric,
        configs,
        delay_s=delay_s,
        seed=jobs[0].cfg.seed,
        logs=logs,
        jitter_frames=jitter_frames,
        captures=captures,
    )
    if outs is None:
        outs = [io.StringIO() for job in jobs for _ in job.placement]
    ranks: list[Rank] = []
    for job in jobs:
        ranks_cfg = replace(job.cfg, ranks=tuple(where[i].ip for i in job.placement))
        ranks_cfg.validate()
        for r, i in enumerate(job.placement):
            out = outs[len(ranks)]
            rank = Rank(replace(ranks_cfg, rank=r), sim.hosts[i].endpoint, out, sim.warnings.append)
            sim.apps[i].append(rank)
            ranks.append(rank)
    first = 0
    for job in jobs:
        if job.cfg.completion == "sender-ack":
            for r in range(len(job.placement)):
                ranks[first + r].on_sent = _telling(
                    sim, ranks[first : first + len(job.placement)], job.placement
                )
        first += len(job.placement)
    for rank in ranks:
        rank.start(sim.now)
    sim.start()
    if watch is not None:
        sim.env.process(watch(sim, ranks))
    sim.run(lambda: all(r.trained for r in ranks), limit_s)
    # Each rank goes on acknowledging for LINGER_S after its training (workload.rank): the
    # time limit bounds training, not that tail.
    sim.run(lambda: all(r.finished for r in ranks), sim.now + 2 * LINGER_S)
    return sim, ranks, outs


def _telling(
    sim: VirtualFabric, ranks: Sequence[Rank], placement: Sequence[int]
) -> Callable[[Message, float], None]:
    """A rank's `on_sent` under the 'sender-ack' completion: the receiving rank hears at once
    that the sender has its last ACK, as ASTRA-sim's ns-3 frontend tells both ends in one
    callback (`qp_finish`), and its host runs at the same instant to send what that allows."""

    def tell(msg: Message, now: float) -> None:
        ranks[msg.dst].peer_acked(msg.flow, now)
        sim.poke(placement[msg.dst])

    return tell


def train(
    cfg: TrainingConfig,
    fabric: Fabric,
    host: HostConfig,
    *,
    delay_s: float = 2e-6,
    limit_s: float = 600.0,
    placement: list[int] | None = None,
    logs: list[IO[str]] | None = None,
    outs: list[IO[str]] | None = None,
    watch: Callable[[VirtualFabric, list[Rank]], Generator] | None = None,
) -> tuple[VirtualFabric, list[Rank], list[IO[str]]]:
    """Run one training job on the fabric; rank r on host `placement[r]` (default: host r).

    Each host's statistics go to `logs` (in host order) and each rank's records to `outs`
    (in rank order), in memory unless given; `watch(sim, ranks)`, if given, runs beside them
    as a `Clock` process (to sample counters). Returns the fabric, the ranks and `outs`."""
    order = list(range(len(host_ports(fabric)))) if placement is None else placement
    return train_jobs(
        [Job(cfg, order, host)],
        fabric,
        delay_s=delay_s,
        limit_s=limit_s,
        logs=logs,
        outs=outs,
        watch=watch,
    )
