/* -*- P4_16 -*- */
/*
 * The FORGIVE receiver's decision in a NIC, for BMv2 pna_nic (PNA).
 *
 * On a trimmed DATA header of a gradient flow the host registered, the
 * pipeline takes the decision the host's receiver core
 * (host_agent/core/receiver.py, OnTrimmedHeader) would: it charges the range
 * to the step's outstanding bytes, applies the vesting rule
 *     forgiven + len <= p/(1-p) * received
 * (with the step's budget and expected bytes) in fixed point without a
 * division, draws against P (the pipeline's own generator: see draw), and turns the
 * header into the reply: the ACK that forgives (rcv_nxt moves past the hole)
 * or the NACK that asks for the range, both with ELIGIBLE and EXHAUSTED set as
 * the core sets them. A full DATA updates the step's `received` (and closes a
 * requested hole) and goes on to the host, which reassembles and ACKs it.
 *
 * What needs the scoreboard stays on the host (docs/nic.md): a range that
 * straddles rcv_nxt or lies above a gap, data above a requested hole, a
 * second hole, CE marks (the CNP timer), a closed step. The first such packet
 * hands its flow to the host for good (state FLOW_HOST); a malformed packet
 * goes to the host unchanged without that, as the core counts and drops it
 * without a state change. Per-rank state is in registers: the host writes a
 * step's id, p and expected bytes at its start and a flow's slot at its
 * registration (controller/nic.py); the pipeline keeps the rest.
 */
#include <core.p4>
#include <bmv2/pna.p4>  /* BMv2's: three blocks, and send_to_port takes a run-time port */

#include "../include/constants.p4"
#include "../include/headers.p4"
#include "include/nic_constants.p4"

/* The draw's generator: a 32-bit linear congruential generator (the constants
 * of Numerical Recipes, full period 2^32), the draw its top 16 bits. */
const bit<32> LCG_MULTIPLIER = 1664525;
const bit<32> LCG_INCREMENT = 1013904223;

struct nic_metadata_t {
    /* nic_ports: the wire side and the host side. */
    PortId_t network_port;
    PortId_t host_port;
    /* gradient_flows: the flow's slots, its step and length, eligibility. */
    bit<32>  flow_slot;
    bit<32>  step_slot;
    bit<32>  step;
    bit<32>  total;
    bit<1>   eligible;
    /* forgive_policy: P in units of 1/65536. */
    bit<32>  forgive_prob;
    /* This packet's range and whether the fast path takes it. */
    bit<32>  lo;
    bit<32>  hi;
    bit<32>  len;
    bool     well_formed;
    bool     hand_over;
    /* The flow's and the step's registers, loaded, updated, stored back. */
    bit<32>  rcv_nxt;
    bit<8>   flow_state;
    bit<32>  hole_end;
    bit<32>  step_id;
    bit<32>  p;
    bit<32>  expected;
    bit<8>   step_open;
    bit<32>  received;
    bit<32>  forgiven;
    bit<32>  outstanding;
    /* The decision, and the reply it makes of a trimmed header. */
    bool     may_forgive;
    bit<16>  draw;
    bool     replying;
    bit<4>   reply_opcode;
    bit<32>  reply_seq;
    bit<32>  reply_aux;
    bit<8>   reply_flags;
}

/*************************************************************************
 *  Parser: the same headers as the switch's (p4src/forgive.p4)
 *************************************************************************/

parser ForgiveNicParser(packet_in packet,
                        out headers_t hdr,
                        inout nic_metadata_t meta,
                        in pna_main_parser_input_metadata_t istd) {

    state start {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        /* No verify here: pna_nic (BMv2 9674187) dies on a failed one. A header with
         * options is parsed no further, so it has no FTH and goes to the host. */
        transition select(hdr.ipv4.ihl, hdr.ipv4.protocol) {
            (IPV4_IHL_NO_OPTIONS, IPPROTO_UDP): parse_udp;
            default: accept;
        }
    }

    state parse_udp {
        packet.extract(hdr.udp);
        transition select(hdr.udp.dstPort) {
            FORGIVE_UDP_PORT: parse_fth;
            default: accept;
        }
    }

    state parse_fth {
        packet.extract(hdr.fth);
        transition accept;  /* the version is checked with the rest (well_formed) */
    }
}

/*************************************************************************
 *  Main control: the receive half's decision
 *************************************************************************/

