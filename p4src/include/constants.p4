/* Numbers of the FORGIVE wire format and of the switch's queueing, stated once more
 * for P4: tests/test_p4_constants.py holds them to common/wire.py and switch_model. */
#ifndef FORGIVE_CONSTANTS_P4
#define FORGIVE_CONSTANTS_P4

const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<8>  IPPROTO_UDP = 17;
const bit<4>  IPV4_IHL_NO_OPTIONS = 5;
const bit<16> FORGIVE_UDP_PORT = 17991;

const bit<4> FTH_VERSION = 1;
const bit<4> FTH_OPCODE_DATA = 0;
const bit<8> FTH_FLAG_TRIMMED = 0x01;

/* IPv4 ECN codepoints (RFC 3168). */
const bit<2> ECN_NOT_ECT = 0;
const bit<2> ECN_CE = 3;

/* A trimmed packet keeps Ethernet (14), IPv4 (20), UDP (8) and FTH (16): the
 * default trim size. A larger trim size keeps some payload too; the lengths of a
 * trimmed packet are then its kept bytes less the headers in front of them. */
const bit<32> TRIMMED_FRAME_BYTES = 58;
const bit<16> TRIMMED_IPV4_TOTAL_LEN = 44;
const bit<16> TRIMMED_UDP_LEN = 24;
const bit<32> ETH_HEADER_BYTES = 14;
const bit<32> IPV4_HEADER_BYTES = 20;

/* Strict priority on BMv2 (simple_switch --priority-queues 2): the queueing
 * logic serves the highest priority value first, so 1 is the high queue. */
const bit<3> PRIO_HIGH = 1;
const bit<3> PRIO_LOW = 0;

/* ecn_pmax is a fraction in units of 1/65536; the RED draw is a 16-bit random. */
const bit<16> ECN_RANDOM_MAX = 0xFFFF;

/* One slot per v1model port number (bit<9>). */
const bit<32> NUM_PORTS = 512;

#endif
