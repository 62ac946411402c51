"""One host's transport endpoint, sans-IO: the core's sender and receiver behind one interface.

Modelled on aioquic's `QuicConnection`: datagrams go in with `receive`,
come out of `datagrams_to_send`, one `get_timer` says when `handle_timer`
must run, and `next_event` hands the application typed events
(`host_agent.events`). Nothing here owns a socket or reads a clock; the
callers pass `now`.

Above the core it keeps what only the host knows: which step each flow
belongs to and in which traffic class, the shedding baselines' draw, the ACK
coalescing of `host_agent.acks`, per-step totals for the statistics, and the
independent recheck of the loss bound (`host_agent.stats`). Peers are IPv4
addresses as 4 bytes; replies go back to the address a DATA packet came from.
"""

from __future__ import annotations

import math
import socket
import sys
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Final

from common import records
from common.frames import ip_bytes
from common.wire import (
    FTH_LEN,
    MAX_DSCP,
    PACKET_BYTES,
    Dscp,
    Flag,
    MalformedPacket,
    Opcode,
    peek,
)
from host_agent.acks import ACK_DELAY, ACK_DELAY_PER_RTO, ACK_EVERY, AckCoalescer
from host_agent.core import (
    CONTROLS,
    DEFAULT_CONTROL,
    DEFAULT_PROFILE,
    PROFILES,
    DcqcnParams,
    ForgiveReceiver,
    ForgiveSender,
    NsccParams,
    ReceiverPolicy,
    StepState,
    TxFlowState,
)
from host_agent.core.sender import MAX_TIMEOUTS
from host_agent.events import (
    BoundViolation,
    Event,
    FlowFailed,
    RecvDone,
    SendDone,
    Shed,
    record,
)
from host_agent.policies import DEFAULT_POLICY, POLICY_NAMES, Policy, is_shed, parse_policy
from host_agent.stats import (
    StatsLog,
    bound_violation,
    budget_violation,
    completion_violation,
    loss_budget,
)
from host_agent.timebins import TimeBins

TRAFFIC_CLASSES: Final[dict[str, Dscp]] = {
    "gradient": Dscp.GRADIENT,
    "tensor-parallel": Dscp.TENSOR_PARALLEL,
    "pipeline-parallel": Dscp.PIPELINE_PARALLEL,
    "other": Dscp.OTHER,
}
_DATA: Final = int(Opcode.DATA)
_TRIMMED: Final = int(Flag.TRIMMED)
_CONTROL: Final = int(Dscp.CONTROL)
_FLOW_RECORDS: Final[dict[type, str]] = {
    RecvDone: records.FLOW_RECV,
    SendDone: records.FLOW_SEND,
    Shed: records.FLOW_SHED,
}
"""The record kind of each flow event; the others are recorded under their own kind."""
UNLOCATED: Final = "unlocated"
"""Where a trimmed header whose DSCP names no location is counted."""

NSCC_ACK_EVERY: Final = 1
"""An ACK per packet under NSCC, as uet-htsim's receiver sends them: a window of a few packets
(the simulator's fabric at bytes / 128 holds about seven) would otherwise wait out the ACK
delay on every round trip, and NSCC's increases and decreases are per ACK."""

Datagram = tuple[bytes, int, int, bytes]
"""(peer, DSCP, flow id, FTH bytes) of one packet to send."""
TRIM_BIN_S: Final = 1e-6
"""The first width, in fabric seconds, of the bins a step's trims are counted in (they widen
as the step goes on; host_agent.timebins)."""
TRIM_FIELDS: Final = ("trimmed_bytes", "gradient_trimmed_bytes", "forgiven_bytes")
"""What `Endpoint.trim_profile` counts per part of a step, in this order."""


def _about(text: str, flag: str | None = None) -> dict[str, str]:
    """A setting's field metadata: the help of its command-line flag (`forgive-agent`,
    `forgive-train`, generated from these fields with each field's default), and the flag's
    name where it is not the field's."""
    return {"help": text} if flag is None else {"help": text, "flag": flag}


