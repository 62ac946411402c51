"""The host's control plane for the FORGIVE NIC program (p4src/pna/forgive_nic.p4) on BMv2 pna_nic.

BMv2's pna_nic serves no P4Runtime: its only control channel is BMv2's Thrift
runtime (the `standard` service every BMv2 target has, plus a `pna_nic`
service of its own), the one `pna_nic_CLI` speaks. So this module, not the
P4Runtime client (`controller.client`, which drives the switches), is the
NIC's client: it writes the per-rank registers the host owns at each step and
each flow registration, installs the flow table, and reads the pipeline's
registers back. The Thrift bindings are the ones BMv2 installs (`bm_runtime`);
`bmv2_python_dir` finds them where the installed CLI looks.

The calls mirror the host-local facts of the receiver core (docs/protocol.md
section 5): `begin_step`, `complete_step`, `register_flow`, `forget_flow`,
under the same `ReceiverPolicy`, so the NIC and the core decide alike.
"""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from host_agent.core import ReceiverPolicy

BUILD_DIR = Path(__file__).resolve().parents[1] / "p4src" / "pna" / "build"
"""The committed compiler output for the NIC (`make p4-nic` rebuilds it)."""
NIC_P4INFO = BUILD_DIR / "forgive_nic.p4info.txtpb"
NIC_JSON = BUILD_DIR / "forgive_nic.json"

CLI = "pna_nic_CLI"
"""BMv2's CLI for pna_nic: a Python wrapper that names where BMv2's Python bindings live."""

P_SCALE = 1_000_000
"""p in the pipeline is parts per million: exact for every p of up to six decimals."""
FORGIVE_PROB_ONE = 65536
"""P in the pipeline is in units of 1/65536, against a 16-bit draw in [0, 65535]."""
NUM_FLOW_SLOTS = 1024
NUM_STEP_SLOTS = 16

FLOW_IN_ORDER = 0
FLOW_HOLE = 1
FLOW_HOST = 2
"""A flow slot's states (p4src/pna/include/nic_constants.p4)."""
FLOW_STATES = {FLOW_IN_ORDER: "in_order", FLOW_HOLE: "hole", FLOW_HOST: "host"}

FLOW_REGISTERS = ("flow_rcv_nxt", "flow_state", "flow_hole_end", "flow_last_draw")
"""The registers per flow slot, zeroed when a flow takes the slot."""
REGISTERS = (
    *FLOW_REGISTERS,
    "step_id", "step_p", "step_expected", "step_open",
    "step_received", "step_forgiven", "step_outstanding", "draw_state",
)  # fmt: skip
"""Every register of the NIC program, by its name in the main control."""
CONTROL = "ForgiveNicControl"
"""The main control's name: BMv2 names its tables, actions and registers under it."""
_CXT = 0


def p_fixed(p: float) -> int:
    """p in parts per million; a p that is not exact there would make the NIC's vesting
    bound differ from the core's, so it is refused."""
    exact = Fraction(str(p)) * P_SCALE
    if exact.denominator != 1 or not 0 <= exact < P_SCALE:
        raise ValueError(f"p={p} is not a multiple of 1e-6 in [0, 1): the NIC cannot hold it")
    return int(exact)


def forgive_prob_fixed(forgive_prob: float) -> int:
    """P in units of 1/65536, rounded to the nearest: the NIC forgives a range that vests
    when its draw d satisfies d < P * 65536, as the core does when random() < P; for a P
    that is a multiple of 1/65536 (0, 0.5, 1) the two agree for the same draw."""
    if not 0.0 <= forgive_prob <= 1.0:
        raise ValueError(f"forgive_prob must lie in [0, 1], got {forgive_prob}")
    return round(forgive_prob * FORGIVE_PROB_ONE)


def bmv2_python_dir(cli: str = CLI) -> Path | None:
    """Where BMv2 installed its Python bindings: the directory its CLI wrapper appends to
    sys.path (autotools' pythondir, which Debian's interpreter does not search)."""
    path = shutil.which(cli)
    if path is None:
        return None
    found = re.search(r'sys\.path\.append\("([^"]+)"\)', Path(path).read_text())
    return Path(found.group(1)) if found else None


