"""One rule that shrinks the note's 400 Gbps fabric to what software dataplanes sustain here.

The note's fabric runs 400 Gbps host links, a 4 MiB data queue per port and
ECN marking from 800 KB. An emulation cannot move bytes that fast, so:

- rates are divided by `rate_scale` = fabric host-link rate / emulated host-link rate;
- byte quantities (gradient and message sizes, queue sizes, ECN thresholds) are
  divided by `byte_scale`; the packet size is not, since a trim reports one whole
  packet of at most 4096 bytes;
- so every duration stretches by `time_scale` = rate_scale / byte_scale: n bytes
  took n/F seconds in the fabric and take (n/b)/(F/s) here. Protocol timers (DCQCN
  periods, the CNP interval, retransmission timeouts) and compute phases are
  multiplied by it, which keeps each of them the same multiple of a transfer time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from common.wire import DATA_FRAME_LEN

FABRIC_HOST_LINK_BPS = 400e9
"""The note's host links."""
MIN_QUEUE_FRAMES = 4
"""A scaled data queue must still hold a few full frames, or every burst trims."""
MIN_LINK_BPS = 8 * DATA_FRAME_LEN
"""A scaled link must carry one full frame per second, or no run would ever finish."""


class ScalingError(ValueError):
    """A scaling that leaves a queue or threshold too small to mean anything."""


@dataclass(frozen=True)
class Scaling:
    fabric_host_link_bps: float = FABRIC_HOST_LINK_BPS
    host_link_bps: float = 20e6
    byte_scale: float = 64.0

    def __post_init__(self) -> None:
        # Written so that NaN fails every test.
        if not (self.host_link_bps > 0 and self.fabric_host_link_bps > 0):
            raise ScalingError("link rates must be > 0")
        if not self.host_link_bps <= self.fabric_host_link_bps < math.inf:
            raise ScalingError("the emulated host link is faster than the fabric's")
        if not 1 <= self.byte_scale < math.inf:
            raise ScalingError(f"byte_scale must be a finite number >= 1, got {self.byte_scale}")

    @property
    def rate_scale(self) -> float:
        return self.fabric_host_link_bps / self.host_link_bps

    @property
    def time_scale(self) -> float:
        return self.rate_scale / self.byte_scale

    def rate(self, fabric_bps: float) -> int:
        """An emulated rate in bit/s for a fabric rate."""
        return max(1, round(fabric_bps / self.rate_scale))

    def link(self, fabric_bps: float, what: str) -> int:
        """A scaled link rate in bit/s, refused if it no longer carries a frame per second."""
        scaled = fabric_bps / self.rate_scale
        if not MIN_LINK_BPS <= scaled < math.inf:
            raise ScalingError(
                f"{what} scales to {scaled:g} bit/s, under one {DATA_FRAME_LEN}-byte frame "
                f"per second ({MIN_LINK_BPS} bit/s); raise it or host_link_mbps"
            )
        return round(scaled)

    def size(self, fabric_bytes: float) -> int:
        """An emulated byte count for a fabric byte count."""
        return max(1, round(fabric_bytes / self.byte_scale))

    def duration(self, fabric_seconds: float) -> float:
        return fabric_seconds * self.time_scale

    def queue(self, fabric_bytes: float, what: str) -> int:
        """A scaled queue size, refused if it no longer holds a few frames."""
        scaled = self.size(fabric_bytes)
        if scaled < MIN_QUEUE_FRAMES * DATA_FRAME_LEN:
            raise ScalingError(
                f"{what} of {fabric_bytes:.0f} B scales to {scaled} B, under {MIN_QUEUE_FRAMES} "
                f"full frames ({MIN_QUEUE_FRAMES} x {DATA_FRAME_LEN} = "
                f"{MIN_QUEUE_FRAMES * DATA_FRAME_LEN} B); lower the byte scale"
            )
        return scaled
