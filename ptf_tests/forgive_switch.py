"""PTF suite for the FORGIVE switch: one file for every target (test param `target`).

Targets differ by architecture the way fabric-tna's suite handles it: the
target class says "v1model" or "tna", and the few tests whose expectations
differ branch on `self.is_tna` (docs/tofino.md): a TNA program gets its own
control calls (p4rt_tna), counts FCS bytes, and on tofino-model trims what
--dod-test-mode deflects rather than what a paced queue overflows.

Every test pushes the pipeline afresh (which zeroes registers and counters),
installs its own entries, sends packets built with the project's scapy FTH
layer and compares what comes out byte for byte. Tests that need a standing
queue throttle the port's low-priority queue: BMv2 paces a queue from the time
its previous packet was scheduled, so after one "plug" packet has left, the
packets of a burst sent right behind it stay queued until the next slot and
see exactly the occupancy the burst builds up.
"""

from __future__ import annotations

import ptf
from ptf import testutils
from ptf.base_tests import BaseTest
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw

from common.wire import (
    DATA_FRAME_LEN,
    ETH_LEN,
    FORGIVE_UDP_PORT,
    IPV4_LEN,
    PACKET_BYTES,
    TRIMMED_FRAME_LEN,
    Dscp,
    Flag,
    Opcode,
)
from controller.session import SwitchSession
from controller.tna_session import TnaSwitchSession
from host_agent.scapy_layer import FTH
from ptf_tests.targets import PRIO_LOW, TARGETS, Endpoint
from switch_model.surface import Thresholds

SWITCH_MAC = "00:00:5e:00:53:01"
HOST_MAC = "02:00:00:00:00:01"
SRC_IP = "10.0.1.1"
ECT0, NOT_ECT, CE = 2, 0, 3
THROTTLED_PPS = 5
"""Low-queue drain rate while a test needs a standing queue: one slot every 0.2 s,
far longer than the switch takes to take in a burst."""
FCS_BYTES = 4
"""Tofino's counters count the frame check sequence; BMv2's and the model's do not."""
DOD_PERIOD = 10
"""tofino-model --dod-test-mode deflects every tenth packet sent with deflect_on_drop."""


def nhop_mac(port: int) -> str:
    return f"02:00:00:00:0{port}:0{port}"


def fth_packet(
    dst: str,
    *,
    sport: int = 49152,
    opcode: Opcode = Opcode.DATA,
    payload_len: int = PACKET_BYTES,
    seq: int = 0,
    ecn: int = ECT0,
    ttl: int = 64,
    src: str = SRC_IP,
    dscp: int | None = None,
) -> Packet:
    """A FORGIVE packet as a host agent sends it (UDP checksum 0, DSCP by class: gradient
    DATA unless `dscp` says otherwise)."""
    data = opcode == Opcode.DATA
    if dscp is None:
        dscp = Dscp.GRADIENT if data else Dscp.CONTROL
    fth = FTH(
        opcode=opcode,
        flags=0 if data else int(Flag.ELIGIBLE),
        length=payload_len,
        flow_id=7,
        seq=seq,
        aux=1 << 20 if data else 0,
    )
    payload = bytes((seq + i) & 0xFF for i in range(payload_len)) if data else b""
    return (
        Ether(dst=SWITCH_MAC, src=HOST_MAC)
        / IP(src=src, dst=dst, tos=(dscp << 2) | (ecn if data else NOT_ECT), ttl=ttl, id=seq)
        / UDP(sport=sport, dport=FORGIVE_UDP_PORT, chksum=0)
        / fth
        / Raw(payload)
    )


def udp_packet(dst: str, frame_len: int, *, ident: int = 0) -> Packet:
    """A non-FTH UDP packet of exactly `frame_len` bytes on the wire."""
    head = (
        Ether(dst=SWITCH_MAC, src=HOST_MAC)
        / IP(src=SRC_IP, dst=dst, id=ident)
        / UDP(sport=40000, dport=5000)
    )
    return head / Raw(bytes(frame_len - len(head)))


def routed(pkt: Packet, port: int) -> Packet:
    """`pkt` as set_nhop forwards it towards `port`: MACs rewritten, TTL down, checksum fixed."""
    out = Ether(bytes(pkt))
    out[Ether].src = out[Ether].dst
    out[Ether].dst = nhop_mac(port)
    out[IP].ttl -= 1
    del out[IP].chksum
    return Ether(bytes(out))


