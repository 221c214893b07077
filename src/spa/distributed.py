"""Data-parallel training over processes, GPUs and nodes, through accelerate.

``accelerate launch --multi_gpu --num_processes N`` (or ``torchrun``) starts one process
per device; the SFT and RL loops ask this module which process they are and exchange
the little they must share. Run without a launcher, there is one process and every
helper here is the identity: a single-process run does exactly what it did before.

Training goes through one of two data-parallel strategies (:func:`wrap`,
:data:`STRATEGIES`; the trainers' ``parallel`` setting). ``ddp``, the default, is torch's
``DistributedDataParallel`` (the class itself rather than ``Accelerator.prepare_model``,
which builds the same wrapper but needs an ``Accelerator`` and its global settings): it
copies the main process's weights to the others when it wraps the model and all-reduces
the gradients, bucket by bucket, during the backward pass; every process holds the whole
model, its gradients and its optimizer state. ``fsdp`` is torch's FSDP2
(``fully_shard``): each decoder layer, and the rest of the model as the root, is split
over the processes, so that each holds 1/N of the weights, the gradients and the
optimizer state; a layer's whole weights are gathered only while it runs, and its
gradients are reduce-scattered back to the shards. The training passes call the model
through :func:`forward`, so that the wrapper sees them. One optimizer step accumulates
several micro-batches, and the processes need not hold as many: in PPO each process
holds the turns of its own episodes, episodes have different numbers of turns, so one
process may hold three micro-batches of a minibatch and another none. The processes
therefore agree on the most micro-batches any of them holds and pad their lists with
zero-weight passes (:func:`accumulation`); under DDP all passes but the last run under
``no_sync`` (their gradients accumulate locally) and the last one all-reduces; under FSDP
every pass is collective anyway (the gathers) and each reduce-scatters its gradients.
Each process's losses are already weighted by the *global* count of the step (tokens or
sequences), so the gradients are summed, not averaged: the sum is the single-process
gradient, and every process then takes the same optimizer step. A single process
wraps nothing and pads nothing.

FSDP shards the module in place: outside the training passes its parameters are shards.
What reads the whole weights (the generation engine, validation, an evaluation on the
main process, a checkpoint) runs inside :func:`gathered`, which every process enters
together (:func:`on_main` takes the model to gather as well); checkpoints take their
tensors from :func:`state_dict` and :func:`optimizer_state`, whole, so that one process
or any other launch resumes from them (:func:`load_optimizer_state`).

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
import sys
import weakref
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

#: The data-parallel strategies of :func:`wrap`, the first the default.
STRATEGIES = ("ddp", "fsdp")
#: The trainers' ``parallel`` setting (SFTConfig, PPOConfig), described once.
PARALLEL_HELP = ("Data-parallel strategy under a launcher (docs/distributed.md): ddp, every process holds the "
                 "whole model, its gradients and optimizer state; fsdp, each holds 1/N of them (FSDP2, per "
                 "decoder layer), for a model whose training does not fit one device. One process ignores it.")

TIMEOUT_ENV = "SPA_DIST_TIMEOUT"
# Long enough for the main process to evaluate 128 levels x 8 samples on a CPU while the
# others wait (about 15 minutes with SmolLM2-135M on one core) many times over.
DEFAULT_TIMEOUT_SECONDS = 2 * 3600

# Depth of alone() blocks: inside one, this process acts as a run of its own.
_alone = 0
# The FSDP wrapper of each module sharded in place (:func:`wrap`), by the module.
_sharded: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# FSDP wrappers inside a gathered() block, and the whole optimizer states gathered there.
_whole: set = set()
_whole_optimizers: dict[int, dict | None] = {}


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


def on_main(fn: Callable[[], T], model: nn.Module | None = None) -> T:
    """``fn()`` run on the main process only (an evaluation that writes files), as a
    single-process run (:func:`alone`), its result sent to the others, which wait for it.

    ``model``: a model that ``fn`` uses, as :func:`wrap` returned it (or the module it
    wrapped). Under FSDP every process gathers its whole weights first (:func:`gathered`):
    the main process cannot gather the others' shards alone.

    An exception in ``fn`` is raised on every process (the others get the same type and
    message), so that none of them waits out the timeout for a result that never comes.
    """
    if world()[1] == 1:
        return fn()
    result, error = None, None
    with gathered(model):
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
    shards of them, and those uses run inside :func:`gathered` (module docstring).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"parallel {strategy!r} is not known; valid: {', '.join(STRATEGIES)}")
    if world()[1] == 1:
        return module
    if strategy == "fsdp":
        return _shard(module)
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


def _sum_hook(group, bucket):  # no annotations: DDP checks them, and these would be strings
    """DDP's gradient all-reduce as a sum. DDP's own averages over the processes, but
    each process's losses are already weighted by the global count of the step, so the
    sum of their gradients is the single-process gradient. (Multiplying every loss by the
    number of processes would undo the average as well, but the losses would then differ
    from a single process's, and round twice where that number is not a power of 2.)"""
    work = torch.distributed.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda done: done.value()[0])


