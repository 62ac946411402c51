/* -*- P4_16 -*- */
/*
 * The FORGIVE switch for Tofino (TNA; Tofino 2's T2NA with -D__TARGET_TOFINO__=2).
 *
 * The behaviour is docs/dataplane.md's; docs/tofino.md says construct by
 * construct how this program differs from the v1model one. In short:
 *
 * - Tofino has no register that ingress and egress share, so the program keeps
 *   no byte count of its own. The traffic manager (TM) decides: each managed
 *   port's data queue is given a buffer of data_queue_bytes (in cells, over
 *   BF-RT), and packets bound for it are sent with deflect_on_drop. When the
 *   TM has no room it deflects the packet, instead of dropping it, to the
 *   pipe's deflection port. Egress there sees deflection_flag: FTH DATA is
 *   rewritten as a trimmed header and mirrored, cut to the trim size by its
 *   mirror session, to its own port's trim queue; anything else, and DATA
 *   that a traffic class or an ACL rule keeps from trimming, is dropped and
 *   counted.
 * - Trimming is set the way SAI sets it (docs/tofino.md, "Trimming knobs"):
 *   the size by the mirror session's truncation and trim_lengths, the DSCP
 *   per egress port in trim_dscp, the queue by the mirror session (BF-RT),
 *   eligibility in trim_eligibility and trim_acl.
 * - ECN is marked in egress from the depth the packet found when it entered
 *   its queue (enq_qdepth, in cells). The RED ramp between ecn_kmin and
 *   ecn_kmax is a set of depth bands, each with its marking probability, that
 *   the controller computes and installs.
 * - Strict priority and queue sizes belong to the TM: qid 0 is the high queue
 *   (transport control and trimmed headers), qid 1 the data queue.
 */
#include <core.p4>
#if __TARGET_TOFINO__ == 2
#include <t2na.p4>
#else
#include <tna.p4>
#endif

#include "../include/constants.p4"
#include "../include/headers.p4"

/* The TM serves qid 0 first (strict priority, set over BF-RT). Mirrored copies
 * enter queue 0 of their port unless the mirror session names another (the
 * trim queue, set over BF-RT: the data queue, or a bounded queue of its own,
 * qid 2 at the high queue's priority; controller/tofino.py). */
const QueueId_t QID_HIGH = 0;
const QueueId_t QID_LOW = 1;

/* What precedes Ethernet in egress: ingress's bridge, or a trimmed copy's
 * mirror header. Both are PREPENDED_BYTES long, so that port_tx, which can
 * take one constant off what the egress parser saw, counts frames alone; a
 * trim's mirror session keeps PREPENDED_BYTES + the trim size. */
const bit<8> KIND_BRIDGED = 1;
const bit<8> KIND_TRIMMED = 2;
const bit<32> PREPENDED_BYTES = 6;
const MirrorType_t MIRROR_TYPE_TRIM = 1;

/* Sizes of the ECMP selector (members, groups, members per group) and of the
 * ECN band table: up to 9 entries per managed port, for 128 ports (a 32-port
 * switch with every port split in four). Range keys cost TCAM words per entry. */
const bit<32> ECMP_MEMBERS = 4096;
const bit<32> ECMP_GROUPS = 1024;
const bit<32> ECMP_MAX_GROUP_SIZE = 64;
const bit<32> ECN_BAND_ENTRIES = 1152;

/*************************************************************************
 *  Headers and metadata
 *************************************************************************/

/* Ingress to egress, in front of Ethernet. A deflected packet reaches egress
 * on the deflection port, so the port it was routed to travels with it, and
 * so do the mirror session that takes its trimmed header back there and
 * whether ingress's eligibility tables let it trim. */
header bridge_h {
    bit<8>     kind;
    @padding bit<(16 - PORT_ID_WIDTH)> _pad0;
    PortId_t   egress_port;
    @padding bit<(15 - MIRROR_ID_WIDTH)> _pad1;
    bit<1>     trim_disabled;
    MirrorId_t trim_session;
}

/* In front of a trimmed header's mirrored copy. */
header trim_mirror_h {
    bit<8>  kind;
    @padding bit<40> _pad;
}

struct tna_headers_t {
    bridge_h      bridge;
    trim_mirror_h trimmed;
    ethernet_t    ethernet;
    ipv4_t        ipv4;
    udp_t         udp;
    fth_t         fth;
}