def ce_marked(pkt: Packet) -> Packet:
    out = Ether(bytes(pkt))
    out[IP].tos = (out[IP].tos & ~0x3) | CE
    del out[IP].chksum
    return Ether(bytes(out))


def trimmed(
    pkt: Packet, port: int, size: int = TRIMMED_FRAME_LEN, dscp: int | None = None
) -> Packet:
    """What a trim to `size` bytes (58 by default: the headers alone) leaves of DATA `pkt`
    routed towards `port`, with its DSCP rewritten to `dscp` if given."""
    out = routed(pkt, port)
    out[FTH].flags = int(out[FTH].flags) | Flag.TRIMMED
    kept = min(len(out), size)
    out = Ether(bytes(out)[:kept])
    out[IP].len = kept - ETH_LEN
    out[UDP].len = kept - ETH_LEN - IPV4_LEN
    out[UDP].chksum = 0
    if dscp is not None:
        out[IP].tos = dscp << 2 | int(out[IP].tos) & 0x3
    del out[IP].chksum
    out = Ether(bytes(out))
    assert len(out) == kept
    return out


class ForgiveTest(BaseTest):
    """Connects to the target named by the test params and pushes the pipeline."""

    def setUp(self) -> None:
        BaseTest.setUp(self)
        self.dataplane = ptf.dataplane_instance
        self.dataplane.flush()
        params = testutils.test_params_get()
        endpoint = Endpoint(
            netns=params["netns"],
            ports={},
            grpc_port=int(params["grpc_port"]),
            aux_port=int(params["aux_port"]),
        )
        target = TARGETS[params["target"]]
        self.target = target(endpoint)
        self.is_tna = target.arch == "tna"
        config = (endpoint.grpc_addr, params["p4info"], params["device_config"])
        self.switch = (
            TnaSwitchSession(*config, self.target) if self.is_tna else SwitchSession(*config)
        )
        self.throttled: list[tuple[int, int]] = []
        self.pps = THROTTLED_PPS

    def tearDown(self) -> None:
        for port, priority in self.throttled:
            self.target.set_queue_rate(port, 0, priority)
        # a failed test can leave packets queued on their old schedule: let them out
        # here rather than into the next test
        while self.throttled and isinstance(
            testutils.dp_poll(self, timeout=1.5 / self.pps), self.dataplane.PollSuccess
        ):
            pass
        self.switch.close()
        BaseTest.tearDown(self)

    def needs_paced_queues(self) -> None:
        """Skip where the target cannot hold a standing queue by draining it slowly."""
        if self.is_tna:
            self.skipTest(
                "tofino-model does not pace queues; DeflectTrimTest covers trimming on TNA"
            )

    def align_deflections(self, port: int, dst: str) -> None:
        """On tofino-model, send not-ECT DATA to managed `port` (routed to by `dst`)
        until --dod-test-mode deflects one: the next DOD_PERIOD - 1 packets sent with
        deflect_on_drop go through, whatever earlier tests sent."""
        if not self.is_tna:
            return
        for i in range(DOD_PERIOD):
            pkt = fth_packet(dst, seq=(1 << 30) + i * PACKET_BYTES, ecn=NOT_ECT)
            self.send(1, pkt)
            (got,) = self.receive(port, 1)
            if got == bytes(trimmed(pkt, port)):
                return
            self.assertEqual(got, bytes(routed(pkt, port)))
        self.fail(f"no trimmed header in {DOD_PERIOD} DATA packets")

    def wire_bytes(self, *frames: Packet) -> int:
        """What port_tx adds for these frames on this target."""
        return sum(len(f) + (FCS_BYTES if self.is_tna else 0) for f in frames)

    def throttle(self, port: int, pps: int = THROTTLED_PPS, priority: int = PRIO_LOW) -> None:
        self.target.set_queue_rate(port, pps, priority)
        self.throttled.append((port, priority))
        self.pps = pps

    def send(self, port: int, pkt: Packet) -> None:
        testutils.send_packet(self, port, pkt)

    def receive(self, port: int, count: int) -> list[bytes]:
        """The next `count` packets out of `port`, in order; fails if any never comes."""
        got = []
        for i in range(count):
            res = testutils.dp_poll(self, port_number=port, timeout=2 + count / self.pps)
            self.assertIsInstance(
                res, self.dataplane.PollSuccess, f"packet {i} of {count} never left port {port}"
            )
            got.append(bytes(res.packet))
        return got

    def expect_sequence(self, port: int, expected: list[Packet]) -> None:
        """The next packets out of `port`, in this order and byte for byte."""
        for i, (got, exp) in enumerate(
            zip(self.receive(port, len(expected)), expected, strict=True)
        ):
            self.assertEqual(
                got.hex(),
                bytes(exp).hex(),
                f"packet {i} out of port {port} differs:\n"
                f"got      {Ether(got).summary()}\nexpected {exp.summary()}",
            )

    def plug(self, port: int, pkt: Packet) -> Packet:
        """Send one packet through the throttled `port` and wait for it: the queue is
        empty and its next slot a full period (1/pps) away."""
        self.send(1, pkt)
        out = routed(pkt, port)
        self.expect_sequence(port, [out])
        return out


