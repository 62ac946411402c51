"""The fabric description the controller reads, and the routes it implies.

A description is JSON:

    {"switches": {"s1": {"target": "model", "grpc": "127.0.0.1:50001", "device_id": 1,
                         "control": "/tmp/forgive-s1.sock"},
                  "s2": {"target": "bmv2", "grpc": "127.0.0.1:50002", "device_id": 2,
                         "thrift_port": 9091}},
     "hosts": {"h1": {"ip": "10.0.0.1", "mac": "02:00:00:00:00:01"}},
     "links": [{"a": "h1", "b": "s1:1", "rate_bps": 1000000000},
               {"a": "s1:2", "b": "s2:1"}],
     "thresholds": {"data_queue_bytes": 4194304, "ecn_kmin": 800000,
                    "ecn_kmax": 3200000, "ecn_pmax": 65536},
     "queues": {"low_queue_bytes": 16777216, "high_queue_bytes": 4194304},
     "ports": {"s1:2": {"ecn_kmin": 400000, "rate_bps": 100000000}},
     "trimming": {"size": 128, "dscp_value": 48},
     "control_queue": ["ack", "nack"]}

Every switch port on a link gets the thresholds (with its own overrides from
"ports") and the queue sizes; links with a rate shape both switch ends. Each
switch routes every host's /32 along shortest paths, spreading over all
equal-cost next hops with an ECMP group. "trimming" sets how every switch trims
(`controller.trimming` has its keys; its defaults are the switch as it always
was). "control_queue" names the transport control every switch queues behind
data instead of ahead of it (any of "ack", "nack", "cnp"; none by default). A Tofino switch ("target": "tofino" or
"tofino2") also names, in "deflect_ports", a device port per pipe it uses
(docs/tofino.md); a description holds one kind of Tofino or BMv2 and model
switches, not both. The trimming section is the same for both; docs/tofino.md
says knob by knob how the Tofino program carries it out.

`parse` checks every key of that shape once, before anything reads it: a
wrong type, an unknown key or a value out of range is a ConfigError naming the
key's path (`switches.s1.device_id`, `links[2].rate_bps`), never another
exception.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.wire import Opcode
from controller import trimming as trim_section
from controller.checks import MAX_BYTES, check_int, check_object, show
from controller.p4info import ConfigError
from controller.trimming import Trimming
from switch_model.surface import PMAX_ONE, Thresholds

THRESHOLD_KEYS = Thresholds._fields
QUEUE_KEYS = ("low_queue_bytes", "high_queue_bytes")
DEFAULT_THRESHOLDS = Thresholds(
    data_queue_bytes=4 << 20, ecn_kmin=800_000, ecn_kmax=3_200_000, ecn_pmax=PMAX_ONE
)
TOFINO_TARGETS = ("tofino", "tofino2")
"""Switches running p4src/tna/forgive.p4 under bf_switchd (controller/tofino.py)."""
TARGETS = ("model", "bmv2", *TOFINO_TARGETS)
MAX_DEVICE_ID = (1 << 64) - 1
"""P4Runtime's device_id is a uint64."""
MAX_RATE_BPS = 10**13
"""10 Tbit/s, beyond any switch port: a larger line rate is a typo."""
MAX_PORT = 511
"""Ports are bit<9> in forgive.p4."""
_MAC = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_SWITCH_KEYS = {"target", "grpc", "device_id", "control", "thrift_port", "deflect_ports"}
_LINK_KEYS = {"a", "b", "rate_bps"}


@dataclass(frozen=True)
class SwitchSpec:
    name: str
    target: str
    grpc: str
    device_id: int
    control: str | None = None
    thrift_port: int | None = None
    deflect_ports: tuple[int, ...] = ()
    """Tofino: per pipe in use, the device port the TM deflects what it cannot queue to."""


@dataclass(frozen=True)
class PortSpec:
    thresholds: Thresholds
    rate_bps: int | None
    low_queue_bytes: int | None
    high_queue_bytes: int | None


@dataclass(frozen=True)
class NextHop:
    port: int
    dmac: int


