"""The host agent: one event loop between a raw socket and the sans-IO protocol core.

Every arriving frame is handed to the core, everything the core returns goes
out at once, and the loop sleeps until the earlier of the core's next deadline
and the next frame. `select` is used rather than epoll because its timeout has
microsecond resolution; epoll's is a millisecond, too coarse to pace packets on
a path whose round trip is itself well under a millisecond.

The agent is also the host-local interface of the design note: the training
side tells it which step begins, how many gradient bytes that step brings,
which flows to expect and what to send (`begin_step`, `register_flow`, `send`,
`complete_step`), and hears back completion events. Those calls are the four
facts no packet carries.
"""

from __future__ import annotations

import contextlib
import ctypes
import heapq
import itertools
import random
import select
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from host_agent.acks import AckCoalescer
from host_agent.core import DcqcnParams, ForgiveReceiver, ForgiveSender, ReceiverPolicy
from host_agent.frames import (
    Arrival,
    FrameBuilder,
    MalformedFrame,
    ip_bytes,
    ip_text,
    mac_bytes,
    parse,
    udp_header,
)
from host_agent.link import RawLink, hold_udp_port, interface_ipv4, interface_mtu
from host_agent.neighbors import Held, Neighbors
from host_agent.policies import Policy, is_shed, parse_policy
from host_agent.stats import StatsLog, bound_violation
from host_agent.wire import (
    ECN_ECT0,
    ECN_NOT_ECT,
    FTH_LEN,
    IPV4_LEN,
    PACKET_BYTES,
    UDP_LEN,
    Dscp,
    Flag,
    MalformedPacket,
    Opcode,
)

TRAFFIC_CLASSES: dict[str, Dscp] = {
    "gradient": Dscp.GRADIENT,
    "tensor-parallel": Dscp.TENSOR_PARALLEL,
    "pipeline-parallel": Dscp.PIPELINE_PARALLEL,
    "other": Dscp.OTHER,
}
RECV_BATCH = 32
MAX_BATCHES = 64
"""Batches of RECV_BATCH frames per wake-up, so a flood cannot starve the sender for long."""
IDLE_WAIT = 0.5
"""Longest sleep with nothing scheduled; bounds how late `run`'s `until` is noticed."""
SPIN_BELOW = 30e-6
"""Deadlines closer than this are polled for, not slept on: a sleep and wake-up costs more."""
BUSY_CHECK = 20e-6
"""While packets are overdue, sockets are looked at this often rather than every iteration."""
MIN_MTU = IPV4_LEN + UDP_LEN + FTH_LEN + PACKET_BYTES
"""IPv4 bytes of a full DATA packet (4140): the smallest MTU that carries one unfragmented."""
_DATA = int(Opcode.DATA)
_TRIMMED = int(Flag.TRIMMED)
_CONTROL = int(Dscp.CONTROL)
_SPORT_BASE = 0xC000
PR_SET_TIMERSLACK = 29

Listener = Callable[[dict[str, Any], bytes | None], None]
"""Receives every completion event; the bytes are a delivered flow's payload, else None."""


@dataclass
class AgentConfig:
    iface: str
    ip: str | None = None
    """This host's IPv4 address; None takes the interface's kernel address."""
    policy: Policy = field(default_factory=lambda: parse_policy("forgive"))
    seed: int = 0
    line_rate_bps: float = 10e9
    rto: float = 0.01
    """Initial retransmission timeout. Not one RTT (tens of microseconds on a veth) but a few
    scheduler time slices: a Python receiver sharing a busy core can pause that long, and a
    shorter timeout then resends data that was only waiting. Trims never wait for it."""
    rto_max: float = 0.2
    time_scale: float = 1.0
    """How many times slower than the fabric it stands for the emulation runs (DCQCN's
    periods, and so the receiver's CNP interval, stretch by it)."""
    spray: bool = True
    """Per-packet UDP source ports (path entropy); False keeps one per flow."""
    neighbors: dict[str, str] = field(default_factory=dict)
    """Static IPv4 -> MAC entries; others resolve through ARP unless a gateway is set."""
    gateway_mac: str | None = None
    """Next hop for every destination without a static entry (a switch port)."""
    stats_path: str | None = None
    keep_payload: bool = True
    """False: the receiver keeps no flow bytes (no `deliver`), for runs that only time flows."""

    def validate(self) -> None:
        """Raise ValueError on the first bad setting, before any socket is opened."""
        if self.ip is not None:
            ip_bytes(self.ip)
        for ip, mac in self.neighbors.items():
            ip_bytes(ip)
            mac_bytes(mac)
        if self.gateway_mac is not None:
            mac_bytes(self.gateway_mac)
        if self.line_rate_bps <= 0:
            raise ValueError("line rate must be positive")
        if not 0 < self.rto <= self.rto_max:
            raise ValueError("need 0 < rto <= rto_max")
        if self.time_scale <= 0:
            raise ValueError("time scale must be positive")


