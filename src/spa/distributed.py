"""Data-parallel training over processes, GPUs and nodes, through accelerate.

``accelerate launch --multi_gpu --num_processes N`` (or ``torchrun``) starts one process
per device; the SFT and RL loops ask this module which process they are and exchange
the little they must share. Run without a launcher, there is one process and every
helper here is the identity: a single-process run does exactly what it did before.

Why explicit gradient all-reduce instead of ``Accelerator.prepare`` (DDP): DDP
all-reduces inside every ``backward()``, so all processes must run the same number of
backward passes. In PPO they do not: each process holds the turns of its own episodes,
episodes have different numbers of turns, so one process may hold three micro-batches
of a minibatch and another none. Here each process accumulates its micro-batches'
gradients, already weighted by the *global* count of the step (tokens or sequences),
and :func:`all_reduce_grads` sums them once before each optimizer step: the sum is the
single-process gradient, and every process then takes the same optimizer step.

Only :class:`accelerate.PartialState` is used (the process state behind ``Accelerator``,
shared with one if the caller made it): ranks, the device, ``gather_object``,
``broadcast_object_list``, ``reduce`` and ``wait_for_everyone``. Without CUDA (or with
``ACCELERATE_USE_CPU``) the processes talk over gloo on CPU.

Work that only the main process does (an evaluation, self-play, a whole stage of
``spa run`` that is not data-parallel) goes through :func:`on_main`: the others wait
for its result in a collective, so the process group's timeout must outlast it. It is
set where the group starts, from ``SPA_DIST_TIMEOUT`` (seconds; default 2 hours, where
torch's own default is 30 minutes for gloo and 10 for NCCL).
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TypeVar

import torch
from accelerate import PartialState
from accelerate.utils import broadcast, broadcast_object_list, gather_object, reduce

from spa.compute import accelerate_cpu

T = TypeVar("T")

# Gradients are summed in flat buckets of at most this many elements (64 MiB in fp32):
# one collective per bucket instead of one per tensor, without a full copy of the grads.
BUCKET_ELEMENTS = 1 << 24

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


def sync_params(module: torch.nn.Module) -> None:
    """Copy the main process's parameters to the others, as DDP does when it wraps a model:
    every process must start from the same weights (a seed-dependent init, a checkpoint
    read from a different disk) for the summed gradients to keep them equal."""
    if world()[1] > 1:
        params = list(module.parameters())
        with torch.no_grad():
            broadcast([p.data for p in params], from_process=0)
            # a write through .data bumps no version counter; the generation engine keeps
            # its fused weights while the counters stand still (spa.models.llama_decoder)
            for p in params:
                torch.autograd.graph.increment_version(p)


def all_reduce_grads(params: list[torch.nn.Parameter]) -> None:
    """Sum the ``.grad`` of ``params`` over the processes, in place; call once before each
    optimizer step.

    Sum, not mean: the losses are already divided by the step's global count, so the
    sum of the processes' gradients is the single-process gradient. A process without
    a gradient for a parameter (no micro-batch in this minibatch) contributes zeros; a
    parameter no process has a gradient for stays ``None``, as it would alone (AdamW
    skips it rather than moving it with its old moments).
    """
    if world()[1] == 1:
        return
    params = list(params)
    if not params:
        return
    device = params[0].device
    has = reduce(torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=device), "sum")
    live = [p for p, h in zip(params, has.tolist()) if h > 0]
    for p in live:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    for bucket in _buckets(live):
        flat = reduce(torch.cat([p.grad.reshape(-1) for p in bucket]), "sum")
        offset = 0
        for p in bucket:
            p.grad.copy_(flat[offset: offset + p.grad.numel()].view_as(p.grad))
            offset += p.grad.numel()


def _buckets(params: list[torch.nn.Parameter]) -> list[list[torch.nn.Parameter]]:
    """Consecutive parameters grouped up to ``BUCKET_ELEMENTS``, one dtype and device per bucket."""
    buckets: list[list[torch.nn.Parameter]] = []
    size = 0
    for p in params:
        last = buckets[-1][-1] if buckets else None
        if last is None or size + p.numel() > BUCKET_ELEMENTS or (p.grad.dtype, p.grad.device) != (
                last.grad.dtype, last.grad.device):
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += p.numel()
    return buckets