def _shard(module: nn.Module) -> nn.Module:
    """``module`` under FSDP2, sharded in place over all processes: each decoder layer a
    group of its own (gathered while it runs, then freed), the rest of the model
    (embeddings, final norm, output head: tied weights must share a group) the root's.
    Returns the root, a :class:`_Caller` of ``module``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    layers = _decoder_layers(module)
    _copy_from_main(module)
    root = _Caller(module)
    root.checkpoint_keys = tuple(module.state_dict())
    mesh = init_device_mesh(state().device.type, (world()[1],))
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    # The root's parameters are needed again as soon as the backward starts (the output
    # head): kept gathered from its forward to its backward, as FSDP does by default.
    fully_shard(root, mesh=mesh, reshard_after_forward=False)
    for part in _fsdp_modules(root):
        # Summed, not averaged (as DDP's _sum_hook), by a plain sum: gloo has no
        # pre-multiplied sum, which FSDP's division by a factor would otherwise use.
        part.set_gradient_divide_factor(1.0)
        part.set_force_sum_reduction_for_comms(True)
    # FSDP takes the first of its modules to run for the root; a layer run first outside
    # the root (an evaluation before any training pass) would take that place and break
    # the next training pass. An empty pass through the root settles it.
    with torch.no_grad():
        root(_nothing)
    root.reshard()
    _sharded[module] = weakref.ref(root)
    return root


def _nothing(module: nn.Module) -> None:
    return None


def _decoder_layers(module: nn.Module) -> nn.ModuleList:
    """The decoder layers that FSDP shards one by one (a ValueError where there are none)."""
    decoder = module.get_decoder() if hasattr(module, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        raise ValueError(f"parallel=fsdp shards a causal LM's decoder layers (get_decoder().layers); "
                         f"{type(module).__name__} has none")
    return layers


def _copy_from_main(module: nn.Module) -> None:
    """The main process's parameters and buffers, on every process (as DDP copies them):
    each process keeps its own shard of what it holds, so all must hold the same."""
    with torch.no_grad():
        for tensor in (*module.parameters(), *module.buffers()):
            torch.distributed.broadcast(tensor.detach(), src=0)


def _fsdp_modules(module: nn.Module) -> list[nn.Module]:
    """The FSDP modules in ``module`` (itself included); none where FSDP was never
    imported (:func:`_shard` imports it), which saves its import (~0.7 s) elsewhere."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is None:
        return []
    return [m for m in module.modules() if isinstance(m, fsdp.FSDPModule)]


def sharded(module: nn.Module) -> bool:
    """Whether FSDP shards (some of) ``module``'s parameters. Every process must then run
    the same sequence of its sharded modules in a pass: each run gathers the module's
    parameters from all processes, and its backward reduce-scatters the gradients."""
    return bool(_fsdp_modules(module))


def _root(model: nn.Module | None) -> nn.Module | None:
    """The FSDP root of ``model`` (:func:`wrap`'s result or the module it sharded); None
    where FSDP does not shard it."""
    if isinstance(model, _Caller):
        model = model.module
    found = _sharded.get(model) if model is not None else None
    return found() if found is not None else None


@contextmanager
def gathered(model: nn.Module | None, *optimizers: torch.optim.Optimizer) -> Iterator[None]:
    """Inside, ``model`` (:func:`wrap`'s result, or the module it wrapped) holds its whole
    weights on every process: under FSDP each process gathers them on entering (a
    collective: every process enters together) and frees them on leaving; otherwise (DDP,
    one process) nothing happens.

    For whatever reads the weights outside the training passes: the generation engine,
    validation, an evaluation on the main process (:func:`on_main`), a checkpoint
    (:func:`state_dict`). The modules run inside as many times as each process likes
    without a collective, as they are not freed after their forward; no backward runs
    inside. ``optimizers``: their states are gathered as well, whole, on the main process
    (:func:`optimizer_state`), for a checkpoint. A block inside another one of the same
    model changes nothing.
    """
    root = _root(model)
    if root is None or root in _whole:
        yield
        return
    states = {id(optimizer): _whole_optimizer_state(optimizer) for optimizer in optimizers}
    parts = _fsdp_modules(root)
    for part in parts:
        part.set_reshard_after_forward(False, recurse=False)
        part.unshard()
    # The whole tensors live in buffers that FSDP refills at each gathering, possibly at
    # the same address: the bump makes the generation engine rebuild its fused weights
    # (spa.models.llama_decoder.weights_key), which would otherwise be the last ones.
    torch.autograd.graph.increment_version(list(root.parameters()))
    _whole.add(root)
    _whole_optimizers.update(states)
    try:
        yield
    finally:
        _whole.discard(root)
        for key in states:
            _whole_optimizers.pop(key, None)
        for part in parts:
            try:
                part.reshard()
            except RuntimeError as error:
                raise RuntimeError(f"FSDP could not free the whole weights that distributed.gathered() collected "
                                   f"({error}): a .numpy() of a weight, or of a view of one, pins its storage; "
                                   "copy the tensor first") from error
            part.set_reshard_after_forward(part is not root, recurse=False)  # as _shard set it


