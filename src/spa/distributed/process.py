"""Which process this is, and the little the processes exchange.

The bottom of :mod:`spa.distributed`: accelerate's process state, the rank and world
size (:func:`world`, a single-process run inside :func:`alone`) and the collectives that
the trainers call directly. Alone (no launcher, or inside :func:`alone`), every helper
here is the identity.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TypeVar

import torch
from accelerate import PartialState
from accelerate.utils import broadcast_object_list, gather_object, reduce
from torch import nn

from spa.compute import accelerate_cpu

T = TypeVar("T")

TIMEOUT_ENV = "SPA_DIST_TIMEOUT"
# Long enough, many times over, for the longest work one process does while the others
# wait: an evaluation of 128 levels x 8 samples on a CPU took about 15 minutes with
# SmolLM2-135M on one core (split by level now, but a process may still wait for the
# slowest share, or for the main process's expert iteration or RWML stage).
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
    every helper of :mod:`spa.distributed` is the identity.

    For work the main process does while the others wait for it
    (:func:`spa.distributed.on_main`): an SFT inside it (expert iteration's rounds) would
    otherwise enter collectives that the waiting processes never join, and hang.
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


def place(module: nn.Module) -> nn.Module:
    """With several processes, move ``module`` to this process's device (``cuda:LOCAL_RANK``
    or the CPU); a single process keeps the model where the caller put it."""
    if world()[1] > 1:
        module.to(state().device)
    return module


def gather(items: list[T]) -> list[T]:
    """Every process's ``items`` (picklable), concatenated in rank order, on every process."""
    return items if world()[1] == 1 else gather_object(list(items))


def gather_on_main(value: T) -> list[T] | None:
    """Every process's ``value`` (picklable), in rank order, on the main process; None on
    the others. For what only the main process reads (a sharded evaluation's trajectories):
    :func:`gather` would send every process's share to every other process as well."""
    if world()[1] == 1:
        return [value]
    values = [None] * world()[1] if is_main() else None
    torch.distributed.gather_object(value, values, dst=0)
    return values


def broadcast_value(value: T) -> T:
    """The main process's ``value`` (picklable), on every process."""
    return value if world()[1] == 1 else broadcast_object_list([value])[0]


def copy_from_main(module: nn.Module) -> None:
    """The main process's parameters and buffers, copied in place into ``module`` on every
    process (a collective; nothing alone). For a module that every process must hold alike
    (a seed-dependent init, a checkpoint read from a different disk): what the wrappers do
    for the trained model, done for one that is not wrapped (PPO's reference) or before
    FSDP cuts the module into shards. ``module`` must be on this process's device."""
    if world()[1] == 1:
        return
    with torch.no_grad():
        for tensor in (*module.parameters(), *module.buffers()):
            torch.distributed.broadcast(tensor.detach(), src=0)


def total(*values: float) -> tuple[float, ...]:
    """Each value summed over the processes (counts and sums of metrics)."""
    if world()[1] == 1:
        return values
    summed = reduce(torch.tensor(values, dtype=torch.float64, device=state().device), "sum")
    return tuple(summed.tolist())


def most(count: int) -> int:
    """The largest ``count`` over the processes."""
    if world()[1] == 1:
        return count
    largest = torch.tensor([count], device=state().device)
    torch.distributed.all_reduce(largest, op=torch.distributed.ReduceOp.MAX)
    return int(largest.item())


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