@dataclass
class Fabric:
    switches: dict[str, SwitchSpec]
    hosts: dict[str, tuple[int, int]]
    """name -> (IPv4 as int, MAC as int)."""
    neighbors: dict[str, dict[int, str]] = field(default_factory=dict)
    """switch -> port -> the host or switch at the other end."""
    peer_port: dict[tuple[str, int], int] = field(default_factory=dict)
    """(switch, port) -> the port on the neighbouring switch, for switch-switch links."""
    ports: dict[tuple[str, int], PortSpec] = field(default_factory=dict)
    trimming: Trimming = trim_section.DEFAULT
    control_with_data: tuple[int, ...] = ()
    """FTH opcodes of the transport control queued behind data (control_queue)."""

    def port_roles(self) -> dict[tuple[str, int], str]:
        """Every switch port on a link: "host" if a host is at its other end, else "fabric"."""
        return {
            (switch, port): "host" if peer in self.hosts else "fabric"
            for switch, ports in self.neighbors.items()
            for port, peer in ports.items()
        }

    def trim_dscp(self, switch: str, port: int) -> int | None:
        """The DSCP trimmed packets leaving this port get (None: they keep theirs)."""
        return self.trimming.dscp_for(self.port_roles()[switch, port], f"{switch}:{port}")

    def trim_locations(self) -> dict[int, str]:
        """DSCP -> the role of the ports that trim to it, where that tells one role."""
        return trim_section.locations(self.trimming, self.port_roles())

    def routes(self, switch: str) -> dict[int, list[NextHop]]:
        """For each host IP, the equal-cost next hops from `switch`, ordered by port."""
        result = {}
        for host, (ip, mac) in self.hosts.items():
            dist = self._distances(host)
            if switch not in dist:
                continue
            hops = []
            for port, peer in sorted(self.neighbors[switch].items()):
                if peer == host:
                    hops.append(NextHop(port, mac))
                elif peer in self.switches and dist.get(peer) == dist[switch] - 1:
                    hops.append(NextHop(port, switch_port_mac(peer, self.peer_port[switch, port])))
            result[ip] = hops
        return result

    def _distances(self, host: str) -> dict[str, int]:
        dist: dict[str, int] = {}
        frontier: deque[str] = deque()
        for switch, ports in self.neighbors.items():
            if host in ports.values():
                dist[switch] = 1
                frontier.append(switch)
        while frontier:
            node = frontier.popleft()
            for peer in self.neighbors[node].values():
                if peer in self.switches and peer not in dist:
                    dist[peer] = dist[node] + 1
                    frontier.append(peer)
        return dist


def switch_port_mac(switch: str, port: int) -> int:
    """A locally administered MAC naming a switch port (switches do not check it)."""
    digest = sum(ord(c) * 31**i for i, c in enumerate(switch)) & 0xFFFF
    return (0x02FE << 32) | (digest << 16) | port


def _names(section: dict, where: str) -> dict:
    for name in section:
        if not _NAME.match(name):
            raise ConfigError(f"{where}: name {show(name)} is not 1-64 of A-Z a-z 0-9 _ . -")
    return section


def _endpoint(text, switches, hosts, where: str) -> tuple[str, int | None]:
    if not isinstance(text, str):
        raise ConfigError(f"{where}: link end {show(text)} is not a string")
    name, sep, port = text.partition(":")
    if name in hosts and not sep:
        return name, None
    if name in switches and sep:
        if not port.isdecimal() or not 0 <= int(port) <= MAX_PORT:
            raise ConfigError(f"{where}: port in {show(text)} is not a number in 0..{MAX_PORT}")
        return name, int(port)
    raise ConfigError(
        f"{where}: link end {show(text)} is neither a host nor SWITCH:PORT of a known switch"
    )


def tofino_pipe(port: int) -> int:
    """The pipe a Tofino device port belongs to (bits 8:7, DEVPORT_PIPE in the TNA includes)."""
    return port >> 7


def _deflect_ports(spec: dict, where: str) -> tuple[int, ...]:
    ports = spec.get("deflect_ports")
    if not isinstance(ports, list) or not ports:
        raise ConfigError(
            f"{where}.deflect_ports: a Tofino switch needs deflect_ports, one device port per pipe"
        )
    result = tuple(check_int(p, f"{where}.deflect_ports", 0, MAX_PORT) for p in ports)
    pipes = [tofino_pipe(p) for p in result]
    if len(set(pipes)) != len(pipes):
        raise ConfigError(f"{where}.deflect_ports: two deflect ports in one pipe")
    return result


