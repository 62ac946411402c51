"""PTF tests of the trimming settings, one knob each, on every v1model target.

Each sets one knob the way the controller does (switch_trimming's default
entry, trim_dscp, trim_queue_limit, trim_eligibility, trim_acl), holds a
standing data queue as the suite's TrimPriorityTest does, and checks every
packet that leaves byte for byte and the SAI counters: trimmed (`trims`),
trimmed and sent (`trim_tx`), trimmed but dropped (`trim_drops`), and
`drops` for what was dropped whole. tofino-model cannot hold a standing
queue, so there they skip; the Deflect* tests at the end check the knobs on
TNA instead, on the packets --dod-test-mode deflects (docs/tofino.md).
"""

from __future__ import annotations

from ptf import testutils
from scapy.layers.inet import IP

from common.wire import DATA_FRAME_LEN, PACKET_BYTES, TRIMMED_FRAME_LEN, Dscp, Opcode
from ptf_tests.forgive_switch import (
    DOD_PERIOD,
    NOT_ECT,
    ForgiveTest,
    fth_packet,
    nhop_mac,
    routed,
    trimmed,
)
from switch_model.port import PRIO_HIGH
from switch_model.surface import SwitchTrimming, Thresholds

S = DATA_FRAME_LEN
NO_MARKING = Thresholds(3 * S, 100 * S, 100 * S, 0)
"""A data queue of three full frames that never marks."""


class TrimSettingsTest(ForgiveTest):
    """Routes 10.0.2.0/24 to port 2 and 10.0.3.0/24 to port 3, both managed."""

    def setUp(self) -> None:
        super().setUp()
        if self.is_tna:
            self.tearDown()  # unittest runs no tearDown after a setUp that skips
            self.needs_paced_queues()
        self.switch.route("10.0.2.0/24", nhop_mac(2), 2)
        self.switch.route("10.0.3.0/24", nhop_mac(3), 3)

    def data(self, i: int, dst: str = "10.0.2.9", **fields):
        """DATA number `i` of a flow, not ECT unless `fields` say otherwise."""
        return fth_packet(dst, seq=i * PACKET_BYTES, **{"ecn": NOT_ECT, **fields})

    def fill(self, port: int, dst: str) -> list:
        """Throttle `port`, let a plug through, and send three full frames: its data
        queue is full; returns the plug and the three, as they will leave."""
        self.switch.set_thresholds(port, NO_MARKING)
        self.throttle(port)
        plug = self.plug(port, self.data(0, dst))
        queued = [self.data(i, dst) for i in (1, 2, 3)]
        for pkt in queued:
            self.send(1, pkt)
        return [plug, *(routed(p, port) for p in queued)]

    def counters_are(self, port: int, **expected: int) -> None:
        c = self.switch.port_counters(port)
        got = {key: getattr(c, key) for key in expected}
        self.assertEqual(got, expected, f"port {port} counters")


class TrimSizeTest(TrimSettingsTest):
    """A 128-byte trim size keeps 70 payload bytes after the FTH, with the lengths of
    what it keeps; a DATA frame shorter than the size keeps all of itself."""

    def runTest(self) -> None:
        self.switch.set_switch_trimming(SwitchTrimming(128, PRIO_HIGH))
        queued = self.fill(2, "10.0.2.9")
        big, small = self.data(4), self.data(5, payload_len=50)
        for pkt in (big, small):
            self.send(1, pkt)
        self.assertEqual((len(trimmed(big, 2, 128)), len(small)), (128, 108))
        self.expect_sequence(2, [trimmed(big, 2, 128), trimmed(small, 2, 128), *queued[1:]])
        testutils.verify_no_other_packets(self)
        self.counters_are(
            2, trims=2, trim_tx=2, trim_drops=0, drops=0, tx_packets=6, tx_bytes=5 * S + 108
        )


class StaticTrimDscpTest(TrimSettingsTest):
    """One trim DSCP for every port (the default entry): every trimmed packet gets it,
    its ECN bits kept; packets that were not trimmed keep their own."""

    def runTest(self) -> None:
        self.switch.set_trim_dscp(Dscp.CONTROL)
        queued = self.fill(2, "10.0.2.9")
        over = [self.data(4, ecn=2), self.data(5, dscp=Dscp.TENSOR_PARALLEL)]
        for pkt in over:
            self.send(1, pkt)
        expected = [trimmed(p, 2, dscp=Dscp.CONTROL) for p in over]
        self.assertEqual(int(expected[0][IP].tos) & 0x3, 2, "ECN kept")
        self.expect_sequence(2, [*expected, *queued[1:]])
        testutils.verify_no_other_packets(self)
        self.counters_are(2, trims=2, trim_tx=2, trim_drops=0, drops=0, tx_packets=6)


