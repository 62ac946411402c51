"""Leaf-spine fabrics: presets, the fabric file format, and the plan they expand into.

A fabric is described at the note's scale (400 Gbps host links, a 4 MiB data
queue, ECN from 800 KB) and shrunk by one `Scaling`. A fabric file is TOML:

    name = "my-fabric"
    leaves = 2
    spines = 1
    hosts_per_leaf = 2
    host_link_gbps = 400        # fabric scale
    spine_link_gbps = 400       # per leaf-spine link

    [switch]                    # fabric scale; all optional
    data_queue_bytes = 4194304
    ecn_kmin_bytes = 800000
    ecn_kmax_bytes = 3200000
    ecn_pmax = 0.2
    control = "high"            # or "data": ACKs, NACKs and CNPs queue behind data

    [emulation]                 # all optional
    host_link_mbps = 20
    byte_scale = 64

    [nic]                       # the hosts' transport; all optional (docs/dcqcn.md)
    window = "none"             # or "bdp": a bandwidth-delay-product window per flow
    dcqcn_state = "message"     # or "qp": DCQCN state per peer and class, across messages
    payload_bytes = 4096        # DATA bytes per packet (ASTRA-sim's ns-3 runs 1000)
    paths = "spray"             # or "message": one source port, so one ECMP path, per message
    cnp = "paced"               # or "per-mark": a CNP for every marked packet
    ack_every = 0               # data packets per ACK at most; 0: the transport's own (32)

    [trimming]                  # all optional: controller.trimming has every key
    size = 58
    dscp_value = "from-tc"
    tc_value = 5
    port_qos_map = { host = "host_trim", fabric = "fabric_trim" }
    [trimming.tc_to_dscp_map.host_trim]
    5 = 3

Oversubscription at a leaf is hosts_per_leaf * host_link / (spines * spine_link).
The trimming section is the controller's, as the switches get it, except that
`trim_queue_bytes` is at fabric scale and shrinks like every queue size.
Every error names the file and the key, in one line, before anything starts.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from common.wire import PACKET_BYTES
from controller import trimming as trim_section
from controller.p4info import ConfigError
from controller.topology import MAX_RATE_BPS, Fabric
from controller.topology import parse as parse_description
from controller.trimming import Trimming
from runplan.scaling import FABRIC_HOST_LINK_BPS, Scaling, ScalingError
from switch_model.surface import PMAX_ONE, Thresholds
from workload.plan import MAX_RANKS

DEFAULT_BYTE_SCALE = 64.0
"""Bytes divided by this when the simulator runs a fabric at its own rates: the note's 64-rank,
20-step job then runs within 10 minutes on one core here (benchmarks/bench_sim.py measures it)."""
LINK_DELAY_S = 1e-6
"""Propagation delay of every link at fabric scale (a few hundred metres of fibre and a
switch's port-to-port latency); stretched by the time scale like every other duration. The
simulator models it; the emulation's veths have their own."""
MAX_FILE_BYTES = 1 << 20
"""A fabric file is a few lines; one this long is read no further than this."""
NAME = re.compile(r"[A-Za-z0-9_-]{1,40}")
"""A fabric's name: a short identifier, since it becomes part of a results folder's name
(`results/<time>-<name>`), where a `/` or `..` would put the results elsewhere."""


class FabricError(ValueError):
    """A fabric description that cannot be built; the message is one line for the user."""


@dataclass(frozen=True)
class SwitchSettings:
    data_queue_bytes: int = 4 << 20
    ecn_kmin_bytes: int = 800_000
    ecn_kmax_bytes: int = 3_200_000
    ecn_pmax: float = 0.2
    control: str = "high"
    """"high": transport control (ACK, NACK, CNP) goes ahead of data, as the note's fabric
    sends it; "data": it waits in the data queue, as ns-3's switches queue ACKs and NACKs in
    the data FIFO (switch-node.cc, `SendToDev`: only CNPs and PFC go to queue 0 unless
    ACK_HIGH_PRIO is set, and astra-network-ns3's config.txt leaves it 0) and ASTRA-sim's
    CNP is a flag on the ACK. The controller sets it through forgive.p4's control_queue
    table. Trimmed headers go ahead either way."""


CONTROL_QUEUES = ("high", "data")
CONTROL_WITH_DATA = ("ack", "nack", "cnp")
"""What `control = "data"` queues behind data (controller.topology's control_queue names)."""
WINDOWS = ("none", "bdp")
DCQCN_STATES = ("message", "qp")
PATHS = ("spray", "message")
CNPS = ("paced", "per-mark")
ECN_FRACTIONS = (800_000 / (4 << 20), 3_200_000 / (4 << 20))
"""The note's marking thresholds as fractions of its 4 MiB data queue."""


@dataclass(frozen=True)
class NicSettings:
    """The hosts' transport beside DCQCN (docs/dcqcn.md, "Sender options"); the defaults are
    the project's own, the alternatives what ASTRA-sim's ns-3 backend and real NICs run."""

    window: str = "none"
    """"bdp": each flow may have one bandwidth-delay product of the longest path unacknowledged
    at the line rate, shrinking with its rate (ns-3 HAS_WIN 1, VAR_WIN 1); "none"."""
    dcqcn_state: str = "message"
    """"message": every message starts at the line rate with fresh state (ASTRA-sim's
    SendFlow opens a QP per message); "qp": state per peer and traffic class, kept across
    messages (a NIC's QP, NCCL's connections)."""
    payload_bytes: int = PACKET_BYTES
    """DATA bytes per packet; not byte-scaled (ns-3's PACKET_PAYLOAD_SIZE is 1000)."""
    paths: str = "spray"
    """"spray": a new UDP source port, so a new ECMP hash, per packet (the note's fabric sprays);
    "message": one source port per message, so every packet of it takes one path, as
    ASTRA-sim's `send_flow` opens each message on a fresh port (astra-sim
    network_frontend/ns3/entry.h, `portNumber[src][dst]++`) and ns-3's switches hash the
    5-tuple (switch-node.cc, `GetOutDev`)."""
    ack_every: int = 0
    """Data packets acknowledged by one ACK at most; 0: the transport's own coalescing (up to
    32, or a hold time: host_agent.acks). ns-3's receiver ACKs every packet
    (L2_ACK_INTERVAL 1), which clocks a window-limited flow packet by packet."""
    cnp: str = "paced"
    """"paced": the profile's notification point (a CNP at most every 4 us under the nic
    profile, docs/dcqcn.md); "per-mark": a CNP for every marked packet, as ns-3's receiver sets
    the CNP flag on the ACK of every marked packet it acknowledges (rdma-hw.cc `ReceiveUdp`,
    every packet ACKed at L2_ACK_INTERVAL 1)."""


@dataclass(frozen=True)
class FabricSpec:
    name: str
    leaves: int
    spines: int
    hosts_per_leaf: int
    host_link_gbps: float = 400.0
    spine_link_gbps: float = 400.0
    switch: SwitchSettings = field(default_factory=SwitchSettings)
    scaling: Scaling = field(default_factory=Scaling)
    trimming: Trimming = trim_section.DEFAULT
    """At fabric scale: `Plan.trimming` is what the switches get."""
    nic: NicSettings = field(default_factory=NicSettings)

    @property
    def oversubscription(self) -> float:
        if self.spines == 0:
            return 1.0
        return self.hosts_per_leaf * self.host_link_gbps / (self.spines * self.spine_link_gbps)

    @property
    def host_count(self) -> int:
        return self.leaves * self.hosts_per_leaf


PRESETS: dict[str, FabricSpec] = {
    # The note's eight-spines-per-leaf case, scaled down: as many spines as hosts per leaf.
    "nonblocking": FabricSpec("nonblocking", leaves=2, spines=2, hosts_per_leaf=2),
    "2to1": FabricSpec("2to1", leaves=2, spines=1, hosts_per_leaf=2),
    "4to1": FabricSpec("4to1", leaves=2, spines=1, hosts_per_leaf=4),
    # Every host on one switch: the many-to-one burst converges on one egress port.
    "incast": FabricSpec("incast", leaves=1, spines=0, hosts_per_leaf=6),
    # The note's own fabrics: 64 ranks on 8 leaves of 8 hosts, 8, 4 or 2 spines per leaf.
    "note-1to1": FabricSpec("note-1to1", leaves=8, spines=8, hosts_per_leaf=8),
    "note-2to1": FabricSpec("note-2to1", leaves=8, spines=4, hosts_per_leaf=8),
    "note-4to1": FabricSpec("note-4to1", leaves=8, spines=2, hosts_per_leaf=8),
}


def _check(spec: FabricSpec) -> FabricSpec:
    if not (isinstance(spec.name, str) and NAME.fullmatch(spec.name)):
        raise FabricError(f"name must be 1 to 40 letters, digits, '-' or '_', got {spec.name!r}")
    for key in ("leaves", "hosts_per_leaf"):
        if getattr(spec, key) < 1:
            raise FabricError(f"{key} must be >= 1, got {getattr(spec, key)}")
    if spec.spines < 0:
        raise FabricError(f"spines must be >= 0, got {spec.spines}")
    if spec.leaves > 1 and spec.spines == 0:
        raise FabricError("a fabric with several leaves needs at least one spine")
    if spec.host_count < 2:
        raise FabricError("a fabric needs at least two hosts")
    if spec.leaves > 250 or spec.hosts_per_leaf > 250 or spec.spines > 250:
        raise FabricError("at most 250 leaves, spines and hosts per leaf")
    if spec.host_count > MAX_RANKS:
        # before any plan: one of 62,500 hosts took 330 MB and 15 s to be refused by the run
        raise FabricError(
            f"{spec.leaves} leaves of {spec.hosts_per_leaf} hosts make {spec.host_count} hosts; "
            f"every host runs a training rank, and a job has at most {MAX_RANKS}"
        )
    for key in ("host_link_gbps", "spine_link_gbps"):
        gbps = getattr(spec, key)
        if not 0 < gbps <= MAX_RATE_BPS / 1e9:
            raise FabricError(f"{key} must lie in (0, {MAX_RATE_BPS / 1e9:g}], got {gbps}")
    nic = spec.nic
    if nic.window not in WINDOWS:
        raise FabricError(f"[nic] window must be one of {', '.join(WINDOWS)}, got {nic.window!r}")
    if nic.dcqcn_state not in DCQCN_STATES:
        raise FabricError(
            f"[nic] dcqcn_state must be one of {', '.join(DCQCN_STATES)}, got {nic.dcqcn_state!r}"
        )
    if spec.switch.control not in CONTROL_QUEUES:
        raise FabricError(
            f"[switch] control must be one of {', '.join(CONTROL_QUEUES)}, "
            f"got {spec.switch.control!r}"
        )
    if nic.paths not in PATHS:
        raise FabricError(f"[nic] paths must be one of {', '.join(PATHS)}, got {nic.paths!r}")
    if nic.cnp not in CNPS:
        raise FabricError(f"[nic] cnp must be one of {', '.join(CNPS)}, got {nic.cnp!r}")
    if not 0 <= nic.ack_every <= 1024:
        raise FabricError(f"[nic] ack_every must lie in 0..1024, got {nic.ack_every}")
    if not 1 <= nic.payload_bytes <= PACKET_BYTES:
        raise FabricError(
            f"[nic] payload_bytes must lie in 1..{PACKET_BYTES}, got {nic.payload_bytes}"
        )
    sw = spec.switch
    if not 0 < sw.ecn_kmin_bytes <= sw.ecn_kmax_bytes <= sw.data_queue_bytes:
        raise FabricError("need 0 < ecn_kmin_bytes <= ecn_kmax_bytes <= data_queue_bytes")
    if not 0 <= sw.ecn_pmax <= 1:
        raise FabricError(f"ecn_pmax must lie in [0, 1], got {sw.ecn_pmax}")
    try:
        spec.scaling.queue(sw.data_queue_bytes, "data_queue_bytes")
        spec.scaling.link(spec.host_link_gbps * 1e9, f"host_link_gbps = {spec.host_link_gbps:g}")
        if spec.spines:
            spec.scaling.link(
                spec.spine_link_gbps * 1e9, f"spine_link_gbps = {spec.spine_link_gbps:g}"
            )
    except ScalingError as err:
        raise FabricError(str(err)) from None
    trim_queue = plan(spec).trimming().trim_queue_bytes
    if trim_queue is not None and trim_queue < spec.trimming.size:
        raise FabricError(
            f"[trimming] trim_queue_bytes of {spec.trimming.trim_queue_bytes} B scales to "
            f"{trim_queue} B, under one {spec.trimming.size}-byte trimmed packet; lower "
            "byte_scale"
        )
    _check_description(spec)
    return spec


def _check_description(spec: FabricSpec) -> None:
    """The controller's parse of the description a run will hand it, before anything starts."""
    try:
        plan(spec).fabric()
    except ConfigError as err:
        raise FabricError(f"the scaled fabric is refused by the controller: {err}") from None


def preset(name: str, scaling: Scaling | None = None) -> FabricSpec:
    if name not in PRESETS:
        raise FabricError(f"unknown fabric preset {name!r}; presets: {', '.join(PRESETS)}")
    return with_scaling(PRESETS[name], scaling or PRESETS[name].scaling)


def with_data_queue(spec: FabricSpec, data_queue_bytes: int) -> FabricSpec:
    """`spec` with another data queue (fabric scale), marking at the note's fractions of it,
    so a ring step can be set against the buffer."""
    kmin, kmax = (int(f * data_queue_bytes) for f in ECN_FRACTIONS)
    switch = replace(
        spec.switch, data_queue_bytes=data_queue_bytes, ecn_kmin_bytes=kmin, ecn_kmax_bytes=kmax
    )
    return _check(replace(spec, switch=switch))


def with_scaling(spec: FabricSpec, scaling: Scaling) -> FabricSpec:
    """`spec` shrunk by another scaling, checked again (its queues must still fit)."""
    return _check(replace(spec, scaling=scaling))


def sim_scaling(
    spec: FabricSpec, host_link_mbps: float | None = None, byte_scale: float | None = None
) -> FabricSpec:
    """`spec` as the simulator runs it: at its own rates and DEFAULT_BYTE_SCALE, unless told
    otherwise (the fabric file's [emulation] section is the emulation's, not the simulator's)."""
    scaling = Scaling(
        host_link_bps=FABRIC_HOST_LINK_BPS if host_link_mbps is None else host_link_mbps * 1e6,
        byte_scale=DEFAULT_BYTE_SCALE if byte_scale is None else byte_scale,
    )
    return with_scaling(spec, scaling)


_TOP_KEYS = {"name", "leaves", "spines", "hosts_per_leaf", "host_link_gbps", "spine_link_gbps"}
_SECTIONS = {"switch", "emulation", "trimming", "nic"}
_NIC_KEYS = {
    "window": str,
    "dcqcn_state": str,
    "payload_bytes": int,
    "paths": str,
    "cnp": str,
    "ack_every": int,
}
_SWITCH_KEYS = {"data_queue_bytes", "ecn_kmin_bytes", "ecn_kmax_bytes", "ecn_pmax", "control"}
_EMULATION_KEYS = {"host_link_mbps", "byte_scale"}


def _typed(table: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = table[key]
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), math.isfinite(value)
    elif kind is float and ok:
        ok = math.isfinite(value)
    if not ok:
        raise FabricError(
            f"{where}{key} must be "
            f"{ {int: 'an integer', str: 'a string'}.get(kind, 'a finite number') }, "
            f"got {value!r}"
        )
    return value


def parse(doc: dict[str, Any]) -> FabricSpec:
    unknown = set(doc) - _TOP_KEYS - _SECTIONS
    if unknown:
        raise FabricError(f"unknown key(s) {', '.join(sorted(unknown))}")
    missing = {"leaves", "spines", "hosts_per_leaf"} - set(doc)
    if missing:
        raise FabricError(f"missing key(s) {', '.join(sorted(missing))}")
    top: dict[str, Any] = {"name": doc.get("name", "custom")}
    for key in ("leaves", "spines", "hosts_per_leaf"):
        top[key] = _typed(doc, key, int, "")
    for key in ("host_link_gbps", "spine_link_gbps"):
        if key in doc:
            top[key] = _typed(doc, key, float, "")
    sections = {}
    for section, keys in (("switch", _SWITCH_KEYS), ("emulation", _EMULATION_KEYS)):
        table = doc.get(section, {})
        if not isinstance(table, dict):
            raise FabricError(f"[{section}] must be a table")
        unknown = set(table) - keys
        if unknown:
            raise FabricError(f"unknown key(s) in [{section}]: {', '.join(sorted(unknown))}")
        sections[section] = {
            k: _typed(
                table,
                k,
                str
                if k == "control"
                else float
                if k in ("ecn_pmax", "host_link_mbps", "byte_scale")
                else int,
                f"[{section}] ",
            )
            for k in table
        }
    nic = doc.get("nic", {})
    if not isinstance(nic, dict):
        raise FabricError("[nic] must be a table")
    unknown = set(nic) - set(_NIC_KEYS)
    if unknown:
        raise FabricError(f"unknown key(s) in [nic]: {', '.join(sorted(unknown))}")
    for key, value in nic.items():
        if _NIC_KEYS[key] is str and not isinstance(value, str):
            raise FabricError(f"[nic] {key} must be a string, got {value!r}")
        if _NIC_KEYS[key] is int:
            _typed(nic, key, int, "[nic] ")
    emu = sections["emulation"]
    try:
        scaling = Scaling(
            host_link_bps=emu.get("host_link_mbps", Scaling.host_link_bps / 1e6) * 1e6,
            byte_scale=emu.get("byte_scale", Scaling.byte_scale),
        )
    except ScalingError as err:
        raise FabricError(str(err)) from None
    try:
        trimming = trim_section.parse(doc.get("trimming", {}), "[trimming]")
    except ConfigError as err:
        raise FabricError(str(err)) from None
    return _check(
        FabricSpec(
            **top,
            switch=SwitchSettings(**sections["switch"]),
            scaling=scaling,
            trimming=trimming,
            nic=NicSettings(**nic),
        )
    )


def load(path: str | Path) -> FabricSpec:
    """Read and validate a fabric file; every failure is a FabricError naming the file."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise FabricError(
                f"fabric file {path}: over {MAX_FILE_BYTES >> 10} KiB, not a fabric file"
            )
        doc = tomllib.loads(data.decode())
    except OSError as err:
        raise FabricError(f"fabric file {path}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise FabricError(f"fabric file {path}: not TOML (not UTF-8 text: {err})") from None
    except RecursionError:
        raise FabricError(f"fabric file {path}: not TOML (nested too deep)") from None
    except tomllib.TOMLDecodeError as err:
        raise FabricError(f"fabric file {path}: not TOML: {err}") from None
    try:
        return parse(doc)
    except FabricError as err:
        raise FabricError(f"fabric file {path}: {err}") from None


# -- the plan a spec expands into ---------------------------------------------------


@dataclass(frozen=True)
class Host:
    name: str
    ip: str
    mac: str
    leaf: str
    port: int


@dataclass(frozen=True)
class Link:
    a: str
    a_port: int | None
    b: str
    b_port: int
    rate_bps: int


def link_name(link: Link) -> str:
    """A link as `--pcap` names it: a host's own link by the host, one between switches as
    `leaf-spine`."""
    return link.a if link.a_port is None else f"{link.a}-{link.b}"


@dataclass(frozen=True)
class Plan:
    spec: FabricSpec
    switches: list[str]
    hosts: list[Host]
    links: list[Link]

    def thresholds(self) -> Thresholds:
        sw, sc = self.spec.switch, self.spec.scaling
        return Thresholds(
            data_queue_bytes=sc.queue(sw.data_queue_bytes, "data_queue_bytes"),
            ecn_kmin=sc.size(sw.ecn_kmin_bytes),
            ecn_kmax=sc.size(sw.ecn_kmax_bytes),
            ecn_pmax=round(sw.ecn_pmax * PMAX_ONE),
        )

    def trimming(self) -> Trimming:
        """The spec's trimming at the emulation's scale (its trim queue bound shrunk)."""
        trimming = self.spec.trimming
        if trimming.trim_queue_bytes is None:
            return trimming
        return replace(trimming, trim_queue_bytes=self.spec.scaling.size(trimming.trim_queue_bytes))

    def fabric(self) -> Fabric:
        """The controller's parse of this plan's description, with endpoints nothing reaches:
        what the switches will be told, for the checks and settings that need no switch."""
        endpoints = {
            name: {"target": "model", "grpc": f"127.0.0.1:{i + 1}", "control": "check"}
            for i, name in enumerate(self.switches)
        }
        return parse_description(self.controller_description(endpoints))

    def named_links(self, names: Sequence[str]) -> list[tuple[str, Link]]:
        """The links `names` name, each once, in the plan's order, with its name: a host
        names its own link, `leaf1-spine1` (either way round) a fabric link, `all` every
        link (`--pcap`); FabricError naming the first unknown one."""
        by_name: dict[str, Link] = {}
        for link in self.links:
            by_name[link_name(link)] = link
            if link.a_port is not None:
                by_name[f"{link.b}-{link.a}"] = link
        wanted: set[Link] = set()
        for name in names:
            if name == "all":
                wanted.update(self.links)
            elif name in by_name:
                wanted.add(by_name[name])
            else:
                fabric = [link_name(k) for k in self.links if k.a_port is not None]
                raise FabricError(
                    f"--pcap: fabric {self.spec.name} has no host or link {name!r}: name a host "
                    f"({self.hosts[0].name}..{self.hosts[-1].name})"
                    + (f", a link between switches ({fabric[0]}, ...)" if fabric else "")
                    + " or all"
                )
        return [(link_name(k), k) for k in self.links if k in wanted]

    def controller_description(self, endpoints: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The controller's fabric JSON, given each switch's target and control endpoints."""
        missing = set(self.switches) - set(endpoints)
        if missing:
            raise FabricError(f"no endpoints for switch(es) {', '.join(sorted(missing))}")
        data_queue = self.thresholds().data_queue_bytes
        return {
            "switches": {name: endpoints[name] for name in self.switches},
            "hosts": {h.name: {"ip": h.ip, "mac": h.mac} for h in self.hosts},
            "links": [
                {
                    "a": link.a if link.a_port is None else f"{link.a}:{link.a_port}",
                    "b": f"{link.b}:{link.b_port}",
                    "rate_bps": link.rate_bps,
                }
                for link in self.links
            ],
            "thresholds": self.thresholds()._asdict(),
            # Physical queues hold what the program admits with room to spare; the
            # program, not the queue, decides when DATA is trimmed.
            "queues": {"low_queue_bytes": 2 * data_queue, "high_queue_bytes": data_queue},
            "trimming": self.trimming().to_json(),
            **(
                {"control_queue": list(CONTROL_WITH_DATA)}
                if self.spec.switch.control == "data"
                else {}
            ),
        }


def plan(spec: FabricSpec) -> Plan:
    """Name every switch, host and link; ports count from 1, hosts first, then uplinks."""
    sc = spec.scaling
    host_rate = sc.link(spec.host_link_gbps * 1e9, "host_link_gbps")
    uplink_rate = sc.link(spec.spine_link_gbps * 1e9, "spine_link_gbps") if spec.spines else 0
    leaves = [f"leaf{i + 1}" for i in range(spec.leaves)]
    spines = [f"spine{i + 1}" for i in range(spec.spines)]
    hosts, links = [], []
    number = 0
    for li, leaf in enumerate(leaves):
        for hi in range(spec.hosts_per_leaf):
            number += 1
            host = Host(
                name=f"h{number}",
                ip=f"10.0.{li}.{hi + 1}",
                mac=f"02:00:00:00:{li:02x}:{hi + 1:02x}",
                leaf=leaf,
                port=hi + 1,
            )
            hosts.append(host)
            links.append(Link(host.name, None, leaf, host.port, host_rate))
        for si, spine in enumerate(spines):
            links.append(Link(leaf, spec.hosts_per_leaf + si + 1, spine, li + 1, uplink_rate))
    return Plan(spec, leaves + spines, hosts, links)