def _switch(name: str, spec, where: str) -> SwitchSpec:
    spec = check_object(spec, where, _SWITCH_KEYS)
    target = spec.get("target")
    if target not in TARGETS:
        raise ConfigError(f"{where}.target must be one of {TARGETS}, got {show(target)}")
    grpc = spec.get("grpc")
    host, _, port = grpc.rpartition(":") if isinstance(grpc, str) else ("", "", "")
    if not host or not port.isdecimal() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"{where}.grpc must be HOST:PORT, got {show(grpc)}")
    control = spec.get("control")
    if target == "model" and (not isinstance(control, str) or not control):
        raise ConfigError(f"{where}.control: a model switch needs its control socket path")
    if target == "bmv2" and "thrift_port" not in spec:
        raise ConfigError(f"{where}.thrift_port: a bmv2 switch needs its thrift_port")
    return SwitchSpec(
        name,
        target,
        grpc,
        check_int(spec.get("device_id", 1), f"{where}.device_id", 0, MAX_DEVICE_ID),
        control if target == "model" else None,
        check_int(spec["thrift_port"], f"{where}.thrift_port", 1, 65535)
        if target == "bmv2"
        else None,
        _deflect_ports(spec, where) if target in TOFINO_TARGETS else (),
    )


def _setting(values: dict, key: str, where: str) -> int:
    """One threshold, queue size or line rate, checked against its own range."""
    if key == "ecn_pmax":
        low, high = 0, PMAX_ONE
    elif key == "rate_bps":
        low, high = 1, MAX_RATE_BPS
    else:
        low, high = (1 if key in QUEUE_KEYS else 0), MAX_BYTES
    return check_int(values[key], f"{where}.{key}", low, high)


def _settings(values: dict, where: str) -> dict[str, int]:
    return {key: _setting(values, key, where) for key in values}


def _thresholds(values: dict[str, int], where: str) -> Thresholds:
    if values["ecn_kmin"] > values["ecn_kmax"]:
        raise ConfigError(
            f"{where}: ecn_kmin {values['ecn_kmin']} exceeds ecn_kmax {values['ecn_kmax']}"
        )
    return Thresholds(*(values[key] for key in THRESHOLD_KEYS))


