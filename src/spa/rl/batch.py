"""From rollouts to training tensors: one sequence per assistant turn, and its loss mask.

Each assistant turn is trained as its own sequence, ``prompt + response``, exactly the
context the model sampled from (with ``history_turns=0`` the prompt of turn k does not
contain turn k-1). Only the response tokens are policy tokens: the prompt and the
environment's text never get loss.

In world-model mode most of a response is state text: a FrozenLake turn averages about
126 tokens, 95 of them inside ``<observation>`` and ``<prediction>``, and about 3 of them
actions. Under a token-mean loss those tokens would carry the action's advantage and
swamp its gradient, so ``turn_samples`` can leave them out of the policy loss
(:func:`state_token_mask`; ``PPOConfig.state_tokens_in_loss``). The critic still values
every response token. The advantages that fill a Sample come from :mod:`spa.rl.advantages`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from spa import distributed
from spa.agent.parsing import ACTION_SEPARATOR, split_actions
from spa.agent.rollout import Trajectory
from spa.models.shared_prefix import hidden_states
from spa.rl import core

STATE_TAGS = ("observation", "prediction")


@dataclass
class Sample:
    """One assistant turn as a training sequence."""

    ids: list[int]  # prompt then response tokens
    start: int  # index of the first response token in ids
    old_logprobs: Tensor  # (R,) sampling log-probs of the response tokens
    episode: int  # index of the trajectory in the rollout
    turn: int
    advantages: Tensor | None = None  # (R,)
    returns: Tensor | None = None  # (R,) critic targets (PPO only)
    old_values: Tensor | None = None  # (R,) critic values at rollout time (PPO only)
    loss_mask: Tensor | None = None  # (R,) bool: the response tokens in the policy loss; None: all
    action_of: Tensor | None = None  # (R,) long: the played action each token goes with (value_actions=each)

    @property
    def response_length(self) -> int:
        return len(self.ids) - self.start

    @property
    def loss_tokens(self) -> int:
        """How many response tokens the policy loss reads."""
        return self.response_length if self.loss_mask is None else int(self.loss_mask.sum())


def turn_samples(trajectories: list[Trajectory], tokenizer=None, state_tokens_in_loss: bool = True,
                 action_tokens: bool = False) -> list[Sample]:
    """One Sample per assistant turn that produced at least one token.

    Each Sample's ``loss_mask`` leaves out of the policy loss the answer's actions that were
    never played (past the per-turn cap, or after the episode ended: :func:`unplayed_span`),
    whose tokens would otherwise carry the advantage of moves that did not happen; with
    ``state_tokens_in_loss=False`` also the contents of the ``<observation>`` and
    ``<prediction>`` blocks (:func:`state_spans`). Finding the spans decodes with
    ``tokenizer``; without one every response token is in the loss. With ``action_tokens``
    each Sample's ``action_of`` says which played action each token goes with
    (:func:`action_index`).
    """
    if (not state_tokens_in_loss or action_tokens) and tokenizer is None:
        raise ValueError("finding the state or action tokens of a response needs the tokenizer")
    samples = []
    for e, trajectory in enumerate(trajectories):
        for k, turn in enumerate(trajectory.turns):
            if turn.response_ids:
                mask = action_of = None
                if tokenizer is not None:
                    decode = _decoder(tokenizer)
                    text = decode(list(turn.response_ids))  # the text the spans index, as the bisection sees it
                    spans = [] if state_tokens_in_loss else state_spans(text)
                    spans += [span for span in [unplayed_span(text, len(turn.actions))] if span]
                    if spans:
                        mask = span_token_mask(list(turn.response_ids), decode, spans)
                    if action_tokens:
                        action_of = action_index(list(turn.response_ids), decode, len(turn.actions))
                samples.append(Sample(list(turn.prompt_ids) + list(turn.response_ids), len(turn.prompt_ids),
                                      torch.tensor(turn.logprobs, dtype=torch.float32), e, k, loss_mask=mask,
                                      action_of=action_of))
    return samples


def state_spans(text: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of the contents of the first closed
    ``<observation>...</observation>`` and ``<prediction>...</prediction>`` of ``text``
    (where ``parse_response`` reads them in a well-formed response), tags excluded."""
    spans = []
    for tag in STATE_TAGS:
        start = text.find(f"<{tag}>")
        end = text.find(f"</{tag}>", start) if start >= 0 else -1
        if end >= 0:
            spans.append((start + len(tag) + 2, end))
    return spans


