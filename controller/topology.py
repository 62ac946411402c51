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
     "ports": {"s1:2": {"ecn_kmin": 400000, "rate_bps": 100000000}}}

Every switch port on a link gets the thresholds (with its own overrides from
"ports") and the queue sizes; links with a rate shape both switch ends. Each
switch routes every host's /32 along shortest paths, spreading over all
equal-cost next hops with an ECMP group. A Tofino switch ("target": "tofino" or
"tofino2") also names, in "deflect_ports", a device port per pipe it uses
(docs/tofino.md); a description holds one kind of Tofino or BMv2 and model
switches, not both.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from controller.p4info import ConfigError

THRESHOLD_KEYS = ("data_queue_bytes", "ecn_kmin", "ecn_kmax", "ecn_pmax")
QUEUE_KEYS = ("low_queue_bytes", "high_queue_bytes")
DEFAULT_THRESHOLDS = {
    "data_queue_bytes": 4 << 20,
    "ecn_kmin": 800_000,
    "ecn_kmax": 3_200_000,
    "ecn_pmax": 1 << 16,
}
TOFINO_TARGETS = ("tofino", "tofino2")
"""Switches running p4src/tna/forgive.p4 under bf_switchd (controller/tofino.py)."""
TARGETS = ("model", "bmv2", *TOFINO_TARGETS)
_MAC = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")


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
    thresholds: tuple[int, int, int, int]
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


def _int(value, what: str, minimum: int = 0) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return value


def tofino_pipe(port: int) -> int:
    """The pipe a Tofino device port belongs to (bits 8:7, DEVPORT_PIPE in the TNA includes)."""
    return port >> 7


def _deflect_ports(name: str, spec: dict) -> tuple[int, ...]:
    ports = spec.get("deflect_ports")
    if not isinstance(ports, list) or not ports:
        raise ConfigError(
            f"switch {name}: a Tofino switch needs deflect_ports, one device port per pipe"
        )
    result = tuple(_int(p, f"switch {name} deflect port") for p in ports)
    if any(p > 511 for p in result):
        raise ConfigError(f"switch {name}: deflect ports exceed 511")
    pipes = [tofino_pipe(p) for p in result]
    if len(set(pipes)) != len(pipes):
        raise ConfigError(f"switch {name}: two deflect ports in one pipe")
    return result


def _endpoint(text, switches, hosts) -> tuple[str, int | None]:
    if not isinstance(text, str):
        raise ConfigError(f"link end {text!r} is not a string")
    name, sep, port = text.partition(":")
    if name in hosts and not sep:
        return name, None
    if name in switches and sep:
        number = _int(int(port) if port.isdigit() else port, f"port in {text!r}")
        if number > 511:
            raise ConfigError(f"port in {text!r} exceeds 511")
        return name, number
    raise ConfigError(f"link end {text!r} is neither a host nor SWITCH:PORT of a known switch")


