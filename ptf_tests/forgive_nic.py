"""PTF suite for the FORGIVE NIC (p4src/pna/forgive_nic.p4 on BMv2 pna_nic): the NIC against the
receiver core.

Every test feeds one packet sequence both to the NIC and to the Python receiver core
(host_agent.core.ForgiveReceiver) under the same ReceiverPolicy, steps and flows, and
checks packet by packet: a trimmed header the NIC decides leaves its network port as the
core's reply (ACK or NACK, with its flags), framed as the host agent frames it, byte for
byte; a full DATA, and any packet the NIC leaves to the host, leaves the host port
unchanged; and after every packet the NIC's registers (received, forgiven, outstanding,
rcv_nxt) equal the core's state. The core draws what the NIC drew (the flow's last_draw
register), so P = 0.5 decides alike on both.

The tests are outside PTF's standard group: the harness runs them, as the module
`forgive_nic`, on the pna_nic target only (ptf_tests/pna_nic.py).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import ptf
from ptf import testutils
from ptf.base_tests import BaseTest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from common.frames import FrameBuilder, ip_bytes, mac_bytes
from common.wire import (
    ECN_CE,
    ECN_ECT0,
    ECN_NOT_ECT,
    FORGIVE_UDP_PORT,
    FTH_LEN,
    HEADERS_LEN,
    PACKET_BYTES,
    Dscp,
    Flag,
    Opcode,
)
from controller.nic import FORGIVE_PROB_ONE, NicReceiverControl
from host_agent.core import ForgiveReceiver, ReceiverPolicy
from host_agent.host import SPORT_BASE
from host_agent.scapy_layer import FTH
from ptf_tests.pna_nic import HOST_PORT, NETWORK_PORT

NIC_MAC = "02:00:00:00:00:0a"
NIC_IP = "10.0.2.2"
PEER_MAC = "00:00:5e:00:53:01"
"""The last hop's MAC: a DATA's source address, and the reply's destination."""
PEER_IP = "10.0.1.1"
POLL_SECONDS = 2.0


def data_frame(
    flow_id: int,
    seq: int,
    length: int,
    total: int,
    *,
    trimmed: bool = False,
    ecn: int = ECN_ECT0,
    version: int = 1,
) -> bytes:
    """A gradient DATA as it reaches the receiver: whole, or trimmed to its 58 header bytes."""
    fth = FTH(
        version=version,
        opcode=Opcode.DATA,
        flags=int(Flag.TRIMMED) if trimmed else 0,
        length=length,
        flow_id=flow_id,
        seq=seq,
        aux=total,
    )
    payload = b"" if trimmed else bytes((seq + i) & 0xFF for i in range(length))
    return bytes(
        Ether(dst=NIC_MAC, src=PEER_MAC)
        / IP(src=PEER_IP, dst=NIC_IP, tos=(Dscp.GRADIENT << 2) | ecn, flags="DF", ttl=63)
        / UDP(sport=SPORT_BASE | 7, dport=FORGIVE_UDP_PORT, chksum=0)
        / fth
        / Raw(payload)
    )


def framed_reply(reply: bytes) -> bytes:
    """The core's reply as the host agent would send it back to the DATA's sender."""
    builder = FrameBuilder(mac_bytes(NIC_MAC), ip_bytes(NIC_IP))
    head = builder.headers(
        mac_bytes(PEER_MAC), ip_bytes(PEER_IP), Dscp.CONTROL, ECN_NOT_ECT, SPORT_BASE, FTH_LEN
    )
    return head + reply


class NicDraws(random.Random):
    """The core's draw source: the draw the NIC took for the flow last, as a fraction."""

    def __init__(self) -> None:
        super().__init__(0)
        self.nic: NicReceiverControl | None = None
        self.flow_id = 0

    def random(self) -> float:
        assert self.nic is not None
        return self.nic.flow_state(self.flow_id)["last_draw"] / FORGIVE_PROB_ONE


@dataclass
class Outcome:
    """What one packet made: the NIC's port and bytes, and the core's replies."""

    port: int
    frame: bytes
    replies: list[bytes]


