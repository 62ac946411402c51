/* Numbers of the NIC program (forgive_nic.p4) beyond the shared ones in
 * ../../include/constants.p4: the replies it writes, its fixed point and its
 * table sizes. tests/test_p4_constants.py holds each one to its Python
 * counterpart (host_agent.wire, host_agent.frames, host_agent.host, controller.nic). */
#ifndef FORGIVE_NIC_CONSTANTS_P4
#define FORGIVE_NIC_CONSTANTS_P4

/* The replies: FTH opcodes and flags (docs/protocol.md section 1). */
const bit<4> FTH_OPCODE_ACK = 1;
const bit<4> FTH_OPCODE_NACK = 2;
const bit<8> FTH_FLAG_ELIGIBLE = 0x04;
const bit<8> FTH_FLAG_EXHAUSTED = 0x08;
const bit<8> FTH_KNOWN_FLAGS = 0x3F;
/* The largest DATA payload: the one packet EXHAUSTED keeps room for. */
const bit<32> PACKET_BYTES = 4096;

/* A reply's framing, as the host agent frames its own control packets. */
const bit<6>  DSCP_CONTROL = 48;
const bit<8>  REPLY_TTL = 64;
const bit<3>  IPV4_FLAG_DONT_FRAGMENT = 2;
const bit<16> REPLY_UDP_SRC_PORT = 0xC000;

/* p is a fraction in parts per million, so every p the receiver policy writes
 * with up to six decimals (0.005, 0.1) is exact; P, the forgiveness
 * probability, is in units of 1/65536, against a 16-bit draw. */
const bit<32> P_SCALE = 1000000;
const bit<32> FORGIVE_PROB_ONE = 65536;

/* Register slots: flows and steps at one receiving rank. */
const bit<32> NUM_FLOW_SLOTS = 1024;
const bit<32> NUM_STEP_SLOTS = 16;

/* A flow slot's state: nothing requested above rcv_nxt; one requested range
 * [rcv_nxt, hole_end) and nothing above it; handed to the host for good. */
const bit<8> FLOW_IN_ORDER = 0;
const bit<8> FLOW_HOLE = 1;
const bit<8> FLOW_HOST = 2;

#endif
