"""The types of the JSON-lines records a run leaves: written by the hosts and ranks, read
by the collector, the runner's progress line and the soak.

Every record carries its type under `TYPE`. A rank's training file
(`<host>.train.jsonl`) holds TRAIN_STEP, LOSS_LAYOUT, LOSS, CONTENT_ERROR,
TRAIN_FAILED and TRAIN_DONE records; a host's statistics file (`<host>.agent.jsonl`) holds one
record per completed flow (FLOW_SEND, FLOW_RECV, FLOW_SHED, FLOW_FAILED), each
BOUND_VIOLATION, and the AGENT summary written when the host stops.
"""

TYPE = "type"
"""The key of a record's type in every record."""

TRAIN_STEP = "train_step"
LOSS_LAYOUT = "loss_layout"
LOSS = "loss"
CONTENT_ERROR = "content_error"
TRAIN_FAILED = "train_failed"
TRAIN_DONE = "train_done"

FLOW_SEND = "flow_send"
FLOW_RECV = "flow_recv"
FLOW_SHED = "flow_shed"
FLOW_FAILED = "flow_failed"
BOUND_VIOLATION = "bound_violation"
AGENT = "agent"