class AsymmetricTrimDscpTest(TrimSettingsTest):
    """A trim DSCP per egress port: trims leaving port 2 (a host downlink, say) get 3,
    trims leaving port 3 (towards the fabric) get 7."""

    def runTest(self) -> None:
        self.switch.set_trim_dscp(3, port=2)
        self.switch.set_trim_dscp(7, port=3)
        for port, dst, dscp in ((2, "10.0.2.9", 3), (3, "10.0.3.9", 7)):
            queued = self.fill(port, dst)
            over = self.data(4, dst)
            self.send(1, over)
            self.expect_sequence(port, [trimmed(over, port, dscp=dscp), *queued[1:]])
            self.counters_are(port, trims=1, trim_tx=1, trim_drops=0, drops=0, tx_packets=5)
        testutils.verify_no_other_packets(self)


class TrimQueueIndexTest(TrimSettingsTest):
    """Queue index 0 sends trimmed headers to the data queue: they leave behind the data
    queued before them (an ACK still overtakes all), and they must fit the data queue's
    budget, or they are trimmed but dropped."""

    def runTest(self) -> None:
        self.switch.set_switch_trimming(SwitchTrimming(TRIMMED_FRAME_LEN, 0))
        self.switch.set_thresholds(
            2, Thresholds(3 * S + 2 * TRIMMED_FRAME_LEN, 100 * S, 100 * S, 0)
        )
        self.throttle(2)
        plug = self.plug(2, self.data(0))
        burst = [self.data(i) for i in range(1, 7)]
        ack = fth_packet("10.0.2.9", opcode=Opcode.ACK, payload_len=PACKET_BYTES, seq=4096)
        for pkt in [*burst, ack]:
            self.send(1, pkt)
        # burst[0..2] fill 3 frames; burst[3], burst[4] trim into the 2 x 58 bytes left;
        # burst[5] trims but finds no room
        self.expect_sequence(
            2,
            [
                routed(ack, 2),
                *(routed(p, 2) for p in burst[:3]),
                trimmed(burst[3], 2),
                trimmed(burst[4], 2),
            ],
        )
        testutils.verify_no_other_packets(self)
        self.counters_are(
            2,
            trims=3,
            trim_tx=2,
            trim_drops=1,
            drops=0,
            tx_packets=7,
            tx_bytes=len(plug) + 5 * S + len(ack),
        )


class TrimEligibilityTest(TrimSettingsTest):
    """A traffic class whose packet_discard_action is drop is dropped, not trimmed, when
    the data queue is full; other classes still trim."""

    def runTest(self) -> None:
        self.switch.disable_trim_class(Dscp.TENSOR_PARALLEL)
        queued = self.fill(2, "10.0.2.9")
        tp, gradient = self.data(4, dscp=Dscp.TENSOR_PARALLEL), self.data(5)
        for pkt in (tp, gradient):
            self.send(1, pkt)
        self.expect_sequence(2, [trimmed(gradient, 2), *queued[1:]])
        testutils.verify_no_other_packets(self)
        self.counters_are(2, trims=1, trim_tx=1, trim_drops=0, drops=1, tx_packets=5)


class DisableTrimRuleTest(TrimSettingsTest):
    """ACL DISABLE_TRIM rules, on a source prefix and on a DSCP: what they match is
    dropped when the data queue is full, what they do not is trimmed."""

    def runTest(self) -> None:
        self.switch.disable_trim_rule(2, src="10.0.1.7/32")
        self.switch.disable_trim_rule(1, dscp=Dscp.PIPELINE_PARALLEL)
        queued = self.fill(2, "10.0.2.9")
        over = [
            self.data(4, src="10.0.1.7"),
            self.data(5, dscp=Dscp.PIPELINE_PARALLEL),
            self.data(6, src="10.0.1.8"),
        ]
        for pkt in over:
            self.send(1, pkt)
        self.expect_sequence(2, [trimmed(over[2], 2), *queued[1:]])
        testutils.verify_no_other_packets(self)
        self.counters_are(2, trims=1, trim_tx=1, trim_drops=0, drops=2, tx_packets=5)


