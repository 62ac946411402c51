"""What a host endpoint tells the application: one frozen dataclass per kind of event.

`Endpoint.next_event()` returns these, in the order they happened; the local
API turns them into JSON lines, the training rank reacts to them directly.
`record()` is the JSON form, shared by the statistics log and the local API.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from functools import cache
from typing import Any

from common import records
from host_agent.core.sender import WindowState


@dataclass(frozen=True, slots=True)
class SendDone:
    """Every byte of a flow this host sent was acknowledged (delivered or forgiven)."""

    flow: int
    step: int | None
    dst: str
    bytes: int
    duration: float
    """From `send` to the last ACK."""
    acked_bytes: int
    sent_bytes: int
    sent_packets: int
    retransmitted_bytes: int
    cc_mode: str
    rate_bps: float
    cnps: int
    cnps_ignored: int
    nacks: int
    rtos: int
    rate_cuts: int
    mode_changes: int
    exempt_time: float
    obeying_again_time: float = 0.0
    """Time spent obeying congestion control after the flow's exemption first began."""
    rtt_max: float = 0.0
    """The longest round trip sampled from a segment sent once."""
    late_acks: int = 0
    """Resent segments acknowledged too soon to be the resend: the earlier copy was late,
    not lost."""
    mark_cuts: int = 0
    """Of `rate_cuts`, those that answered an ECN mark rather than a trim alone."""
    below_line_s: float = 0.0
    """Time the flow's DCQCN rate was below the line rate while it was open."""
    window: WindowState | None = None
    """NSCC only (recorded only then): the flow's window, its bound, base round trip and
    smoothed queueing delay when it ended."""

    kind = "send_done"


@dataclass(frozen=True, slots=True)
class RecvDone:
    """A registered flow is settled: every byte received or forgiven."""

    flow: int
    step: int
    traffic_class: str
    duration: float
    """From the flow's first packet to its last."""
    total: int
    received_bytes: int
    forgiven_bytes: int
    trims: int
    ce_marks: int
    cnps_sent: int
    exemption_eligible: bool
    trimmed_bytes: int = 0
    """Bytes of the flow that arrived as trimmed headers (their length fields)."""
    forgiven_ranges: tuple[tuple[int, int], ...] = ()
    """The byte ranges forgiven (zero-filled in `payload`), for the run's loss record."""
    payload: bytes | None = None
    """The flow's bytes, forgiven ranges zero-filled, when it was registered to deliver."""

    kind = "recv_done"


@dataclass(frozen=True, slots=True)
class Shed:
    """A gradient message a shedding policy dropped before it was sent (both ends agree)."""

    flow: int
    step: int
    bytes: int | None
    sending: bool
    """True at the sender (the message never left), False at the receiver (it never comes)."""

    @property
    def kind(self) -> str:
        return "send_done" if self.sending else "recv_done"


@dataclass(frozen=True, slots=True)
class FlowFailed:
    """A flow this host sent gave up after too many consecutive retransmission timeouts."""

    flow: int
    step: int | None
    dst: str
    bytes: int
    acked_bytes: int
    rtos: int
    reason: str

    kind = records.FLOW_FAILED


@dataclass(frozen=True, slots=True)
class BoundViolation:
    """The host's own recheck of a step's accounting failed; reported, never corrected."""

    step: int
    where: str
    problem: str

    kind = records.BOUND_VIOLATION


Event = SendDone | RecvDone | Shed | FlowFailed | BoundViolation


def record(event: Event) -> dict[str, Any]:
    """The event as the JSON object the local API sends (without the payload bytes)."""
    out: dict[str, Any] = {"event": event.kind}
    for name, when_set in _recorded(type(event)):
        value = getattr(event, name)
        if when_set:
            if value is None:
                continue
            value = asdict(value)
        out[name] = value
    if isinstance(event, Shed):
        out["shed"] = True
    return out


@cache
def _recorded(kind: type) -> tuple[tuple[str, bool], ...]:
    """The fields `record` writes for an event class, in order, each with whether it is
    written only when set: worked out once per class, since a run records every flow twice."""
    return tuple(
        (f.name, f.name in _RECORDED_WHEN_SET) for f in fields(kind) if f.name not in _NOT_RECORDED
    )


_NOT_RECORDED = frozenset(("payload", "sending"))
_RECORDED_WHEN_SET = frozenset(("window",))
"""Fields a record has only when they hold a value (a state dataclass, recorded as its JSON
object), so runs without them record as before."""
