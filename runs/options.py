"""A fabric from what a command line names: a preset or a fabric file, at an engine's scaling.

Shared by `forgive run`/`compare` and `forgive study`, so that the same options mean the
same fabric in every command.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from host_agent.core import DEFAULT_PROFILE, StaticSchedule
from runplan.fabric import (
    CNPS,
    CONTROL_QUEUES,
    DCQCN_STATES,
    PATHS,
    WINDOWS,
    FabricError,
    FabricSpec,
    NicSettings,
    load,
    preset,
    sim_scaling,
    with_data_queue,
    with_scaling,
)
from runplan.scaling import Scaling, ScalingError


def fabric_from(
    name: str,
    engine: str = "mininet",
    host_link_mbps: float | None = None,
    byte_scale: float | None = None,
) -> FabricSpec:
    """The preset or .toml file `name`; the simulator runs it at its own rates and the
    simulator's byte scale, the emulation at the file's [emulation] scaling; either option
    given overrides. FabricError in one line naming the options."""
    spec = load(name) if Path(name).suffix.lower() == ".toml" else preset(name)
    given = [
        f"--{option} {value:g}"
        for option, value in (("host-link-mbps", host_link_mbps), ("byte-scale", byte_scale))
        if value is not None
    ]
    if engine == "sim":
        try:
            return sim_scaling(spec, host_link_mbps, byte_scale)
        except (ScalingError, FabricError) as err:
            raise FabricError(f"{' '.join(given) or 'simulator scaling'}: {err}") from None
    if not given:
        return spec
    try:
        scaling = Scaling(
            host_link_bps=spec.scaling.host_link_bps
            if host_link_mbps is None
            else host_link_mbps * 1e6,
            byte_scale=spec.scaling.byte_scale if byte_scale is None else byte_scale,
        )
        return with_scaling(spec, scaling)
    except (ScalingError, FabricError) as err:
        raise FabricError(f"{' '.join(given)}: {err}") from None


NIC_OPTIONS = (("window", WINDOWS), ("dcqcn_state", DCQCN_STATES), ("paths", PATHS), ("cnp", CNPS))
"""The [nic] settings a command line may override, with their values."""

REGIME_PROFILES: dict[str, dict[str, str | float | int]] = {
    # ASTRA-sim's packet backend as the note's figures ran on it (astra-network-ns3
    # scratch/config/config.txt): the Mellanox DCQCN of rdma-hw.cc (the nic profile), a
    # bandwidth-delay window per QP (HAS_WIN 1, VAR_WIN 1), a fresh line-rate QP per message
    # (astra-sim's SendFlow). Its PACKET_PAYLOAD_SIZE 1000 and 32 MB shared buffer are not
    # part of it: --payload-bytes 1000 gives the first; docs/study.md says why and what
    # the calibration measured with it.
    "astra": {"dcqcn": "nic", "window": "bdp", "dcqcn_state": "message"},
    # astra with a data queue of 8 MiB per port (fabric scale), a quarter of ns-3's 32 MB
    # shared buffer (BUFFER_SIZE 32), as a shared buffer lets a hot port hold more than an
    # even share: the preset under which three of the four calibration rows of
    # `forgive study calibrate` hold at bytes / 32 (docs/study.md).
    "astra-buffer": {
        "dcqcn": "nic",
        "window": "bdp",
        "dcqcn_state": "message",
        "data_queue_kib": 8192,
    },
    # ASTRA-sim's ns-3 backend as it runs, mechanisms and all (docs/astra-sim.md): astra's
    # transport with ns-3's 1000-byte payload and an ACK per packet, ACKs, NACKs and CNPs in
    # the switches' data queue, a path per message (a new source port per QP), a CNP for
    # every marked packet, and astra-sim's collective: the all-reduce in
    # Ring.json's 4 parts, one at a time, each reduce-scatter message reduced at its 50 GB/s
    # local memory bandwidth, a ring message taken as received once its sender has its
    # last ACK.
    "astra-ns3": {
        "dcqcn": "nic",
        "window": "bdp",
        "dcqcn_state": "message",
        "payload_bytes": 1000,
        "ack_every": 1,
        "control": "data",
        "paths": "message",
        "cnp": "per-mark",
        "splits": 4,
        "active_splits": 1,
        "local_mem_gbs": 50.0,
        "completion": "sender-ack",
    },
}
"""Named sets of regime options (--profile); an option given beside one overrides it."""


def regime_profile(args: argparse.Namespace) -> dict[str, str | float]:
    """The --profile's options, or none; FabricError in one line for an unknown one."""
    name = getattr(args, "profile", None)
    if name is None:
        return {}
    if name not in REGIME_PROFILES:
        raise FabricError(f"--profile must be one of {', '.join(REGIME_PROFILES)}, got {name!r}")
    return REGIME_PROFILES[name]


def dcqcn_profile(args: argparse.Namespace) -> str:
    """--dcqcn if given, else the --profile's, else the default (DEFAULT_PROFILE)."""
    given = getattr(args, "dcqcn", None)
    return given or str(regime_profile(args).get("dcqcn", DEFAULT_PROFILE))


