"""n data-parallel replicas of one model in one process, synchronised through the lossy ring.

Every replica starts from the same weights and draws its minibatches from its
own shard of the training images. Two ways to synchronise them:

- `allreduce` (what the emulated workload runs): the gradients are
  all-reduced and every replica steps its own optimizer on its view of the
  result. A replica that lost part of an all-gather applies a different
  update there, and nothing ever pulls it back.
- `sharded` (Weintraub et al.'s setting, as in ZeRO): after reduce-scatter each
  chunk's owner steps the optimizer for that chunk alone, then all-gathers the
  updated parameters. A replica that loses a range keeps its previous copy
  (renormalise) or takes the zeros it was delivered (zero-fill) until a later
  broadcast reaches it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.functional import cross_entropy

from impact.drift import pair_drift
from impact.layout import GradientLayout
from impact.masks import StepLoss
from impact.model import Digits, ModelSpec, build
from impact.ring import Ring
from workload.lossrecord import Layout
from workload.plan import chunk_owner

ALLREDUCE = "allreduce"
SHARDED = "sharded"
UPDATE_STRIDE = 7
"""Sampling stride over elements for the update correlations: enough elements, little memory."""


@dataclass
class Trace:
    """Per step, after the step's update."""

    train_loss: list[float] = field(default_factory=list)
    """Mean over replicas of the loss on the minibatch each trained on."""
    test_loss: list[float] = field(default_factory=list)
    """Mean over replicas of the loss on the held-out images."""
    test_accuracy: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)
    """Norm of the lossless average gradient: what the detector would read."""
    drift: list[float] = field(default_factory=list)
    """E[D^2] between replicas' parameters (impact.drift.pair_drift): every pair under
    `allreduce`, the pairs of non-owners (the analyses' D) under `sharded`."""
    update_sq: list[float] = field(default_factory=list)
    """sigma^2 of the step: mean squared change of the parameters their owners hold."""
    lost_elements: list[float] = field(default_factory=list)
    """Share of the elements sent over all hops that lost at least one byte."""


class Replicas:
    def __init__(
        self,
        spec: ModelSpec,
        data: Digits,
        record_layout: Layout,
        seed: int,
        scheme: str = ALLREDUCE,
        evaluate: bool = True,
        keep_updates: bool = False,
        direct: bool = False,
    ) -> None:
        if scheme not in (ALLREDUCE, SHARDED):
            raise ValueError(f"unknown scheme {scheme!r}")
        spec.validate()
        n = record_layout.ranks
        self.n, self.spec, self.data, self.scheme, self.evaluate = n, spec, data, scheme, evaluate
        self.direct = direct
        """All-gather straight from each chunk's owner instead of round the ring (Ring.all_gather)."""
        torch.manual_seed(seed)
        base = build(spec, data.x_train.shape[1], int(data.y_train.max()) + 1)
        self.models: list[nn.Module] = [copy.deepcopy(base) for _ in range(n)]
        named = [(name, tuple(p.shape)) for name, p in base.named_parameters()]
        self.layout = GradientLayout.of(named, n)
        self.ring = Ring(self.layout, record_layout)
        self.generator = torch.Generator().manual_seed(seed)
        order = torch.randperm(len(data.x_train), generator=self.generator)
        self.shards = [order[r::n] for r in range(n)]
        if scheme == ALLREDUCE:
            self.optimizers = [torch.optim.Adam(m.parameters(), lr=spec.lr) for m in self.models]
        else:
            self.master = nn.Parameter(self.flat_params()[0].clone())
            self.optimizers = [torch.optim.Adam([self.master], lr=spec.lr)]
        self.trace = Trace()
        self.updates: list[torch.Tensor] | None = [] if keep_updates else None
        """With keep_updates: every UPDATE_STRIDE-th element of each step's owner update."""

    def flat_params(self) -> torch.Tensor:
        with torch.no_grad():
            return torch.stack(
                [torch.cat([p.reshape(-1) for p in m.parameters()]) for m in self.models]
            )

    def _load_params(self, rows: torch.Tensor) -> None:
        with torch.no_grad():
            for model, row in zip(self.models, rows, strict=True):
                torch.nn.utils.vector_to_parameters(row, model.parameters())

    def _gradients(self) -> tuple[torch.Tensor, float]:
        rows, losses = [], []
        for model, shard in zip(self.models, self.shards, strict=True):
            pick = shard[torch.randint(len(shard), (self.spec.batch,), generator=self.generator)]
            model.zero_grad(set_to_none=True)
            loss = cross_entropy(model(self.data.x_train[pick]), self.data.y_train[pick])
            loss.backward()
            losses.append(float(loss.detach()))
            rows.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
        return torch.stack(rows), sum(losses) / len(losses)

    def step(self, loss: StepLoss, treatment: str) -> None:
        """One training step with `loss` applied to its ring hops."""
        grads, train_loss = self._gradients()
        hops = self.ring.hop_losses(loss)
        before = self.flat_params()
        if self.scheme == ALLREDUCE:
            views = self.ring.all_reduce(grads, hops, treatment, self.direct)
            for model, opt, row in zip(self.models, self.optimizers, views, strict=True):
                offset = 0
                for p in model.parameters():
                    p.grad = row[offset : offset + p.numel()].view_as(p).clone()
                    offset += p.numel()
                opt.step()
        else:
            sums, counts = self.ring.reduce_scatter(grads, hops, treatment)
            self.master.grad = self.ring.reduced(sums, counts, treatment)
            self.optimizers[0].step()
            fresh = self.master.detach()
            self._load_params(self.ring.all_gather(fresh, before, hops, treatment, self.direct))
        after = self.flat_params()
        owned = self._owner_rows(after) - self._owner_rows(before)
        if self.updates is not None:
            self.updates.append(owned[::UPDATE_STRIDE].clone())
        trace = self.trace
        trace.train_loss.append(train_loss)
        trace.grad_norm.append(float(grads.double().mean(dim=0).norm()))
        trace.drift.append(
            pair_drift(after, self.layout.chunks, owners_too=self.scheme == ALLREDUCE)
        )
        trace.update_sq.append(float((owned.double() ** 2).mean()))
        sent = 2 * (self.n - 1) * self.layout.elements  # every phase sends every chunk once
        lost = sum(int(h.elements_lost.sum()) for h in hops.values())
        trace.lost_elements.append(lost / sent)
        if self.evaluate:
            test_loss, accuracy = self.score()
            trace.test_loss.append(test_loss)
            trace.test_accuracy.append(accuracy)

    def _owner_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """One flat buffer with each chunk as the rank that owns it holds it."""
        out = torch.empty(rows.shape[1], dtype=rows.dtype)
        for chunk, sl in enumerate(self.ring.slices):
            out[sl] = rows[chunk_owner(chunk, self.n), sl]
        return out

    def score(self) -> tuple[float, float]:
        """Mean over replicas of test loss and test accuracy."""
        losses, hits = [], []
        with torch.no_grad():
            for model in self.models:
                out = model(self.data.x_test)
                losses.append(float(cross_entropy(out, self.data.y_test)))
                hits.append(float((out.argmax(dim=1) == self.data.y_test).double().mean()))
        return sum(losses) / len(losses), sum(hits) / len(hits)