@dataclass(frozen=True)
class EndpointConfig:
    """The endpoint's settings. `to_dict` / `from_dict` are its JSON form (a run plan's
    host entry); the agents' command lines have one flag per field (commands.agent)."""

    policy: Policy = field(
        default_factory=lambda: parse_policy(DEFAULT_POLICY),
        metadata=_about(f"one of {', '.join(POLICY_NAMES)}"),
    )
    seed: int = field(default=0, metadata=_about("shared seed of every random draw"))
    line_rate_bps: float = field(
        default=10e9, metadata=_about("DCQCN line rate in bit/s", "--line-rate")
    )
    rto: float = field(default=0.01, metadata=_about("initial retransmission timeout, s"))
    """Initial retransmission timeout. Not one RTT (tens of microseconds on a veth) but a few
    scheduler time slices: a Python receiver sharing a busy core can pause that long, and a
    shorter timeout then resends data that was only waiting. Trims never wait for it."""
    rto_max: float = field(default=0.2, metadata=_about("largest backed-off RTO, s"))
    max_timeouts: int = field(
        default=MAX_TIMEOUTS,
        metadata=_about("timeouts in a row without progress before a flow fails"),
    )
    """Timeouts in a row without progress after which a flow fails (FlowFailed)."""
    time_scale: float = field(
        default=1.0,
        metadata=_about("emulation slowdown against the modelled fabric; stretches DCQCN's timers"),
    )
    """How many times slower than the fabric it stands for the emulation runs (DCQCN's
    periods, the receiver's CNP interval and the ACK hold time stretch by it)."""
    keep_payload: bool = field(
        default=True,
        metadata=_about(
            "keep no received bytes (flows cannot be delivered; saves memory and copies)",
            "--no-payload",
        ),
    )
    """False: the receiver keeps no flow bytes (no `deliver`), for runs that only time flows."""
    ack_every: int | None = field(
        default=None,
        metadata=_about("ACKs coalesced per flow (default: the congestion control's own)"),
    )
    """ACKs coalesced per flow; None: the congestion control's own (ACK_EVERY under DCQCN,
    NSCC_ACK_EVERY under NSCC, whose window moves with every ACK)."""
    trim_locations: Mapping[int, str] = field(
        default_factory=dict,
        metadata=_about(
            "trimmed headers arriving with DSCP were trimmed at LOCATION (host: the last hop,"
            " fabric: inside it), as the switches' asymmetric trim DSCP sets (repeatable)",
            "--trim-dscp",
        ),
    )
    """DSCP -> where a trimmed header with that DSCP was trimmed ("host": on the last hop,
    "fabric": inside the fabric), as the switches' asymmetric trim DSCP says. Every
    trimmed header received is counted under its location (`rx_trims_<location>`, and
    `rx_trims_unlocated` for a DSCP not listed); empty: trims are not located."""
    dcqcn: str = field(
        default=DEFAULT_PROFILE,
        metadata=_about(f"DCQCN profile (docs/dcqcn.md): {' or '.join(PROFILES)}"),
    )
    """The DCQCN profile (host_agent.core.dcqcn.PROFILES) of the sender and the notification point."""
    cc: str = field(
        default=DEFAULT_CONTROL,
        metadata=_about(f"congestion control (docs/nscc.md): {' or '.join(CONTROLS)}"),
    )
    """The sender's congestion control (host_agent.core.CONTROLS): DCQCN's rate, or NSCC's
    window (docs/nscc.md). The receiver's notification point is DCQCN's either way; NSCC
    reads the ECN echo on ACKs and leaves the CNPs unanswered."""
    window_bytes: float = field(
        default=0.0, metadata=_about("sender window per flow at the line rate, bytes; 0: none")
    )
    """The sender's window per flow at the line rate, bytes (0: none; ForgiveSender)."""
    qp_state: bool = field(
        default=False,
        metadata=_about("keep DCQCN's state per peer and traffic class across messages"),
    )
    """Keep DCQCN's state per peer and traffic class across messages, as a NIC's QP does."""
    payload_bytes: int = field(default=PACKET_BYTES, metadata=_about("DATA bytes per packet"))
    """The most DATA bytes per packet."""
    cnp_per_mark: bool = field(
        default=False, metadata=_about("a CNP for every marked packet, not the profile's pacing")
    )
    """The notification point answers every CE mark with a CNP (cnp_interval 0), as ns-3's
    receiver flags every ACK of a marked packet; False: the DCQCN profile's pacing."""

    def validate(self) -> None:
        """Raise ValueError on the first bad setting."""
        for dscp, where in self.trim_locations.items():
            if not isinstance(dscp, int) or not 0 <= dscp <= MAX_DSCP:
                raise ValueError(f"trim location DSCP {dscp!r} is not in 0..{MAX_DSCP}")
            if not isinstance(where, str) or not where.isidentifier() or where == UNLOCATED:
                raise ValueError(f"trim location {where!r} is not a name")
        if self.line_rate_bps <= 0:
            raise ValueError("line rate must be positive")
        if not 0 < self.rto <= self.rto_max:
            raise ValueError("need 0 < rto <= rto_max")
        if self.time_scale <= 0:
            raise ValueError("time scale must be positive")
        if self.ack_every is not None and self.ack_every < 1:
            raise ValueError("ack_every must be >= 1")
        if self.max_timeouts < 1:
            raise ValueError("max timeouts must be >= 1")
        if self.dcqcn not in PROFILES:
            raise ValueError(f"unknown DCQCN profile {self.dcqcn!r} (known: {', '.join(PROFILES)})")
        if self.cc not in CONTROLS:
            raise ValueError(
                f"unknown congestion control {self.cc!r} (known: {', '.join(CONTROLS)})"
            )
        if not (math.isfinite(self.window_bytes) and self.window_bytes >= 0):
            raise ValueError(
                f"window must be a finite number of bytes >= 0, got {self.window_bytes}"
            )
        if not 1 <= self.payload_bytes <= PACKET_BYTES:
            raise ValueError(
                f"payload must lie in 1..{PACKET_BYTES} bytes, got {self.payload_bytes}"
            )

    def to_dict(self) -> dict[str, Any]:
        """The configuration as JSON values (the policy by its name, DSCPs as text): how a
        run plan hands it to a trainer process, which reads it back with `from_dict`."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["policy"] = self.policy.name
        out["trim_locations"] = {str(dscp): where for dscp, where in self.trim_locations.items()}
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> EndpointConfig:
        """Build and validate a configuration from `to_dict`'s form; ValueError names an
        unknown setting or one of the wrong type."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"unknown endpoint setting(s) {', '.join(unknown)}")
        given = dict(values)
        policy = given.pop("policy", DEFAULT_POLICY)
        locations = given.pop("trim_locations", {})
        if not isinstance(policy, str):
            raise ValueError(f"endpoint setting policy = {policy!r} is not a policy name")
        if not isinstance(locations, dict) or not all(
            isinstance(d, str) and d.isdecimal() for d in locations
        ):
            raise ValueError(f"endpoint setting trim_locations = {locations!r} is not DSCP -> name")
        for name, value in given.items():
            default = known[name].default
            kind = int if default is None else type(default)
            fits = (
                (value is None and default is None)
                or (isinstance(value, bool) == (kind is bool) and isinstance(value, kind))
                or (kind is float and isinstance(value, int) and not isinstance(value, bool))
            )
            if not fits:
                raise ValueError(f"endpoint setting {name} = {value!r} is not {kind.__name__}")
        config = cls(
            policy=parse_policy(policy),
            trim_locations={int(d): where for d, where in locations.items()},
            **given,
        )
        config.validate()
        return config