def missing() -> str | None:
    """Why the NIC cannot be driven here, or None."""
    for tool in ("pna_nic", CLI):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    pydir = bmv2_python_dir()
    if pydir is None or not (pydir / "bm_runtime" / "standard").is_dir():
        return "BMv2's Python bindings (bm_runtime) not found beside pna_nic_CLI"
    try:
        import thrift  # noqa: F401
    except ImportError:
        return "the thrift Python package (Debian: python3-thrift) not installed"
    return None


def _bindings() -> tuple[Any, Any]:
    pydir = bmv2_python_dir()
    if pydir is None:
        raise RuntimeError(f"{CLI} not installed: BMv2's Python bindings cannot be found")
    if str(pydir) not in sys.path:
        sys.path.append(str(pydir))
    from bm_runtime.standard import Standard, ttypes

    return Standard, ttypes


def _param(value: int, bits: int) -> bytes:
    if not 0 <= value < 1 << bits:
        raise ValueError(f"{value} does not fit {bits} bits")
    return value.to_bytes((bits + 7) // 8, "big")


@dataclass(frozen=True)
class NicFlow:
    """A registered flow: where its state lives in the NIC and the table entry naming it."""

    flow_id: int
    slot: int
    step: int
    handle: int


class NicReceiverControl:
    """One host's connection to its NIC: the host-local facts in, the pipeline's state out.

    Refuses what the NIC program does not implement, before anything is written: the
    full-budget comparison (`vesting=False`) and a p the fixed point cannot hold.
    """

    def __init__(self, thrift_port: int, policy: ReceiverPolicy, host: str = "127.0.0.1"):
        if not policy.vesting:
            raise ValueError("the NIC implements vesting only; vesting=False stays on the host")
        self.policy = policy
        self._p = {False: p_fixed(policy.p_high), True: p_fixed(policy.p_low)}
        self._forgive_prob = forgive_prob_fixed(policy.forgive_prob)
        from thrift.protocol import TBinaryProtocol, TMultiplexedProtocol
        from thrift.transport import TSocket, TTransport

        standard, self._types = _bindings()
        self._transport = TTransport.TBufferedTransport(TSocket.TSocket(host, thrift_port))
        protocol = TMultiplexedProtocol.TMultiplexedProtocol(
            TBinaryProtocol.TBinaryProtocol(self._transport), "standard"
        )
        self._rt = standard.Client(protocol)
        self._transport.open()
        self._flows: dict[int, NicFlow] = {}
        self._free_slots = list(range(NUM_FLOW_SLOTS - 1, -1, -1))
        self._steps: dict[int, tuple[int, bool]] = {}
        """step -> (its p in parts per million, whether its budget is open)."""

    def close(self) -> None:
        self._transport.close()

    # -- the NIC's configuration ---------------------------------------------

    def reset(self) -> None:
        """Empty the flow table and zero every register, then set P again and seed the
        pipeline's draw generator with the policy's seed (the core's draw is seeded with it
        too; the two generators differ, so the suite feeds the core the NIC's). Not BMv2's
        reset_state: pna_nic (BMv2 9674187) resets a multicast engine there that it never
        created, and dies."""
        self._rt.bm_mt_clear_entries(_CXT, f"{CONTROL}.gradient_flows", False)
        for register in REGISTERS:
            self._rt.bm_register_reset(_CXT, f"{CONTROL}.{register}")
        self._write("draw_state", 0, self.policy.seed % (1 << 32))
        self._flows.clear()
        self._free_slots = list(range(NUM_FLOW_SLOTS - 1, -1, -1))
        self._steps.clear()
        self._set_default("forgive_policy", "set_forgive_prob", [_param(self._forgive_prob, 32)])

    def set_ports(self, network_port: int, host_port: int) -> None:
        self._set_default(
            "nic_ports", "set_ports", [_param(network_port, 32), _param(host_port, 32)]
        )

    def _set_default(self, table: str, action: str, data: list[bytes]) -> None:
        self._rt.bm_mt_set_default_action(_CXT, f"{CONTROL}.{table}", f"{CONTROL}.{action}", data)

    def _write(self, register: str, index: int, value: int) -> None:
        self._rt.bm_register_write(_CXT, f"{CONTROL}.{register}", index, value)

    def _read(self, register: str, index: int) -> int:
        return self._rt.bm_register_read(_CXT, f"{CONTROL}.{register}", index)

    # -- the host-local facts (receiver.py's begin_step ... forget_flow) -----

    def begin_step(self, step: int, critical: bool, expected_bytes: int) -> None:
        """OnStepBegin: the step's slot gets its id, p and expected bytes; counters zeroed."""
        if step in self._steps:
            raise ValueError(f"step {step} has already begun")
        if not 0 <= expected_bytes < 1 << 32:
            raise ValueError(f"expected_bytes must lie in [0, 2**32), got {expected_bytes}")
        slot = step % NUM_STEP_SLOTS
        for other, (_, is_open) in self._steps.items():
            if is_open and other % NUM_STEP_SLOTS == slot:
                raise ValueError(f"step slot {slot} still holds open step {other}")
        p = self._p[critical]
        for register, value in (
            ("step_id", step),
            ("step_p", p),
            ("step_expected", expected_bytes),
            ("step_received", 0),
            ("step_forgiven", 0),
            ("step_outstanding", 0),
            ("step_open", 1),
        ):
            self._write(register, slot, value)
        self._steps[step] = (p, True)

    def complete_step(self, step: int) -> None:
        """OnAllReduceComplete: the budget closes; the NIC hands later trims to the host."""
        if step in self._steps:
            self._write("step_open", step % NUM_STEP_SLOTS, 0)
            self._steps[step] = (self._steps[step][0], False)

    def register_flow(self, flow_id: int, step: int, size: int) -> NicFlow:
        """A gradient flow of `step` and `size` bytes. Only gradient flows are offloaded: every
        other flow's packets go to the host, whose core never forgives them. Eligibility is
        fixed here as the core fixes it."""
        if flow_id in self._flows:
            raise ValueError(f"flow {flow_id} is already registered")
        if not 0 < size < 1 << 32:
            raise ValueError(f"flow size must be an integer in 1..2**32-1, got {size!r}")
        if step not in self._steps:
            raise ValueError(f"step {step} has not begun")
        if not self._free_slots:
            raise ValueError(f"all {NUM_FLOW_SLOTS} flow slots are in use")
        p, is_open = self._steps[step]
        eligible = int(self.policy.exemption and is_open and p > 0)
        slot = self._free_slots.pop()
        for register in FLOW_REGISTERS:
            self._write(register, slot, 0)
        key = self._types.BmMatchParam(
            type=self._types.BmMatchParamType.EXACT,
            exact=self._types.BmMatchParamExact(_param(flow_id, 32)),
        )
        data = [
            _param(slot, 32),
            _param(step % NUM_STEP_SLOTS, 32),
            _param(step, 32),
            _param(size, 32),
            _param(eligible, 1),
        ]
        handle = self._rt.bm_mt_add_entry(
            _CXT,
            f"{CONTROL}.gradient_flows",
            [key],
            f"{CONTROL}.offload",
            data,
            self._types.BmAddEntryOptions(),
        )
        flow = NicFlow(flow_id, slot, step, handle)
        self._flows[flow_id] = flow
        return flow

    def forget_flow(self, flow_id: int) -> None:
        flow = self._flows.pop(flow_id, None)
        if flow is not None:
            self._rt.bm_mt_delete_entry(_CXT, f"{CONTROL}.gradient_flows", flow.handle)
            self._free_slots.append(flow.slot)

    # -- the pipeline's state ------------------------------------------------

    def step_state(self, step: int) -> dict[str, int | bool]:
        """The step's counters as the pipeline keeps them (the core's step_state names)."""
        slot = step % NUM_STEP_SLOTS
        return {
            "received": self._read("step_received", slot),
            "forgiven": self._read("step_forgiven", slot),
            "outstanding": self._read("step_outstanding", slot),
            "open": bool(self._read("step_open", slot)),
        }

    def flow_state(self, flow_id: int) -> dict[str, int | str]:
        """rcv_nxt, the slot's state, the requested hole's end and the last draw taken."""
        slot = self._flows[flow_id].slot
        return {
            "rcv_nxt": self._read("flow_rcv_nxt", slot),
            "state": FLOW_STATES[self._read("flow_state", slot)],
            "hole_end": self._read("flow_hole_end", slot),
            "last_draw": self._read("flow_last_draw", slot),
        }