class RoutingTest(ForgiveTest):
    """LPM picks the longest prefix, set_nhop rewrites MACs, TTL and checksum;
    misses and expiring TTLs are dropped."""

    def runTest(self) -> None:
        self.switch.route("10.0.2.0/24", nhop_mac(2), 2)
        self.switch.route("10.0.2.5/32", nhop_mac(3), 3)
        wide = fth_packet("10.0.2.9")
        narrow = fth_packet("10.0.2.5", sport=50000)
        icmp = Ether(dst=SWITCH_MAC, src=HOST_MAC) / IP(src=SRC_IP, dst="10.0.2.77") / ICMP()
        for pkt, port in ((wide, 2), (narrow, 3), (icmp, 2)):
            self.send(1, pkt)
            testutils.verify_packet(self, routed(pkt, port), port)
        self.send(1, fth_packet("10.9.9.9"))
        self.send(1, fth_packet("10.0.2.9", ttl=1))
        testutils.verify_no_other_packets(self)

        c2, c3 = self.switch.port_counters(2), self.switch.port_counters(3)
        self.assertEqual((c2.tx_packets, c2.tx_bytes), (2, self.wire_bytes(wide, icmp)))
        self.assertEqual((c3.tx_packets, c3.tx_bytes), (1, self.wire_bytes(narrow)))
        self.assertEqual(c2.drops, 1, "the TTL-1 packet counts as a drop at its egress port")
        self.assertEqual((c2.trims, c2.ce_marks), (0, 0))


class EcmpTest(ForgiveTest):
    """One sprayed flow (source port per packet) spreads over every member, and a
    given 5-tuple always takes the same member."""

    def runTest(self) -> None:
        members = [(nhop_mac(p), p) for p in (2, 3, 4)]
        self.switch.route_ecmp("10.0.9.0/24", 7, members)
        chosen: dict[int, int] = {}
        for sport in range(49152, 49152 + 48):
            pkt = fth_packet("10.0.9.1", sport=sport, payload_len=64)
            self.send(1, pkt)
            res = testutils.dp_poll(self, timeout=2)
            self.assertIsInstance(res, self.dataplane.PollSuccess, f"sport {sport} not forwarded")
            self.assertIn(res.port, (2, 3, 4))
            self.assertEqual(bytes(res.packet), bytes(routed(pkt, res.port)))
            chosen[sport] = res.port
        self.assertEqual(set(chosen.values()), {2, 3, 4}, f"members used: {chosen}")
        for sport in (49152, 49170, 49199):
            pkt = fth_packet("10.0.9.1", sport=sport, payload_len=64)
            self.send(1, pkt)
            testutils.verify_packet(self, routed(pkt, chosen[sport]), chosen[sport])
        testutils.verify_no_other_packets(self)
        out = sum(self.switch.port_counters(p).tx_packets for p in (2, 3, 4))
        self.assertEqual(out, len(chosen) + 3)


class EcnMarkingTest(ForgiveTest):
    """ECT DATA below ecn_kmin and in a band with ecn_pmax 0 stays unmarked, at or
    above ecn_kmax it is marked; not-ECT DATA is never marked."""

    def runTest(self) -> None:
        self.needs_paced_queues()
        self.switch.route("10.0.2.0/24", nhop_mac(2), 2)
        s = DATA_FRAME_LEN
        self.switch.set_thresholds(2, Thresholds(100 * s, 2 * s, 3 * s, 0))
        self.throttle(2)
        plug = self.plug(2, fth_packet("10.0.2.9", seq=0))
        ecns = [ECT0, ECT0, ECT0, ECT0, NOT_ECT, ECT0]
        burst = [
            fth_packet("10.0.2.9", seq=(i + 1) * PACKET_BYTES, ecn=e) for i, e in enumerate(ecns)
        ]
        for pkt in burst:
            self.send(1, pkt)
        # occupancy seen by burst[i] is i full frames: kmin at i=2, kmax at i=3
        marked = {3, 5}
        expected = [
            ce_marked(routed(p, 2)) if i in marked else routed(p, 2) for i, p in enumerate(burst)
        ]
        self.expect_sequence(2, expected)
        testutils.verify_no_other_packets(self)
        c = self.switch.port_counters(2)
        self.assertEqual(c.ce_marks, len(marked))
        self.assertEqual((c.tx_packets, c.tx_bytes), (1 + len(burst), len(plug) + len(burst) * s))
        self.assertEqual((c.trims, c.drops), (0, 0))


