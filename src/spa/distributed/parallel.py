"""How a trained module is spread over the processes (:func:`wrap`), and its training passes.

:func:`wrap` picks the strategy (:mod:`spa.distributed.ddp` or :mod:`spa.distributed.fsdp`);
:func:`forward` and :func:`accumulation` run the passes through whichever wrapper it chose.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TypeVar

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from spa.distributed import ddp, fsdp, process
from spa.distributed.caller import Caller

T = TypeVar("T")

#: The data-parallel strategies of :func:`wrap`, the first the default.
STRATEGIES = ("ddp", "fsdp")
#: The trainers' ``parallel`` setting (SFTConfig, PPOConfig), described once.
PARALLEL_HELP = ("Data-parallel strategy under a launcher (docs/distributed.md): ddp, every process holds the "
                 "whole model, its gradients and optimizer state; fsdp, each holds 1/N of them (FSDP2, per "
                 "decoder layer), for a model whose training does not fit one device. One process ignores it.")


def check_strategy(strategy: str) -> str:
    """``strategy`` if it is one of :data:`STRATEGIES`, else a ValueError naming it and them
    (the trainers' ``parallel`` setting is checked here, where it is used)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"parallel {strategy!r} is not known; valid: {', '.join(STRATEGIES)}")
    return strategy


def wrap(module: nn.Module, strategy: str = "ddp") -> nn.Module:
    """``module`` as it trains: spread over the processes by ``strategy`` (``ddp`` or
    ``fsdp``: :data:`STRATEGIES`) with several processes, itself alone.

    The one place that decides how a trained module is spread over the processes.
    Wrapping copies the main process's parameters and buffers to the others: every process
    must start from the same weights (a seed-dependent init, a checkpoint read from a
    different disk). The copy bumps the parameters' version counters, so a generation
    engine built earlier rebuilds its fused weights
    (:mod:`spa.models.llama_decoder`). Training passes go through :func:`forward` and
    :func:`accumulation`. Under DDP, generation, evaluation, checkpoints and copies use
    ``module`` itself, whose parameters the wrapper shares; under FSDP ``module`` holds
    shards of them, and those uses run inside :func:`spa.distributed.gathered`.
    """
    check_strategy(strategy)
    if process.world()[1] == 1:
        return module
    return fsdp.wrap(module) if strategy == "fsdp" else ddp.wrap(module)


def _wrapped(model: nn.Module) -> bool:
    return isinstance(model, (DistributedDataParallel, Caller))


def forward(model: nn.Module, fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(module, *args, **kwargs)`` as a training pass of ``model`` (:func:`wrap`'s
    result): through the wrapper's forward where ``model`` is wrapped, so that DDP's
    backward all-reduces and FSDP gathers the root's parameters; a plain call otherwise."""
    if _wrapped(model):
        return model(fn, *args, **kwargs)
    return fn(model, *args, **kwargs)


def accumulation(model: nn.Module, items: list[T]) -> list[tuple[T | None, AbstractContextManager]]:
    """This process's micro-batches of one optimizer step, each with the context that its
    forward and backward must run in.

    ``model`` wrapped (:func:`wrap`): the processes agree on the most micro-batches any of
    them holds (one small collective) and ``items`` is padded with ``None`` to that many.
    For each ``None`` the caller runs a pass on any small input with its loss multiplied
    by 0: it adds nothing to the gradients, but every process runs as many passes, and in
    each of them every parameter takes part. So every trainable parameter ends the step
    with a gradient, the same on every process (one without micro-batches of its own
    adds zeros), as on a single process, whose passes use every parameter too; none is
    None on one process and set on another.

    Under DDP the context is ``no_sync`` for all passes but the last (their gradients
    accumulate locally) and nothing for the last, whose backward all-reduces the
    accumulated gradients; DDP alone would need only the last pass matched. Under FSDP
    every pass gathers each layer's parameters from all processes, so all passes must be
    matched, and each one reduce-scatters its gradients onto the shards, where they add
    up (no context): skipping those reductions would keep a whole, unsharded gradient on
    every process until the last pass, the memory that FSDP is there to save.

    ``model`` plain (one process): ``items`` as they are, with empty contexts.
    """
    if not _wrapped(model):
        return [(item, nullcontext()) for item in items]
    count = process.most(len(items))
    padded = [*items, *[None] * (count - len(items))]
    if not isinstance(model, DistributedDataParallel):
        # FSDP keeps the root's parameters gathered from a forward to its backward; after a
        # forward without one they would stay so, and miss the optimizer's next step.
        model.reshard()
        return [(item, nullcontext()) for item in padded]
    return [(item, model.no_sync() if i < count - 1 else nullcontext()) for i, item in enumerate(padded)]