struct ingress_metadata_t {
    /* Named as in the v1model program: the ecmp_nhop key. */
    bit<16> ecmp_group_id;
    /* L4 ports fed to the ECMP hash, 0 for packets without UDP. */
    bit<16> l4_src_port;
    bit<16> l4_dst_port;
    /* Set by set_nhop: the packet has an egress port. */
    bool    routed;
    /* The parser's IPv4 checksum unit found the header checksum wrong. */
    bool    ipv4_checksum_err;
}

struct egress_metadata_t {
    MirrorId_t trim_session;
    /* KIND_TRIMMED, set with the mirror request: Tofino's mirror field lists
     * take metadata, not constants. */
    bit<8>     trim_kind;
    /* The lengths of a trimmed packet longer than the trim size: the kept bytes
     * less the headers in front (trim_lengths; 58 bytes unless set). */
    bit<16>    trim_ipv4_len;
    bit<16>    trim_udp_len;
    /* IPv4 bytes past the trim size, 0 when the packet is no longer than it. */
    bit<16>    trim_excess;
    /* Uniform in [0, 65535], drawn for every packet that may be marked. */
    bit<16>    mark_draw;
}

/*************************************************************************
 *  Ingress parser
 *************************************************************************/

parser IngressParser(packet_in pkt,
                     out tna_headers_t hdr,
                     out ingress_metadata_t meta,
                     out ingress_intrinsic_metadata_t ig_intr_md) {

    Checksum() ipv4_checksum;

    state start {
        pkt.extract(ig_intr_md);
        pkt.advance(PORT_METADATA_SIZE);
        meta.ecmp_group_id = 0;
        meta.l4_src_port = 0;
        meta.l4_dst_port = 0;
        meta.routed = false;
        meta.ipv4_checksum_err = false;
        transition parse_ethernet;
    }

    state parse_ethernet {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    /* A header with options is not parsed further; ingress drops it as malformed. */
    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        ipv4_checksum.add(hdr.ipv4);
        /* True when the checksum is wrong, as Tofino's checksum unit reports it. */
        meta.ipv4_checksum_err = ipv4_checksum.verify();
        transition select(hdr.ipv4.ihl, hdr.ipv4.protocol) {
            (IPV4_IHL_NO_OPTIONS, IPPROTO_UDP): parse_udp;
            default: accept;
        }
    }

    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dstPort) {
            FORGIVE_UDP_PORT: parse_fth;
            default: accept;
        }
    }

    /* The version is checked in ingress, where a wrong one counts as malformed. */
    state parse_fth {
        pkt.extract(hdr.fth);
        transition accept;
    }
}

/*************************************************************************
 *  Ingress: route, pick the queue, ask the TM to deflect what it cannot hold
 *************************************************************************/