class EcnBandTest(ForgiveTest):
    """Between ecn_kmin and ecn_kmax the mark is drawn per packet: with the marking
    probability between 0.5 and 0.95 across a burst, some packets are marked and
    some are not, and the counter agrees with what came out."""

    def runTest(self) -> None:
        self.needs_paced_queues()
        self.switch.route("10.0.2.0/24", nhop_mac(2), 2)
        s = DATA_FRAME_LEN
        self.switch.set_thresholds(2, Thresholds(100 * s, 0, 4 * s, 65536))
        self.throttle(2, pps=10)
        self.plug(2, fth_packet("10.0.2.9", ecn=NOT_ECT))
        # two unmarkable full frames hold the occupancy at 2 frames (probability 0.5);
        # 30 small ECT packets then climb towards 4 frames
        prefill = [fth_packet("10.0.2.9", seq=i * PACKET_BYTES, ecn=NOT_ECT) for i in (1, 2)]
        small = [fth_packet("10.0.2.9", seq=i * 200, payload_len=200) for i in range(30)]
        for pkt in [*prefill, *small]:
            self.send(1, pkt)
        got = self.receive(2, len(prefill) + len(small))
        self.assertEqual(got[:2], [bytes(routed(p, 2)) for p in prefill])
        marked = 0
        for i, (out, pkt) in enumerate(zip(got[2:], small, strict=True)):
            plain, ce = bytes(routed(pkt, 2)), bytes(ce_marked(routed(pkt, 2)))
            self.assertIn(out, (plain, ce), f"small packet {i} altered beyond ECN")
            marked += out == ce
        self.assertTrue(0 < marked < len(small), f"{marked} of {len(small)} marked")
        testutils.verify_no_other_packets(self)
        self.assertEqual(self.switch.port_counters(2).ce_marks, marked)


class TrimPriorityTest(ForgiveTest):
    """DATA that does not fit data_queue_bytes leaves as a 58-byte trimmed header on
    the high queue; trimmed headers and an ACK overtake the data queued before them."""

    def runTest(self) -> None:
        self.needs_paced_queues()
        self.switch.route("10.0.2.0/24", nhop_mac(2), 2)
        s = DATA_FRAME_LEN
        self.switch.set_thresholds(2, Thresholds(3 * s, s, 2 * s, 65536))
        self.throttle(2)
        plug = self.plug(2, fth_packet("10.0.2.9", seq=0, ecn=NOT_ECT))
        burst = [fth_packet("10.0.2.9", seq=(i + 1) * PACKET_BYTES, ecn=NOT_ECT) for i in range(5)]
        ack = fth_packet("10.0.2.9", opcode=Opcode.ACK, payload_len=PACKET_BYTES, seq=4096)
        for pkt in [*burst, ack]:
            self.send(1, pkt)
        # burst[0..2] fill the queue to exactly 3 frames; burst[3], burst[4] do not fit
        expected = [
            trimmed(burst[3], 2),
            trimmed(burst[4], 2),
            routed(ack, 2),
            *(routed(p, 2) for p in burst[:3]),
        ]
        self.expect_sequence(2, expected)
        testutils.verify_no_other_packets(self)
        c = self.switch.port_counters(2)
        self.assertEqual(c.trims, 2)
        self.assertEqual(c.tx_packets, 1 + len(burst) + 1)
        # port_tx counts bytes as received (see docs/dataplane.md): trims count full size
        self.assertEqual(c.tx_bytes, len(plug) + len(burst) * s + len(ack))
        self.assertEqual((c.drops, c.ce_marks), (0, 0))