def state_dict(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """``model``'s weights for a checkpoint (``save_pretrained``'s ``state_dict``): None
    where FSDP does not shard it (the model's own ``state_dict()`` then); under FSDP, inside
    :func:`gathered`, CPU copies of the whole tensors, tied weights tied (the module's own
    ``state_dict()`` would hand back shards). A RuntimeError outside :func:`gathered`."""
    root = _root(model)
    if root is None:
        return None
    if root not in _whole:
        raise RuntimeError("the weights of a model that FSDP shards are whole only inside distributed.gathered()")
    module = root.module
    tensors = dict(module.named_parameters(remove_duplicate=False))
    tensors.update(module.named_buffers(remove_duplicate=False))
    copies: dict[int, torch.Tensor] = {}  # one copy per tensor: a tied weight stays one
    for key in root.checkpoint_keys:
        tensor = tensors[key]
        if id(tensor) not in copies:
            copies[id(tensor)] = tensor.detach().to("cpu", copy=True)
    return {key: copies[id(tensors[key])] for key in root.checkpoint_keys}


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict | None:
    """``optimizer.state_dict()`` for a checkpoint, with whole tensors whatever the
    strategy: under FSDP those that :func:`gathered` collected for it (on the main process;
    None on the others), a RuntimeError for a sharded state outside that block."""
    if id(optimizer) in _whole_optimizers:
        return _whole_optimizers[id(optimizer)]
    state = optimizer.state_dict()
    if any(_is_shard(value) for entries in state["state"].values() for value in entries.values()):
        raise RuntimeError("the state of an optimizer of a model that FSDP shards is whole only inside "
                           "distributed.gathered(model, optimizer)")
    return state


def _whole_optimizer_state(optimizer: torch.optim.Optimizer) -> dict | None:
    """``optimizer.state_dict()`` with each shard gathered whole (a collective), on the
    main process, on the CPU; None on the others."""
    state = optimizer.state_dict()
    main = is_main()
    whole = {index: {key: _whole_tensor(value, main) for key, value in entries.items()}
             for index, entries in state["state"].items()}
    return {**state, "state": whole} if main else None


def _whole_tensor(value, keep: bool):
    if not _is_shard(value):
        return value
    whole = value.full_tensor()  # every process takes part
    return whole.cpu() if keep else None


def _is_shard(value) -> bool:
    tensor = sys.modules.get("torch.distributed.tensor")
    return tensor is not None and isinstance(value, tensor.DTensor)


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """``optimizer.load_state_dict(state)``, for a state saved whole (by
    :func:`optimizer_state`, or by ``state_dict()`` on one process or under DDP): under
    FSDP each process keeps its own shard of every tensor, sharded as its parameter."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if any(_is_shard(p) for p in params):
        # the saved ids, group by group, name the parameters in order (as load_state_dict reads them)
        by_id = dict(zip((i for group in state["param_groups"] for i in group["params"]), params))
        state = {**state, "state": {i: {key: _shard_like(value, by_id[i]) for key, value in entries.items()}
                                    for i, entries in state["state"].items()}}
    optimizer.load_state_dict(state)


def _shard_like(value, param: torch.Tensor):
    """``value`` (a whole tensor of ``param``'s shape) as this process's shard of it;
    anything else (Adam's step count) as it is."""
    from torch.distributed.tensor import distribute_tensor

    if not torch.is_tensor(value) or not _is_shard(param) or value.shape != param.shape:
        return value
    # every process holds the whole tensor (read from the same file): each cuts its own shard
    return distribute_tensor(value.to(param.device), param.device_mesh, param.placements, src_data_rank=None)


def forward(model: nn.Module, fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(module, *args, **kwargs)`` as a training pass of ``model`` (:func:`wrap`'s
    result): through the wrapper's forward where ``model`` is wrapped, so that DDP's
    backward all-reduces and FSDP gathers the root's parameters; a plain call otherwise."""
    if isinstance(model, (DistributedDataParallel, _Caller)):
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
    if not isinstance(model, (DistributedDataParallel, _Caller)):
        return [(item, nullcontext()) for item in items]
    count = _most(len(items))
    padded = [*items, *[None] * (count - len(items))]
    if not isinstance(model, DistributedDataParallel):
        # FSDP keeps the root's parameters gathered from a forward to its backward; after a
        # forward without one they would stay so, and miss the optimizer's next step.
        model.reshard()
        return [(item, nullcontext()) for item in padded]
    return [(item, model.no_sync() if i < count - 1 else nullcontext()) for i, item in enumerate(padded)]


def _most(count: int) -> int:
    """The largest ``count`` over the processes."""
    most = torch.tensor([count], device=state().device)
    torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX)
    return int(most.item())
