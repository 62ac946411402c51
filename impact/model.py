"""The model and data the replay trains: an MLP on scikit-learn's bundled handwritten digits.

The digits (1,797 8x8 images, 10 classes) ship inside scikit-learn, so nothing
is downloaded. The split into training and test images is fixed (it does not
move with the training seed), so every seed and comparison is scored on the
same 540 test images. The default MLP has about 267,000 parameters, about
1 MiB of float32 gradient: as many bytes as a rank all-reduces per step in the
default emulation, so the recorded ranges map onto the model almost one to one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from impact.config import ModelSpec

SPLIT_SEED = 20250702
"""Fixes which images are held out; any constant would do."""
TEST_IMAGES = 540


@dataclass(frozen=True)
class Digits:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def load_digits() -> Digits:
    """The bundled digits, pixels scaled to [0, 1], split once by SPLIT_SEED."""
    from sklearn.datasets import load_digits as bundled

    raw = bundled()
    x = torch.tensor(raw.data, dtype=torch.float32) / 16.0
    y = torch.tensor(raw.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(SPLIT_SEED))
    test, train = order[:TEST_IMAGES], order[TEST_IMAGES:]
    return Digits(x[train], y[train], x[test], y[test])


def build(spec: ModelSpec, inputs: int = 64, classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Linear(inputs, spec.hidden),
        nn.ReLU(),
        nn.Linear(spec.hidden, spec.hidden),
        nn.ReLU(),
        nn.Linear(spec.hidden, classes),
    )
