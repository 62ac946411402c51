/* -*- P4_16 -*- */
/*
 * The FORGIVE switch for BMv2 simple_switch (v1model).
 *
 * Per egress port it keeps two strict-priority queues: transport control and
 * trimmed headers go high (control may be queued with data instead, per
 * opcode: control_queue), everything else low. The program, not BMv2, decides
 * what the low queue admits: BMv2 queues count packets, FORGIVE budgets bytes,
 * so ingress keeps each port's low-queue byte occupancy in a register and
 * trims (FTH DATA) or drops (anything else) a packet that would overflow it.
 * How it trims is set by the controller the way SAI sets a switch's trimming:
 * size and queue switch-wide, DSCP per egress port, eligibility per traffic
 * class, ACL rules that disable it, and a bound on the trim queue (its bytes
 * are kept the same way), past which a trimmed packet is dropped and counted.
 * The control surface (table, action, counter names) is documented in
 * docs/dataplane.md and shared with the Python switch model.
 */
#include <core.p4>
#include <v1model.p4>

#include "include/constants.p4"
#include "include/headers.p4"

error {
    Ipv4OptionsPresent,
    FthVersionUnknown
}

/*************************************************************************
 *  Per-queue byte occupancy, shared by ingress (admits) and egress (releases)
 *************************************************************************/

register<bit<32>>(NUM_PORTS) low_queue_occupancy;
register<bit<32>>(NUM_PORTS) high_queue_occupancy;

/*************************************************************************
 *  Parser
 *************************************************************************/

parser ForgiveParser(packet_in packet,
                     out headers_t hdr,
                     inout metadata_t meta,
                     inout standard_metadata_t standard_metadata) {

    state start {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        verify(hdr.ipv4.ihl == IPV4_IHL_NO_OPTIONS, error.Ipv4OptionsPresent);
        transition select(hdr.ipv4.protocol) {
            IPPROTO_UDP: parse_udp;
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
        verify(hdr.fth.version == FTH_VERSION, error.FthVersionUnknown);
        transition accept;
    }
}

/*************************************************************************
 *  Checksum verification
 *************************************************************************/

control ForgiveVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        verify_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.dscp, hdr.ipv4.ecn,
              hdr.ipv4.totalLen, hdr.ipv4.identification, hdr.ipv4.flags,
              hdr.ipv4.fragOffset, hdr.ipv4.ttl, hdr.ipv4.protocol,
              hdr.ipv4.srcAddr, hdr.ipv4.dstAddr },
            hdr.ipv4.hdrChecksum, HashAlgorithm.csum16);
    }
}

/*************************************************************************
 *  Ingress: route, then decide queue, trim, drop or ECN mark
 *************************************************************************/