class NonFthDropTest(ForgiveTest):
    """A non-FTH packet that does not fit the data queue is dropped, never trimmed."""

    def runTest(self) -> None:
        self.needs_paced_queues()
        self.switch.route("10.0.2.0/24", nhop_mac(2), 2)
        s = 1500
        self.switch.set_thresholds(2, Thresholds(3 * s, 0, 0, 65536))
        self.throttle(2)
        self.plug(2, udp_packet("10.0.2.9", s, ident=99))
        burst = [udp_packet("10.0.2.9", s, ident=i) for i in range(5)]
        for pkt in burst:
            self.send(1, pkt)
        self.expect_sequence(2, [routed(p, 2) for p in burst[:3]])
        testutils.verify_no_other_packets(self)
        c = self.switch.port_counters(2)
        self.assertEqual((c.tx_packets, c.tx_bytes), (4, 4 * s))
        self.assertEqual((c.drops, c.trims, c.ce_marks), (2, 0, 0))


class DepthMarkTest(ForgiveTest):
    """With ecn_kmin = ecn_kmax = 0 every ECT DATA packet is marked, even into an
    empty queue; not-ECT DATA and control never are; with thresholds beyond any
    queue nothing is. Needs no paced queue, so it runs on every target."""

    def runTest(self) -> None:
        self.switch.route("10.0.2.0/24", nhop_mac(2), 2)
        self.switch.route("10.0.3.0/24", nhop_mac(3), 3)
        self.switch.set_thresholds(2, Thresholds(100 * DATA_FRAME_LEN, 0, 0, 0))
        far = 50 * DATA_FRAME_LEN
        self.switch.set_thresholds(3, Thresholds(100 * DATA_FRAME_LEN, far, far, 65536))
        self.align_deflections(2, "10.0.2.9")
        before = self.switch.port_counters(2).ce_marks
        sent = [
            (fth_packet("10.0.2.9", seq=0), 2, True),
            (fth_packet("10.0.2.9", seq=PACKET_BYTES, ecn=NOT_ECT), 2, False),
            (fth_packet("10.0.2.9", opcode=Opcode.ACK, payload_len=0), 2, False),
            (fth_packet("10.0.3.9", seq=0), 3, False),
        ]
        for pkt, port, marked in sent:
            self.send(1, pkt)
            out = routed(pkt, port)
            self.expect_sequence(port, [ce_marked(out) if marked else out])
        testutils.verify_no_other_packets(self)
        self.assertEqual(self.switch.port_counters(2).ce_marks - before, 1)
        self.assertEqual(self.switch.port_counters(3).ce_marks, 0)


class DeflectTrimTest(ForgiveTest):
    """tofino-model --dod-test-mode deflects every tenth packet sent with
    deflect_on_drop (every low-queue packet to a managed port): the deflected
    DATA leaves its port as its 58-byte trimmed header, deflected non-FTH
    traffic is dropped and counted, the other nine go through untouched."""

    def runTest(self) -> None:
        if not self.is_tna:
            self.skipTest("deflect-on-drop test mode is tofino-model's")
        self.switch.route("10.0.2.0/24", nhop_mac(2), 2)
        self.switch.set_thresholds(
            2, Thresholds(100 * DATA_FRAME_LEN, 50 * DATA_FRAME_LEN, 50 * DATA_FRAME_LEN, 0)
        )
        self.align_deflections(2, "10.0.2.9")
        before = self.switch.port_counters(2)
        burst = [fth_packet("10.0.2.9", seq=i * PACKET_BYTES) for i in range(DOD_PERIOD)]
        for pkt in burst:
            self.send(1, pkt)
        got = self.receive(2, DOD_PERIOD)
        expected = [bytes(routed(p, 2)) for p in burst[:-1]] + [bytes(trimmed(burst[-1], 2))]
        self.assertEqual(sorted(got), sorted(expected))
        others = [udp_packet("10.0.2.9", 1000, ident=i) for i in range(DOD_PERIOD)]
        for pkt in others:
            self.send(1, pkt)
        self.expect_sequence(2, [routed(p, 2) for p in others[:-1]])
        testutils.verify_no_other_packets(self)
        after = self.switch.port_counters(2)
        self.assertEqual(after.trims - before.trims, 1)
        self.assertEqual(after.drops - before.drops, 1)
        self.assertEqual(after.tx_packets - before.tx_packets, 2 * DOD_PERIOD - 1)
        self.assertEqual(
            after.tx_bytes - before.tx_bytes,
            self.wire_bytes(*burst[:-1], trimmed(burst[-1], 2), *others[:-1]),
        )
