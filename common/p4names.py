"""The control-plane names of both P4 programs: every table, action, key field, counter
and register a controller, a test or the switch model names.

p4src/forgive.p4 (v1model: BMv2 and the switch model) comes first; the TNA
port (p4src/tna/forgive.p4) keeps its names for routes, next hops and ECMP
groups, and the second part lists where it differs. switch_model.surface adds
the shapes the model implements (key widths, action parameters, counter
units) to the v1model names; controller.tofino drives the TNA ones.
docs/dataplane.md and docs/tofino.md describe the programs.
"""

# -- p4src/forgive.p4 (v1model) ------------------------------------------------------

INGRESS = "ForgiveIngress"
EGRESS = "ForgiveEgress"
"""The program's two controls; every table, action and counter name below is qualified by one."""

LPM_TABLE = f"{INGRESS}.ipv4_lpm"
ECMP_TABLE = f"{INGRESS}.ecmp_nhop"
THRESHOLD_TABLE = f"{INGRESS}.port_thresholds"
SWITCH_TRIMMING_TABLE = f"{INGRESS}.switch_trimming"
"""Keyless: its default entry holds the switch-wide trim size and queue."""
TRIM_ELIGIBILITY_TABLE = f"{INGRESS}.trim_eligibility"
TRIM_ACL_TABLE = f"{INGRESS}.trim_acl"
TRIM_DSCP_TABLE = f"{INGRESS}.trim_dscp"
TRIM_QUEUE_TABLE = f"{INGRESS}.trim_queue_limit"
CONTROL_QUEUE_TABLE = f"{INGRESS}.control_queue"
"""FTH opcode -> whether that transport control waits in the data queue (queue_with_data)."""

DST_ADDR = "hdr.ipv4.dstAddr"
SRC_ADDR = "hdr.ipv4.srcAddr"
FTH_OPCODE = "hdr.fth.opcode"
DSCP = "hdr.ipv4.dscp"
ECMP_GROUP_ID = "meta.ecmp_group_id"
ECMP_MEMBER = "meta.ecmp_member"
EGRESS_SPEC = "standard_metadata.egress_spec"

SET_NHOP = f"{INGRESS}.set_nhop"
SET_ECMP_GROUP = f"{INGRESS}.set_ecmp_group"
DROP = f"{INGRESS}.drop"
SET_THRESHOLDS = f"{INGRESS}.set_thresholds"
SET_SWITCH_TRIMMING = f"{INGRESS}.set_switch_trimming"
DISABLE_TRIM = f"{INGRESS}.disable_trim"
SET_TRIM_DSCP = f"{INGRESS}.set_trim_dscp"
SET_TRIM_QUEUE_BYTES = f"{INGRESS}.set_trim_queue_bytes"
QUEUE_WITH_DATA = f"{INGRESS}.queue_with_data"
NO_ACTION = "NoAction"

PORT_TX = f"{EGRESS}.port_tx"
PORT_CE_MARKS = f"{INGRESS}.port_ce_marks"
PORT_TRIMS = f"{INGRESS}.port_trims"
PORT_TRIM_TX = f"{INGRESS}.port_trim_tx"
PORT_TRIM_DROPS = f"{INGRESS}.port_trim_drops"
PORT_DROPS = f"{INGRESS}.port_drops"
COUNTERS = (PORT_TX, PORT_CE_MARKS, PORT_TRIMS, PORT_TRIM_TX, PORT_TRIM_DROPS, PORT_DROPS)

LOW_QUEUE_OCCUPANCY = "low_queue_occupancy"
HIGH_QUEUE_OCCUPANCY = "high_queue_occupancy"
"""The per-port registers of each queue's bytes (diagnostic; nothing writes them over
P4Runtime)."""

# -- p4src/tna/forgive.p4 (TNA), where it differs -------------------------------------

ECMP_PROFILE = f"{INGRESS}.ecmp_profile"
TRIM_TABLE = f"{INGRESS}.trim_sessions"
SET_TRIM_SESSION = f"{INGRESS}.set_trim_session"
ECN_TABLE = f"{EGRESS}.ecn_marking"
MARK_CE = f"{EGRESS}.mark_ce"
TRIM_LENGTHS_TABLE = f"{EGRESS}.trim_lengths"
"""Keyless: its default entry holds the lengths of a packet trimmed to the trim size."""
SET_TRIM_LENGTHS = f"{EGRESS}.set_trim_lengths"
TNA_TRIM_DSCP_TABLE = f"{EGRESS}.trim_dscp"
"""The per-port trim DSCP, applied as the trimmed header leaves its port."""
TNA_SET_TRIM_DSCP = f"{EGRESS}.set_trim_dscp"
EGRESS_PORT = "egress_port"
ENQ_QDEPTH = "enq_qdepth"
MARK_DRAW = "mark_draw"
TNA_PORT_CE_MARKS = f"{EGRESS}.port_ce_marks"
TNA_PORT_TRIMS = f"{EGRESS}.port_trims"
TNA_PORT_TRIM_TX = f"{EGRESS}.port_trim_tx"
TNA_PORT_EGRESS_DROPS = f"{EGRESS}.port_drops"
"""Drops for want of room; PORT_DROPS (ingress) counts the malformed, as in v1model."""