def parse(description) -> Fabric:
    description = check_object(
        description,
        "topology",
        {
            "switches",
            "hosts",
            "links",
            "thresholds",
            "queues",
            "ports",
            "trimming",
            "control_queue",
        },
    )
    switches: dict[str, SwitchSpec] = {}
    addresses: dict[str, str] = {}
    for name, spec in _names(
        check_object(description.get("switches", {}), "switches"), "switches"
    ).items():
        switch = _switch(name, spec, f"switches.{name}")
        if switch.grpc in addresses:
            raise ConfigError(f"switches {addresses[switch.grpc]} and {name} share {switch.grpc}")
        addresses[switch.grpc] = name
        switches[name] = switch
    if not switches:
        raise ConfigError("topology has no switches")
    kinds = {s.target for s in switches.values()}
    if kinds & set(TOFINO_TARGETS) and len(kinds) > 1:
        raise ConfigError(f"topology mixes switch targets {sorted(kinds)}: one Tofino kind alone")
    hosts: dict[str, tuple[int, int]] = {}
    owners: dict[tuple[str, int], str] = {}
    for name, spec in _names(check_object(description.get("hosts", {}), "hosts"), "hosts").items():
        where = f"hosts.{name}"
        spec = check_object(spec, where, {"ip", "mac"})
        if name in switches:
            raise ConfigError(f"{name} is both a host and a switch")
        try:
            if not isinstance(spec.get("ip"), str):
                raise ValueError
            ip = int(ipaddress.IPv4Address(spec["ip"]))
        except ValueError:
            raise ConfigError(f"{where}.ip: bad IPv4 address {show(spec.get('ip'))}") from None
        mac = spec.get("mac", "")
        if not isinstance(mac, str) or not _MAC.match(mac):
            raise ConfigError(f"{where}.mac: bad MAC {show(mac)}")
        mac_int = int(mac.replace(":", ""), 16)
        for key, value in (("ip", ip), ("mac", mac_int)):
            other = owners.setdefault((key, value), name)
            if other != name:
                raise ConfigError(f"{where}.{key} {spec[key]} is also {other}'s")
        hosts[name] = (ip, mac_int)
    fabric = Fabric(switches, hosts, neighbors={s: {} for s in switches})
    thresholds = _settings(
        check_object(description.get("thresholds", {}), "thresholds", THRESHOLD_KEYS), "thresholds"
    )
    thresholds = {**DEFAULT_THRESHOLDS._asdict(), **thresholds}
    _thresholds(thresholds, "thresholds")
    queues = _settings(check_object(description.get("queues", {}), "queues", QUEUE_KEYS), "queues")
    rates: dict[tuple[str, int], int] = {}
    links = description.get("links", [])
    if not isinstance(links, list):
        raise ConfigError(f"links must be a list, got {show(links)}")
    for i, link in enumerate(links):
        where = f"links[{i}]"
        link = check_object(link, where, _LINK_KEYS)
        ends = [_endpoint(link.get(k), switches, hosts, f"{where}.{k}") for k in ("a", "b")]
        if ends[0][1] is None and ends[1][1] is None:
            raise ConfigError(f"{where} joins two hosts")
        rate = _setting(link, "rate_bps", where) if "rate_bps" in link else None
        for (node, port), (peer, peer_port) in (ends, ends[::-1]):
            if port is None:
                continue
            if port in fabric.neighbors[node]:
                raise ConfigError(f"{where}: port {node}:{port} is on two links")
            fabric.neighbors[node][port] = peer
            if peer_port is not None:
                fabric.peer_port[node, port] = peer_port
            if rate is not None:
                rates[node, port] = rate
    for name, switch in switches.items():
        for port in fabric.neighbors[name] if switch.target in TOFINO_TARGETS else ():
            if tofino_pipe(port) not in {tofino_pipe(p) for p in switch.deflect_ports}:
                raise ConfigError(
                    f"switches.{name}: port {port} is in pipe {tofino_pipe(port)}, "
                    "which has no deflect port"
                )
    overrides: dict[tuple[str, int], dict[str, int]] = {}
    for key, values in check_object(description.get("ports", {}), "ports").items():
        where = f"ports.{key}"
        name, port = _endpoint(key, switches, {}, "ports")
        if port not in fabric.neighbors[name]:
            raise ConfigError(f"ports: {key} is not on any link")
        allowed = (*THRESHOLD_KEYS, *QUEUE_KEYS, "rate_bps")
        overrides[name, port] = _settings(check_object(values, where, allowed), where)
    for switch, ports in fabric.neighbors.items():
        for port in ports:
            own = {**thresholds, **queues, **overrides.get((switch, port), {})}
            rate = overrides.get((switch, port), {}).get("rate_bps", rates.get((switch, port)))
            fabric.ports[switch, port] = PortSpec(
                _thresholds(own, f"ports.{switch}:{port}"),
                rate,
                own.get("low_queue_bytes"),
                own.get("high_queue_bytes"),
            )
    fabric.trimming = trim_section.parse(description.get("trimming", {}))
    trim_section.check_ports(fabric.trimming, fabric.port_roles())
    fabric.control_with_data = _control_queue(description.get("control_queue", []))
    if fabric.control_with_data and kinds & set(TOFINO_TARGETS):
        raise ConfigError(
            "control_queue: the Tofino program sends transport control ahead of data only "
            "(docs/tofino.md)"
        )
    return fabric


CONTROL_OPCODES = {"ack": int(Opcode.ACK), "nack": int(Opcode.NACK), "cnp": int(Opcode.CNP)}
"""The transport control "control_queue" may name, by FTH opcode."""


def _control_queue(names: Any) -> tuple[int, ...]:
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"control_queue must be a list of names, got {show(names)}")
    unknown = [n for n in names if n not in CONTROL_OPCODES]
    if unknown:
        raise ConfigError(
            f"control_queue: unknown {show(unknown[0])}; known: {', '.join(CONTROL_OPCODES)}"
        )
    return tuple(sorted({CONTROL_OPCODES[n] for n in names}))


def load(path: str | Path) -> Fabric:
    """Read and check a description; every failure is one ConfigError naming the file."""
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise ConfigError(f"cannot read topology {path}: {err.strerror}") from None
    try:
        description = json.loads(raw)
    except RecursionError:
        raise ConfigError(f"topology {path} is not JSON: nested too deep") from None
    except ValueError as err:  # JSONDecodeError, or bytes that are no Unicode text
        raise ConfigError(f"topology {path} is not JSON: {err}") from None
    try:
        return parse(description)
    except ConfigError as err:
        raise ConfigError(f"topology {path}: {err}") from None
