"""PTF tests of the trimming settings, one knob each, on every v1model target.

Each sets one knob the way the controller does (switch_trimming's default
entry, trim_dscp, trim_queue_limit, trim_eligibility, trim_acl), holds a
standing data queue as the suite's TrimPriorityTest does, and checks every
packet that leaves byte for byte and the SAI counters: trimmed (`trims`),
trimmed and sent (`trim_tx`), trimmed but dropped (`trim_drops`), and
`drops` for what was dropped whole. The TNA program has none of these knobs
yet (docs/tofino.md), so on tofino-model they skip.
"""

from __future__ import annotations

from ptf import testutils
from scapy.layers.inet import IP

from host_agent.wire import PACKET_BYTES, TRIMMED_FRAME_LEN, Dscp, Opcode
from ptf_tests.forgive_switch import (
    FULL_FRAME,
    NOT_ECT,
    ForgiveTest,
    fth_packet,
    nhop_mac,
    routed,
    trimmed,
)
from switch_model.port import PRIO_HIGH
from switch_model.surface import SwitchTrimming, Thresholds

S = FULL_FRAME
NO_MARKING = Thresholds(3 * S, 100 * S, 100 * S, 0)
"""A data queue of three full frames that never marks."""


class TrimSettingsTest(ForgiveTest):
    """Routes 10.0.2.0/24 to port 2 and 10.0.3.0/24 to port 3, both managed."""

    def setUp(self) -> None:
        super().setUp()
        if self.is_tna:
            self.tearDown()  # unittest runs no tearDown after a setUp that skips
            self.skipTest("the TNA program has no trimming settings yet (docs/tofino.md)")
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