class TrimmedButDroppedTest(TrimSettingsTest):
    """A high queue bounded to two trimmed headers: while it holds two, further trims are
    dropped and counted as trimmed but dropped; once it drains, trims are sent again."""

    def runTest(self) -> None:
        # every DATA packet overflows a data queue of 0 bytes and is trimmed
        self.switch.set_thresholds(2, Thresholds(0, 100 * S, 100 * S, 0))
        self.switch.set_trim_queue_bytes(2, 2 * TRIMMED_FRAME_LEN)
        self.throttle(2, priority=PRIO_HIGH)
        ack = fth_packet("10.0.2.9", opcode=Opcode.ACK, payload_len=0)
        self.send(1, ack)
        self.expect_sequence(2, [routed(ack, 2)])
        burst = [self.data(i) for i in range(5)]
        for pkt in burst:
            self.send(1, pkt)
        self.expect_sequence(2, [trimmed(burst[0], 2), trimmed(burst[1], 2)])
        testutils.verify_no_other_packets(self)
        self.counters_are(2, trims=5, trim_tx=2, trim_drops=3, drops=0, tx_packets=3)
        after = self.data(5)
        self.send(1, after)
        self.expect_sequence(2, [trimmed(after, 2)])
        self.counters_are(2, trims=6, trim_tx=3, trim_drops=3, drops=0, tx_packets=4)


class DeflectSettingsTest(ForgiveTest):
    """On tofino-model: managed port 2, deflections aligned, so that of the next
    DOD_PERIOD DATA packets the last is the one deflected (forgive_switch.DeflectTrimTest)."""

    def setUp(self) -> None:
        super().setUp()
        if not self.is_tna:
            self.tearDown()
            self.skipTest("deflect-on-drop test mode is tofino-model's")
        self.switch.route("10.0.2.0/24", nhop_mac(2), 2)
        self.switch.set_thresholds(2, NO_MARKING._replace(data_queue_bytes=100 * S))
        self.align_deflections(2, "10.0.2.9")
        self.before = self.switch.port_counters(2)

    def burst(self, **fields) -> list:
        return [
            fth_packet("10.0.2.9", seq=i * PACKET_BYTES, **{"ecn": NOT_ECT, **fields})
            for i in range(DOD_PERIOD)
        ]

    def leaves(self, burst: list, last) -> None:
        """The nine go through; `last` (None: nothing) is what the deflected one becomes."""
        got = self.receive(2, DOD_PERIOD - (last is None))
        expected = [bytes(routed(p, 2)) for p in burst[:-1]]
        self.assertEqual(sorted(got), sorted(expected + ([] if last is None else [bytes(last)])))
        testutils.verify_no_other_packets(self)

    def grew(self, **expected: int) -> None:
        after = self.switch.port_counters(2)
        got = {key: getattr(after, key) - getattr(self.before, key) for key in expected}
        self.assertEqual(got, expected)


class DeflectTrimSizeTest(DeflectSettingsTest):
    """A 128-byte trim size: the deflected DATA leaves as its first 128 bytes."""

    def runTest(self) -> None:
        self.switch.set_switch_trimming(SwitchTrimming(128, PRIO_HIGH))
        burst = self.burst()
        for pkt in burst:
            self.send(1, pkt)
        self.leaves(burst, trimmed(burst[-1], 2, 128))
        self.grew(trims=1, trim_tx=1, trim_drops=0, drops=0)


class DeflectTrimDscpTest(DeflectSettingsTest):
    """A trim DSCP for port 2: the trimmed header gets it, the nine keep theirs."""

    def runTest(self) -> None:
        self.switch.set_trim_dscp(7, port=2)
        burst = self.burst()
        for pkt in burst:
            self.send(1, pkt)
        self.leaves(burst, trimmed(burst[-1], 2, dscp=7))
        self.grew(trims=1, trim_tx=1, drops=0)


class DeflectIneligibleTest(DeflectSettingsTest):
    """A class that may not trim, and a DISABLE_TRIM rule: the deflected packet is
    dropped whole and counted, not trimmed."""

    def runTest(self) -> None:
        self.switch.disable_trim_class(Dscp.TENSOR_PARALLEL)
        burst = self.burst(dscp=Dscp.TENSOR_PARALLEL)
        for pkt in burst:
            self.send(1, pkt)
        self.leaves(burst, None)
        self.grew(trims=0, drops=1)
        self.switch.disable_trim_rule(1, src="10.0.1.7/32")
        burst = self.burst(src="10.0.1.7")
        for pkt in burst:
            self.send(1, pkt)
        self.leaves(burst, None)
        self.grew(trims=0, drops=2)
