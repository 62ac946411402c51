"""The all-reduce's line-rate bound, and the baseline's slack against it.

The note's saving comes out of the gap between its DCQCN baseline's all-reduce and the time the
fabric's links need for it at line rate: its `tight` took 32.3 ms where the links of its 4:1
fabric need about 10.6 ms, a slack of about three. Where the baseline already runs near the bound
there is nothing for the exemption to win. The bound here is the ring's: every rank sends
2 (n - 1) / n of its gradient bytes to its successor, each hop through its host links and, when
the successor sits on another leaf, through the two leaves' uplinks, which ECMP is taken to share
perfectly. The busiest of those links, at its line rate, sets the bound. Tensor-parallel and other
traffic are left out: the bound is what the all-reduce alone would need.
"""

from __future__ import annotations

from collections import Counter

from runplan.fabric import plan
from runplan.run import RunConfig


def busiest_uplink_hops(config: RunConfig) -> tuple[int, int]:
    """(ranks of the first job, ring hops through the busiest leaf's uplinks): hops leaving a
    leaf and hops entering one, whichever leaf has the most."""
    _, hosts = config.jobs(plan(config.fabric))[0]
    leaving: Counter[str] = Counter()
    entering: Counter[str] = Counter()
    for i, host in enumerate(hosts):
        succ = hosts[(i + 1) % len(hosts)]
        if succ.leaf != host.leaf:
            leaving[host.leaf] += 1
            entering[succ.leaf] += 1
    return len(hosts), max([*leaving.values(), *entering.values(), 0])


def allreduce_bound_s(config: RunConfig) -> float:
    """The ring all-reduce's line-rate bound for the first job of `config`, in fabric seconds
    (the note's bytes and rates, before any scaling)."""
    spec = config.fabric
    n, busiest_uplink = busiest_uplink_hops(config)
    per_rank = 2 * (n - 1) / n * config.workload.grad_bytes * 8
    times = [per_rank / (spec.host_link_gbps * 1e9)]
    if busiest_uplink:
        times.append(busiest_uplink * per_rank / (spec.spines * spec.spine_link_gbps * 1e9))
    return max(times)


def slack(allreduce_fabric_s: float, config: RunConfig) -> float:
    """A measured all-reduce time (fabric seconds) over its line-rate bound."""
    return allreduce_fabric_s / allreduce_bound_s(config)
