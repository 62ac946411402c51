"""What a run is, compiled once into the plan both engines run.

`RunConfig` describes a run: the fabric, the training job, the policy (and a
companion job's), the seed, the DCQCN profile and congestion control, the
engine. `plan_run` checks it (a bad one is one RunError line before anything
starts) and compiles it: the fabric plan, the links' delay on the engine's
clock, and per rank a `HostEntry` holding its parsed policy, its endpoint's and
its rank's configuration, and the files it writes. The sweep (`runs.sweep`)
compiles it once and hands it to the engine: the simulator (`simulator.run`)
builds its hosts and ranks from the entries; the Mininet runner
(`topologies.runner`) hands each trainer process its entry as one JSON
argument. Neither engine rebuilds a part of it; each gives back an
`EngineResult`, which the sweep collects with the records the plan names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.frames import mac_text
from common.tls import ClientTls, ServerTls, TlsError
from common.wire import DATA_FRAME_LEN, TRIMMED_FRAME_LEN
from controller import DEVICE_CONFIG, P4INFO
from controller.topology import switch_port_mac
from host_agent.core import CONTROLS, DEFAULT_CONTROL, DEFAULT_PROFILE, PROFILES
from host_agent.endpoint import EndpointConfig
from host_agent.policies import DEFAULT_POLICY, parse_policy
from runplan.fabric import LINK_DELAY_S, FabricSpec, Host, Link, Plan, plan
from workload.hostplan import HostEntry
from workload.plan import TrainingConfig

TARGETS = ("model", "bmv2")
PLACEMENTS = ("interleaved", "packed")
ENGINES = ("mininet", "sim")
"""Where a run happens: Mininet and real processes (root, `topologies`), or virtual time
(`simulator`)."""


TLS_FILES = {
    "ca": "ca.pem",
    "switch_cert": "switch.pem",
    "switch_key": "switch.key",
    "controller_cert": "controller.pem",
    "controller_key": "controller.key",
}
"""A run's --p4runtime-tls folder: the CA that signed both pairs, every switch's certificate
(for 127.0.0.1, the address the run's controller dials) and key, the controller's."""


def server_tls(folder: str | Path) -> ServerTls:
    """What each of a run's switches serves P4Runtime with: its pair, and only clients the
    folder's CA signed (mutual TLS)."""
    f = Path(folder)
    return ServerTls(f / TLS_FILES["switch_cert"], f / TLS_FILES["switch_key"], f / TLS_FILES["ca"])


def client_tls(folder: str | Path) -> ClientTls:
    """What a run's controller dials its switches with."""
    f = Path(folder)
    return ClientTls(
        f / TLS_FILES["ca"], f / TLS_FILES["controller_cert"], f / TLS_FILES["controller_key"]
    )


class RunError(RuntimeError):
    """A run that could not start or did not finish; the message says why in one line."""


@dataclass(frozen=True)
class Workload:
    """The training job at fabric scale; `RunConfig.training_config` shrinks it by the scaling rule."""

    steps: int = 20
    grad_bytes: int = 64 << 20
    """Gradient bytes each rank all-reduces per step."""
    tp_bytes: int = 16 << 20
    """Bytes each rank sends to every other member of its tensor-parallel group."""
    tp_group: int = 2
    pp_bytes: int = 4 << 20
    compute_s: float = 0.5e-3
    detector: str = "static"
    burst: bool = False
    """A background burst (class other) from the last rank to rank 0 on step 2."""
    critical: tuple[int, ...] = ()
    """The static schedule's critical steps (TrainingConfig.critical); empty: the note's."""
    misclassify: tuple[int, ...] = ()
    """Steps the detector gets wrong on purpose (TrainingConfig.misclassify)."""
    tp_phase: str = "own"
    """Tensor-parallel traffic in its own phase before the all-reduce, or overlapping it
    (TrainingConfig.tp_phase)."""
    splits: int = 1
    """The all-reduce in this many parts, each its own ring (TrainingConfig.splits)."""
    active_splits: int = 1
    """Parts of the all-reduce running at once (TrainingConfig.active_splits)."""
    completion: str = "receiver"
    """When a ring message counts as received (TrainingConfig.completion)."""
    reduce_bytes_per_s: float = 0.0
    """The reduction rate of a reduce-scatter message at fabric scale (bytes/s; 0: at once;
    TrainingConfig.reduce_bytes_per_s)."""


JOBS: dict[str, Workload] = {
    "default": Workload(),
    # The note's job: tensor-parallel groups of 8 whose all-to-all makes seven senders
    # converge on every receiving link (7 x 54 MiB, three quarters of the bytes), beside the
    # ring all-reduce of 64 MiB gradients (2 x 63/64 x 64 MiB, the quarter that is eligible).
    "note": Workload(grad_bytes=64 << 20, tp_bytes=54 << 20, tp_group=8, pp_bytes=0),
}
"""Named training jobs at fabric scale (`--job`); single options override their sizes."""


CAPTURE_SNAPLEN = 128
"""Bytes a capture keeps of each frame by default: a FORGIVE frame's 58 header bytes and the
first 70 of its payload (a 128-byte trim, SAI's default, keeps as much), so a capture of full
DATA frames holds about a thirtieth of their bytes."""
CAPTURE_FRAMES = 100_000
"""Frames a capture keeps by default, per link (about 16 MB at the default snap length)."""
MIN_SNAPLEN = TRIMMED_FRAME_LEN
"""A capture keeps at least a FORGIVE frame's headers: Ethernet, IPv4, UDP and the FTH."""
MAX_SNAPLEN = 262144
"""tcpdump's and dumpcap's largest snap length."""


@dataclass(frozen=True)
class Captures:
    """The links a run writes to pcapng (`--pcap`; runplan.fabric.Plan.named_links names
    them), every frame cut to `snaplen` bytes, at most `max_frames` frames per link. What is
    captured never changes what a run does, so it is no part of the run cache's key."""

    links: tuple[str, ...] = ()
    snaplen: int = CAPTURE_SNAPLEN
    max_frames: int = CAPTURE_FRAMES

    def check(self) -> None:
        """RunError, in one line naming the option, for a snap length or cap out of range."""
        if not MIN_SNAPLEN <= self.snaplen <= MAX_SNAPLEN:
            raise RunError(
                f"--pcap-snaplen must lie in {MIN_SNAPLEN}..{MAX_SNAPLEN} (a FORGIVE frame's "
                f"headers are {MIN_SNAPLEN} bytes), got {self.snaplen}"
            )
        if self.max_frames < 1:
            raise RunError(f"--pcap-frames must be >= 1, got {self.max_frames}")


@dataclass(frozen=True)
class LinkCapture:
    """One link a run captures: its `--pcap` name, the fabric plan's link and the file."""

    name: str
    link: Link
    path: Path


@dataclass(frozen=True)
class RunConfig:
    fabric: FabricSpec
    switch: str = "model"
    policy: str = DEFAULT_POLICY
    seed: int = 1
    workload: Workload = Workload()
    timeout_s: float = 600.0
    placement: str = "interleaved"
    """Ranks to hosts: 'interleaved' alternates leaves, so ring, TP and PP neighbours sit
    on different leaves and cross the (oversubscribed) uplinks; 'packed' fills one leaf
    after another, which keeps most of the ring inside a leaf."""
    engine: str = "mininet"
    dcqcn: str = DEFAULT_PROFILE
    """The DCQCN profile every host runs (host_agent.core.dcqcn)."""
    cc: str = DEFAULT_CONTROL
    """The congestion control every sender runs (host_agent.core.CONTROLS; docs/nscc.md)."""
    companion: str | None = None
    """The policy of a second job of the same shape on the other half of the hosts, or None:
    the first job takes the first half of the ranks' hosts, the second the rest."""
    switch_restarts: int = 0
    """How many times a run starts again a switch whose process exited (emulation only).
    0: a switch that exits ends the run, in one line naming it. Above 0: the switch is
    started again on its interfaces, the controller sees its stream end and gives it the
    pipeline and every entry again, the flows recover by retransmission, and each outage is
    counted in the result (RunResult.switch_restarts)."""
    jitter_frames: float = 0.0
    """Simulator only: the most a host's frame is late at its switch port, in full frames at
    the host's line rate (simulator.engine; 0, exact timing). It breaks the fixed phase
    between equally paced senders that exact timing keeps and the emulation's late
    processes never do (docs/simulation.md, "Agreement with the emulation")."""
    captures: Captures = Captures()
    """The links whose frames the run writes to pcapng, from either engine."""

    p4runtime_tls: str | None = None
    """Emulation only: a folder of certificates (`TLS_FILES`) for P4Runtime over mutual TLS
    between the run's controller and its switches; None speaks P4Runtime without TLS, as
    it may on the loopback addresses the run's switches listen on. It decides nothing of
    what the run measures (the run cache leaves it out of a run's key)."""

    def validate(self) -> None:
        """Refuse a bad configuration before anything is started (one-line RunError)."""
        if self.p4runtime_tls is not None:
            if self.engine != "mininet":
                raise RunError(
                    "--p4runtime-tls needs --engine mininet (the simulator speaks no P4Runtime)"
                )
            try:
                server_tls(self.p4runtime_tls).pems()
                client_tls(self.p4runtime_tls).pems()
            except TlsError as err:
                raise RunError(f"--p4runtime-tls {self.p4runtime_tls}: {err}") from None
        if self.engine not in ENGINES:
            raise RunError(f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.switch not in TARGETS:
            raise RunError(f"--switch must be one of {', '.join(TARGETS)}, got {self.switch!r}")
        if self.engine == "sim" and self.switch != "model":
            raise RunError("--engine sim runs the switch model's pipeline: use --switch model")
        if self.placement not in PLACEMENTS:
            raise RunError(
                f"--placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}"
            )
        if self.dcqcn not in PROFILES:
            raise RunError(f"--dcqcn must be one of {', '.join(PROFILES)}, got {self.dcqcn!r}")
        if self.cc not in CONTROLS:
            raise RunError(f"--cc must be one of {', '.join(CONTROLS)}, got {self.cc!r}")
        if self.switch_restarts < 0:
            raise RunError(f"--switch-restarts must be >= 0, got {self.switch_restarts}")
        if self.switch_restarts and self.engine != "mininet":
            raise RunError(
                "--switch-restarts needs --engine mininet (the simulator has no processes)"
            )
        if not (0.0 <= self.jitter_frames < math.inf):
            raise RunError(f"--jitter must be a finite number >= 0, got {self.jitter_frames}")
        if self.jitter_frames and self.engine != "sim":
            raise RunError(
                "--jitter needs --engine sim (the emulation's hosts are late by themselves)"
            )
        if self.workload.completion == "sender-ack" and self.engine != "sim":
            raise RunError(
                "--completion sender-ack needs --engine sim: it is ASTRA-sim's frontend telling "
                "a receiver of its sender's last ACK at once, which only an engine that sees "
                "both ends can do"
            )
        if self.companion is not None and self.fabric.host_count < 4:
            raise RunError("a second job needs a fabric of at least 4 hosts (2 per job)")
        try:
            parse_policy(self.policy)
            if self.companion is not None:
                parse_policy(self.companion)
            fabric_plan = plan(self.fabric)
            for job in range(len(self.jobs(fabric_plan))):
                self.training_config(fabric_plan, rank=0, job=job).validate()
            if self.captures.links:
                self.captures.check()
                fabric_plan.named_links(self.captures.links)
        except ValueError as err:
            raise RunError(str(err)) from None
        for artifact in (P4INFO, DEVICE_CONFIG):
            if not artifact.exists():
                raise RunError(f"{artifact} is missing: run `make p4`")

    def training_config(self, fabric_plan: Plan, rank: int, job: int = 0) -> TrainingConfig:
        sc, wl = self.fabric.scaling, self.workload
        ranks = tuple(h.ip for h in self.jobs(fabric_plan)[job][1])
        return TrainingConfig(
            ranks=ranks,
            rank=rank,
            steps=wl.steps,
            grad_bytes=sc.size(wl.grad_bytes),
            compute_s=sc.duration(wl.compute_s),
            tp_bytes=sc.size(wl.tp_bytes) if wl.tp_bytes else 0,
            tp_group=wl.tp_group,
            pp_bytes=sc.size(wl.pp_bytes) if wl.pp_bytes else 0,
            detector=wl.detector,
            burst_step=2 if wl.burst else None,
            burst_bytes=sc.size(wl.grad_bytes) * 2,
            burst_src=len(ranks) - 1,
            burst_dst=0,
            critical=wl.critical,
            misclassify=wl.misclassify,
            tp_phase=wl.tp_phase,
            splits=wl.splits,
            active_splits=wl.active_splits,
            completion=wl.completion,
            reduce_bytes_per_s=wl.reduce_bytes_per_s / sc.rate_scale,
            seed=self.seed,
        )

    def rank_hosts(self, fabric_plan: Plan) -> list[Host]:
        """The host of each rank, in rank order."""
        if self.placement == "packed":
            return list(fabric_plan.hosts)
        per_leaf = self.fabric.hosts_per_leaf
        hosts = fabric_plan.hosts
        leaves = [hosts[i : i + per_leaf] for i in range(0, len(hosts), per_leaf)]
        return [leaf[k] for k in range(per_leaf) for leaf in leaves]

    def jobs(self, fabric_plan: Plan) -> list[tuple[str, list[Host]]]:
        """(policy, hosts in rank order) of each training job: one, or two with a companion.
        Halving the interleaved order gives each job hosts on every leaf, so both cross the
        same uplinks."""
        hosts = self.rank_hosts(fabric_plan)
        if self.companion is None:
            return [(self.policy, hosts)]
        half = len(hosts) // 2
        return [(self.policy, hosts[:half]), (self.companion, hosts[half : 2 * half])]


@dataclass(frozen=True)
class RunPlan:
    """One run, compiled: its configuration, the fabric plan, one entry per rank of every
    job (in job then rank order), and where every host of the fabric writes."""

    config: RunConfig
    fabric: Plan
    link_delay_s: float
    """Every link's propagation delay on the engine's clock: the fabric's (LINK_DELAY_S)
    stretched by the time scale in virtual time; none on veths, which add their own."""
    jobs: list[tuple[str, list[Host]]]
    """(policy, hosts in rank order) of each job, as `RunConfig.jobs` gives them."""
    hosts: list[HostEntry]
    train_files: dict[str, Path]
    """Per host of the fabric, its rank's JSON-lines training records."""
    stats_files: dict[str, Path]
    """Per host of the fabric, its agent's JSON-lines statistics."""
    captures: list[LinkCapture] = field(default_factory=list)
    """Each link the run captures, with the pcapng file it goes to (RunConfig.captures)."""


@dataclass
class EngineResult:
    """What an engine measured beside the records the plan's files hold: the switches'
    counters summed over their ports, their trims and marks sampled over the run, and (the
    emulation's) every switch started again."""

    counters: dict[str, dict[str, int]]
    timeline: list[dict[str, Any]] = field(default_factory=list)
    switch_restarts: list[dict[str, Any]] = field(default_factory=list)
    captures: list[dict[str, Any]] = field(default_factory=list)
    """Per link captured: `link`, `path`, `frames` written (None where the capture tool did
    not say) and `over_cap`, frames past the cap not written (None where unknown)."""


def link_delay(config: RunConfig) -> float:
    """Each link's propagation delay on the engine's clock (RunPlan.link_delay_s)."""
    return LINK_DELAY_S * config.fabric.scaling.time_scale if config.engine == "sim" else 0.0


def plan_run(config: RunConfig, out_dir: Path) -> RunPlan:
    """Check `config` (RunError) and compile it for its engine. Every value is worked out
    first and the entries made last, in one pass."""
    config.validate()
    link_delay_s = link_delay(config)
    fabric_plan = plan(config.fabric)
    jobs = config.jobs(fabric_plan)
    train_files = {h.name: out_dir / f"{h.name}.train.jsonl" for h in fabric_plan.hosts}
    stats_files = {h.name: out_dir / f"{h.name}.agent.jsonl" for h in fabric_plan.hosts}
    endpoints = [endpoint_config(config, fabric_plan, policy, link_delay_s) for policy, _ in jobs]
    ranks = [
        (job, host, config.training_config(fabric_plan, rank, job))
        for job, (_, hosts) in enumerate(jobs)
        for rank, host in enumerate(hosts)
    ]
    captures = [
        LinkCapture(name, link, out_dir / f"{name}.pcapng")
        for name, link in fabric_plan.named_links(config.captures.links)
    ]
    run = RunPlan(config, fabric_plan, link_delay_s, jobs, [], train_files, stats_files, captures)
    run.hosts.extend(
        HostEntry(
            name=host.name,
            job=job,
            endpoint=endpoints[job],
            training=training,
            gateway_mac=mac_text(switch_port_mac(host.leaf, host.port)),
            train_file=str(train_files[host.name]),
            stats_file=str(stats_files[host.name]),
            timeout_s=config.timeout_s,
            spray=config.fabric.nic.paths == "spray",
        )
        for job, host, training in ranks
    )
    return run


def endpoint_config(
    config: RunConfig, fabric_plan: Plan, policy: str, link_delay_s: float = 0.0
) -> EndpointConfig:
    """Every host's endpoint in a job of `policy`: NIC rate, timer stretch and timeouts,
    DCQCN profile and congestion control, and what the switches' trim DSCPs say of where a
    trim happened, whichever engine runs it; `link_delay_s` is each link's propagation delay
    (none on veths)."""
    sc, nic = config.fabric.scaling, config.fabric.nic
    rto = initial_rto(fabric_plan, link_delay_s)
    return EndpointConfig(
        policy=parse_policy(policy),
        seed=config.seed,
        line_rate_bps=sc.rate(config.fabric.host_link_gbps * 1e9),
        time_scale=sc.time_scale,
        rto=rto,
        rto_max=10 * rto,
        trim_locations=fabric_plan.fabric().trim_locations(),
        dcqcn=config.dcqcn,
        cc=config.cc,
        window_bytes=bdp_bytes(fabric_plan, link_delay_s) if nic.window == "bdp" else 0.0,
        qp_state=nic.dcqcn_state == "qp",
        payload_bytes=nic.payload_bytes,
        cnp_per_mark=nic.cnp == "per-mark",
        ack_every=nic.ack_every or None,
    )


def bdp_bytes(fabric_plan: Plan, link_delay_s: float = 0.0) -> float:
    """The longest path's bandwidth-delay product, as ns-3's third.cc sizes its windows (a
    round trip of twice the links' propagation delays plus one packet's payload serialised
    at each hop's rate, times the host's line rate), worked out at fabric scale and divided
    by the byte scale like every byte quantity, so that a window keeps its ratio to the
    queues. `link_delay_s` is a link's delay on the run's clock (stretched by the time
    scale)."""
    spec, sc = fabric_plan.spec, fabric_plan.spec.scaling
    host_rate = spec.host_link_gbps * 1e9
    rates = [host_rate, host_rate]
    if spec.spines:
        rates[1:1] = [spec.spine_link_gbps * 1e9] * 2
    payload_bits = spec.nic.payload_bytes * 8
    delay = link_delay_s / sc.time_scale
    rtt = 2 * len(rates) * delay + sum(payload_bits / r for r in rates)
    return rtt * host_rate / 8 / sc.byte_scale


def initial_rto(fabric_plan: Plan, link_delay_s: float = 0.0) -> float:
    """A first timeout no shorter than the longest path's propagation round trip plus a
    full data queue ahead of a packet and a few hops' serialisation at the host rate;
    later flows use the measured round trip instead."""
    host_rate = fabric_plan.spec.scaling.rate(fabric_plan.spec.host_link_gbps * 1e9)
    queued = fabric_plan.thresholds().data_queue_bytes + 4 * DATA_FRAME_LEN
    hops = 4 if fabric_plan.spec.spines else 2
    return 2 * hops * link_delay_s + queued * 8 / host_rate