class NicTest(BaseTest):
    """Connects to the NIC, resets it, and runs sequences into it and the core side by side."""

    policy = ReceiverPolicy(p_low=0.005, p_high=0.1, forgive_prob=1.0)

    def setUp(self) -> None:
        BaseTest.setUp(self)
        self.dataplane = ptf.dataplane_instance
        self.dataplane.flush()
        params = testutils.test_params_get()
        self.aux_port = int(params["aux_port"])
        self.start(self.policy)

    def start(self, policy: ReceiverPolicy) -> None:
        """Both sides afresh under `policy`."""
        if getattr(self, "nic", None) is not None:
            self.nic.close()
        self.nic = NicReceiverControl(self.aux_port, policy)
        self.nic.reset()
        self.nic.set_ports(NETWORK_PORT, HOST_PORT)
        self.draws = NicDraws()
        self.draws.nic = self.nic
        self.core = ForgiveReceiver(policy, rng=self.draws)
        self.now = 0.0
        self.sizes: dict[int, int] = {}
        self.replies_seen: list[bytes] = []
        self.handed_steps: set[int] = set()
        """Steps with a flow the host holds: their counters are the host's from then on."""

    def tearDown(self) -> None:
        self.nic.close()
        BaseTest.tearDown(self)

    # -- both sides at once -------------------------------------------------

    def begin_step(self, step: int, expected: int, critical: bool = False) -> None:
        self.nic.begin_step(step, critical, expected)
        self.core.begin_step(step, critical, expected)

    def register_flow(self, flow_id: int, step: int, size: int) -> None:
        self.nic.register_flow(flow_id, step, size)
        self.core.register_flow(flow_id, step=step, gradient=True, size=size, keep_payload=False)
        self.sizes[flow_id] = size

    def packet(self, frame: bytes, flow_id: int, ce: bool = False) -> Outcome:
        """Into the NIC, then the core (which draws what the NIC drew); what left and why."""
        testutils.send_packet(self, NETWORK_PORT, frame)
        res = testutils.dp_poll(self, timeout=POLL_SECONDS)
        self.assertIsInstance(res, self.dataplane.PollSuccess, "the NIC sent nothing")
        self.draws.flow_id = flow_id
        self.now += 1e-3
        replies = self.core.receive(frame[HEADERS_LEN:], ce=ce, now=self.now)
        return Outcome(res.port, bytes(res.packet), replies)

    def decided(self, flow_id: int, seq: int, length: int) -> bytes:
        """A trimmed header the NIC decides: its reply is the core's, framed, byte for byte.
        Returns the reply's FTH."""
        out = self.packet(
            data_frame(flow_id, seq, length, self.sizes[flow_id], trimmed=True), flow_id
        )
        self.assertEqual(len(out.replies), 1, "the core made no single reply")
        self.assertEqual(out.port, NETWORK_PORT, "the NIC left a decidable trim to the host")
        self.assertEqual(out.frame.hex(), framed_reply(out.replies[0]).hex())
        self.assert_same_state(flow_id)
        fth = out.frame[HEADERS_LEN:]
        self.replies_seen.append(fth)
        return fth

    def delivered(self, flow_id: int, seq: int, length: int) -> None:
        """A full DATA: to the host unchanged, with the step's counters moved as the core's."""
        frame = data_frame(flow_id, seq, length, self.sizes[flow_id])
        out = self.packet(frame, flow_id)
        self.assertEqual((out.port, out.frame), (HOST_PORT, frame))
        self.assert_same_state(flow_id)

    def handed_over(self, frame: bytes, flow_id: int, ce: bool = False) -> None:
        """A packet the NIC leaves to the host: out of the host port unchanged, the flow's
        slot marked as the host's from now on."""
        out = self.packet(frame, flow_id, ce)
        self.assertEqual((out.port, out.frame.hex()), (HOST_PORT, frame.hex()))
        self.assertEqual(self.nic.flow_state(flow_id)["state"], "host")
        self.handed_steps.add(self.core.flow_state(flow_id).step)

    def assert_same_state(self, flow_id: int) -> None:
        core_flow = self.core.flow_state(flow_id)
        step = core_flow.step
        core_step = self.core.step_state(step)
        nic_step = self.nic.step_state(step)
        # once the host holds one of the step's flows, the NIC no longer sees its bytes
        keys = (
            ("open",)
            if step in self.handed_steps
            else ("received", "forgiven", "outstanding", "open")
        )
        for key in keys:
            self.assertEqual(nic_step[key], getattr(core_step, key), f"step {step} {key}")
        self.assertEqual(self.nic.flow_state(flow_id)["rcv_nxt"], core_flow.rcv_nxt)

    def fill(self, flow_id: int, start: int, count: int) -> int:
        """`count` full DATA of PACKET_BYTES from `start`; returns the next offset."""
        for i in range(count):
            self.delivered(flow_id, start + i * PACKET_BYTES, PACKET_BYTES)
        return start + count * PACKET_BYTES