def add_regime_options(parser: argparse.ArgumentParser) -> None:
    """The options that set the fabric's and job's regime beside the fabric file
    (docs/dcqcn.md, "Sender options"); unset, the fabric's own or the job's value stands."""
    parser.add_argument(
        "--profile",
        help=f"a named set of the options below and --dcqcn: {', '.join(REGIME_PROFILES)} "
        "(astra: ASTRA-sim's ns-3 backend; astra-buffer: astra with an 8 MiB data queue; "
        "docs/dcqcn.md)",
    )
    parser.add_argument("--window", help=f"sender window: {' or '.join(WINDOWS)} (default none)")
    parser.add_argument(
        "--dcqcn-state",
        help=f"DCQCN state: {' or '.join(DCQCN_STATES)} (per message, default; or per QP)",
    )
    parser.add_argument(
        "--payload-bytes", type=int, help="DATA bytes per packet (default 4096; ns-3 runs 1000)"
    )
    parser.add_argument(
        "--ack-every",
        type=int,
        metavar="N",
        help="data packets per ACK at most (default 0: the transport's coalescing, up to 32; "
        "ns-3 ACKs every packet, 1)",
    )
    parser.add_argument(
        "--control-queue",
        dest="control",
        help="where switches queue ACKs, NACKs and CNPs: ahead of data (high, default) or "
        "behind it in the data queue (data: ns-3's switches)",
    )
    parser.add_argument(
        "--paths",
        help="ECMP path entropy: a new source port per packet (spray, default) or one per "
        "message (message: ASTRA-sim's ns-3)",
    )
    parser.add_argument(
        "--cnp",
        help="notification point: the profile's pacing (paced, default) or a CNP for every "
        "marked packet (per-mark: ns-3's CNP flag on every ACK)",
    )
    parser.add_argument(
        "--data-queue-kib",
        type=float,
        help="data queue per port at fabric scale, KiB (default 4096); marking keeps the "
        "note's fractions of it",
    )
    parser.add_argument(
        "--tp-phase",
        help="tensor-parallel traffic in its own phase (own, default) or overlapping the "
        "all-reduce (overlap)",
    )
    parser.add_argument(
        "--allreduce-splits",
        dest="splits",
        type=int,
        metavar="P",
        help="the all-reduce in P parts, each its own ring (default 1; ASTRA-sim's "
        "preferred-dataset-splits, 4 in its Ring.json)",
    )
    parser.add_argument(
        "--active-splits",
        dest="active_splits",
        type=int,
        metavar="A",
        help="parts of the all-reduce running at once (default 1; ASTRA-sim's "
        "active-chunks-per-dimension)",
    )
    parser.add_argument(
        "--local-mem-gbs",
        dest="local_mem_gbs",
        type=float,
        metavar="GBPS",
        help="a reduce-scatter message waits three passes over its bytes at this many GB/s "
        "before the ring goes on (default 0: none; ASTRA-sim's local-mem-bw, 50 in Ring.json)",
    )
    parser.add_argument(
        "--completion",
        help="a ring message is received when its receiver holds its bytes (receiver, "
        "default) or once its sender has its last ACK (sender-ack: ASTRA-sim's ns-3 "
        "frontend; --engine sim)",
    )
    add_schedule_option(parser)


TIMEOUT_HELP = (
    "per run, s (default %(default)g): wall time under mininet; under sim, virtual time until "
    "training ends (the ranks then acknowledge late packets a while longer, uncounted)"
)
"""--timeout's help, the same for every command that runs."""


