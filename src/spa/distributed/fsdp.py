"""FSDP2: a model's weights, gradients and optimizer state sharded over the processes.

:func:`wrap` shards a module in place (``parallel=fsdp``); what reads its whole weights
outside the training passes runs inside :func:`gathered`; checkpoints take whole tensors
from :func:`state_dict` and :func:`optimizer_state`, and :func:`load_optimizer_state`
cuts a whole optimizer state back into shards. Where nothing is sharded (DDP, one
process) each of these leaves the module as it is. torch's FSDP is imported only where a
module is sharded (about 0.7 s): the checks here look it up in ``sys.modules`` instead.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from spa.distributed import process
from spa.distributed.caller import Caller

# The FSDP wrapper of each module sharded in place (:func:`wrap`), by the module.
_sharded: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# FSDP wrappers inside a gathered() block, and the whole optimizer states gathered there.
_whole: set = set()
_whole_optimizers: dict[int, dict | None] = {}


def wrap(module: nn.Module) -> Caller:
    """``module`` under FSDP2, sharded in place over all processes: each decoder layer a
    group of its own (gathered while it runs, then freed), the rest of the model
    (embeddings, final norm, output head: tied weights must share a group) the root's.
    Returns the root, a :class:`Caller` of ``module``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    layers = _decoder_layers(module)
    # each process keeps its own shard of what it holds, so all must hold the same
    process.copy_from_main(module)
    root = Caller(module)
    root.checkpoint_keys = tuple(module.state_dict())
    mesh = init_device_mesh(process.state().device.type, (process.world()[1],))
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    # The root's parameters are needed again as soon as the backward starts (the output
    # head): kept gathered from its forward to its backward, as FSDP does by default.
    fully_shard(root, mesh=mesh, reshard_after_forward=False)
    for part in _fsdp_modules(root):
        # Summed, not averaged (as DDP's sum hook), by a plain sum: gloo has no
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


def _fsdp_modules(module: nn.Module) -> list[nn.Module]:
    """The FSDP modules in ``module`` (itself included); none where FSDP was never
    imported (:func:`wrap` imports it), which saves its import elsewhere."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is None:
        return []
    return [m for m in module.modules() if isinstance(m, fsdp.FSDPModule)]


def sharded(module: nn.Module) -> bool:
    """Whether FSDP shards (some of) ``module``'s parameters. Every process must then run
    the same sequence of its sharded modules in a pass: each run gathers the module's
    parameters from all processes, and its backward reduce-scatters the gradients."""
    return bool(_fsdp_modules(module))


def _root(model: nn.Module | None) -> Caller | None:
    """The FSDP root of ``model`` (:func:`wrap`'s result or the module it sharded); None
    where FSDP does not shard it."""
    if isinstance(model, Caller):
        model = model.module
    found = _sharded.get(model) if model is not None else None
    return found() if found is not None else None


@contextmanager
def gathered(model: nn.Module | None, *optimizers: torch.optim.Optimizer) -> Iterator[None]:
    """Inside, ``model`` (:func:`spa.distributed.wrap`'s result, or the module it wrapped)
    holds its whole weights on every process: under FSDP each process gathers them on
    entering (a collective: every process enters together) and frees them on leaving;
    otherwise (DDP, one process) nothing happens.

    For whatever reads the weights outside the training passes: the generation engine,
    validation, an evaluation (every process playing its share of the levels), a
    checkpoint (:func:`state_dict`). The modules run inside as many times as each process
    likes without a collective, as they are not freed after their forward; no backward
    runs inside. ``optimizers``: their states are gathered as well, whole, on the main
    process (:func:`optimizer_state`), for a checkpoint. A block inside another one of the
    same model changes nothing.
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
            part.set_reshard_after_forward(part is not root, recurse=False)  # as wrap set it


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
    main = process.is_main()
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
