"""Data-parallel training over processes, GPUs and nodes, through accelerate.

``accelerate launch --multi_gpu --num_processes N`` (or ``torchrun``) starts one process
per device; the SFT and RL loops ask this module which process they are and exchange
the little they must share. Run without a launcher, there is one process and every
helper here is the identity: a single-process run does exactly what it did before.

Training goes through torch's ``DistributedDataParallel`` (:func:`wrap`; the class
itself rather than ``Accelerator.prepare_model``, which builds the same wrapper but
needs an ``Accelerator`` and its global settings): it copies the main process's weights
to the others when it wraps the model and all-reduces the gradients, bucket by bucket,
during the backward pass. The training passes call the model through :func:`forward`,
so that DDP sees them. One optimizer step accumulates
several micro-batches, and the processes need not hold as many: in PPO each process
holds the turns of its own episodes, episodes have different numbers of turns, so one
process may hold three micro-batches of a minibatch and another none. The processes
therefore agree on the most micro-batches any of them holds and pad their lists with
zero-weight passes (:func:`accumulation`); all passes but the last run under DDP's
``no_sync`` (their gradients accumulate locally) and the last one all-reduces. Each
process's losses are already weighted by the *global* count of the step (tokens or
sequences), so the gradients are summed, not averaged: the sum is the single-process
gradient, and every process then takes the same optimizer step. A single process
wraps nothing and pads nothing.

Of accelerate only :class:`accelerate.PartialState` is used (the process state behind
``Accelerator``, shared with one if the caller made it): ranks, the device,
``gather_object``, ``broadcast_object_list``, ``reduce`` and ``wait_for_everyone``.
Without CUDA (or with ``ACCELERATE_USE_CPU``) the processes talk over gloo on CPU.

Work that only the main process does (an evaluation, self-play, a whole stage of
``spa run`` that is not data-parallel) goes through :func:`on_main`: the others wait
for its result in a collective, so the process group's timeout must outlast it. It is
set where the group starts, from ``SPA_DIST_TIMEOUT`` (seconds; default 2 hours, where
torch's own default is 30 minutes for gloo and 10 for NCCL).
"""

from __future__ import annotations

import inspect
import os
import pickle
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import timedelta
from typing import TypeVar

import torch
from accelerate import PartialState
from accelerate.utils import broadcast_object_list, gather_object, reduce
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from spa.compute import accelerate_cpu

T = TypeVar("T")

TIMEOUT_ENV = "SPA_DIST_TIMEOUT"
# Long enough for the main process to evaluate 128 levels x 8 samples on a CPU while the
# others wait (about 15 minutes with SmolLM2-135M on one core) many times over.
DEFAULT_TIMEOUT_SECONDS = 2 * 3600

# Depth of alone() blocks: inside one, this process acts as a run of its own.
_alone = 0


