"""The module that DDP or FSDP wraps around a trained model (:class:`Caller`).

Apart from both wrappers, which each build one: :mod:`spa.distributed.fsdp` and
:mod:`spa.distributed.ddp` import it, and :mod:`spa.distributed.parallel` tells a wrapped
model from a plain one by it.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn


class Caller(nn.Module):
    """What DDP or FSDP wraps: its forward runs a function of the trained module.

    The training passes call the decoder and the output head apart (the vocabulary
    projection runs only where there are targets), not the model's own forward; DDP
    prepares its gradient hooks only in its forward, and FSDP gathers the parameters
    outside the decoder layers (embeddings, final norm, output head) in the forward of
    the module it wraps, so they go through this one.
    """

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        # the keys of module.state_dict() before FSDP: what a checkpoint of it holds
        self.checkpoint_keys: tuple[str, ...] = ()

    def forward(self, fn: Callable, *args, **kwargs):
        return fn(self.module, *args, **kwargs)