@dataclass(slots=True)
class _TxFlow:
    dst_ip: bytes
    dscp: int
    sport: int
    step: int | None
    size: int
    started: float
    mac: bytes | None = None
    prefix: bytes = b""
    prefix_len: int = -1
    """FTH length that `prefix` (Ethernet + IPv4, ECT(0)) was built for; -1: none yet."""

    @property
    def tos(self) -> int:
        return (self.dscp << 2) | ECN_ECT0


@dataclass(slots=True)
class _RxFlow:
    step: int
    traffic_class: str
    deliver: bool
    first_arrival: float | None = None
    completed: bool = False
    forget_when_done: bool = False


@dataclass(slots=True)
class _StepInfo:
    critical: bool
    expected: int


class HostAgent:
    """One emulated host's transport endpoint; see the module docstring for the local API."""

    def __init__(self, config: AgentConfig, listener: Listener | None = None) -> None:
        config.validate()
        self.config = config
        self.policy = config.policy
        ip = config.ip or interface_ipv4(config.iface)
        if ip is None:
            raise ValueError(f"interface {config.iface!r} has no IPv4 address; pass one")
        self.ip = ip_bytes(ip)
        mtu = interface_mtu(config.iface)
        if mtu is not None and mtu < MIN_MTU:
            raise ValueError(
                f"interface {config.iface!r} has MTU {mtu}; full DATA packets need {MIN_MTU} (use 9000)"
            )
        self.link = RawLink(config.iface)
        self._port_holder = hold_udp_port(ip)
        self.builder = FrameBuilder(self.link.mac, self.ip)
        p_low, p_high = self.policy.receiver_probabilities
        dcqcn = DcqcnParams(line_rate_bps=config.line_rate_bps, time_scale=config.time_scale)
        self.rx = ForgiveReceiver(
            ReceiverPolicy(
                p_low=p_low,
                p_high=p_high,
                forgive_prob=self.policy.forgive_prob,
                seed=config.seed,
                vesting=self.policy.vesting,
                exemption=self.policy.exemption,
                cnp_interval=dcqcn.cnp_interval,
            )
        )
        self.tx = ForgiveSender(
            dcqcn,
            seed=config.seed,
            rto=config.rto,
            rto_max=config.rto_max,
        )
        self.listeners: list[Listener] = [listener] if listener else []
        self.log = StatsLog(config.stats_path, ip)
        self.counters: Counter = Counter()
        self.neighbors = Neighbors(
            self.link.mac,
            self.ip,
            lambda frame: self.link.send(frame, b""),
            self._release,
            {ip_bytes(k): mac_bytes(v) for k, v in config.neighbors.items()},
            mac_bytes(config.gateway_mac) if config.gateway_mac else None,
        )
        self._tx_flows: dict[int, _TxFlow] = {}
        self._rx_flows: dict[int, _RxFlow] = {}
        self._steps: dict[int, _StepInfo] = {}
        self._totals: defaultdict[int | None, Counter] = defaultdict(Counter)
        """Per step (None: flows sent without one), sums over the flows this host finished."""
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_seq = itertools.count()
        self._readers: dict[int, Callable[[], None]] = {self.link.fileno(): self._on_frames}
        self._fds = list(self._readers)
        self._writers: dict[int, Callable[[], None]] = {}
        self._acks = AckCoalescer()
        self._sport_rng = random.Random(config.seed ^ int.from_bytes(self.ip, "big"))

    # ----- the host-local interface -------------------------------------------------

    def begin_step(self, step: int, critical: bool, expected_gradient_bytes: int) -> None:
        """Open a step's loss budget; call before any of its flows are registered."""
        if step in self._steps:
            raise ValueError(f"step {step} already begun")
        if expected_gradient_bytes < 0:
            raise ValueError("expected gradient bytes must be >= 0")
        self._steps[step] = _StepInfo(critical, expected_gradient_bytes)
        self.rx.begin_step(step, critical=critical, expected_bytes=expected_gradient_bytes)
        self.log.write("step_begin", step=step, critical=critical, expected=expected_gradient_bytes)

    def register_flow(
        self,
        flow_id: int,
        step: int,
        traffic_class: str,
        deliver: bool = False,
        size: int | None = None,
    ) -> None:
        """Expect a flow from a peer. `deliver` hands its bytes to the listeners on completion.

        Under a shedding policy a gradient message the shared draw sheds is
        never sent, so it completes here at once as shed (`size` reports how
        many bytes that was).
        """
        _check_class(traffic_class)
        if deliver and not self.config.keep_payload:
            raise ValueError("this agent keeps no payloads (--no-payload), so it cannot deliver")
        if flow_id in self._rx_flows:
            raise ValueError(f"flow {flow_id} is already registered")
        gradient = traffic_class == "gradient"
        if gradient and self._shed(step, flow_id):
            self._totals[step]["rx_shed_bytes"] += size or 0
            self.call_later(0.0, lambda: self._emit_shed("recv_done", flow_id, step, size))
            return
        # Only a flow handed to the listeners needs its bytes kept.
        self.rx.register_flow(flow_id, step=step, gradient=gradient, keep_payload=deliver)
        self._rx_flows[flow_id] = _RxFlow(step, traffic_class, deliver)

    def send(
        self,
        dst: str,
        flow_id: int,
        data: bytes,
        traffic_class: str,
        step: int | None = None,
    ) -> None:
        """Start sending `data` as flow `flow_id`; a `send_done` event follows its last ACK."""
        _check_class(traffic_class)
        if flow_id in self._tx_flows:
            raise ValueError(f"flow {flow_id} is already being sent")
        if not data:
            raise ValueError("a flow carries at least one byte")
        if traffic_class == "gradient" and step is not None and self._shed(step, flow_id):
            self._totals[step]["tx_shed_bytes"] += len(data)
            self.call_later(0.0, lambda: self._emit_shed("send_done", flow_id, step, len(data)))
            return
        now = time.monotonic()
        dst_ip = ip_bytes(dst)
        self.tx.open_flow(flow_id, len(data), now=now, data=data, peer=dst)
        sport = _SPORT_BASE | ((flow_id * 2654435761) >> 7) & 0x3FFF
        self._tx_flows[flow_id] = _TxFlow(
            dst_ip, TRAFFIC_CLASSES[traffic_class], sport, step, len(data), now
        )

    def complete_step(self, step: int) -> None:
        """Close a step's loss budget (the note's OnAllReduceComplete) and log its totals.

        The record holds the core's gradient accounting for the step (p,
        budget, expected, received, forgiven, outstanding) beside totals over
        every flow of the step this host finished so far: `rx_*` for flows it
        received (all classes), `tx_*` for flows it sent (shed ones included).
        """
        if step not in self._steps:
            raise ValueError(f"step {step} was never begun")
        self.rx.complete_step(step)
        state = self._check_step(step, "complete_step")
        info = self._steps[step]
        self.log.write(
            "step", step=step, critical=info.critical, **dict(state), **dict(self._totals[step])
        )

    def forget_step(self, step: int) -> None:
        """Drop the receive state of a finished step's flows once no sender can still need it.

        A flow of that step still arriving (a background burst) is dropped when it completes.
        """
        for flow_id, flow in list(self._rx_flows.items()):
            if flow.step != step:
                continue
            if flow.completed:
                self.rx.forget_flow(flow_id)
                del self._rx_flows[flow_id]
            else:
                flow.forget_when_done = True

    def step_state(self, step: int) -> dict[str, Any]:
        state = self.rx.step_state(step)
        if state is None:
            raise ValueError(f"step {step} was never begun")
        return state

    # ----- loop plumbing ---------------------------------------------------------------

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        self.call_at(time.monotonic() + delay, fn)

    def call_at(self, when: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (when, next(self._timer_seq), fn))

    def add_reader(self, fd: int, fn: Callable[[], None]) -> None:
        self._readers[fd] = fn
        self._fds = list(self._readers)

    def remove_reader(self, fd: int) -> None:
        self._readers.pop(fd, None)
        self._fds = list(self._readers)

    def add_writer(self, fd: int, fn: Callable[[], None]) -> None:
        """Call `fn` whenever `fd` can take more bytes, until `remove_writer`."""
        self._writers[fd] = fn

    def remove_writer(self, fd: int) -> None:
        self._writers.pop(fd, None)

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Serve frames, timers and readers until `until()` turns true (forever without it)."""
        _tighten_timer_slack()
        acks = self._acks
        timers = self._timers
        checked = 0.0
        while not (until and until()):
            now = time.monotonic()
            if timers and timers[0][0] <= now:
                self._run_timers(now)
            if acks.held:
                self._send_replies(acks.due(now))
            self._transmit(now)
            now = time.monotonic()
            timeout = self._timeout(now)
            if timeout < SPIN_BELOW:
                if timeout == 0.0 and now - checked < BUSY_CHECK:
                    continue  # more is due already: keep sending, look at sockets shortly
                timeout = 0.0
            checked = now
            ready, writable, _ = select.select(self._fds, list(self._writers), [], timeout)
            for fd in ready:
                reader = self._readers.get(fd)
                if reader is not None:
                    reader()
            for fd in writable:
                writer = self._writers.get(fd)
                if writer is not None:
                    writer()

    def close(self) -> None:
        """Write the run's summary record (counters and totals over every finished flow)."""
        self.log.write(
            "agent",
            policy=self.policy.name,
            **dict(self.counters),
            **dict(sum(self._totals.values(), Counter())),
            acks_coalesced=self._acks.coalesced,
            link_tx_errors=self.link.tx_errors,
            unresolved_drops=self.neighbors.dropped,
            socket_drops=self.link.kernel_drops(),
            core_rx=dict(self.rx.stats),
            core_tx=dict(self.tx.stats),
        )
        self.log.close()
        self.link.close()
        if self._port_holder is not None:
            self._port_holder.close()

    def _run_timers(self, now: float) -> None:
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, fn = heapq.heappop(timers)
            fn()

    def _timeout(self, now: float) -> float:
        deadline = now + IDLE_WAIT
        for candidate in (self.tx.next_deadline(), self._acks.deadline()):
            if candidate is not None and candidate < deadline:
                deadline = candidate
        if self._timers and self._timers[0][0] < deadline:
            deadline = self._timers[0][0]
        return max(deadline - now, 0.0)

    # ----- sending -----------------------------------------------------------------------

    def _transmit(self, now: float) -> None:
        """Frame and send what the core's sender has due; the per-packet hot path.

        A flow keeps its Ethernet+IPv4 prefix for the packet length it last
        sent, so a bulk flow packs only its 8-byte UDP header per packet and
        hands the three parts to one scatter-gather send.
        """
        packets = self.tx.poll(now)
        if not packets:
            return
        flows = self._tx_flows
        sendmsg = self.link.sock.sendmsg
        spray = self.config.spray
        rng = self._sport_rng
        for pkt in packets:
            flow = flows.get(int.from_bytes(pkt[4:8], "big"))
            if flow is None:
                self.counters["tx_unknown_flow"] += 1
                continue
            sport = _SPORT_BASE | rng.getrandbits(14) if spray else flow.sport
            size = len(pkt)
            if size != flow.prefix_len:
                mac = flow.mac or self._next_hop(flow, now)
                if mac is None:
                    self.neighbors.hold(flow.dst_ip, (flow.dscp, sport, pkt))
                    continue
                flow.prefix = self.builder.ip_prefix(mac, flow.dst_ip, flow.tos, size)
                flow.prefix_len = size
            try:
                sendmsg((flow.prefix, udp_header(sport, size), pkt))
            except OSError:
                self.link.tx_errors += 1
        self.counters["tx_data"] += len(packets)
        self.counters["tx_data_bytes"] += sum(len(pkt) for pkt in packets) - FTH_LEN * len(packets)

    def _next_hop(self, flow: _TxFlow, now: float) -> bytes | None:
        flow.mac = self.neighbors.resolve(flow.dst_ip, now)
        return flow.mac

    def _release(self, ip: bytes, mac: bytes, packets: list[Held]) -> None:
        for dscp, sport, pkt in packets:
            self.link.send(self.builder.headers(mac, ip, dscp, ECN_ECT0, sport, len(pkt)), pkt)

    # ----- receiving ---------------------------------------------------------------------

    def _on_frames(self) -> None:
        """Drain the socket before the sender runs again, flushing held ACKs every batch.

        Reading everything first matters after the process was descheduled:
        the ACKs queued meanwhile must be applied before `poll` decides that
        their segments timed out.
        """
        for _ in range(MAX_BATCHES):
            if not self._on_batch():
                break
        now = time.monotonic()
        self._send_replies(self._acks.due(now))
        self._drain_receiver_completions(now)
        self._drain_sender_completions(now)

    def _on_batch(self) -> int:
        counters = self.counters
        rx_flows = self._rx_flows
        offer = self._acks.offer
        frames = self.link.recv_batch(RECV_BATCH)
        for frame in frames:
            now = time.monotonic()
            try:
                arrival = parse(frame)
            except MalformedFrame as exc:
                counters["malformed_frames"] += 1
                self._note_malformed(exc)
                continue
            if arrival is None:
                if not self.neighbors.on_arp(frame):
                    counters["ignored_frames"] += 1
                continue
            if arrival.dst_ip != self.ip:
                counters["not_for_us"] += 1
                continue
            fth = arrival.fth
            if len(fth) < FTH_LEN:
                counters["malformed_frames"] += 1
                continue
            if fth[0] & 0x0F == _DATA:
                counters["rx_data"] += 1
                total = int.from_bytes(fth[12:16], "big")
                for reply in self.rx.receive(fth, arrival.ce, now):
                    self._send_replies(offer(reply, arrival, now, total))
                flow = rx_flows.get(int.from_bytes(fth[4:8], "big"))
                if flow is None:
                    continue
                if flow.first_arrival is None:
                    flow.first_arrival = now
                if fth[1] & _TRIMMED and flow.traffic_class == "gradient":
                    self._check_step(flow.step, "trim")
            else:
                counters["rx_control"] += 1
                try:
                    self.tx.receive(bytes(fth), now)
                except MalformedPacket as exc:
                    counters["malformed_control"] += 1
                    self._note_malformed(exc)
        return len(frames)

    def _send_replies(self, replies: list[tuple[bytes, Arrival]]) -> None:
        """ACK, NACK and CNP go back to the DATA's source address through our own next hop.

        The frame's source MAC is only a fallback: behind a switch it names the
        port the sender addressed, not necessarily the one facing this host.
        """
        headers = self.builder.headers
        send = self.link.send
        known = self.neighbors.known
        for reply, to in replies:
            mac = known(to.src_ip) or to.src_mac
            send(headers(mac, to.src_ip, _CONTROL, ECN_NOT_ECT, to.sport, len(reply)), reply)

    def _note_malformed(self, exc: Exception) -> None:
        if self.counters["malformed_logged"] < 10:
            self.counters["malformed_logged"] += 1
            print(f"forgive-agent: dropped a malformed packet: {exc}", file=sys.stderr)

    # ----- completions, statistics and the bound --------------------------------------

    def _drain_receiver_completions(self, now: float) -> None:
        for flow_id in self.rx.take_completed():
            flow = self._rx_flows.get(flow_id)
            if flow is None:
                continue
            state = dict(self.rx.flow_state(flow_id))
            totals = self._totals[flow.step]
            for key in ("received_bytes", "forgiven_bytes", "trims", "ce_marks", "cnps_sent"):
                totals[f"rx_{key}"] += state.get(key, 0)
            event = {
                "event": "recv_done",
                "flow": flow_id,
                "step": flow.step,
                "traffic_class": flow.traffic_class,
                "duration": now - (flow.first_arrival or now),
                **{k: state[k] for k in _RECV_FIELDS if k in state},
            }
            if flow.traffic_class == "gradient":
                self._check_step(flow.step, "recv_done")
            self.log.write("flow_recv", **event)
            payload = self.rx.payload(flow_id) if flow.deliver else None
            flow.completed = True
            if flow.forget_when_done:
                self.rx.forget_flow(flow_id)
                del self._rx_flows[flow_id]
            self._emit(event, payload)

    def _drain_sender_completions(self, now: float) -> None:
        for flow_id in self.tx.take_completed():
            flow = self._tx_flows.pop(flow_id, None)
            if flow is None:
                continue
            state = dict(self.tx.flow_state(flow_id))
            self.tx.close_flow(flow_id)
            totals = self._totals[flow.step]
            for key in ("retransmitted_bytes", "cnps", "nacks", "rtos", "mode_changes"):
                totals[f"tx_{key}"] += state.get(key, 0)
            event = {
                "event": "send_done",
                "flow": flow_id,
                "step": flow.step,
                "dst": ip_text(flow.dst_ip),
                "bytes": flow.size,
                "duration": now - flow.started,
                **{k: state[k] for k in _SEND_FIELDS if k in state},
            }
            self.log.write("flow_send", **event)
            self._emit(event, None)

    def _emit_shed(self, kind: str, flow_id: int, step: int, size: int | None) -> None:
        event = {"event": kind, "flow": flow_id, "step": step, "shed": True, "bytes": size}
        self.log.write("flow_shed", **event)
        self._emit(event, None)

    def _emit(self, event: dict[str, Any], payload: bytes | None) -> None:
        for listener in self.listeners:
            listener(event, payload)

    def _check_step(self, step: int, where: str) -> dict[str, Any]:
        """Recheck the note's bound for `step` from the core's state; count and shout on failure."""
        state = self.rx.step_state(step)
        if state is None:
            return {}
        problem = bound_violation(state, self.policy.vesting)
        if problem:
            self.counters["bound_violations"] += 1
            message = f"BOUND VIOLATION at {where}, step {step}: {problem}"
            print(f"forgive-agent: {message}", file=sys.stderr)
            self.log.write("bound_violation", step=step, where=where, problem=problem)
        return state

    def _shed(self, step: int, flow_id: int) -> bool:
        if not self.policy.shed:
            return False
        info = self._steps.get(step)
        if info is None:
            raise ValueError(f"step {step} was never begun")
        return is_shed(self.policy, self.config.seed, step, flow_id, info.critical)


_RECV_FIELDS = (
    "total",
    "received_bytes",
    "forgiven_bytes",
    "trims",
    "ce_marks",
    "cnps_sent",
    "exemption_eligible",
)
_SEND_FIELDS = (
    "acked_bytes",
    "sent_bytes",
    "sent_packets",
    "retransmitted_bytes",
    "cc_mode",
    "rate_bps",
    "cnps",
    "cnps_ignored",
    "nacks",
    "rtos",
    "rate_cuts",
    "mode_changes",
    "exempt_time",
)


def _tighten_timer_slack() -> None:
    """Ask the kernel to wake us within a microsecond of a timeout, not its default 50 us.

    Pacing a 4 KiB packet at 1 Gbit/s leaves 33 us between packets, so the
    default slack alone would halve the rate. Best effort: without prctl
    (another OS) the loop still works, only with coarser pacing.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)


def _check_class(traffic_class: str) -> None:
    if traffic_class not in TRAFFIC_CLASSES:
        raise ValueError(
            f"unknown traffic class {traffic_class!r} (known: {', '.join(TRAFFIC_CLASSES)})"
        )