def opcode(fth: bytes) -> Opcode:
    return Opcode(fth[0] & 0x0F)


def flags(fth: bytes) -> Flag:
    return Flag(fth[1])


@testutils.nonstandard
class VestingBoundTest(NicTest):
    """Trims on each side of forgiven + len <= p/(1-p) * received (p = 0.1: nine received
    bytes vest one): at equality the range vests, one byte more does not."""

    def runTest(self) -> None:
        self.begin_step(1, expected=64 * PACKET_BYTES)
        self.register_flow(5, 1, 32 * PACKET_BYTES)
        seq = self.fill(5, 0, 9)  # received 36864 = 9 * 4096
        self.assertEqual(opcode(self.decided(5, seq, PACKET_BYTES)), Opcode.ACK)
        seq += PACKET_BYTES
        self.assertEqual(opcode(self.decided(5, seq, 1)), Opcode.NACK)  # 4097 > 36864 / 9
        self.delivered(5, seq, 1)  # the retransmission closes the hole
        self.delivered(5, seq + 1, 8)  # received 36873 = 9 * 4097
        seq += 9
        self.assertEqual(opcode(self.decided(5, seq, 1)), Opcode.ACK)
        self.assertEqual(opcode(self.decided(5, seq + 1, 1)), Opcode.NACK)
        self.assertTrue(all(flags(f) == Flag.ELIGIBLE for f in self.replies_seen))


@testutils.nonstandard
class BudgetExhaustionTest(NicTest):
    """EXHAUSTED rises when forgiven + outstanding + one packet passes floor(p * expected)
    and falls when the outstanding range arrives; a range trimmed again is charged once; and
    the step's expected bytes refuse a trim that vesting alone would allow."""

    def runTest(self) -> None:
        self.begin_step(1, expected=20 * PACKET_BYTES)  # budget 8192
        self.register_flow(5, 1, 24 * PACKET_BYTES)
        seq = self.fill(5, 0, 9)
        first = self.decided(5, seq, PACKET_BYTES)  # forgiven 4096: 8192 > 8192 is false
        self.assertEqual((opcode(first), flags(first)), (Opcode.ACK, Flag.ELIGIBLE))
        seq += PACKET_BYTES
        second = self.decided(5, seq, PACKET_BYTES)  # outstanding 4096 as well: exhausted
        exhausted = Flag.ELIGIBLE | Flag.EXHAUSTED
        self.assertEqual((opcode(second), flags(second)), (Opcode.NACK, exhausted))
        self.assertEqual(self.decided(5, seq, PACKET_BYTES), second)  # trimmed again
        self.delivered(5, seq, PACKET_BYTES)  # outstanding back to 0: released
        released = self.decided(5, 0, PACKET_BYTES)  # a late duplicate header: an ACK
        self.assertEqual((opcode(released), flags(released)), (Opcode.ACK, Flag.ELIGIBLE))
        seq = self.fill(5, seq + PACKET_BYTES, 9)  # received 77824: all the step expects
        capped = self.decided(5, seq, PACKET_BYTES)  # vests, but received + forgiven > expected
        self.assertEqual((opcode(capped), flags(capped)), (Opcode.NACK, exhausted))


