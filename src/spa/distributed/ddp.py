"""DDP: every process holds the whole model, and the gradients are summed over them.

:func:`wrap` builds torch's ``DistributedDataParallel`` itself rather than through
``Accelerator.prepare_model``, which builds the same wrapper but needs an ``Accelerator``
and its global settings.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from spa.distributed import process
from spa.distributed.caller import Caller


def wrap(module: nn.Module) -> DistributedDataParallel:
    """``module`` under DDP, which copies the main process's parameters and buffers to the
    others as it wraps and sums the gradients, bucket by bucket, in the backward pass."""
    device = process.state().device
    wrapped = DistributedDataParallel(
        Caller(module), device_ids=[device] if device.type == "cuda" else None,
        # Buffers (rotary frequencies) are computed alike everywhere; broadcasting them
        # before each forward would add a collective to every pass.
        **_no_buffer_sync(),
        # Every pass uses every parameter (the padding passes too: accumulation), so DDP
        # need not walk the autograd graph after each forward to find unused ones, which
        # find_unused_parameters=True costs. A model with parameters outside the training
        # pass fails loudly at its second step ("Expected to have finished reduction").
        find_unused_parameters=False)
    wrapped.register_comm_hook(wrapped.process_group, _sum_hook)
    return wrapped


def _no_buffer_sync() -> dict[str, bool]:
    """DDP's switch that stops it broadcasting the buffers before each forward, by the
    installed torch's name for it (torch 2.13 renamed it and warns on the old one)."""
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def _sum_hook(group, bucket):  # no annotations: DDP checks them, and these would be strings
    """DDP's gradient all-reduce as a sum. DDP's own averages over the processes, but
    each process's losses are already weighted by the global count of the step, so the
    sum of their gradients is the single-process gradient. (Multiplying every loss by the
    number of processes would undo the average as well, but the losses would then differ
    from a single process's, and round twice where that number is not a power of 2.)"""
    work = torch.distributed.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda done: done.value()[0])