control ForgiveIngress(inout tna_headers_t hdr,
                  inout ingress_metadata_t meta,
                  in ingress_intrinsic_metadata_t ig_intr_md,
                  in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                  inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                  inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {

    /* Malformed and expired packets that had an egress port; egress counts the
     * drops for space under the same name. */
    Counter<bit<32>, PortId_t>(NUM_PORTS, CounterType_t.PACKETS) port_drops;

    action drop() {
        ig_dprsr_md.drop_ctl = 1;
    }

    action set_nhop(mac_addr_t dmac, PortId_t port) {
        hdr.ethernet.srcAddr = hdr.ethernet.dstAddr;
        hdr.ethernet.dstAddr = dmac;
        ig_tm_md.ucast_egress_port = port;
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
        meta.routed = true;
    }

    action set_ecmp_group(bit<16> group_id) {
        meta.ecmp_group_id = group_id;
    }

    table ipv4_lpm {
        key = { hdr.ipv4.dstAddr: lpm; }
        actions = { set_nhop; set_ecmp_group; drop; }
        default_action = drop();
        size = 1024;
    }

    /* A group's members are next hops; the selector hashes the five fields
     * below, the UDP source port among them, so a sprayed flow spreads.
     * Keys on metadata carry @name here and below, so that their control-plane
     * names do not depend on what a compiler calls the block parameters. */
    Hash<bit<16>>(HashAlgorithm_t.CRC16) ecmp_hash;
    ActionProfile(ECMP_MEMBERS) ecmp_profile;
    ActionSelector(ecmp_profile, ecmp_hash, SelectorMode_t.FAIR,
                   ECMP_MAX_GROUP_SIZE, ECMP_GROUPS) ecmp_selector;

    table ecmp_nhop {
        key = {
            meta.ecmp_group_id: exact @name("meta.ecmp_group_id");
            hdr.ipv4.srcAddr: selector;
            hdr.ipv4.dstAddr: selector;
            hdr.ipv4.protocol: selector;
            meta.l4_src_port: selector;
            meta.l4_dst_port: selector;
        }
        actions = { set_nhop; drop; }
        default_action = drop();
        size = ECMP_GROUPS;
        implementation = ecmp_selector;
    }

    action use_udp_ports() {
        meta.l4_src_port = hdr.udp.srcPort;
        meta.l4_dst_port = hdr.udp.dstPort;
    }

    /* Count first, against the port the packet would have left by. */
    action drop_at_port() {
        port_drops.count(ig_tm_md.ucast_egress_port);
        ig_dprsr_md.drop_ctl = 1;
    }

    /* Every routed packet carries the bridge, so egress tells it from a
     * trimmed copy and a deflected packet still names its own port. */
    action bridge() {
        hdr.bridge.setValid();
        hdr.bridge.kind = KIND_BRIDGED;
        hdr.bridge.egress_port = ig_tm_md.ucast_egress_port;
        hdr.bridge.trim_disabled = 0;
        hdr.bridge.trim_session = 0;
    }

    action send_high() {
        ig_tm_md.qid = QID_HIGH;
    }

    action send_low() {
        ig_tm_md.qid = QID_LOW;
    }

    /* A managed port: the TM deflects what its data queue cannot hold, and the
     * session takes trimmed headers back to this port. */
    action set_trim_session(MirrorId_t session) {
        ig_tm_md.deflect_on_drop = 1;
        hdr.bridge.trim_session = session;
    }

    /* No entry: the port is unmanaged (nothing trimmed, dropped for space or marked). */
    table trim_sessions {
        key = { ig_tm_md.ucast_egress_port: exact @name("egress_port"); }
        actions = { set_trim_session; NoAction; }
        default_action = NoAction();
        size = NUM_PORTS;
    }

    /* The packet is dropped, not trimmed, when the TM deflects it: a traffic
     * class whose packet_discard_action is drop, or an ACL DISABLE_TRIM rule.
     * Named and keyed as in the v1model program. */
    action disable_trim() {
        hdr.bridge.trim_disabled = 1;
    }

    table trim_eligibility {
        key = { hdr.ipv4.dscp: exact; }
        actions = { disable_trim; NoAction; }
        default_action = NoAction();
        size = 64;
    }

    table trim_acl {
        key = {
            hdr.ipv4.srcAddr: ternary;
            hdr.ipv4.dstAddr: ternary;
            hdr.ipv4.dscp: ternary;
        }
        actions = { disable_trim; NoAction; }
        default_action = NoAction();
        size = 256;
    }

    /* Tofino's gateways test fields, not bool locals computed in actions, so the
     * conditions are written where they are tested. */
    apply {
        if (hdr.ipv4.isValid()) {
            if (hdr.udp.isValid()) {
                use_udp_ports();
            }
            switch (ipv4_lpm.apply().action_run) {
                set_ecmp_group: {
                    ecmp_nhop.apply();
                }
            }
        } else {
            drop();
        }

        if (meta.routed) {
            bridge();
            /* Expired or malformed (the IPv4 header is valid: the packet was routed). */
            if (hdr.ipv4.ttl <= 1 || ig_prsr_md.parser_err != 0 || meta.ipv4_checksum_err
                || hdr.ipv4.ihl != IPV4_IHL_NO_OPTIONS
                || (hdr.fth.isValid() && hdr.fth.version != FTH_VERSION)) {
                drop_at_port();
            } else if (hdr.fth.isValid()
                       && (hdr.fth.opcode != FTH_OPCODE_DATA
                           || (hdr.fth.flags & FTH_FLAG_TRIMMED) != 0)) {
                /* Control: ACK, NACK, CNP, and DATA already trimmed upstream. */
                send_high();
            } else {
                send_low();
                /* Tofino applies a table alone in an if: the hit is tested first. */
                if (trim_sessions.apply().hit) {
                    /* Not control, so FTH here is untrimmed DATA. */
                    if (hdr.fth.isValid()) {
                        trim_eligibility.apply();
                        trim_acl.apply();
                    }
                }
            }
        }
    }
}

control IngressDeparser(packet_out pkt,
                        inout tna_headers_t hdr,
                        in ingress_metadata_t meta,
                        in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    /* The IPv4 checksum is recomputed once, in egress, after every rewrite. */
    apply {
        pkt.emit(hdr);
    }
}

/*************************************************************************
 *  Egress parser
 *************************************************************************/

parser EgressParser(packet_in pkt,
                    out tna_headers_t hdr,
                    out egress_metadata_t meta,
                    out egress_intrinsic_metadata_t eg_intr_md) {

    state start {
        pkt.extract(eg_intr_md);
        meta.trim_session = 0;
        meta.trim_kind = 0;
        meta.trim_ipv4_len = TRIMMED_IPV4_TOTAL_LEN;
        meta.trim_udp_len = TRIMMED_UDP_LEN;
        meta.trim_excess = 0;
        meta.mark_draw = 0;
        transition select(pkt.lookahead<bit<8>>()) {
            KIND_BRIDGED: parse_bridge;
            KIND_TRIMMED: parse_trimmed;
            default: reject;
        }
    }

    state parse_bridge {
        pkt.extract(hdr.bridge);
        transition parse_ethernet;
    }

    state parse_trimmed {
        pkt.extract(hdr.trimmed);
        transition parse_ethernet;
    }

    /* Only routed IPv4 reaches egress, options-free (ingress dropped the rest). */
    state parse_ethernet {
        pkt.extract(hdr.ethernet);
        pkt.extract(hdr.ipv4);
        transition select(hdr.ipv4.protocol) {
            IPPROTO_UDP: parse_udp;
            default: accept;
        }
    }

    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dstPort) {
            FORGIVE_UDP_PORT: parse_fth;
            default: accept;
        }
    }

    state parse_fth {
        pkt.extract(hdr.fth);
        transition accept;
    }
}

