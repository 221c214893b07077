"""From rollouts to training tensors: one sequence per assistant turn, advantages per episode.

Each assistant turn is trained as its own sequence, ``prompt + response``, exactly the
context the model sampled from (with ``history_turns=0`` the prompt of turn k does not
contain turn k-1). Only the response tokens are policy tokens: the prompt and the
environment's text never get loss.

Advantages are computed per *episode*: the response tokens of its turns, in order, form
one chain, so with gamma = lambda = 1 and the episode reward on the last token of the last
turn, every token of the episode sees that reward (the paper's setting). GRPO instead gives
every token of an episode the episode's group-normalised score.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from spa.agent.rollout import Trajectory
from spa.models.shared_prefix import hidden_states
from spa.rl import core

REWARD_PLACEMENTS = ("episode", "turn")


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

    @property
    def response_length(self) -> int:
        return len(self.ids) - self.start


def turn_samples(trajectories: list[Trajectory]) -> list[Sample]:
    """One Sample per assistant turn that produced at least one token."""
    samples = []
    for e, trajectory in enumerate(trajectories):
        for k, turn in enumerate(trajectory.turns):
            if turn.response_ids:
                samples.append(Sample(list(turn.prompt_ids) + list(turn.response_ids), len(turn.prompt_ids),
                                      torch.tensor(turn.logprobs, dtype=torch.float32), e, k))
    return samples


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


def policy_forward(model, ids: Tensor, attention: Tensor, targets: Tensor, entropy: bool = True
                   ) -> tuple[Tensor, Tensor | None, Tensor]:
    """Log-probs of the response tokens (B, R), their entropies (B, R) or None, and the mask."""
    hidden = hidden_before_targets(model.get_decoder(), ids, attention, targets)
    logits = model.get_output_embeddings()(hidden).float()
    logprobs = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:][targets[:, 1:]][:, None])[:, 0]
    lengths = targets.sum(1).tolist()
    logprobs, mask = _unflatten(logprobs, lengths)
    ent = _unflatten(core.entropy_from_logits(logits), lengths)[0] if entropy else None
    return logprobs, ent, mask


def place_rewards(trajectory: Trajectory, lengths: list[int], placement: str) -> Tensor:
    """Token rewards of one episode's response chain (sum of the turns' lengths).

    ``episode``: the episode's total reward (format penalties included) on its last
    token, the paper's setting. ``turn``: each turn's reward on that turn's last token.
    """
    if placement not in REWARD_PLACEMENTS:
        raise ValueError(f"reward placement {placement!r} is not known; valid: {', '.join(REWARD_PLACEMENTS)}")
    rewards = torch.zeros(sum(lengths))
    ends = torch.tensor(lengths).cumsum(0) - 1
    if placement == "episode":
        rewards[ends[-1]] = trajectory.total_reward
    else:
        rewards[ends] = torch.tensor([trajectory.turns[k].reward for k in range(len(lengths))])
    return rewards


def critic_advantages(samples: list[Sample], trajectories: list[Trajectory], estimator: str,
                      placement: str, gamma: float, lam: float) -> None:
    """Fill ``advantages`` and ``returns`` of every sample from its ``old_values`` (PPO).

    The turns of an episode are chained in order (see the module docstring) and the
    estimator (``gae`` or ``turn_gae``) runs over all episodes at once as (E, T) rows.
    """
    by_episode: dict[int, list[Sample]] = {}
    for s in samples:
        by_episode.setdefault(s.episode, []).append(s)
    episodes = list(by_episode.values())
    rows = [torch.cat([s.old_values for s in ep]) for ep in episodes]
    values, mask = pad_responses(rows)
    rewards, _ = pad_responses([place_rewards(trajectories[ep[0].episode], [s.response_length for s in ep],
                                              placement) for ep in episodes])
    turn_ids, _ = pad_responses([torch.cat([torch.full((s.response_length,), float(s.turn)) for s in ep])
                                 for ep in episodes])
    if estimator == "gae":
        adv, ret = core.gae(rewards, values, mask, gamma, lam)
    elif estimator == "turn_gae":
        adv, ret = core.turn_gae(rewards, values, mask, turn_ids.long(), gamma, lam)
    else:
        raise ValueError(f"critic advantage estimator {estimator!r} is not known; valid: gae, turn_gae")
    for row, ep in enumerate(episodes):
        offset = 0
        for s in ep:
            s.advantages = adv[row, offset: offset + s.response_length].clone()
            s.returns = ret[row, offset: offset + s.response_length].clone()
            offset += s.response_length


def group_advantages(samples: list[Sample], trajectories: list[Trajectory], normalize_std: bool) -> None:
    """Fill ``advantages`` with the episode's GRPO score, the same on all its tokens."""
    scores = torch.tensor([t.total_reward for t in trajectories], dtype=torch.float32)
    groups = torch.tensor([t.group for t in trajectories])
    per_episode = core.group_advantages(scores, groups, normalize_std)
    for s in samples:
        s.advantages = torch.full((s.response_length,), float(per_episode[s.episode]))
