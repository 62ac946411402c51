"""The ring all-reduce of `workload.plan`, hop by hop on real tensors, with each hop's lost bytes applied.

Reduce-scatter: in phase j rank r sends its running sum of chunk
ring_chunk(r, j) to r+1, which adds its own gradient. A lost range takes the
whole partial sum of those bytes with it: the receiver's sum restarts from its
own contribution there. After n-1 phases the chunk's owner holds the sum.

All-gather: the owner sends the reduced chunk round the ring, each rank
forwarding what it holds. A rank that loses a range lacks those bytes of the
reduced chunk, and so does every rank it forwards them to.

Two treatments of the lost bytes:

- zero-fill: what the transport delivers. The lost bytes read as zeros, at
  byte granularity (a range may end inside a float32), and the sum is divided
  by n as if every contribution had arrived.
- renormalise (Weintraub et al., arXiv:2507.07114): every element carries the
  count of contributions its sum holds, the sum is divided by that count, and
  a rank that lacks a reduced element uses its own best estimate instead: its
  partial sum over the contributions it did receive, or in the sharded scheme
  its previous copy of the parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from impact.layout import ELEMENT_BYTES, GradientLayout, rescale
from impact.masks import StepLoss
from workload.lossrecord import Layout
from workload.plan import chunk_owner, ring_chunk, ring_next

ZERO_FILL = "zero-fill"
RENORMALISE = "renormalise"
TREATMENTS = (ZERO_FILL, RENORMALISE)


@dataclass
class HopLoss:
    """One hop's loss in the model's chunk: the lost bytes, and the elements any of them touch."""

    bytes_lost: torch.Tensor
    """bool, one per byte of the model's chunk."""
    elements_lost: torch.Tensor
    """bool, one per float32 of the model's chunk."""


class Ring:
    """All-reduce and all-gather over `n` replicas' flat buffers, shaped by the model's layout."""

    def __init__(self, grad_layout: GradientLayout, record_layout: Layout) -> None:
        if grad_layout.ranks != record_layout.ranks:
            raise ValueError(
                f"the model has {grad_layout.ranks} replicas, the record {record_layout.ranks} ranks"
            )
        self.layout = grad_layout
        self.record = record_layout
        self.n = grad_layout.ranks
        self.slices = [slice(a, a + k) for a, k in grad_layout.chunks]

    def hop_losses(self, loss: StepLoss) -> dict[tuple[int, int], HopLoss]:
        """The step's recorded ranges as masks over the model's chunks (rescaled chunk by chunk)."""
        out = {}
        for (j, src), ranges in loss.items():
            chunk = ring_chunk(src, j, self.n)
            run_bytes = self.record.chunks[chunk][1]
            model_bytes = self.layout.chunk_bytes(chunk)
            lost_bytes = torch.zeros(model_bytes, dtype=torch.bool)
            lost_elements = torch.zeros(model_bytes // ELEMENT_BYTES, dtype=torch.bool)
            for lo, hi in ranges:
                a, b = rescale(lo, hi, run_bytes, model_bytes)
                if a < b:
                    lost_bytes[a:b] = True
                    lost_elements[a // ELEMENT_BYTES : -(-b // ELEMENT_BYTES)] = True
            if lost_elements.any():
                out[j, src] = HopLoss(lost_bytes, lost_elements)
        return out

    @staticmethod
    def _zero_bytes(values: torch.Tensor, lost: HopLoss) -> torch.Tensor:
        as_bytes = values.view(torch.uint8)
        as_bytes[lost.bytes_lost] = 0
        return values

    def reduce_scatter(
        self, grads: torch.Tensor, losses: dict[tuple[int, int], HopLoss], treatment: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Running sums and contribution counts per rank and element after reduce-scatter.

        Row r holds, for every chunk r handled, the sum it formed (the owner's is
        the chunk's total). Counts fall where a lost range took contributions away.
        """
        _check(treatment)
        n = self.n
        sums = grads.clone()
        counts = torch.ones_like(grads)
        for j in range(n - 1):
            arriving = []
            for src in range(n):
                sl = self.slices[ring_chunk(src, j, n)]
                value, count = sums[src, sl].clone(), counts[src, sl].clone()
                lost = losses.get((j, src))
                if lost is not None:
                    count[lost.elements_lost] = 0
                    if treatment == ZERO_FILL:
                        self._zero_bytes(value, lost)
                    else:
                        value[lost.elements_lost] = 0
                arriving.append((ring_next(src, n), sl, value, count))
            for dst, sl, value, count in arriving:
                sums[dst, sl] = value + grads[dst, sl]
                counts[dst, sl] = count + 1
        return sums, counts

    def reduced(self, sums: torch.Tensor, counts: torch.Tensor, treatment: str) -> torch.Tensor:
        """Each chunk as its owner reduced it, in one flat buffer: sum / n, or sum / count."""
        out = torch.empty(sums.shape[1], dtype=sums.dtype)
        for chunk, sl in enumerate(self.slices):
            owner = chunk_owner(chunk, self.n)
            total = sums[owner, sl]
            out[sl] = total / self.n if treatment == ZERO_FILL else total / counts[owner, sl]
        return out

    def all_gather(
        self,
        fresh: torch.Tensor,
        fallback: torch.Tensor,
        losses: dict[tuple[int, int], HopLoss],
        treatment: str,
        direct: bool = False,
    ) -> torch.Tensor:
        """Every rank's copy of `fresh` (one flat buffer, each chunk as its owner holds it).

        A lost range reads as zeros (zero-fill) or as the receiver's own row of
        `fallback` (renormalise). On the ring a rank forwards what it holds;
        `direct` instead delivers the owner's chunk to every rank, each losing
        only its own hop's ranges (the independent receptions the drift
        analyses assume).
        """
        _check(treatment)
        n = self.n
        held = fallback.clone()
        for chunk, sl in enumerate(self.slices):
            held[chunk_owner(chunk, n), sl] = fresh[sl]
        for j in range(n - 1, 2 * (n - 1)):
            arriving = []
            for src in range(n):
                sl = self.slices[ring_chunk(src, j, n)]
                dst = ring_next(src, n)
                value = (fresh[sl] if direct else held[src, sl]).clone()
                lost = losses.get((j, src))
                if lost is not None:
                    if treatment == ZERO_FILL:
                        self._zero_bytes(value, lost)
                    else:
                        value[lost.elements_lost] = fallback[dst, sl][lost.elements_lost]
                arriving.append((dst, sl, value))
            for dst, sl, value in arriving:
                held[dst, sl] = value
        return held

    def all_reduce(
        self,
        grads: torch.Tensor,
        losses: dict[tuple[int, int], HopLoss],
        treatment: str,
        direct: bool = False,
    ) -> torch.Tensor:
        """Each rank's view of the averaged gradient after reduce-scatter and all-gather."""
        sums, counts = self.reduce_scatter(grads, losses, treatment)
        reduced = self.reduced(sums, counts, treatment)
        return self.all_gather(reduced, sums / counts, losses, treatment, direct)


def _check(treatment: str) -> None:
    if treatment not in TREATMENTS:
        raise ValueError(f"unknown treatment {treatment!r} (known: {', '.join(TREATMENTS)})")
