"""A fabric from what a command line names: a preset or a fabric file, at an engine's scaling.

Shared by `forgive run`/`compare` and `forgive study`, so that the same options mean the
same fabric in every command.
"""

from __future__ import annotations

from pathlib import Path

from topologies.fabric import FabricError, FabricSpec, load, preset, with_scaling
from topologies.scaling import Scaling, ScalingError
from topologies.simulated import sim_scaling


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