class _Sending:
    """A message being sent (plain, not a dataclass: common.native)."""

    def __init__(self, peer: bytes, dscp: int, step: int | None, size: int, started: float) -> None:
        self.peer = peer
        self.dscp = dscp
        self.step = step
        self.size = size
        self.started = started


class _Receiving:
    """A message being received (plain, not a dataclass: common.native)."""

    def __init__(self, step: int, traffic_class: str, deliver: bool) -> None:
        self.step = step
        self.traffic_class = traffic_class
        self.deliver = deliver
        self.peer: bytes | None = None
        """Where the flow's DATA comes from: replies the receiver makes unprompted go there."""
        self.first_arrival: float | None = None
        self.completed = False
        self.forget_when_done = False
        self.trimmed_bytes = 0
        """Bytes of the flow's DATA that reached this host as trimmed headers (the length
        fields)."""


@dataclass(slots=True)
class _Step:
    """What the workload declared about a step, kept apart from the core's own copy."""

    critical: bool
    expected: int
    p: float
    budget: int
    """floor(p * expected), computed here rather than read from the core."""
    trims: TimeBins | None
    """When the step's trimmed headers arrived (TRIM_FIELDS), from `begin_step` on; None once
    the step is forgotten."""
    open_gradient_flows: int = 0
    shed: int = 0
    """Gradient bytes of this step shed at registration (they never come)."""
    unsized_shed: bool = False
    """A shed flow of unknown size: the step's byte count cannot be checked."""


