"""Inter-replica drift E[D^2] and the two closed forms for it under independent drops.

Weintraub et al. (arXiv:2507.07114, Theorem 3.1) model one parameter of a
shard that its owner updates by Delta_t each step and broadcasts; a worker
that misses the broadcast keeps its previous copy. D is the difference between
two workers' copies, sigma^2 = E[Delta_t^2], and each worker misses each
broadcast independently with probability p. Their recurrence

    E[D_{t+1}^2] = p^2 E[D_t^2] + 2p(1-p) sigma^2

settles at 2p/(1+p) sigma^2. The review of that paper points out that a
worker which missed several broadcasts in a row lags by the sum of the
updates it missed, not by one: with worker i's lag L_i (steps since its last
reception, P(L = l) = (1-p) p^l) and uncorrelated updates,
D is the sum of |L_1 - L_2| updates and E[D^2] = sigma^2 E|L_1 - L_2| =
2p/((1-p)(1+p)) sigma^2.

The same lag argument with correlated updates gives E[D^2] as a sum over the
gap m = |L_1 - L_2| of E[(sum of m consecutive updates)^2], which the
measured correlations of the updates k steps apart determine;
`lag_prediction` computes it, so a measurement can be told apart from both
closed forms for the reason it differs.

Estimator: D^2 averaged over every element of every chunk and over every
pair of ranks other than the chunk's owner (whose copy is always fresh),
divided by sigma^2 of the last few steps (`trailing_sigma2`), and averaged
over steps where the drop rate holds still (after a burn-in).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import torch

from impact.masks import uniform_packets
from impact.ring import RENORMALISE, Ring
from workload.plan import chunk_owner


def paper_constant(p: float) -> float:
    """E[D^2] / sigma^2 at steady state, as Weintraub et al. state it: 2p/(1+p)."""
    return 2 * p / (1 + p)


def review_constant(p: float) -> float:
    """E[D^2] / sigma^2 at steady state under the lag model with uncorrelated updates."""
    return 2 * p / ((1 - p) * (1 + p))


def gap_probabilities(p: float, up_to: int) -> list[float]:
    """P(|L_1 - L_2| = m) for m = 0 .. up_to, L_i independent with P(L = l) = (1-p) p^l."""
    out = [(1 - p) / (1 + p)]
    out += [2 * (1 - p) * p**m / (1 + p) for m in range(1, up_to + 1)]
    return out


def lag_prediction(p: float, r: Sequence[float]) -> float:
    """E[D^2] under the lag model with update covariances r[k] = E[Delta_t Delta_{t+k}].

    A gap of m steps holds m consecutive updates, whose sum has second moment
    m r_0 + 2 sum_{k<m} (m-k) r_k; covariances beyond len(r)-1 are taken as
    zero. With r = [sigma^2] this is review_constant(p) * sigma^2 exactly, and
    with correlations (r_0 = 1) it is the ratio E[D^2] / sigma^2.
    """
    if not 0 <= p < 1:
        raise ValueError(f"p must lie in [0, 1), got {p}")
    out = 0.0
    tail = 1.0 - (1 - p) / (1 + p)
    m = 1
    while tail > 1e-12 and m < 10_000:
        prob = 2 * (1 - p) * p**m / (1 + p)
        second = m * r[0] + 2 * sum((m - k) * r[k] for k in range(1, min(m, len(r))))
        out += prob * second
        tail -= prob
        m += 1
    return out


def pair_drift(
    copies: torch.Tensor, chunks: Sequence[tuple[int, int]], owners_too: bool = False
) -> float:
    """Mean of D^2 over elements and over every pair of non-owner ranks of each chunk.

    `copies` holds one row per rank; `chunks` are (first element, count). The
    analyses' D is between two ranks that each may miss the owner's broadcast;
    `owners_too` counts every pair instead, which is the spread of replicas
    that nothing resynchronises. Without a pair to count the result is NaN.
    """
    n = copies.shape[0]
    total, weight = 0.0, 0
    for chunk, (first, count) in enumerate(chunks):
        owner = chunk_owner(chunk, n)
        block = copies[:, first : first + count].double()
        ranks = [r for r in range(n) if owners_too or r != owner]
        for i, j in combinations(ranks, 2):
            total += float(((block[i] - block[j]) ** 2).sum())
            weight += count
    return total / weight if weight else float("nan")


def update_correlations(updates: Sequence[torch.Tensor], max_lag: int) -> list[float]:
    """rho_k: the correlation of the updates k steps apart, averaged over every pair measured.

    Each pair is normalised by its own two update sizes, so a training whose
    updates shrink over time still gives correlations near 1 for steps that
    move the same way; rho_0 is 1.
    """
    rows = [u.double() for u in updates]
    norms = [float(u.norm()) for u in rows]
    out = []
    for k in range(min(max_lag, len(rows) - 1) + 1):
        pairs = [
            float(rows[t] @ rows[t + k]) / (norms[t] * norms[t + k])
            for t in range(len(rows) - k)
            if norms[t] and norms[t + k]
        ]
        out.append(sum(pairs) / len(pairs) if pairs else 0.0)
    return out


def trailing_sigma2(update_sq: Sequence[float], window: int) -> list[float]:
    """sigma^2 at each step: the mean squared update over the last `window` steps.

    The drift at a step is made of the last few steps' updates, so it is
    compared with their size rather than with the run's, which Adam shrinks
    several-fold over a training.
    """
    out = []
    for t in range(len(update_sq)):
        recent = update_sq[max(0, t - window + 1) : t + 1]
        out.append(sum(recent) / len(recent))
    return out


def step_ratios(d2: Sequence[float], s2: Sequence[float], window: int) -> list[float]:
    """E[D^2] / sigma^2 at each step, sigma^2 trailing (above); 0 where nothing moved yet."""
    sigma2 = trailing_sigma2(s2, window)
    return [d / s if s > 0 else 0.0 for d, s in zip(d2, sigma2, strict=True)]


def steady_ratio(
    d2: Sequence[float], s2: Sequence[float], window: int, use: Sequence[int]
) -> float:
    """The mean of `step_ratios` over the step indices in `use` (0-based)."""
    if not use:
        raise ValueError("no steps to average over")
    ratios = step_ratios(d2, s2, window)
    return sum(ratios[i] for i in use) / len(use)


def simulate_independent_updates(
    ring: Ring, p: float, steps: int, seed: int, direct: bool = True
) -> tuple[list[float], list[float]]:
    """The analyses' own setting, with no model: owners add i.i.d. N(0, 1) updates to their
    chunks and broadcast them; each packet of each hop is lost with probability p and the
    receiver keeps its previous copy. Returns E[D^2] and sigma^2 per step."""
    gen = torch.Generator().manual_seed(seed)
    n, elements = ring.n, ring.layout.elements
    fresh = torch.zeros(elements)
    copies = torch.zeros(n, elements)
    drift, update_sq = [], []
    for step in range(1, steps + 1):
        update = torch.randn(elements, generator=gen)
        fresh = fresh + update
        hops = ring.hop_losses(uniform_packets(ring.record, step, p, f"{seed}:iid"))
        copies = ring.all_gather(fresh, copies, hops, RENORMALISE, direct)
        drift.append(pair_drift(copies, ring.layout.chunks))
        update_sq.append(float((update.double() ** 2).mean()))
    return drift, update_sq
