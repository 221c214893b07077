"""Data-parallel training over processes, GPUs and nodes, through accelerate.

``accelerate launch --multi_gpu --num_processes N`` (or ``torchrun``) starts one process
per device; the SFT and RL loops ask this package which process they are and exchange
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
What reads the whole weights (the generation engine, validation, an evaluation, a
checkpoint) runs inside :func:`gathered`, which every process enters
together (:func:`on_main` takes the model to gather as well); checkpoints take their
tensors from :func:`state_dict` and :func:`optimizer_state`, whole, so that one process
or any other launch resumes from them (:func:`load_optimizer_state`).

Of accelerate only :class:`accelerate.PartialState` is used (the process state behind
``Accelerator``, shared with one if the caller made it): ranks, the device,
``gather_object``, ``broadcast_object_list``, ``reduce`` and ``wait_for_everyone``.
Without CUDA (or with ``ACCELERATE_USE_CPU``) the processes talk over gloo on CPU.

Work that only the main process does (writing an evaluation's files, random-exploration
data, a whole stage of ``spa run`` that is not data-parallel) goes through :func:`on_main`:
the others wait for its result in a collective, so the process group's timeout must
outlast it. It is set where the group starts, from ``SPA_DIST_TIMEOUT`` (seconds; default
2 hours, where torch's own default is 30 minutes for gloo and 10 for NCCL). Work split
over the processes whose results the main process collects (the levels of an evaluation
or of self-play: :mod:`spa.agent.sharding`) goes through :func:`from_each`, which
raises one process's exception on all of them, as :func:`on_main` does.

The package, bottom to top (each module imports only those listed before it):
:mod:`~spa.distributed.process` (the process state and the collectives),
:mod:`~spa.distributed.caller` (the module the wrappers wrap),
:mod:`~spa.distributed.fsdp` (sharding, :func:`gathered`, whole checkpoints),
:mod:`~spa.distributed.ddp` (the DDP wrapper and its summed all-reduce),
:mod:`~spa.distributed.parallel` (:func:`wrap`, :func:`forward`, :func:`accumulation`) and
:mod:`~spa.distributed.main_process` (:func:`on_main`, :func:`from_each`). Callers use the names re-exported
here (``from spa import distributed; distributed.wrap(...)``); the submodules import
one another, never this package's own names, so that there is no import cycle.
"""

from spa.distributed.fsdp import gathered, load_optimizer_state, optimizer_state, sharded, state_dict
from spa.distributed.main_process import from_each, on_main
from spa.distributed.parallel import PARALLEL_HELP, STRATEGIES, accumulation, check_strategy, forward, wrap
from spa.distributed.process import (DEFAULT_TIMEOUT_SECONDS, TIMEOUT_ENV, alone, broadcast_value, copy_from_main,
                                     gather, gather_on_main, is_main, place, shard, state, sum_stats, timeout, total,
                                     wait, world)

__all__ = ["DEFAULT_TIMEOUT_SECONDS", "PARALLEL_HELP", "STRATEGIES", "TIMEOUT_ENV", "accumulation", "alone",
           "broadcast_value", "check_strategy", "copy_from_main", "forward", "from_each", "gather", "gather_on_main",
           "gathered", "is_main", "load_optimizer_state", "on_main", "optimizer_state", "place", "shard", "sharded",
           "state", "state_dict", "sum_stats", "timeout", "total", "wait", "world", "wrap"]