def add_schedule_option(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """--critical-steps: the static schedule's critical steps (TrainingConfig.critical)."""
    parser.add_argument(
        "--critical-steps",
        default=default,
        help="the steps the static schedule takes as critical, comma-separated (default "
        + (default or "the note's 1,2,3 and the last")
        + "; 1 with --steps 5 keeps the note's share, 4 in 20)",
    )


def tp_phase(args: argparse.Namespace) -> str | None:
    """The --tp-phase given, or None; a bad one is a FabricError in one line."""
    from workload.plan import TP_PHASES

    value = getattr(args, "tp_phase", None)
    if value is not None and value not in TP_PHASES:
        raise FabricError(f"--tp-phase must be one of {', '.join(TP_PHASES)}, got {value!r}")
    return value


def job_regime(args: argparse.Namespace) -> dict[str, str | int | float]:
    """The job's regime options (JOB_SETTINGS) given on the command line, each over its
    --profile's, as Workload fields; those neither gives are left out. A bad value is a
    FabricError in one line naming the option."""
    from workload.plan import COMPLETIONS

    profile = regime_profile(args)
    out: dict[str, str | int | float] = {}
    phase = tp_phase(args)
    if phase is not None:
        out["tp_phase"] = phase
    for key in ("splits", "active_splits"):
        value = getattr(args, key, None)
        value = profile.get(key) if value is None else value
        if value is None:
            continue
        if not isinstance(value, int) or value < 1:
            raise FabricError(f"--{_option(key)} must be an integer >= 1, got {value!r}")
        out[key] = value
    gbs = getattr(args, "local_mem_gbs", None)
    gbs = profile.get("local_mem_gbs") if gbs is None else gbs
    if gbs is not None:
        if not (isinstance(gbs, int | float) and math.isfinite(gbs) and gbs >= 0):
            raise FabricError(f"--local-mem-gbs must be a finite number >= 0, got {gbs!r}")
        out["reduce_bytes_per_s"] = float(gbs) * 1e9
    completion = getattr(args, "completion", None) or profile.get("completion")
    if completion is not None:
        if completion not in COMPLETIONS:
            raise FabricError(
                f"--completion must be one of {', '.join(COMPLETIONS)}, got {completion!r}"
            )
        out["completion"] = str(completion)
    return out


def profile_job(name: str) -> dict[str, str | int | float]:
    """The job's part of the profile `name` (REGIME_PROFILES), as Workload fields: what
    `--profile name` gives the job when no job option is given beside it."""
    return job_regime(argparse.Namespace(profile=name))


def _option(key: str) -> str:
    """A setting's command-line name (splits is --allreduce-splits)."""
    return "allreduce-splits" if key == "splits" else key.replace("_", "-")


def critical_from(args: argparse.Namespace, steps: int) -> tuple[int, ...]:
    """The --critical-steps given, as StaticSchedule.of keeps them: sorted, or () for the
    note's schedule, given or not (the same runs, under the same cache keys). A bad list, an
    empty one, or a step outside 1..steps, is a FabricError in one line."""
    text = getattr(args, "critical_steps", None)
    if text is None:
        return ()
    try:
        values = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise FabricError(f"bad --critical-steps {text!r}: integers, comma-separated") from None
    outside = FabricError(f"--critical-steps {text!r}: each step must lie in 1..{steps}")
    if not values:
        raise outside  # to StaticSchedule.of an empty list is the note's; here it names none
    try:
        return StaticSchedule.of(steps, values).setting()
    except ValueError:
        raise outside from None


REGIME_SETTINGS = (
    "window",
    "dcqcn_state",
    "paths",
    "cnp",
    "payload_bytes",
    "ack_every",
    "data_queue_kib",
    "control",
)
"""The fabric's regime options, as REGIME_PROFILES and the command line name them; a
profile's dcqcn is the run's, not the fabric's (dcqcn_profile)."""


def with_regime(spec: FabricSpec, args: argparse.Namespace) -> FabricSpec:
    """`spec` with the regime options given on the command line, each over its --profile's;
    FabricError in one line naming the option."""
    profile = regime_profile(args)
    given = {key: getattr(args, key, None) for key in REGIME_SETTINGS}
    return with_settings(
        spec, {key: profile.get(key) if value is None else value for key, value in given.items()}
    )


def with_profile(spec: FabricSpec, name: str) -> FabricSpec:
    """`spec` with the fabric's part of the profile `name` (REGIME_PROFILES), as `--profile
    name` gives it."""
    return with_settings(spec, REGIME_PROFILES[name])


def with_settings(spec: FabricSpec, settings: Mapping[str, str | float | None]) -> FabricSpec:
    """`spec` with the regime settings (REGIME_SETTINGS) `settings` gives; one absent or None
    leaves the fabric's own. FabricError in one line naming the option."""
    changes = {}
    for key, values in NIC_OPTIONS:
        value = settings.get(key)
        if value is None:
            continue
        if value not in values:
            raise FabricError(
                f"--{key.replace('_', '-')} must be one of {', '.join(values)}, got {value!r}"
            )
        changes[key] = value
    for key in ("payload_bytes", "ack_every"):
        value = settings.get(key)
        if value is not None:
            changes[key] = value
    if changes:
        nic: NicSettings = replace(spec.nic, **changes)
        try:
            spec = with_scaling(replace(spec, nic=nic), spec.scaling)
        except FabricError as err:
            raise FabricError(
                str(err)
                .replace("[nic] payload_bytes", "--payload-bytes")
                .replace("[nic] ack_every", "--ack-every")
            ) from None
    control = settings.get("control")
    if control is not None:
        if control not in CONTROL_QUEUES:
            raise FabricError(
                f"--control-queue must be one of {', '.join(CONTROL_QUEUES)}, got {control!r}"
            )
        spec = replace(spec, switch=replace(spec.switch, control=control))
    queue = settings.get("data_queue_kib")
    if queue is not None:
        queue = float(queue)
        if not (math.isfinite(queue) and queue > 0):
            raise FabricError(f"--data-queue-kib must be a finite number > 0, got {queue}")
        try:
            spec = with_data_queue(spec, round(queue * 1024))
        except FabricError as err:
            raise FabricError(f"--data-queue-kib {queue:g}: {err}") from None
    return spec