def run_draws(test: NicTest, forgive_prob: float, trims: int) -> list[Opcode]:
    """With P = `forgive_prob` and p = 0.5, eight received packets vest eight trims; each
    trim is decided by the draw, a refused one is trimmed again (decided afresh), and one
    past vesting is retransmitted whole. Returns the decisions in order."""
    test.start(ReceiverPolicy(p_low=0.005, p_high=0.5, forgive_prob=forgive_prob))
    test.begin_step(1, expected=64 * PACKET_BYTES)
    test.register_flow(5, 1, 64 * PACKET_BYTES)
    seq = test.fill(5, 0, 8)
    decisions = []
    for _ in range(trims):
        decision = opcode(test.decided(5, seq, PACKET_BYTES))
        decisions.append(decision)
        if decision == Opcode.ACK:
            seq += PACKET_BYTES
        elif test.core.step_state(1).forgiven + PACKET_BYTES > test.core.step_state(1).received:
            test.delivered(5, seq, PACKET_BYTES)
            seq += PACKET_BYTES
    return decisions


@testutils.nonstandard
class DrawAlwaysTest(NicTest):
    """P = 1: every trim that vests is forgiven; vesting alone refuses."""

    def runTest(self) -> None:
        decisions = run_draws(self, 1.0, 12)
        self.assertEqual(decisions, [Opcode.ACK] * 8 + [Opcode.NACK, Opcode.ACK] * 2)


@testutils.nonstandard
class DrawNeverTest(NicTest):
    """P = 0: nothing is forgiven; the refused range stays outstanding, charged once."""

    def runTest(self) -> None:
        self.assertEqual(run_draws(self, 0.0, 12), [Opcode.NACK] * 12)
        self.assertEqual(self.nic.step_state(1)["outstanding"], PACKET_BYTES)


@testutils.nonstandard
class DrawHalfTest(NicTest):
    """P = 0.5: the NIC's draws decide both ways, and the core, given the same draws,
    decides each trim as the NIC did (12 fair draws all alike: 2 ** -11)."""

    def runTest(self) -> None:
        decisions = run_draws(self, 0.5, 12)
        self.assertIn(Opcode.ACK, decisions)
        self.assertIn(Opcode.NACK, decisions)


@testutils.nonstandard
class HandOverTest(NicTest):
    """What needs the scoreboard, CE or a closed budget leaves the NIC for the host, and the
    flow with it; other flows and malformed packets pass to the host, no state touched.
    (The core here only keeps pace: once the host holds a flow the NIC's counters no longer
    see its bytes, so states are compared only before the first hand-over.)"""

    def runTest(self) -> None:
        size = 16 * PACKET_BYTES
        self.begin_step(1, expected=64 * PACKET_BYTES)
        for flow_id in (5, 6, 7, 8):
            self.register_flow(flow_id, 1, size)
        # data above a requested hole
        self.fill(6, 0, 1)
        self.assertEqual(opcode(self.decided(6, PACKET_BYTES, PACKET_BYTES)), Opcode.NACK)
        self.handed_over(data_frame(6, 2 * PACKET_BYTES, PACKET_BYTES, size), 6)
        # a trim above a gap (data lost without a trim), and everything after it
        self.fill(5, 0, 2)
        self.handed_over(data_frame(5, 3 * PACKET_BYTES, PACKET_BYTES, size, trimmed=True), 5)
        self.handed_over(data_frame(5, 2 * PACKET_BYTES, PACKET_BYTES, size), 5)
        # a CE-marked trim: its CNP is the host's
        frame = data_frame(7, 0, PACKET_BYTES, size, trimmed=True, ecn=ECN_CE)
        self.handed_over(frame, 7, ce=True)
        # a flow the host did not offload (not gradient)
        self.core.register_flow(9, step=1, gradient=False, size=size, keep_payload=False)
        frame = data_frame(9, 0, PACKET_BYTES, size, trimmed=True)
        out = self.packet(frame, 9)
        self.assertEqual((out.port, out.frame), (HOST_PORT, frame))
        # a malformed header
        before = self.nic.flow_state(8)
        frame = data_frame(8, 0, PACKET_BYTES, size, trimmed=True, version=2)
        out = self.packet(frame, 8)
        self.assertEqual((out.port, out.frame), (HOST_PORT, frame))
        self.assertEqual(self.nic.flow_state(8), before)
        # the step's budget closed
        self.nic.complete_step(1)
        self.core.complete_step(1)
        self.handed_over(data_frame(8, 0, PACKET_BYTES, size, trimmed=True), 8)