def action_ends(text: str, count: int) -> list[int]:
    """The character positions just after each of the first ``count`` actions that the first
    closed ``<answer>`` block names (``||``-separated, as ``parse_response`` splits them);
    fewer where it names fewer, none without a closed answer block."""
    start = text.find("<answer>")
    end = text.find("</answer>", start) if start >= 0 else -1
    if end < 0:
        return []
    position, ends = start + len("<answer>"), []
    for part in text[position:end].split(ACTION_SEPARATOR):
        if len(ends) == count:
            break
        if part.strip():
            ends.append(position + len(part.rstrip()))
        position += len(part) + len(ACTION_SEPARATOR)
    return ends


def unplayed_span(text: str, played: int) -> tuple[int, int] | None:
    """The character span ``[start, end)`` of the first ``<answer>`` block's contents after
    its first ``played`` actions (``||``-separated, as ``parse_response`` splits them), up
    to ``</answer>``; ``None`` when the answer names no more actions than were played (or
    none were, or there is no closed answer block)."""
    ends = action_ends(text, played) if played >= 1 else []
    if len(ends) < max(played, 1):
        return None
    cut, end = ends[-1], text.find("</answer>", text.find("<answer>"))
    return (cut, end) if split_actions(text[cut:end]) else None


def action_index(response_ids: list[int], decode: Callable[[list[int]], str], played: int) -> Tensor:
    """(R,) long: for each response token, which of the turn's ``played`` actions it goes
    with. Everything up to the end of the first action (the think text, the tags) is 0; the
    tokens after the end of action j (the separator, action j + 1's name) go with j + 1; the
    tail after the last played action (the closing tag, any unplayed actions) with the last.
    A token that straddles an action's end goes with that action."""
    index = torch.zeros(len(response_ids), dtype=torch.long)
    for end in action_ends(decode(response_ids), played)[:-1]:
        index[_first_token_from(response_ids, decode, end):] += 1
    return index


def state_token_mask(response_ids: list[int], decode: Callable[[list[int]], str]) -> Tensor:
    """:func:`span_token_mask` over the response's :func:`state_spans`."""
    return span_token_mask(response_ids, decode, state_spans(decode(response_ids)))


def span_token_mask(response_ids: list[int], decode: Callable[[list[int]], str],
                    spans: list[tuple[int, int]]) -> Tensor:
    """(R,) bool over the response tokens: False on the tokens that lie wholly inside one
    of the character ``spans`` of the decoded response, True elsewhere (any token that
    straddles a span's edge included).

    Token k covers the characters ``[c_k, c_{k+1})`` with ``c_k = len(decode(ids[:k]))``:
    decoding a prefix gives a prefix of the text (a character split across tokens decodes
    to one replacement character, of the same length), so ``c_k`` grows with k and each
    span's first and last token are found by bisection, about 4 log2(R) prefix decodes
    per response instead of R. ``decode(ids) -> str`` is the tokenizer's decode.
    """
    keep = torch.ones(len(response_ids), dtype=torch.bool)
    for start, end in spans:
        first, stop = _first_token_from(response_ids, decode, start), _last_token_to(response_ids, decode, end)
        if first < stop:
            keep[first:stop] = False
    return keep


def _token_start(response_ids: list[int], decode: Callable[[list[int]], str], k: int) -> int:
    """``c_k``, the character position where token k begins in the decoded response."""
    return len(decode(response_ids[:k])) if k else 0


def _first_token_from(response_ids: list[int], decode: Callable[[list[int]], str], pos: int) -> int:
    """The smallest k with ``c_k >= pos`` (R when none), by bisection."""
    lo, hi = 0, len(response_ids)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if _token_start(response_ids, decode, mid) < pos else (lo, mid)
    return lo


def _last_token_to(response_ids: list[int], decode: Callable[[list[int]], str], pos: int) -> int:
    """The largest k with ``c_k <= pos``, by bisection."""
    lo, hi = 0, len(response_ids)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _token_start(response_ids, decode, mid) <= pos else (lo, mid - 1)
    return lo


def _decoder(tokenizer) -> Callable[[list[int]], str]:
    """The tokenizer's decode with nothing dropped or re-spaced, so prefixes stay prefixes."""
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def loss_masks(samples: list[Sample]) -> Tensor:
    """(B, R_max) bool: each sample's ``loss_mask`` (all its response tokens where None), right-padded
    with False like :func:`pad_responses`."""
    masks = [torch.ones(s.response_length, dtype=torch.bool) if s.loss_mask is None else s.loss_mask
             for s in samples]
    return pad_responses([m.float() for m in masks])[0].bool()


