/* Header and metadata types shared by the FORGIVE programs. */
#ifndef FORGIVE_HEADERS_P4
#define FORGIVE_HEADERS_P4

typedef bit<9>  port_t;
typedef bit<48> mac_addr_t;
typedef bit<32> ipv4_addr_t;

header ethernet_t {
    mac_addr_t dstAddr;
    mac_addr_t srcAddr;
    bit<16>    etherType;
}

header ipv4_t {
    bit<4>      version;
    bit<4>      ihl;
    bit<6>      dscp;
    bit<2>      ecn;
    bit<16>     totalLen;
    bit<16>     identification;
    bit<3>      flags;
    bit<13>     fragOffset;
    bit<8>      ttl;
    bit<8>      protocol;
    bit<16>     hdrChecksum;
    ipv4_addr_t srcAddr;
    ipv4_addr_t dstAddr;
}

header udp_t {
    bit<16> srcPort;
    bit<16> dstPort;
    bit<16> length;
    bit<16> checksum;
}

/* FORGIVE transport header, 16 bytes (docs/protocol.md section 1). */
header fth_t {
    bit<4>  version;
    bit<4>  opcode;
    bit<8>  flags;
    bit<16> length;
    bit<32> flow_id;
    bit<32> seq;
    bit<32> aux;
}

struct headers_t {
    ethernet_t ethernet;
    ipv4_t     ipv4;
    udp_t      udp;
    fth_t      fth;
}

struct metadata_t {
    /* ECMP selection; names are part of the control surface (ecmp_nhop keys). */
    bit<16> ecmp_group_id;
    bit<16> ecmp_member;
    bit<16> ecmp_num_members;
    /* L4 ports fed to the ECMP hash, 0 for packets without UDP. */
    bit<16> l4_src_port;
    bit<16> l4_dst_port;
    /* Set by set_nhop: the packet has an egress port. */
    bit<1>  routed;
    /* Bytes this packet added to its egress port's low-queue occupancy;
     * egress takes exactly this much off again. 0 when not in the low queue. */
    bit<32> admitted_bytes;
    /* The same for the high queue (transport control and trimmed headers). */
    bit<32> admitted_high_bytes;
    /* Per-port thresholds, valid when port_thresholds hit. */
    bit<32> data_queue_bytes;
    bit<32> ecn_kmin;
    bit<32> ecn_kmax;
    bit<32> ecn_pmax;
    /* Trimming (docs/dataplane.md, "Trimming"): the switch-wide size and queue,
     * set before switch_trimming applies; whether a table disabled the trim;
     * the trim queue's byte limit, valid when trim_queue_limit hit. */
    bit<32> trim_size;
    bit<3>  trim_queue;
    bit<1>  trim_disabled;
    bit<32> trim_queue_bytes;
    /* Set by control_queue: this transport control waits in the data queue. */
    bit<1>  control_with_data;
}

#endif
