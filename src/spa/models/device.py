"""Where a model lives, and moving a batch there.

One process trains or generates on the device its model sits on (a GPU under
``accelerate launch``, the CPU otherwise); batches are built on the CPU and moved
just before the forward pass. On CPU the move is a no-op.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's (first) parameters."""
    return next(model.parameters()).device


def on_device(tensors: Iterable[torch.Tensor], model: nn.Module) -> list[torch.Tensor]:
    """The tensors on the model's device."""
    device = model_device(model)
    return [t.to(device) for t in tensors]
