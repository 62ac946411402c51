"""The FORGIVE protocol as a pure library: no sockets, no clock, no threads.

Bytes and `now` go in; bytes and deadlines come out, and the state of a flow or
step as frozen dataclasses (`RxFlowState`, `StepState`, `TxFlowState`). The raw-socket agent, the
switch model's tests and any simulator drive these same objects.
"""

from host_agent.core.dcqcn import (
    DEFAULT_PROFILE,
    PROFILES,
    DcqcnParams,
    DcqcnRate,
    LineRate,
    NicDcqcnRate,
    new_rate,
)
from host_agent.core.detector import (
    AccordionDetector,
    CriticalRegimeDetector,
    Misclassifying,
    StaticSchedule,
)
from host_agent.core.nscc import CONTROLS, DEFAULT_CONTROL, NsccParams, NsccWindow
from host_agent.core.receiver import (
    ForgiveReceiver,
    ReceiverCounts,
    ReceiverPolicy,
    RxFlowState,
    StepState,
)
from host_agent.core.sender import (
    EXEMPT,
    OBEYING,
    ForgiveSender,
    SenderCounts,
    TxFlowState,
    WindowState,
)

__all__ = [
    "CONTROLS",
    "DEFAULT_CONTROL",
    "DEFAULT_PROFILE",
    "EXEMPT",
    "OBEYING",
    "PROFILES",
    "AccordionDetector",
    "CriticalRegimeDetector",
    "DcqcnParams",
    "DcqcnRate",
    "ForgiveReceiver",
    "ForgiveSender",
    "LineRate",
    "Misclassifying",
    "NicDcqcnRate",
    "NsccParams",
    "NsccWindow",
    "ReceiverCounts",
    "ReceiverPolicy",
    "RxFlowState",
    "SenderCounts",
    "StaticSchedule",
    "StepState",
    "TxFlowState",
    "WindowState",
    "new_rate",
]