class Endpoint:
    """The host-local interface of the note (begin_step, register_flow, send, complete_step)
    plus the datagram interface of a sans-IO connection."""

    def __init__(
        self,
        config: EndpointConfig | None = None,
        log: StatsLog | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        config = config or EndpointConfig()
        config.validate()
        self.config = config
        self.policy = config.policy
        self.log = log or StatsLog(None, "")
        self.warn = warn or _stderr
        p_low, p_high = self.policy.receiver_probabilities
        dcqcn = DcqcnParams.for_profile(config.dcqcn, config.line_rate_bps, config.time_scale)
        self.rx = ForgiveReceiver(
            ReceiverPolicy(
                p_low=p_low,
                p_high=p_high,
                forgive_prob=self.policy.forgive_prob,
                seed=config.seed,
                vesting=self.policy.vesting,
                exemption=self.policy.exemption,
                **{
                    **dcqcn.receiver_fields(),
                    **({"cnp_interval": 0.0} if config.cnp_per_mark else {}),
                },
            )
        )
        cc = (
            NsccParams.for_link(config.line_rate_bps, config.time_scale)
            if config.cc == "nscc"
            else dcqcn
        )
        self.tx = ForgiveSender(
            cc,
            rto=config.rto,
            rto_max=config.rto_max,
            max_timeouts=config.max_timeouts,
            window_bytes=config.window_bytes,
            qp_state=config.qp_state,
            payload_bytes=config.payload_bytes,
        )
        # A held ACK must never outlast the peer's first timeout: at a fabric's own rates
        # (the simulator) that timeout is microseconds, far below the emulation's ACK_DELAY.
        ack_delay = min(ACK_DELAY * config.time_scale, config.rto / ACK_DELAY_PER_RTO)
        every = config.ack_every
        if every is None:
            every = NSCC_ACK_EVERY if config.cc == "nscc" else ACK_EVERY
        self.acks = AckCoalescer(every, ack_delay)
        self.counters: Counter = Counter()
        self._trim_keys = {
            dscp: f"rx_trims_{where}" for dscp, where in config.trim_locations.items()
        }
        """DSCP -> the counter its trimmed headers go to; every one starts at 0, so a run
        whose fabric trimmed nowhere near a host says so."""
        if self._trim_keys:
            for key in (*self._trim_keys.values(), f"rx_trims_{UNLOCATED}"):
                self.counters[key] = 0
        self._sending: dict[int, _Sending] = {}
        self._receiving: dict[int, _Receiving] = {}
        self._steps: dict[int, _Step] = {}
        self._totals: defaultdict[int | None, Counter] = defaultdict(Counter)
        """Per step (None: flows sent without one), sums over the flows this host finished."""
        self._replies: list[tuple[bytes, bytes]] = []
        """(reply, peer) ready to go out, in the order the coalescer released them."""
        self._events: deque[Event] = deque()

    # ----- the host-local interface -------------------------------------------------

    def begin_step(
        self, step: int, critical: bool, expected_gradient_bytes: int, now: float
    ) -> None:
        """Open a step's loss budget; call before any of its flows are registered."""
        if step in self._steps:
            raise ValueError(f"step {step} already begun")
        if expected_gradient_bytes < 0:
            raise ValueError("expected gradient bytes must be >= 0")
        p_low, p_high = self.policy.receiver_probabilities
        p = p_low if critical else p_high
        expected = expected_gradient_bytes
        trims = TimeBins(now, TRIM_BIN_S * self.config.time_scale, len(TRIM_FIELDS))
        self._steps[step] = _Step(critical, expected, p, loss_budget(p, expected), trims)
        self.rx.begin_step(step, critical=critical, expected_bytes=expected_gradient_bytes)
        self.log.write(
            "step_begin", now, step=step, critical=critical, expected=expected_gradient_bytes
        )
        self._check_step(step, "begin_step", now)

    def register_flow(
        self,
        flow_id: int,
        step: int,
        traffic_class: str,
        now: float,
        deliver: bool = False,
        size: int | None = None,
    ) -> None:
        """Expect a flow from a peer. `deliver` hands its bytes over in its RecvDone event.

        Under a shedding policy a gradient message the shared draw sheds is
        never sent, so it completes here at once as shed (`size` reports how
        many bytes that was).
        """
        _check_class(traffic_class)
        if deliver and not self.config.keep_payload:
            raise ValueError("this agent keeps no payloads (--no-payload), so it cannot deliver")
        if flow_id in self._receiving:
            raise ValueError(f"flow {flow_id} is already registered")
        if size is not None and size <= 0:
            raise ValueError(f"flow size must be positive, got {size}")
        gradient = traffic_class == "gradient"
        if gradient and self._shed(step, flow_id):
            self._totals[step]["rx_shed_bytes"] += size or 0
            info = self._steps[step]
            info.shed += size or 0
            info.unsized_shed |= size is None
            self._emit(Shed(flow_id, step, size, sending=False), now)
            return
        # Only a flow handed over on completion needs its bytes kept; a known size is
        # the flow's total, whatever a packet claims.
        self.rx.register_flow(
            flow_id, step=step, gradient=gradient, keep_payload=deliver, size=size
        )
        self._receiving[flow_id] = _Receiving(step, traffic_class, deliver)
        opened = self._steps.get(step)
        if gradient and opened is not None:
            opened.open_gradient_flows += 1

    def send(
        self,
        dst: str,
        flow_id: int,
        data: bytes | memoryview,
        traffic_class: str,
        now: float,
        step: int | None = None,
    ) -> None:
        """Start sending `data` as flow `flow_id`; a SendDone event follows its last ACK."""
        _check_class(traffic_class)
        if flow_id in self._sending:
            raise ValueError(f"flow {flow_id} is already being sent")
        if not data:
            raise ValueError("a flow carries at least one byte")
        peer = ip_bytes(dst)
        if traffic_class == "gradient" and step is not None and self._shed(step, flow_id):
            self._totals[step]["tx_shed_bytes"] += len(data)
            self._emit(Shed(flow_id, step, len(data), sending=True), now)
            return
        self.tx.open_flow(
            flow_id, len(data), now=now, data=data, peer=peer, qp=(peer, traffic_class)
        )
        self._sending[flow_id] = _Sending(
            peer, TRAFFIC_CLASSES[traffic_class], step, len(data), now
        )

    def complete_step(self, step: int, now: float) -> None:
        """Close a step's loss budget (the note's OnAllReduceComplete) and log its totals.

        The record holds the core's gradient accounting for the step (p,
        budget, expected, received, forgiven, outstanding) beside totals over
        every flow of the step this host finished so far: `rx_*` for flows it
        received (all classes), `tx_*` for flows it sent (shed ones included).
        """
        info = self._steps.get(step)
        if info is None:
            raise ValueError(f"step {step} was never begun")
        self.rx.complete_step(step)
        self._check_step(step, "complete_step", now)
        state = self.rx.step_state(step)
        assert state is not None  # begun in the core with the host's own record of it
        self.log.write(
            "step", now, step=step, critical=info.critical, **asdict(state), **self._totals[step]
        )

    def forget_step(self, step: int) -> None:
        """Drop the receive state of a finished step's flows once no sender can still need it.

        A flow of that step still arriving (a background burst) is dropped when it completes.
        The step's trim profile goes too.
        """
        info = self._steps.get(step)
        if info is not None:
            info.trims = None
        for flow_id, flow in list(self._receiving.items()):
            if flow.step != step:
                continue
            if flow.completed:
                self._forget(flow_id)
            else:
                flow.forget_when_done = True

    def trim_profile(self, step: int, start: float, end: float, parts: int = 5) -> list[list[int]]:
        """Per equal part of [start, end), the step's trimmed headers as TRIM_FIELDS: bytes
        trimmed from any flow of the step, from its gradient flows, and of those the bytes
        the receiver forgave at once. Trims before `start` count in the first part."""
        info = self._steps.get(step)
        if info is None or info.trims is None:
            raise ValueError(f"step {step} was never begun or is forgotten")
        return info.trims.split(start, end, parts)

    def step_state(self, step: int) -> StepState:
        state = self.rx.step_state(step)
        if state is None:
            raise ValueError(f"step {step} was never begun")
        return state

    def step_problem(self, step: int) -> str | None:
        """What the host's checks find wrong with `step` now, or None (nothing is counted)."""
        state = self.rx.step_state(step)
        info = self._steps.get(step)
        if state is None or info is None:
            return None
        problems = [
            bound_violation(state, self.policy.vesting),
            budget_violation(state, info.p, info.expected, info.budget),
        ]
        if not state.open and info.open_gradient_flows == 0 and not info.unsized_shed:
            problems.append(completion_violation(state, info.expected, info.shed))
        return "; ".join(p for p in problems if p) or None

    # ----- datagrams, timers and events ---------------------------------------------------

    def receive(
        self, datagram: bytes | memoryview, peer: bytes, ce: bool, now: float, dscp: int = 0
    ) -> None:
        """One FTH packet from `peer` (DATA for the receiver, feedback for the sender), with
        the DSCP it arrived with (which, on a trimmed header, says where it was trimmed)."""
        counters = self.counters
        try:
            opcode, flags, _, flow_id, _, total = peek(datagram)
        except MalformedPacket:
            counters["malformed_frames"] += 1
            return
        if opcode != _DATA:
            counters["rx_control"] += 1
            self.tx.receive(datagram, now)
            self._drain_sender(now)
            return
        counters["rx_data"] += 1
        flow = self._receiving.get(flow_id)
        trimmed = flags & _TRIMMED and flow is not None
        if trimmed:
            before = self.rx.forgiven_bytes(flow_id)
        replies = self.rx.receive(datagram, ce, now)
        if replies:
            offer, out = self.acks.offer, self._replies
            for reply in replies:
                out.extend(offer(reply, peer, now, total))
        located = flags & _TRIMMED and self._trim_keys
        if located:
            key = self._trim_keys.get(dscp, f"rx_trims_{UNLOCATED}")
            counters[key] += 1
        if flow is not None:
            if flow.first_arrival is None:
                flow.first_arrival = now
            flow.peer = peer
            if located:
                self._totals[flow.step][key] += 1
            if trimmed:
                self._count_trim(flow, datagram, self.rx.forgiven_bytes(flow_id) - before, now)
        self._drain_receiver(now)

    def _count_trim(
        self, flow: _Receiving, datagram: bytes | memoryview, forgiven: int, now: float
    ) -> None:
        """A trimmed header of a registered flow: its bytes for the flow and the step's
        profile, and the step's bound rechecked if it was gradient."""
        length = peek(datagram)[2]
        flow.trimmed_bytes += length
        gradient = flow.traffic_class == "gradient"
        info = self._steps.get(flow.step)
        if info is not None and info.trims is not None:
            info.trims.add(now, length, length if gradient else 0, forgiven)
        if gradient:
            self._check_step(flow.step, "trim", now)

    def datagrams_to_send(self, now: float, data: bool = True) -> list[Datagram]:
        """Replies released so far, then (unless `data` is False) the DATA due by `now`.

        Asking for DATA runs the sender's timers too (a timed-out segment is due again).
        """
        out: list[Datagram] = [(peer, _CONTROL, 0, reply) for reply, peer in self._replies]
        self._replies = []
        if not data:
            return out
        packets = self.tx.poll(now)
        if packets:
            sending = self._sending
            nbytes = 0
            for pkt in packets:
                flow_id = peek(pkt)[3]
                flow = sending.get(flow_id)
                if flow is None:
                    self.counters["tx_unknown_flow"] += 1
                    continue
                out.append((flow.peer, flow.dscp, flow_id, pkt))
                nbytes += len(pkt) - FTH_LEN
            self.counters["tx_data"] += len(packets)
            self.counters["tx_data_bytes"] += nbytes
        self._drain_sender(now)  # a timeout may have ended a flow
        return out

    def get_timer(self) -> float | None:
        """The earliest time `handle_timer` (or `datagrams_to_send`) has work, or None."""
        best = self.tx.next_deadline()
        acks = self.acks.deadline() if self.acks.held else None
        if acks is not None and (best is None or acks < best):
            best = acks
        cnps = self.rx.next_deadline()
        if cnps is not None and (best is None or cnps < best):
            best = cnps
        return best

    def handle_timer(self, now: float) -> None:
        """Release held ACKs and CNPs that are due; the sender's timers run in
        `datagrams_to_send`, which every driver calls after this."""
        if self.acks.held:
            self._replies.extend(self.acks.due(now))
        for cnp in self.rx.poll(now):
            flow = self._receiving.get(peek(cnp)[3])
            if flow is not None and flow.peer is not None:
                # A CNP releases the flow's held ACK first, as one from `receive` does.
                self._replies.extend(self.acks.offer(cnp, flow.peer, now, 0))

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    def summary(self) -> dict[str, Any]:
        """The host's counters, totals over every finished flow and the cores' own counts."""
        return {
            "policy": self.policy.name,
            **self.counters,
            **sum(self._totals.values(), Counter()),
            "acks_coalesced": self.acks.coalesced,
            "core_rx": asdict(self.rx.stats),
            "core_tx": asdict(self.tx.stats),
            "rx_rejected": dict(self.rx.rejected),
            "tx_rejected": dict(self.tx.rejected),
        }

    # ----- completions, statistics and the bound ----------------------------------------

    def _emit(self, event: Event, now: float) -> None:
        self._events.append(event)
        kind = _FLOW_RECORDS.get(type(event))
        if kind is None:
            kind = event.kind
        self.log.write(kind, now, **record(event))

    def _drain_receiver(self, now: float) -> None:
        for flow_id in self.rx.take_completed():
            flow = self._receiving.get(flow_id)
            if flow is None:
                continue
            state = self.rx.flow_state(flow_id)
            assert state is not None and state.total is not None  # complete, so sized
            totals = self._totals[flow.step]
            totals["rx_received_bytes"] += state.received_bytes
            totals["rx_forgiven_bytes"] += state.forgiven_bytes
            totals["rx_trims"] += state.trims
            totals["rx_ce_marks"] += state.ce_marks
            totals["rx_cnps_sent"] += state.cnps_sent
            event = RecvDone(
                flow=flow_id,
                step=flow.step,
                traffic_class=flow.traffic_class,
                duration=now - (flow.first_arrival or now),
                total=state.total,
                received_bytes=state.received_bytes,
                forgiven_bytes=state.forgiven_bytes,
                trims=state.trims,
                ce_marks=state.ce_marks,
                cnps_sent=state.cnps_sent,
                exemption_eligible=state.exemption_eligible,
                trimmed_bytes=flow.trimmed_bytes,
                forgiven_ranges=(
                    tuple(self.rx.forgiven_ranges(flow_id)) if state.forgiven_bytes else ()
                ),
                payload=self.rx.payload(flow_id) if flow.deliver else None,
            )
            flow.completed = True
            if flow.traffic_class == "gradient":
                info = self._steps.get(flow.step)
                if info is not None:
                    info.open_gradient_flows -= 1
                self._check_step(flow.step, "recv_done", now)
            self._emit(event, now)
            if flow.forget_when_done:
                self._forget(flow_id)

    def _drain_sender(self, now: float) -> None:
        for flow_id in self.tx.take_failed():
            closed = self._close_sending(flow_id)
            if closed is None:
                continue
            flow, state = closed
            self.counters["flows_failed"] += 1
            totals = self._totals[flow.step]
            totals["tx_failed_flows"] += 1
            self._add_sent(totals, state)
            dst = socket.inet_ntoa(flow.peer)
            reason = (
                f"{self.config.max_timeouts} retransmission timeout rounds in a row,"
                f" {state.acked_bytes} of {flow.size} bytes acknowledged"
            )
            self._emit(
                FlowFailed(
                    flow_id, flow.step, dst, flow.size, state.acked_bytes, state.rtos, reason
                ),
                now,
            )
        for flow_id in self.tx.take_completed():
            closed = self._close_sending(flow_id)
            if closed is None:
                continue
            flow, state = closed
            self._add_sent(self._totals[flow.step], state)
            self._emit(
                SendDone(
                    flow=flow_id,
                    step=flow.step,
                    dst=socket.inet_ntoa(flow.peer),
                    bytes=flow.size,
                    duration=now - flow.started,
                    acked_bytes=state.acked_bytes,
                    sent_bytes=state.sent_bytes,
                    sent_packets=state.sent_packets,
                    retransmitted_bytes=state.retransmitted_bytes,
                    cc_mode=state.cc_mode,
                    rate_bps=state.rate_bps,
                    cnps=state.cnps,
                    cnps_ignored=state.cnps_ignored,
                    nacks=state.nacks,
                    rtos=state.rtos,
                    rate_cuts=state.rate_cuts,
                    mode_changes=state.mode_changes,
                    exempt_time=state.exempt_time,
                    obeying_again_time=state.obeying_again_time,
                    rtt_max=state.rtt_max,
                    late_acks=state.late_acks,
                    mark_cuts=state.mark_cuts,
                    below_line_s=state.below_line_s,
                    window=state.window,
                ),
                now,
            )

    def _close_sending(self, flow_id: int) -> tuple[_Sending, TxFlowState] | None:
        """A flow the sender finished or gave up, closed in the core: (the flow, its final
        state), or None where it is not one of ours."""
        flow = self._sending.pop(flow_id, None)
        if flow is None:
            return None
        state = self.tx.flow_state(flow_id)
        assert state is not None
        self.tx.close_flow(flow_id)
        return flow, state

    @staticmethod
    def _add_sent(totals: Counter, state: TxFlowState) -> None:
        """A closed flow's sender counts, into its step's totals."""
        totals["tx_retransmitted_bytes"] += state.retransmitted_bytes
        totals["tx_cnps"] += state.cnps
        totals["tx_nacks"] += state.nacks
        totals["tx_rtos"] += state.rtos
        totals["tx_mode_changes"] += state.mode_changes

    def _forget(self, flow_id: int) -> None:
        self.rx.forget_flow(flow_id)
        self.acks.forget(flow_id)
        del self._receiving[flow_id]

    def _check_step(self, step: int, where: str, now: float) -> None:
        """Recheck `step` independently of the core's own guards; count and report a failure."""
        problem = self.step_problem(step)
        if problem:
            self.counters["bound_violations"] += 1
            self.warn(f"BOUND VIOLATION at {where}, step {step}: {problem}")
            self._emit(BoundViolation(step, where, problem), now)

    def _shed(self, step: int, flow_id: int) -> bool:
        if not self.policy.shed:
            return False
        info = self._steps.get(step)
        if info is None:
            raise ValueError(f"step {step} was never begun")
        return is_shed(self.policy, self.config.seed, step, flow_id, info.critical)


def _stderr(message: str) -> None:
    print(f"forgive-agent: {message}", file=sys.stderr)


def _check_class(traffic_class: str) -> None:
    if traffic_class not in TRAFFIC_CLASSES:
        raise ValueError(
            f"unknown traffic class {traffic_class!r} (known: {', '.join(TRAFFIC_CLASSES)})"
        )
