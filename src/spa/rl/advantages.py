"""The step's advantages, from the sampled turns to what the policy loss reads.

Every estimator lives here, on top of the pure tensor math of :mod:`spa.rl.core`:

* ``gae`` / ``turn_gae`` (PPO, with a critic): the response tokens of an episode's turns,
  in order, form one chain (:func:`critic_advantages`), so with gamma = lambda = 1 and the
  episode reward on the last token of the last turn every token of the episode sees that
  reward (the paper's setting);
* ``grpo`` / ``grpo_no_std``: every token of an episode gets the episode's
  group-normalised score (:func:`grpo_advantages`);
* ``mc``: every token of a turn gets the turn's Monte-Carlo advantage
  (:mod:`spa.rl.montecarlo`), centred and scaled over the step.

Then what needs the whole step: episode balancing, whitening over every process's
policy-loss tokens, the action centring and the weight of negative advantages, in that
order. Each function here that says so must be called by every process, with or without
samples, because it reduces over all of them.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from spa import distributed
from spa.agent.rollout import Trajectory, Turn
from spa.models.device import on_device
from spa.rl import core
from spa.rl.batch import Sample, collate, loss_masks, pad_responses
from spa.rl.config import PER_TURN, REWARD_PLACEMENTS, PPOConfig
from spa.rl.critic import Critic



def compute_advantages(samples: list[Sample], kept: list[Trajectory], critic: Critic | None, config: PPOConfig,
                       pad_id: int, autocast, turn_values: list[list[float]] | None = None) -> dict:
    """Fill the samples' advantages (and, with a critic, old values and returns).

    Local to each process: GAE runs along one episode, GRPO normalises within one group,
    and both live whole on one process. With a critic, the advantages are then whitened
    over the step (``whiten_advantages``; the moments are global), and the explained
    variance over all processes' turns is returned. With ``advantage="mc"``,
    ``turn_values[e][t]`` is turn t of ``kept[e]``'s Monte-Carlo advantage
    (:mod:`spa.rl.montecarlo`), or a tuple of one per played action whose tokens
    (``Sample.action_of``) each get their own: every token of the turn gets it, less the step's mean over
    the training turns (of every process) with ``mc_center``, divided by the standard
    deviation about that centre (the root mean square without it). Every process must call it.
    """
    if config.advantage in PER_TURN:
        per_turn = [turn_values[s.episode][s.turn] for s in samples]
        raw = [a for value in per_turn for a in per_action(value)]
        count, total, squares = distributed.total(float(len(raw)), float(sum(raw)), float(sum(a * a for a in raw)))
        mean = total / max(count, 1.0) if config.mc_center else 0.0
        spread = max(squares / max(count, 1.0) - mean * mean, 0.0) ** 0.5
        scale = 1.0 / spread if spread > 0 else 0.0
        for s, value in zip(samples, per_turn):
            if isinstance(value, tuple):  # one per played action: each action's tokens get their own
                values = (torch.tensor(value) - mean) * scale
                s.advantages = values[s.action_of.clamp(max=len(value) - 1)]
            else:
                s.advantages = torch.full((s.response_length,), (value - mean) * scale)
        _finish(samples, kept, config)
        # This process's training turns: the raw mean is how much better than its state's
        # value the policy's moves did, in the task's reward units (no solver needed).
        return {"advantages/mc_rms": (squares / max(count, 1.0)) ** 0.5,
                "advantages/mc_mean": sum(raw) / max(len(raw), 1),
                "advantages/mc_positive": sum(a > 0 for a in raw) / max(len(raw), 1)}
    if critic is None:
        if samples:
            grpo_advantages(samples, kept, normalize_std=config.advantage == "grpo")
        if config.balance_episodes:
            _balance(samples)
        _finish(samples, kept, config)
        return {}
    critic.eval()
    step = config.micro_batch_size
    with autocast:
        values = critic.values(on_device(collate(samples[i: i + step], pad_id), critic)
                               for i in range(0, len(samples), step))
    for s, v in zip(samples, values):
        s.old_values = v.float().cpu()
    if samples:
        critic_advantages(samples, kept, config.advantage, config.reward, config.gamma, config.lam)
    if config.balance_episodes:
        _balance(samples)
    if config.whiten_advantages:
        whiten_advantages(samples)
    _finish(samples, kept, config)
    v, mask = pad_responses(distributed.gather([s.old_values for s in samples]))
    r, _ = pad_responses(distributed.gather([s.returns for s in samples]))
    return {"critic/explained_variance": core.explained_variance(v, r, mask)}


def per_action(value: float | tuple[float, ...]) -> tuple[float, ...]:
    """A turn's Monte-Carlo value as one value per played action (``value_actions=each``
    gives a tuple; one value stands for the whole turn)."""
    return value if isinstance(value, tuple) else (value,)


def _finish(samples: list[Sample], kept: list[Trajectory], config: PPOConfig) -> None:
    """The last touches to the advantages, after any balancing and whitening: the action
    centring, then the negative weight (last, so that 0 leaves no push down at all).
    Every process must call it."""
    if config.center_actions:
        center_actions(samples, kept)
    if config.negative_weight != 1.0:
        for s in samples:
            s.advantages = core.weigh_negatives(s.advantages, config.negative_weight)


def draw_turns(samples: list[Sample], draws: int, seed: int | tuple[int, ...]) -> list[Sample]:
    """``draws`` of this process's samples drawn by the size of their advantage
    (:func:`spa.rl.core.magnitude_draw`, with replacement; ``PPOConfig.train_turns``), in
    their order, with the advantages that keep the step's gradient unbiased; every sample
    when there are no more than ``draws``. Each sample's advantage must be one value on
    all its tokens (``advantage=mc``)."""
    if draws >= len(samples):
        return samples
    first = torch.stack([s.advantages[0] for s in samples])
    generator = torch.Generator().manual_seed(int(np.random.SeedSequence(seed).generate_state(1)[0]))
    chosen, advantages = core.magnitude_draw(first, draws, generator)
    drawn = []
    for i, a in zip(chosen.tolist(), advantages.tolist()):
        samples[i].advantages = torch.full_like(samples[i].advantages, a)
        drawn.append(samples[i])
    return drawn


def center_actions(samples: list[Sample], trajectories: list[Trajectory]) -> None:
    """Shift each sample's advantages by minus :func:`spa.rl.core.key_means` of its turn's
    first action, over the samples of every process, in place. ``trajectories`` are those
    the samples index (``Sample.episode``); a turn with no action keeps its advantages.
    Every process must call it."""
    keys = [_first_action(trajectories[s.episode].turns[s.turn]) for s in samples]
    local = [(k, _loss_sum(s), float(s.loss_tokens)) for s, k in zip(samples, keys) if k is not None]
    everyone = distributed.gather(local)
    if not everyone:
        return
    names = sorted({k for k, _, _ in everyone})
    index = {k: i for i, k in enumerate(names)}
    means = core.key_means(torch.tensor([v for _, v, _ in everyone]), torch.tensor([n for _, _, n in everyone]),
                           torch.tensor([index[k] for k, _, _ in everyone]), len(names))
    for s, k in zip(samples, keys):
        if k is not None:
            s.advantages = s.advantages - float(means[index[k]])


def _first_action(turn: Turn) -> str | None:
    return turn.actions[0] if turn.actions else None


def _loss_sum(sample: Sample) -> float:
    adv = sample.advantages if sample.loss_mask is None else sample.advantages[sample.loss_mask]
    return float(adv.sum())


def _balance(samples: list[Sample]) -> None:
    """:func:`balance_episodes` with the mean tokens per episode over every process's episodes
    (episodes live whole on one process). Every process must call it."""
    episodes, tokens = distributed.total(float(len({s.episode for s in samples})),
                                         float(sum(s.loss_tokens for s in samples)))
    if samples:
        balance_episodes(samples, tokens / max(episodes, 1))


def whiten_advantages(samples: list[Sample], eps: float = 1e-8) -> None:
    """Whiten the advantages of the step in place: (A - mean) / sqrt(var + eps), with the
    mean and the (population) variance over the policy-loss tokens of every process.

    One process gets ``core.masked_whiten`` over its padded (B, R) advantages and loss
    masks (to float rounding: the moments are summed in float64); several get what one
    process holding all the samples would (two reductions: the mean, then the squared
    deviations from it). The tokens outside the loss get the same affine map (never
    read). The returns (the critic's targets) are not touched. Every process must call
    it, with or without samples.
    """
    adv, _ = pad_responses([s.advantages for s in samples])
    mask = loss_masks(samples)
    count, total = distributed.total(float(mask.sum()), float(core.masked_sum(adv, mask)))
    mean = total / max(count, 1)
    (squares,) = distributed.total(float(core.masked_sum((adv.double() - mean) ** 2, mask)))
    var = squares / max(count, 1)
    for s in samples:
        s.advantages = core.whiten_with(s.advantages, torch.ones_like(s.advantages, dtype=torch.bool), mean, var,
                                        eps=eps)


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


def balance_episodes(samples: list[Sample], mean_tokens: float | None = None) -> None:
    """Scale the samples' advantages so that every episode weighs the same in a token-mean
    loss (:func:`spa.rl.core.episode_balance`), in place. An episode is the samples
    sharing ``episode``; ``mean_tokens`` is the mean policy-loss tokens per episode (by
    default over these samples' episodes)."""
    episodes = sorted({s.episode for s in samples})
    tokens = {e: 0 for e in episodes}
    for s in samples:
        tokens[s.episode] += s.loss_tokens
    scales = core.episode_balance(torch.tensor([tokens[e] for e in episodes]), mean_tokens)
    scale = dict(zip(episodes, scales.tolist()))
    for s in samples:
        s.advantages = s.advantages * scale[s.episode]


def grpo_advantages(samples: list[Sample], trajectories: list[Trajectory], normalize_std: bool) -> None:
    """Fill ``advantages`` with the episode's GRPO score, the same on all its tokens."""
    scores = torch.tensor([t.total_reward for t in trajectories], dtype=torch.float32)
    groups = torch.tensor([t.group for t in trajectories])
    per_episode = core.group_advantages(scores, groups, normalize_std)
    for s in samples:
        s.advantages = torch.full((s.response_length,), float(per_episode[s.episode]))
