/* -*- P4_16 -*- */
/* The reference for benchmarks/bench_bmv2.py: parse Ethernet, send port 1 to port 2. */
#include <core.p4>
#include <v1model.p4>

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

struct headers_t { ethernet_t ethernet; }
struct metadata_t { }

parser MinimalParser(packet_in packet, out headers_t hdr, inout metadata_t meta,
                     inout standard_metadata_t standard_metadata) {
    state start {
        packet.extract(hdr.ethernet);
        transition accept;
    }
}

control MinimalVerifyChecksum(inout headers_t hdr, inout metadata_t meta) { apply { } }

control MinimalIngress(inout headers_t hdr, inout metadata_t meta,
                       inout standard_metadata_t standard_metadata) {
    apply { standard_metadata.egress_spec = 2; }
}

control MinimalEgress(inout headers_t hdr, inout metadata_t meta,
                      inout standard_metadata_t standard_metadata) { apply { } }

control MinimalComputeChecksum(inout headers_t hdr, inout metadata_t meta) { apply { } }

control MinimalDeparser(packet_out packet, in headers_t hdr) {
    apply { packet.emit(hdr.ethernet); }
}

V1Switch(MinimalParser(), MinimalVerifyChecksum(), MinimalIngress(), MinimalEgress(),
         MinimalComputeChecksum(), MinimalDeparser()) main;