def timeout() -> timedelta:
    """How long a collective waits for the other processes: ``SPA_DIST_TIMEOUT`` seconds,
    else :data:`DEFAULT_TIMEOUT_SECONDS`; a ValueError naming a bad value."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return timedelta(seconds=DEFAULT_TIMEOUT_SECONDS)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{TIMEOUT_ENV}={raw!r} is not a timeout; valid: a finite number of seconds > 0 "
                         f"(default {DEFAULT_TIMEOUT_SECONDS})")
    return timedelta(seconds=seconds)


def state() -> PartialState:
    """accelerate's process state, created on first use (it initialises the process group).

    ``cpu`` is forced when CUDA is absent: accelerate otherwise treats a launched CPU
    process as a lone one (its gloo path needs the flag) and each would train alone. It
    is also set where ``ACCELERATE_USE_CPU`` says so, as ``--device cpu`` under a launcher
    does (:func:`spa.compute.claim`), so that the processes stay on the CPU beside a GPU.
    The group's :func:`timeout` applies where this call starts it (the first one).
    """
    cpu = not torch.cuda.is_available() or accelerate_cpu()
    return PartialState(cpu=cpu, timeout=timeout())


def world() -> tuple[int, int]:
    """``(rank, world_size)`` of this process; ``(0, 1)`` inside :func:`alone`."""
    if _alone:
        return 0, 1
    s = state()
    return s.process_index, s.num_processes


@contextmanager
def alone() -> Iterator[None]:
    """Inside, this process acts as a single-process run: :func:`world` is ``(0, 1)`` and
    every helper here is the identity.

    For work the main process does while the others wait for it (:func:`on_main`): an SFT
    inside it (expert iteration's rounds) would otherwise enter collectives that the
    waiting processes never join, and hang.
    """
    global _alone
    _alone += 1
    try:
        yield
    finally:
        _alone -= 1


def is_main() -> bool:
    """Whether this is the process that writes checkpoints, metrics and evaluations."""
    return world()[0] == 0


def shard(items: list[T]) -> list[T]:
    """This process's share of ``items``: every ``world``-th item from its rank (all of them alone)."""
    rank, size = world()
    return items[rank::size]


def place(module: torch.nn.Module) -> torch.nn.Module:
    """With several processes, move ``module`` to this process's device (``cuda:LOCAL_RANK``
    or the CPU); a single process keeps the model where the caller put it."""
    if world()[1] > 1:
        module.to(state().device)
    return module


def gather(items: list[T]) -> list[T]:
    """Every process's ``items`` (picklable), concatenated in rank order, on every process."""
    return items if world()[1] == 1 else gather_object(list(items))


def broadcast_value(value: T) -> T:
    """The main process's ``value`` (picklable), on every process."""
    return value if world()[1] == 1 else broadcast_object_list([value])[0]


def on_main(fn: Callable[[], T]) -> T:
    """``fn()`` run on the main process only (an evaluation that writes files), as a
    single-process run (:func:`alone`), its result sent to the others, which wait for it.

    An exception in ``fn`` is raised on every process (the others get the same type and
    message), so that none of them waits out the timeout for a result that never comes.
    """
    if world()[1] == 1:
        return fn()
    result, error = None, None
    if is_main():
        try:
            with alone():
                result = fn()
        except Exception as caught:  # noqa: BLE001 - sent on, then raised here as well
            error = caught
    result, sent = broadcast_value((result, None if error is None else _portable(error)))
    if error is not None:
        raise error
    if sent is not None:
        raise sent
    return result


def _portable(error: Exception) -> Exception:
    """``error`` if it survives pickling (to go to the other processes), else a RuntimeError
    with its type and message."""
    try:
        return pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - any failure to pickle means: send the text
        return RuntimeError(f"{type(error).__name__}: {error}")


def total(*values: float) -> tuple[float, ...]:
    """Each value summed over the processes (counts and sums of metrics)."""
    if world()[1] == 1:
        return values
    summed = reduce(torch.tensor(values, dtype=torch.float64, device=state().device), "sum")
    return tuple(summed.tolist())


def sum_stats(totals: dict[str, float], count: int) -> tuple[dict[str, float], int]:
    """Weighted metric sums and their weight, added over the processes (keys may differ:
    a process without samples has none)."""
    if world()[1] == 1:
        return totals, count
    merged: dict[str, float] = {}
    parts = gather([(totals, count)])
    for part, _ in parts:
        for key, value in part.items():
            merged[key] = merged.get(key, 0.0) + value
    return merged, sum(n for _, n in parts)


def wait() -> None:
    """Block until every process gets here (after the main process wrote a checkpoint)."""
    if world()[1] > 1:
        state().wait_for_everyone()


def wrap(module: nn.Module) -> nn.Module:
    """``module`` as it trains: wrapped in DDP with several processes, itself alone.

    The one place that decides how a trained module is spread over the processes.
    Wrapping copies the main process's parameters and buffers to the others: every process
    must start from the same weights (a seed-dependent init, a checkpoint read from a
    different disk). The copy bumps the parameters' version counters, so a generation
    engine built earlier rebuilds its fused weights
    (:mod:`spa.models.llama_decoder`). Training passes go through :func:`forward` and
    :func:`accumulation`; generation, evaluation, checkpoints and copies use ``module``
    itself, whose parameters the wrapper shares.
    """
    if world()[1] == 1:
        return module
    device = state().device
    wrapped = DistributedDataParallel(
        _Caller(module), device_ids=[device] if device.type == "cuda" else None,
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


class _Caller(nn.Module):
    """What DDP wraps: its forward runs a function of the trained module.

    The training passes call the decoder and the output head apart (the vocabulary
    projection runs only where there are targets), not the model's own forward; DDP
    prepares its gradient hooks only in its forward, so they go through this one.
    """

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, fn: Callable, *args, **kwargs):
        return fn(self.module, *args, **kwargs)


def _sum_hook(group, bucket):  # no annotations: DDP checks them, and these would be strings
    """DDP's gradient all-reduce as a sum. DDP's own averages over the processes, but
    each process's losses are already weighted by the global count of the step, so the
    sum of their gradients is the single-process gradient. (Multiplying every loss by the
    number of processes would undo the average as well, but the losses would then differ
    from a single process's, and round twice where that number is not a power of 2.)"""
    work = torch.distributed.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda done: done.value()[0])


def forward(model: nn.Module, fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(module, *args, **kwargs)`` as a training pass of ``model`` (:func:`wrap`'s
    result): through DDP's forward where ``model`` is wrapped, so that the backward of
    the result all-reduces; a plain call otherwise."""
    if isinstance(model, DistributedDataParallel):
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
    None on one process and set on another. The context is DDP's ``no_sync`` for all
    passes but the last (their gradients accumulate locally) and nothing for the last,
    whose backward all-reduces the accumulated gradients. DDP alone would need only the
    last pass matched; the same number of passes everywhere is what a sharded wrapper
    (FSDP, which gathers the parameters in every pass) needs as well.

    ``model`` plain (one process): ``items`` as they are, with empty contexts.
    """
    if not isinstance(model, DistributedDataParallel):
        return [(item, nullcontext()) for item in items]
    count = _most(len(items))
    padded = [*items, *[None] * (count - len(items))]
    return [(item, model.no_sync() if i < count - 1 else nullcontext()) for i, item in enumerate(padded)]


def _most(count: int) -> int:
    """The largest ``count`` over the processes."""
    most = torch.tensor([count], device=state().device)
    torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX)
    return int(most.item())