def parse(description: dict) -> Fabric:
    if not isinstance(description, dict):
        raise ConfigError("topology must be a JSON object")
    unknown = set(description) - {"switches", "hosts", "links", "thresholds", "queues", "ports"}
    if unknown:
        raise ConfigError(f"unknown topology keys {sorted(unknown)}")
    switches = {}
    devices = {}
    for name, spec in description.get("switches", {}).items():
        target = spec.get("target")
        if target not in TARGETS:
            raise ConfigError(f"switch {name}: target must be one of {TARGETS}, got {target!r}")
        if not isinstance(spec.get("grpc"), str) or ":" not in spec["grpc"]:
            raise ConfigError(f"switch {name}: grpc must be HOST:PORT")
        device_id = _int(spec.get("device_id", 1), f"switch {name} device_id")
        if target == "model" and not spec.get("control"):
            raise ConfigError(f"switch {name}: a model switch needs its control socket path")
        if target == "bmv2" and "thrift_port" not in spec:
            raise ConfigError(f"switch {name}: a bmv2 switch needs its thrift_port")
        deflect_ports = _deflect_ports(name, spec) if target in TOFINO_TARGETS else ()
        if spec["grpc"] in devices:
            raise ConfigError(f"switches {devices[spec['grpc']]} and {name} share {spec['grpc']}")
        devices[spec["grpc"]] = name
        switches[name] = SwitchSpec(
            name,
            target,
            spec["grpc"],
            device_id,
            spec.get("control"),
            _int(spec["thrift_port"], f"switch {name} thrift_port", 1)
            if target == "bmv2"
            else None,
            deflect_ports,
        )
    if not switches:
        raise ConfigError("topology has no switches")
    kinds = {s.target for s in switches.values()}
    if kinds & set(TOFINO_TARGETS) and len(kinds) > 1:
        raise ConfigError(f"topology mixes switch targets {sorted(kinds)}: one Tofino kind alone")
    hosts = {}
    for name, spec in description.get("hosts", {}).items():
        if name in switches:
            raise ConfigError(f"{name} is both a host and a switch")
        try:
            ip = int(ipaddress.IPv4Address(spec.get("ip")))
        except (ipaddress.AddressValueError, ValueError):
            raise ConfigError(f"host {name}: bad IPv4 address {spec.get('ip')!r}") from None
        mac = spec.get("mac", "")
        if not isinstance(mac, str) or not _MAC.match(mac):
            raise ConfigError(f"host {name}: bad MAC {mac!r}")
        hosts[name] = (ip, int(mac.replace(":", ""), 16))
    fabric = Fabric(switches, hosts, neighbors={s: {} for s in switches})
    thresholds = dict(DEFAULT_THRESHOLDS)
    thresholds.update(description.get("thresholds", {}))
    queues = description.get("queues", {})
    rates: dict[tuple[str, int], int] = {}
    for link in description.get("links", []):
        ends = [_endpoint(link.get(k), switches, hosts) for k in ("a", "b")]
        if ends[0][1] is None and ends[1][1] is None:
            raise ConfigError(f"link {link} joins two hosts")
        for (node, port), (peer, peer_port) in (ends, ends[::-1]):
            if port is None:
                continue
            if port in fabric.neighbors[node]:
                raise ConfigError(f"port {node}:{port} is on two links")
            fabric.neighbors[node][port] = peer
            if peer_port is not None:
                fabric.peer_port[node, port] = peer_port
            if "rate_bps" in link:
                rates[node, port] = _int(link["rate_bps"], f"link {link} rate_bps", 1)
    for name, switch in switches.items():
        for port in fabric.neighbors[name] if switch.target in TOFINO_TARGETS else ():
            if tofino_pipe(port) not in {tofino_pipe(p) for p in switch.deflect_ports}:
                raise ConfigError(
                    f"switch {name}: port {port} is in pipe {tofino_pipe(port)}, "
                    "which has no deflect port"
                )
    overrides = description.get("ports", {})
    for key in overrides:
        name, port = _endpoint(key, switches, {})
        if port not in fabric.neighbors[name]:
            raise ConfigError(f"ports: {key} is not on any link")
    for switch, ports in fabric.neighbors.items():
        for port in ports:
            own = {**thresholds, **queues, **overrides.get(f"{switch}:{port}", {})}
            unknown = set(own) - set(THRESHOLD_KEYS) - set(QUEUE_KEYS) - {"rate_bps"}
            if unknown:
                raise ConfigError(f"{switch}:{port}: unknown settings {sorted(unknown)}")
            values = [_int(own[k], f"{switch}:{port} {k}") for k in THRESHOLD_KEYS]
            if values[1] > values[2]:
                raise ConfigError(f"{switch}:{port}: ecn_kmin exceeds ecn_kmax")
            if values[3] > 1 << 16:
                raise ConfigError(f"{switch}:{port}: ecn_pmax exceeds 65536 (probability 1)")
            rate = own.get("rate_bps", rates.get((switch, port)))
            fabric.ports[switch, port] = PortSpec(
                tuple(values),
                None if rate is None else _int(rate, f"{switch}:{port} rate_bps", 1),
                *(
                    None if own.get(k) is None else _int(own[k], f"{switch}:{port} {k}", 1)
                    for k in QUEUE_KEYS
                ),
            )
    return fabric


def load(path: str | Path) -> Fabric:
    try:
        description = json.loads(Path(path).read_text())
    except OSError as err:
        raise ConfigError(f"cannot read topology {path}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"topology {path} is not JSON: {err}") from None
    if not isinstance(description, dict):
        raise ConfigError(f"topology {path} must be a JSON object")
    try:
        return parse(description)
    except (AttributeError, TypeError) as err:
        raise ConfigError(f"topology {path} is malformed: {err}") from None