def collate(samples: list[Sample], pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """Right-padded ``ids`` and ``attention`` (B, L), and ``targets`` (B, L): True at the
    positions of response tokens (the tokens whose log-prob the policy is trained on)."""
    width = max(len(s.ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(samples), width), dtype=torch.long)
    targets = torch.zeros((len(samples), width), dtype=torch.bool)
    for row, s in enumerate(samples):
        ids[row, : len(s.ids)] = torch.tensor(s.ids)
        attention[row, : len(s.ids)] = 1
        targets[row, s.start: len(s.ids)] = True
    return ids, attention, targets


def pad_responses(values: list[Tensor]) -> tuple[Tensor, Tensor]:
    """Per-sample (R_i,) tensors -> (B, R_max) right-padded and its mask."""
    width = max((len(v) for v in values), default=0)
    out = torch.zeros(len(values), width)
    mask = torch.zeros(len(values), width, dtype=torch.bool)
    for row, v in enumerate(values):
        out[row, : len(v)] = v
        mask[row, : len(v)] = True
    return out, mask


def _unflatten(flat: Tensor, lengths: list[int]) -> tuple[Tensor, Tensor]:
    """(N,) values in row-major order of the response positions -> (B, R_max) and mask."""
    mask = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]
    out = flat.new_zeros(mask.shape)
    out[mask] = flat
    return out, mask


def hidden_before_targets(decoder, ids: Tensor, attention: Tensor, targets: Tensor) -> Tensor:
    """Hidden states (N, H) at the positions that predict the response tokens.

    Token t is predicted from position t - 1; only those N positions go on to the
    vocabulary projection or the value head (most of the sequence is prompt), and the
    system prompt the rows share runs once (:mod:`spa.models.shared_prefix`).
    """
    hidden, offset = hidden_states(decoder, ids, attention, targets)
    return hidden[:, :-1][targets[:, offset + 1:]]


def policy_forward(model, ids: Tensor, attention: Tensor, targets: Tensor, entropy: bool = True,
                   temperature: float = 1.0) -> tuple[Tensor, Tensor | None, Tensor]:
    """Log-probs of the response tokens (B, R), their entropies (B, R) or None, and the mask.

    Both are those of the sampling distribution ``softmax(logits / temperature)``, as the
    engine's recorded log-probs are: at T != 1 the raw logits would put the PPO ratio off
    1 before any update (T = 0.7: ratio 0.944, clipfrac 0.073). Top-p truncation is not
    reproduced (the RL stage samples with top_p = 1).
    """
    return _per_position(_response_logits(model, ids, attention, targets, temperature), ids, targets, entropy)


def forward_with_kl(model, reference, ids: Tensor, attention: Tensor, targets: Tensor,
                    temperature: float = 1.0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`policy_forward`'s log-probs, entropies and mask, and the exact KL from the
    policy to ``reference`` over the whole vocabulary at each response position (B, R)
    (:func:`spa.rl.core.exact_kl`). The reference runs without gradients."""
    logits = _response_logits(model, ids, attention, targets, temperature)
    with torch.no_grad():
        ref_logits = _response_logits(reference, ids, attention, targets, temperature)
    logprobs, entropy, mask = _per_position(logits, ids, targets, entropy=True)
    return logprobs, entropy, _unflatten(core.exact_kl(logits, ref_logits), targets.sum(1).tolist())[0], mask


def _response_logits(model, ids: Tensor, attention: Tensor, targets: Tensor, temperature: float) -> Tensor:
    """The sampling distribution's logits (N, V) at the N positions that predict response tokens.

    ``model`` may be the trained policy as :func:`spa.distributed.wrap` returned it: the
    pass then goes through the DDP wrapper, whose backward all-reduces the gradients."""
    return distributed.forward(model, _logits, ids, attention, targets, temperature)


def _logits(model, ids: Tensor, attention: Tensor, targets: Tensor, temperature: float) -> Tensor:
    hidden = hidden_before_targets(model.get_decoder(), ids, attention, targets)
    logits = model.get_output_embeddings()(hidden).float()
    return logits / temperature if temperature != 1.0 else logits


def _per_position(logits: Tensor, ids: Tensor, targets: Tensor, entropy: bool) -> tuple[Tensor, Tensor | None, Tensor]:
    """From the logits (N, V) that predict the response tokens: their log-probs (B, R), the
    entropies (B, R) or None, and the mask."""
    lengths = targets.sum(1).tolist()
    sampled = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:][targets[:, 1:]][:, None])[:, 0]
    logprobs, mask = _unflatten(sampled, lengths)
    ent = _unflatten(core.entropy_from_logits(logits), lengths)[0] if entropy else None
    return logprobs, ent, mask