/*************************************************************************
 *  Egress: trim or drop what the TM deflected, mark ECN, count what leaves
 *************************************************************************/

control ForgiveEgress(inout tna_headers_t hdr,
                 inout egress_metadata_t meta,
                 in egress_intrinsic_metadata_t eg_intr_md,
                 in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                 inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                 inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {

    Counter<bit<64>, PortId_t>(NUM_PORTS, CounterType_t.PACKETS_AND_BYTES) port_tx;
    Counter<bit<32>, PortId_t>(NUM_PORTS, CounterType_t.PACKETS) port_ce_marks;
    /* SAI's trim counters: trimmed (at the deflect port, for the port the packet
     * was routed to) and trimmed and sent (the trimmed header leaving that
     * port). Trimmed but dropped is their difference: the TM dropped the
     * header for want of room in the trim queue (docs/tofino.md). */
    Counter<bit<32>, PortId_t>(NUM_PORTS, CounterType_t.PACKETS) port_trims;
    Counter<bit<32>, PortId_t>(NUM_PORTS, CounterType_t.PACKETS) port_trim_tx;
    Counter<bit<32>, PortId_t>(NUM_PORTS, CounterType_t.PACKETS) port_drops;

    Random<bit<16>>() ecn_random;

    /* SAI's switch-wide trim size, as the lengths a trimmed packet longer than it
     * gets; the mirror sessions cut at the same size. No entry: 58 bytes. */
    action set_trim_lengths(bit<16> ipv4_total_len, bit<16> udp_len) {
        meta.trim_ipv4_len = ipv4_total_len;
        meta.trim_udp_len = udp_len;
    }

    table trim_lengths {
        actions = { set_trim_lengths; NoAction; }
        default_action = NoAction();
    }

    /* A saturating subtraction: Tofino's gateways do not compare two fields. */
    action measure_excess() {
        meta.trim_excess = hdr.ipv4.totalLen |-| meta.trim_ipv4_len;
    }

    action shorten() {
        hdr.ipv4.totalLen = meta.trim_ipv4_len;
        hdr.udp.length = meta.trim_udp_len;
    }

    /* The deflected DATA becomes its header: TRIMMED set, the UDP checksum 0
     * (the deparser recomputes the IPv4 checksum; shorten has set the lengths
     * of what the session keeps), mirrored to its own port, where the session
     * cuts it to the trim size. The deflected original goes no further. */
    action trim() {
        hdr.fth.flags = hdr.fth.flags | FTH_FLAG_TRIMMED;
        hdr.udp.checksum = 0;
        port_trims.count(hdr.bridge.egress_port);
        meta.trim_session = hdr.bridge.trim_session;
        meta.trim_kind = KIND_TRIMMED;
        eg_dprsr_md.mirror_type = MIRROR_TYPE_TRIM;
        eg_dprsr_md.drop_ctl = 1;
    }

    /* A deflected packet that is not FTH DATA, or may not trim: dropped for space
     * at its own port. */
    action drop_for_space() {
        port_drops.count(hdr.bridge.egress_port);
        eg_dprsr_md.drop_ctl = 1;
    }

    action mark_ce() {
        hdr.ipv4.ecn = ECN_CE;
        port_ce_marks.count(eg_intr_md.egress_port);
    }

    action draw() {
        meta.mark_draw = ecn_random.get();
    }

    /* The RED decision as one match: per managed port and band of depths (cells
     * of the packet's queue when it entered), the draws that mark. A band marking
     * with probability p/65536 matches draws 0..p-1; from ecn_kmax, all draws. No
     * entry, no mark. */
    table ecn_marking {
        key = {
            eg_intr_md.egress_port: exact @name("egress_port");
            eg_intr_md.enq_qdepth: range @name("enq_qdepth");
            meta.mark_draw: range @name("mark_draw");
        }
        actions = { mark_ce; NoAction; }
        default_action = NoAction();
        size = ECN_BAND_ENTRIES;
    }

    /* The trimmed packet's DSCP: one value for every port (the default entry)
     * or one per egress port (asymmetric DSCP); none keeps the DSCP. */
    action set_trim_dscp(bit<6> dscp) {
        hdr.ipv4.dscp = dscp;
    }

    table trim_dscp {
        key = { eg_intr_md.egress_port: exact @name("egress_port"); }
        actions = { set_trim_dscp; NoAction; }
        default_action = NoAction();
        size = NUM_PORTS;
    }

    action count_trim_tx() {
        port_trim_tx.count(eg_intr_md.egress_port);
    }

    /* Bytes as the egress parser saw them, less the bridge or mirror header. */
    action count_tx() {
        port_tx.count(eg_intr_md.egress_port, PREPENDED_BYTES);
    }

    apply {
#if __TARGET_TOFINO__ == 2
        /* Mirror the packet as the deparser writes it, not as it entered egress.
         * Only trim() mirrors, so it is set for every packet: set in trim()
         * alone, its validity bit left bf-p4c's Tofino 2 PHV allocation with
         * no container for egress's validity bits. */
        eg_dprsr_md.mirror_io_select = 1;
#endif
        if (hdr.trimmed.isValid()) {
            /* A trimmed header, back on its own port's trim queue. */
            count_trim_tx();
            trim_dscp.apply();
        } else if (eg_intr_md.deflection_flag == 1) {
            /* Untrimmed FTH DATA that may trim. */
            if (hdr.fth.isValid() && hdr.fth.opcode == FTH_OPCODE_DATA
                && (hdr.fth.flags & FTH_FLAG_TRIMMED) == 0 && hdr.bridge.trim_disabled == 0) {
                trim_lengths.apply();
                measure_excess();
                if (meta.trim_excess != 0) {
                    shorten();
                }
                trim();
            } else {
                drop_for_space();
            }
        } else if (hdr.fth.isValid() && hdr.fth.opcode == FTH_OPCODE_DATA
                   && (hdr.fth.flags & FTH_FLAG_TRIMMED) == 0
                   && hdr.ipv4.ecn != ECN_NOT_ECT && hdr.ipv4.ecn != ECN_CE) {
            /* Untrimmed ECN-capable DATA, not yet marked. */
            draw();
            ecn_marking.apply();
        }
        /* Everything but the deflected packets leaves (one use of the counter). */
        if (eg_intr_md.deflection_flag == 0) {
            count_tx();
        }
    }
}

control EgressDeparser(packet_out pkt,
                       inout tna_headers_t hdr,
                       in egress_metadata_t meta,
                       in egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {

    Checksum() ipv4_checksum;
    Mirror(MIRROR_TYPE_TRIM) trim_mirror;

    /* The bridge and the mirror header never leave the switch. */
    apply {
        hdr.ipv4.hdrChecksum = ipv4_checksum.update({
            hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.dscp, hdr.ipv4.ecn,
            hdr.ipv4.totalLen, hdr.ipv4.identification, hdr.ipv4.flags,
            hdr.ipv4.fragOffset, hdr.ipv4.ttl, hdr.ipv4.protocol,
            hdr.ipv4.srcAddr, hdr.ipv4.dstAddr });
        if (eg_dprsr_md.mirror_type == MIRROR_TYPE_TRIM) {
            trim_mirror.emit<trim_mirror_h>(meta.trim_session, { meta.trim_kind, 0 });
        }
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.fth);
    }
}

Pipeline(IngressParser(),
         ForgiveIngress(),
         IngressDeparser(),
         EgressParser(),
         ForgiveEgress(),
         EgressDeparser()) pipe;

Switch(pipe) main;
