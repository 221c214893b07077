"""Training forward passes that run the batch's shared prompt prefix once.

The sequences of a training batch of one environment all start with the same system
prompt (the rules and the answer format), typically 60-70% of their tokens. Run as a
batch of one, its keys and values are repeated for the rows and the rest of each row
attends to them: the same numbers as a full forward pass, with the prefix's compute
divided by the batch size; gradients flow back through the repeat into the prefix.
Not under gradient checkpointing, whose layers drop the cache, nor under FSDP.
"""

from __future__ import annotations

from torch import Tensor

from spa import distributed
from spa.models.kv import cache_arg, returned_cache
from spa.models.recompute import recomputes

MIN_SHARED_PREFIX = 16  # shorter common prefixes are not worth a second forward call


def shared_prefix_length(ids: Tensor, attention: Tensor, trained: Tensor) -> int:
    """Length of the untrained token prefix every row of the batch shares (0 if short).

    Counted only while no row has padding or a trained token there; the position before
    a trained token is excluded too, since position t - 1 predicts token t.
    """
    if ids.shape[0] < 2:
        return 0
    same = (ids == ids[:1]).all(0) & attention.bool().all(0) & ~trained.any(0)
    same[:-1] &= ~trained[:, 1:].any(0)
    length = int(same.long().cumprod(0).sum())
    return length if length >= MIN_SHARED_PREFIX else 0


def hidden_states(decoder, ids: Tensor, attention: Tensor, trained: Tensor) -> tuple[Tensor, int]:
    """``(hidden, offset)``: the decoder's last hidden states of positions ``offset..L-1``.

    ``trained`` (B, L) marks the tokens whose prediction matters (loss targets, policy
    tokens). ``offset`` is the length of the shared prefix that ran once (0 when there is
    none); its own hidden states are not returned, and no trained token needs them, so
    callers pair ``hidden[:, :-1]`` with the targets ``trained[:, offset + 1:]``.
    """
    # Under gradient checkpointing the layers run without the prefix's KV cache
    # (spa.models.recompute), so the batch runs whole. So it does under FSDP: every process
    # must run each layer as often (each run gathers it), and whether a batch shares a
    # prefix differs between them.
    offset = 0 if recomputes(decoder) or distributed.sharded(decoder) else shared_prefix_length(ids, attention, trained)
    if not offset:  # no cache: nothing reads it (and gradient checkpointing would drop it)
        return decoder(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state, 0
    from transformers import DynamicCache

    cache = returned_cache(decoder(input_ids=ids[:1, :offset], use_cache=True, **cache_arg(DynamicCache())))
    cache.batch_repeat_interleave(ids.shape[0])
    hidden = decoder(input_ids=ids[:, offset:], attention_mask=attention, use_cache=True,
                     **cache_arg(cache)).last_hidden_state
    return hidden, offset