control ForgiveIngress(inout headers_t hdr,
                       inout metadata_t meta,
                       inout standard_metadata_t standard_metadata) {

    counter(NUM_PORTS, CounterType.packets) port_ce_marks;
    /* SAI's three trim counters: trimmed (sent or not), trimmed and admitted
     * to the trim queue, trimmed but dropped because the trim queue was full. */
    counter(NUM_PORTS, CounterType.packets) port_trims;
    counter(NUM_PORTS, CounterType.packets) port_trim_tx;
    counter(NUM_PORTS, CounterType.packets) port_trim_drops;
    counter(NUM_PORTS, CounterType.packets) port_drops;

    action drop() {
        mark_to_drop(standard_metadata);
    }

    action set_nhop(mac_addr_t dmac, port_t port) {
        hdr.ethernet.srcAddr = hdr.ethernet.dstAddr;
        hdr.ethernet.dstAddr = dmac;
        standard_metadata.egress_spec = port;
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
        meta.routed = 1;
    }

    action set_ecmp_group(bit<16> group_id, bit<16> num_members) {
        meta.ecmp_group_id = group_id;
        meta.ecmp_num_members = num_members;
    }

    table ipv4_lpm {
        key = { hdr.ipv4.dstAddr: lpm; }
        actions = { set_nhop; set_ecmp_group; drop; }
        default_action = drop();
        size = 1024;
    }

    action choose_ecmp_member() {
        hash(meta.ecmp_member, HashAlgorithm.crc16, (bit<16>)0,
             { hdr.ipv4.srcAddr, hdr.ipv4.dstAddr, hdr.ipv4.protocol,
               meta.l4_src_port, meta.l4_dst_port },
             meta.ecmp_num_members);
    }

    table ecmp_nhop {
        key = {
            meta.ecmp_group_id: exact;
            meta.ecmp_member: exact;
        }
        actions = { set_nhop; drop; }
        default_action = drop();
        size = 1024;
    }

    action set_thresholds(bit<32> data_queue_bytes, bit<32> ecn_kmin,
                          bit<32> ecn_kmax, bit<32> ecn_pmax) {
        meta.data_queue_bytes = data_queue_bytes;
        meta.ecn_kmin = ecn_kmin;
        meta.ecn_kmax = ecn_kmax;
        meta.ecn_pmax = ecn_pmax;
    }

    /* No entry: the port is unmanaged (no trimming, no marking). */
    table port_thresholds {
        key = { standard_metadata.egress_spec: exact; }
        actions = { set_thresholds; NoAction; }
        default_action = NoAction();
        size = NUM_PORTS;
    }

    /* Malformed, expired or over-budget packets that had an egress port. */
    action drop_at_port() {
        /* Count first: mark_to_drop moves egress_spec to the drop port. */
        port_drops.count((bit<32>)standard_metadata.egress_spec);
        mark_to_drop(standard_metadata);
    }

    /* Switch-wide trimming (SAI's PACKET_TRIM_SIZE and PACKET_TRIM_QUEUE_INDEX):
     * the default entry; without one a trim keeps TRIMMED_FRAME_BYTES and goes
     * to the high queue. */
    action set_switch_trimming(bit<32> size, bit<3> queue_index) {
        meta.trim_size = size;
        meta.trim_queue = queue_index;
    }

    table switch_trimming {
        actions = { set_switch_trimming; NoAction; }
        default_action = NoAction();
    }

    /* The packet is dropped, not trimmed, when its queue is full: a traffic
     * class whose packet_discard_action is drop, or an ACL DISABLE_TRIM rule. */
    action disable_trim() {
        meta.trim_disabled = 1;
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

    /* The trimmed packet's DSCP: one value for every port (the default entry)
     * or one per egress port (asymmetric DSCP); none keeps the DSCP. */
    action set_trim_dscp(bit<6> dscp) {
        hdr.ipv4.dscp = dscp;
    }

    table trim_dscp {
        key = { standard_metadata.egress_spec: exact; }
        actions = { set_trim_dscp; NoAction; }
        default_action = NoAction();
        size = NUM_PORTS;
    }

    /* Bytes the high queue may hold before a trimmed packet headed there is
     * dropped; no entry: unbounded. */
    action set_trim_queue_bytes(bit<32> trim_queue_bytes) {
        meta.trim_queue_bytes = trim_queue_bytes;
    }

    table trim_queue_limit {
        key = { standard_metadata.egress_spec: exact; }
        actions = { set_trim_queue_bytes; NoAction; }
        default_action = NoAction();
        size = NUM_PORTS;
    }

    /* Cut to `kept` bytes (Ethernet/IPv4/UDP/FTH and, past a 58-byte trim size,
     * some payload the receiver ignores). FTH length stays: it names the lost
     * range. The UDP checksum no longer covers the payload, so it becomes 0. */
    action trim(bit<32> kept) {
        truncate(kept);
        hdr.fth.flags = hdr.fth.flags | FTH_FLAG_TRIMMED;
        hdr.ipv4.totalLen = (bit<16>)(kept - ETH_HEADER_BYTES);
        hdr.udp.length = (bit<16>)(kept - ETH_HEADER_BYTES - IPV4_HEADER_BYTES);
        hdr.udp.checksum = 0;
        port_trims.count((bit<32>)standard_metadata.egress_spec);
        port_trim_tx.count((bit<32>)standard_metadata.egress_spec);
    }

    /* Trimmed, but the trim queue has no room: SAI's trimmed-but-dropped. */
    action drop_trimmed() {
        port_trims.count((bit<32>)standard_metadata.egress_spec);
        port_trim_drops.count((bit<32>)standard_metadata.egress_spec);
        mark_to_drop(standard_metadata);
    }

    action mark_ce() {
        hdr.ipv4.ecn = ECN_CE;
        port_ce_marks.count((bit<32>)standard_metadata.egress_spec);
    }

    /* Transport control goes ahead of data unless an entry here, keyed on the
     * FTH opcode, queues it with data: ns-3's switches queue ACKs and NACKs
     * behind data in one FIFO (ACK_HIGH_PRIO 0), and ASTRA-sim's CNP is a flag
     * on the ACK. Such control is admitted as data is, but never trimmed or
     * marked: a full data queue drops it. Trimmed DATA is not looked up: it
     * always goes ahead. */
    action queue_with_data() {
        meta.control_with_data = 1;
    }

    table control_queue {
        key = { hdr.fth.opcode: exact; }
        actions = { queue_with_data; NoAction; }
        default_action = NoAction();
        size = 16;
    }

    /* Egress may release bytes of the same port concurrently: the add is one
     * read-modify-write inside one action, which BMv2 runs under the register
     * array's lock (and which @atomic asks of any other target). */
    action admit_low(bit<32> size) {
        @atomic {
            bit<32> occupancy;
            low_queue_occupancy.read(occupancy, (bit<32>)standard_metadata.egress_spec);
            low_queue_occupancy.write((bit<32>)standard_metadata.egress_spec, occupancy + size);
        }
        meta.admitted_bytes = size;
        standard_metadata.priority = PRIO_LOW;
    }

    /* Mirror of admit_low for the high queue, whose bytes only bound trims. */
    action admit_high(bit<32> size) {
        @atomic {
            bit<32> occupancy;
            high_queue_occupancy.read(occupancy, (bit<32>)standard_metadata.egress_spec);
            high_queue_occupancy.write((bit<32>)standard_metadata.egress_spec, occupancy + size);
        }
        meta.admitted_high_bytes = size;
        standard_metadata.priority = PRIO_HIGH;
    }

    apply {
        /* Read only for routed packets, whose IPv4 header is valid. */
        bool expired = hdr.ipv4.ttl <= 1;
        bool malformed = standard_metadata.parser_error != error.NoError
                         || standard_metadata.checksum_error == 1;
        bool is_data = hdr.fth.isValid() && hdr.fth.opcode == FTH_OPCODE_DATA
                       && (hdr.fth.flags & FTH_FLAG_TRIMMED) == 0;
        /* ACK, NACK, CNP, and DATA already trimmed upstream. */
        bool is_control = hdr.fth.isValid() && !is_data;
        bit<32> size = standard_metadata.packet_length;

        if (hdr.ipv4.isValid()) {
            if (hdr.udp.isValid()) {
                meta.l4_src_port = hdr.udp.srcPort;
                meta.l4_dst_port = hdr.udp.dstPort;
            }
            switch (ipv4_lpm.apply().action_run) {
                set_ecmp_group: {
                    if (meta.ecmp_num_members == 0) {
                        drop();
                    } else {
                        choose_ecmp_member();
                        ecmp_nhop.apply();
                    }
                }
            }
        } else {
            drop();
        }

        if (meta.routed == 1) {
            if (expired || malformed) {
                drop_at_port();
            } else {
                if (is_control && hdr.fth.opcode != FTH_OPCODE_DATA) {
                    control_queue.apply();
                }
                if (is_control && meta.control_with_data == 0) {
                    admit_high(size);
                } else if (!port_thresholds.apply().hit) {
                    admit_low(size);
                } else {
                    bit<32> occupancy;
                    low_queue_occupancy.read(occupancy, (bit<32>)standard_metadata.egress_spec);
                    if (occupancy + size > meta.data_queue_bytes) {
                        if (is_data) {
                            trim_eligibility.apply();
                            trim_acl.apply();
                        }
                        if (!is_data || meta.trim_disabled == 1) {
                            drop_at_port();
                        } else {
                            meta.trim_size = TRIMMED_FRAME_BYTES;
                            meta.trim_queue = PRIO_HIGH;
                            switch_trimming.apply();
                            bit<32> kept = size < meta.trim_size ? size : meta.trim_size;
                            /* The trimmed packet must fit its queue: the data queue's
                             * budget, or the high queue's limit where one is set. */
                            bool full = false;
                            if (meta.trim_queue == PRIO_LOW) {
                                full = occupancy + kept > meta.data_queue_bytes;
                            } else if (trim_queue_limit.apply().hit) {
                                bit<32> queued;
                                high_queue_occupancy.read(queued, (bit<32>)standard_metadata.egress_spec);
                                full = queued + kept > meta.trim_queue_bytes;
                            }
                            if (full) {
                                drop_trimmed();
                            } else {
                                trim(kept);
                                trim_dscp.apply();
                                if (meta.trim_queue == PRIO_LOW) {
                                    admit_low(kept);
                                } else {
                                    admit_high(kept);
                                }
                            }
                        }
                    } else {
                        if (is_data && hdr.ipv4.ecn != ECN_NOT_ECT && hdr.ipv4.ecn != ECN_CE
                                && occupancy >= meta.ecn_kmin) {
                            if (occupancy >= meta.ecn_kmax) {
                                mark_ce();
                            } else {
                                /* Probability pmax/65536 * (occ-kmin)/(kmax-kmin), without a
                                 * division: r*(kmax-kmin) < pmax*(occ-kmin), r uniform in [0, 65535]. */
                                bit<16> r;
                                random(r, 0, ECN_RANDOM_MAX);
                                bit<64> lhs = (bit<64>)r * (bit<64>)(meta.ecn_kmax - meta.ecn_kmin);
                                bit<64> rhs = (bit<64>)meta.ecn_pmax
                                              * (bit<64>)(occupancy - meta.ecn_kmin);
                                if (lhs < rhs) {
                                    mark_ce();
                                }
                            }
                        }
                        admit_low(size);
                    }
                }
            }
        }
    }
}

/*************************************************************************
 *  Egress: release low-queue bytes, count what leaves
 *************************************************************************/

control ForgiveEgress(inout headers_t hdr,
                      inout metadata_t meta,
                      inout standard_metadata_t standard_metadata) {

    counter(NUM_PORTS, CounterType.packets_and_bytes) port_tx;

    /* Mirror of admit_low; clamps at 0 so a register cleared by the control
     * plane while packets are queued cannot wrap. */
    action release_low() {
        @atomic {
            bit<32> occupancy;
            low_queue_occupancy.read(occupancy, (bit<32>)standard_metadata.egress_port);
            low_queue_occupancy.write((bit<32>)standard_metadata.egress_port,
                occupancy > meta.admitted_bytes ? occupancy - meta.admitted_bytes : 0);
        }
    }

    action release_high() {
        @atomic {
            bit<32> occupancy;
            high_queue_occupancy.read(occupancy, (bit<32>)standard_metadata.egress_port);
            high_queue_occupancy.write((bit<32>)standard_metadata.egress_port,
                occupancy > meta.admitted_high_bytes ? occupancy - meta.admitted_high_bytes : 0);
        }
    }

    apply {
        if (meta.admitted_bytes != 0) {
            release_low();
        }
        if (meta.admitted_high_bytes != 0) {
            release_high();
        }
        port_tx.count((bit<32>)standard_metadata.egress_port);
    }
}

/*************************************************************************
 *  Checksum computation
 *************************************************************************/

control ForgiveComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        update_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.dscp, hdr.ipv4.ecn,
              hdr.ipv4.totalLen, hdr.ipv4.identification, hdr.ipv4.flags,
              hdr.ipv4.fragOffset, hdr.ipv4.ttl, hdr.ipv4.protocol,
              hdr.ipv4.srcAddr, hdr.ipv4.dstAddr },
            hdr.ipv4.hdrChecksum, HashAlgorithm.csum16);
    }
}

/*************************************************************************
 *  Deparser
 *************************************************************************/

control ForgiveDeparser(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.fth);
    }
}

V1Switch(
    ForgiveParser(),
    ForgiveVerifyChecksum(),
    ForgiveIngress(),
    ForgiveEgress(),
    ForgiveComputeChecksum(),
    ForgiveDeparser()
) main;