control ForgiveNicControl(inout headers_t hdr,
                          inout nic_metadata_t meta,
                          in pna_main_input_metadata_t istd,
                          inout pna_main_output_metadata_t ostd) {

    /* Per flow slot. Zeroed by the host when it registers the flow. */
    Register<bit<32>, bit<32>>(NUM_FLOW_SLOTS) flow_rcv_nxt;
    Register<bit<8>, bit<32>>(NUM_FLOW_SLOTS) flow_state;
    Register<bit<32>, bit<32>>(NUM_FLOW_SLOTS) flow_hole_end;
    /* The last draw taken for the flow, for the host to audit a decision. */
    Register<bit<16>, bit<32>>(NUM_FLOW_SLOTS) flow_last_draw;

    /* Per step slot, from the host: the step it holds, p (parts per million),
     * the step's expected gradient bytes, and whether its budget is open. */
    Register<bit<32>, bit<32>>(NUM_STEP_SLOTS) step_id;
    Register<bit<32>, bit<32>>(NUM_STEP_SLOTS) step_p;
    Register<bit<32>, bit<32>>(NUM_STEP_SLOTS) step_expected;
    Register<bit<8>, bit<32>>(NUM_STEP_SLOTS) step_open;
    /* Per step slot, the pipeline's: bytes received (credited up to expected),
     * forgiven, and requested while charged to the budget. */
    Register<bit<32>, bit<32>>(NUM_STEP_SLOTS) step_received;
    Register<bit<32>, bit<32>>(NUM_STEP_SLOTS) step_forgiven;
    Register<bit<32>, bit<32>>(NUM_STEP_SLOTS) step_outstanding;

    /* The generator's state, seeded by the host (controller/nic.py). PNA's Random
     * extern does not run here: p4c 1.2.5.5's PNA backend writes it as the
     * primitive modify_field_rng_uniform, which BMv2's pna_nic does not have
     * (it has a Random extern object that p4c does not emit). */
    Register<bit<32>, bit<32>>(1) draw_state;

    action set_ports(PortId_t network_port, PortId_t host_port) {
        meta.network_port = network_port;
        meta.host_port = host_port;
    }

    /* The default entry names the two ports; the host sets it before anything. */
    table nic_ports {
        actions = { set_ports; }
        default_action = set_ports((PortId_t)32w0, (PortId_t)32w0);
    }

    action set_forgive_prob(bit<32> forgive_prob) {
        meta.forgive_prob = forgive_prob;
    }

    /* P, the probability a range that vests is forgiven (1/65536 units). */
    table forgive_policy {
        actions = { set_forgive_prob; }
        default_action = set_forgive_prob(32w0);
    }

    action offload(bit<32> flow_slot, bit<32> step_slot, bit<32> step,
                   bit<32> total, bit<1> eligible) {
        meta.flow_slot = flow_slot;
        meta.step_slot = step_slot;
        meta.step = step;
        meta.total = total;
        meta.eligible = eligible;
    }

    /* The gradient flows the host registered (StepOf, IsGradientAllReduce and
     * the size it posted). Any other flow's packets go to the host. */
    table gradient_flows {
        key = { hdr.fth.flow_id: exact; }
        actions = { offload; NoAction; }
        default_action = NoAction();
        size = NUM_FLOW_SLOTS;
    }

    /* A 16-bit draw in [0, 65535], kept for the host to audit the decision. */
    action draw() {
        bit<32> state = draw_state.read(32w0);
        state = state * LCG_MULTIPLIER + LCG_INCREMENT;
        draw_state.write(32w0, state);
        meta.draw = state[31:16];
        flow_last_draw.write(meta.flow_slot, meta.draw);
    }

    action to_host() {
        send_to_port(meta.host_port);
    }

    action to_network() {
        send_to_port(meta.network_port);
    }

    action hand_to_host() {
        flow_state.write(meta.flow_slot, FLOW_HOST);
        send_to_port(meta.host_port);
    }

    action load_state() {
        meta.rcv_nxt = flow_rcv_nxt.read(meta.flow_slot);
        meta.flow_state = flow_state.read(meta.flow_slot);
        meta.hole_end = flow_hole_end.read(meta.flow_slot);
        meta.step_id = step_id.read(meta.step_slot);
        meta.p = step_p.read(meta.step_slot);
        meta.expected = step_expected.read(meta.step_slot);
        meta.step_open = step_open.read(meta.step_slot);
        meta.received = step_received.read(meta.step_slot);
        meta.forgiven = step_forgiven.read(meta.step_slot);
        meta.outstanding = step_outstanding.read(meta.step_slot);
    }

    action store_state() {
        flow_rcv_nxt.write(meta.flow_slot, meta.rcv_nxt);
        flow_state.write(meta.flow_slot, meta.flow_state);
        flow_hole_end.write(meta.flow_slot, meta.hole_end);
        step_received.write(meta.step_slot, meta.received);
        step_forgiven.write(meta.step_slot, meta.forgiven);
        step_outstanding.write(meta.step_slot, meta.outstanding);
    }

    /* The trimmed header becomes the reply, framed as the host frames its own
     * control packets, and goes back out of the port it came in by. */
    action reply() {
        mac_addr_t peer_mac = hdr.ethernet.srcAddr;
        hdr.ethernet.srcAddr = hdr.ethernet.dstAddr;
        hdr.ethernet.dstAddr = peer_mac;
        ipv4_addr_t peer_ip = hdr.ipv4.srcAddr;
        hdr.ipv4.srcAddr = hdr.ipv4.dstAddr;
        hdr.ipv4.dstAddr = peer_ip;
        hdr.ipv4.dscp = DSCP_CONTROL;
        hdr.ipv4.ecn = ECN_NOT_ECT;
        hdr.ipv4.identification = 0;
        hdr.ipv4.flags = IPV4_FLAG_DONT_FRAGMENT;
        hdr.ipv4.fragOffset = 0;
        hdr.ipv4.ttl = REPLY_TTL;
        hdr.udp.srcPort = REPLY_UDP_SRC_PORT;
        hdr.udp.length = TRIMMED_UDP_LEN;
        hdr.udp.checksum = 0;
        hdr.fth.opcode = meta.reply_opcode;
        hdr.fth.flags = meta.reply_flags;
        hdr.fth.seq = meta.reply_seq;
        hdr.fth.aux = meta.reply_aux;
        send_to_port(meta.network_port);
    }

    /* The reply's IPv4 header checksum, summed here: p4c's PNA backend takes the
     * InternetChecksum extern in the parser and deparser only, and the deparser
     * may not write a header. The ones' complement sum of the header's 16-bit
     * words (the checksum's own as zero), its carries folded in twice. */
    action ipv4_checksum() {
        bit<32> sum = (bit<32>)(hdr.ipv4.version ++ hdr.ipv4.ihl ++ hdr.ipv4.dscp ++ hdr.ipv4.ecn)
            + (bit<32>)hdr.ipv4.totalLen
            + (bit<32>)hdr.ipv4.identification
            + (bit<32>)(hdr.ipv4.flags ++ hdr.ipv4.fragOffset)
            + (bit<32>)(hdr.ipv4.ttl ++ hdr.ipv4.protocol)
            + (bit<32>)hdr.ipv4.srcAddr[31:16] + (bit<32>)hdr.ipv4.srcAddr[15:0]
            + (bit<32>)hdr.ipv4.dstAddr[31:16] + (bit<32>)hdr.ipv4.dstAddr[15:0];
        sum = (sum & 32w0xFFFF) + (sum >> 16);
        sum = (sum & 32w0xFFFF) + (sum >> 16);
        hdr.ipv4.hdrChecksum = ~sum[15:0];
    }

    apply {
        nic_ports.apply();
        forgive_policy.apply();
        if (istd.input_port != meta.network_port) {
            /* The host's own transmissions pass through. */
            to_network();
        } else if (!hdr.fth.isValid() || istd.parser_error != error.NoError) {
            to_host();
        } else if (!gradient_flows.apply().hit) {
            to_host();
        } else {
            load_state();
            meta.replying = false;
            meta.lo = hdr.fth.seq;
            meta.len = (bit<32>)hdr.fth.length;
            meta.hi = meta.lo + meta.len;
            bool trimmed = (hdr.fth.flags & FTH_FLAG_TRIMMED) != 0;
            /* host_agent.wire.check_fields, and the flow's registered total:
             * what fails goes to the host, which counts and drops it. */
            meta.well_formed = hdr.fth.version == FTH_VERSION
                && hdr.fth.opcode == FTH_OPCODE_DATA
                && (hdr.fth.flags & ~FTH_KNOWN_FLAGS) == 0
                && meta.len != 0 && meta.len <= PACKET_BYTES
                && (bit<64>)meta.lo + (bit<64>)meta.len <= (bit<64>)hdr.fth.aux
                && hdr.fth.aux == meta.total;
            /* The fast path: a trimmed header of the bare 58 bytes (the reply
             * reuses them), a full DATA whose lengths agree, not CE-marked,
             * of the step the slot holds while its budget is open. */
            meta.hand_over = meta.flow_state == FLOW_HOST
                || hdr.ipv4.ecn == ECN_CE
                || meta.step_id != meta.step || meta.step_open == 0;
            bit<32> ip_len = (bit<32>)hdr.ipv4.totalLen;
            bit<32> headers_len = (bit<32>)TRIMMED_IPV4_TOTAL_LEN;
            if (trimmed) {
                /* A trim may keep some payload, never more than the range. */
                meta.well_formed = meta.well_formed
                    && ip_len >= headers_len && ip_len <= headers_len + meta.len;
                meta.hand_over = meta.hand_over || ip_len != headers_len;
            } else {
                meta.well_formed = meta.well_formed && ip_len == headers_len + meta.len;
            }

            if (!meta.well_formed) {
                to_host();
            } else if (meta.hand_over) {
                hand_to_host();
            } else if (trimmed && meta.hi <= meta.rcv_nxt) {
                /* Nothing missing after all: acknowledge, charge nothing. */
                meta.replying = true;
                meta.reply_opcode = FTH_OPCODE_ACK;
            } else if (!trimmed && meta.hi <= meta.rcv_nxt) {
                /* A duplicate: settled already, no credit; the host ACKs it. */
                to_host();
            } else if (meta.lo != meta.rcv_nxt
                       || (meta.flow_state == FLOW_HOLE && meta.hi != meta.hole_end)) {
                /* Straddles rcv_nxt, lies above a gap, or is not the hole:
                 * the scoreboard's work. */
                hand_to_host();
            } else if (!trimmed) {
                /* In order, or exactly the requested hole: Absent or
                 * Requested -> Received. Bytes past `expected` earn no credit. */
                bit<32> room = 0;
                if (meta.received + meta.forgiven < meta.expected) {
                    room = meta.expected - meta.received - meta.forgiven;
                }
                if (meta.len <= room) {
                    meta.received = meta.received + meta.len;
                } else {
                    meta.received = meta.received + room;
                }
                if (meta.flow_state == FLOW_HOLE) {
                    meta.outstanding = meta.outstanding - meta.len;
                }
                meta.rcv_nxt = meta.hi;
                meta.flow_state = FLOW_IN_ORDER;
                store_state();
                to_host();
            } else {
                /* OnTrimmedHeader: a range trimmed again is outstanding already. */
                if (meta.flow_state == FLOW_IN_ORDER) {
                    meta.outstanding = meta.outstanding + meta.len;
                }
                /* The budget floor(p * expected), the expected bytes, and the
                 * vesting rule (forgiven + len) * (1 - p) <= p * received:
                 * all in units of p's fixed point, no division. */
                bit<64> forgiven_after = (bit<64>)meta.forgiven + (bit<64>)meta.len;
                bit<64> p64 = (bit<64>)meta.p;
                meta.may_forgive =
                    forgiven_after * (bit<64>)P_SCALE <= p64 * (bit<64>)meta.expected
                    && (bit<64>)meta.received + forgiven_after <= (bit<64>)meta.expected
                    && forgiven_after * ((bit<64>)P_SCALE - p64)
                        <= p64 * (bit<64>)meta.received;
                if (meta.may_forgive) {
                    /* The draw; a range it refuses stays outstanding. */
                    draw();
                    meta.may_forgive = (bit<32>)meta.draw < meta.forgive_prob;
                }
                if (meta.may_forgive) {
                    meta.forgiven = meta.forgiven + meta.len;
                    meta.outstanding = meta.outstanding - meta.len;
                    meta.rcv_nxt = meta.hi;
                    meta.flow_state = FLOW_IN_ORDER;
                } else {
                    meta.flow_state = FLOW_HOLE;
                    meta.hole_end = meta.hi;
                }
                store_state();
                meta.replying = true;
                meta.reply_opcode = FTH_OPCODE_NACK;
                if (meta.may_forgive) {
                    meta.reply_opcode = FTH_OPCODE_ACK;
                }
            }
            if (meta.replying) {
                /* An ACK says rcv_nxt and the range acknowledged; a NACK the
                 * range requested and rcv_nxt. Flags(flow), after the
                 * decision's own update: ELIGIBLE as fixed at registration,
                 * EXHAUSTED while forgiven + outstanding + one packet
                 * exceeds floor(p * expected). */
                meta.reply_seq = meta.rcv_nxt;
                meta.reply_aux = meta.lo;
                if (meta.reply_opcode == FTH_OPCODE_NACK) {
                    meta.reply_seq = meta.lo;
                    meta.reply_aux = meta.rcv_nxt;
                }
                meta.reply_flags = 0;
                if (meta.eligible == 1) {
                    meta.reply_flags = FTH_FLAG_ELIGIBLE;
                    if (((bit<64>)meta.forgiven + (bit<64>)meta.outstanding
                            + (bit<64>)PACKET_BYTES) * (bit<64>)P_SCALE
                        > (bit<64>)meta.p * (bit<64>)meta.expected) {
                        meta.reply_flags = FTH_FLAG_ELIGIBLE | FTH_FLAG_EXHAUSTED;
                    }
                }
                reply();
                ipv4_checksum();
            }
        }
    }
}

/*************************************************************************
 *  Deparser
 *************************************************************************/

control ForgiveNicDeparser(packet_out packet,
                           inout headers_t hdr,
                           in nic_metadata_t meta,
                           in pna_main_output_metadata_t ostd) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.fth);
    }
}

PNA_NIC(ForgiveNicParser(), ForgiveNicControl(), ForgiveNicDeparser()) main;
