"""Per-turn Monte-Carlo advantages from copies of the environment: a credit for every move.

An outcome-only policy gradient gives every turn of an episode the episode's score. On
these tasks that labels a move right only about half the time (a group shares only its
first state, and a slip on the ice punishes a good move), so the update is mostly noise.
Here each turn gets its own advantage, from the task's reward alone (``reset``, ``step``,
``fork``, ``random_action``; no solver)::

    A_t = b_t + Q(s_t, a_t) - V(s_t)

with ``s_t`` the state before turn t, ``a_t`` the actions the turn played and ``b_t`` the
part of the turn's reward the environment does not give (the format penalty, shaping
bonuses). Two ways to estimate Q and V (``PPOConfig.mc_continuation``):

* ``random`` (the default; no model call): ``Q(s, a)`` is the mean return of
  ``mc_rollouts`` forks of the environment that play ``a`` and then uniformly random
  valid actions, ``V(s)`` the same with random actions from the start; the slips are
  drawn afresh on every fork, so a slip in the episode itself does not reach the
  advantage. Both are values of *random play* after the turn: one step of policy
  improvement over random play (Bertsekas' rollout algorithm), unbiased for a policy
  that plays near chance and biased (but action-independent in its baseline) otherwise.
* ``policy`` (VinePPO, Kazemnejad et al. 2024): ``V(s)`` is the mean return of
  ``mc_rollouts`` continuations played by the policy itself from ``s``, and
  ``A_t = r_t + V(s_{t+1}) - V(s_t)`` (``V = 0`` once the episode has ended). Unbiased
  for the current policy; it costs ``mc_rollouts`` model continuations per turn.

Random continuations get the actions the episode has left (:func:`action_budgets`); a
turn that played nothing (malformed) gets exactly its penalty. The policy's continuations
play the turns the episode has left, under its limits.

The trainer then centres the step's advantages on their mean (``mc_center``: a baseline
constant over the step) and divides them by their standard deviation, one scale for the
whole step (:func:`spa.rl.advantages.compute_advantages`): a malformed turn's -0.1 keeps
its size relative to a win (GRPO's per-group std blew it up to the size of a win), and the
step size no longer depends on the task's reward units (FrozenLake 1, Sokoban up to 10.9).
"""

from __future__ import annotations

import json
import zlib
from collections import Counter
from dataclasses import replace

import numpy as np

from spa.agent.labels import label_actions, label_turns, replay
from spa.agent.prompts import state_block
from spa.agent.rollout import RolloutConfig, Start, Trajectory, play_on
from spa.envs.lookahead import continuation_return
from spa.models.engine import SamplingParams
from spa.rl.config import VALUE_OBJECTIVES


def action_budgets(trajectory: Trajectory, config: RolloutConfig) -> list[tuple[int, int]]:
    """For each turn, the actions random play may still take before it and after it:
    ``(max_actions - used before the turn, max_actions - used after it)``, never below 0.

    The budget is the episode's actions, not its turns: random play takes one action at a
    time, and charging it for a turn the agent wasted would reward wasting turns wherever
    random play's value is negative (Sokoban's -0.1 a step): the saved actions would look
    like a gain.
    """
    prompt = config.prompt
    max_actions = config.max_actions or prompt.max_turns * prompt.max_actions_per_turn
    budgets, used = [], 0
    for turn in trajectory.turns:
        before = max_actions - used
        used += len(turn.actions)
        budgets.append((max(before, 0), max(max_actions - used, 0)))
    return budgets


def random_advantages(trajectories: list[Trajectory], config: RolloutConfig, rollouts: int,
                      seed: tuple[int, ...]) -> list[list[float]]:
    """``A_t = b_t + Q_rand(s_t, a_t) - V_rand(s_t)`` for every turn of every trajectory.

    Each turn's estimates draw from a generator seeded by ``seed``, the episode's group and
    sample and the turn index, so they depend neither on the order of the trajectories nor
    on the number of processes that hold them.
    """
    out = []
    for trajectory in trajectories:
        budgets = action_budgets(trajectory, config)
        advantages = []
        for t, env in replay(trajectory):
            turn, (before, after) = trajectory.turns[t], budgets[t]
            bonus = turn.reward - turn.env_reward
            if not turn.actions:  # nothing played: Q = V exactly, the turn gets its penalty alone
                advantages.append(bonus)
                continue
            rng = np.random.default_rng((*seed, trajectory.group, trajectory.sample, t))
            v = continuation_return(env, [], rollouts, before, rng)
            q = continuation_return(env, list(turn.actions), rollouts, after, rng)
            advantages.append(bonus + q - v)
        out.append(advantages)
    return out


def label_advantages(trajectories: list[Trajectory], rollouts: int, horizon: int, seed: tuple[int, ...],
                     objective: str = "linear", actions: str = "first") -> list[list[float | tuple[float, ...]]]:
    """Per-turn advantages from the value label: whether a turn's first action is among the
    best at its state by Monte-Carlo value under random continuation (the label the
    Monte-Carlo-value rounds keep, :func:`spa.agent.labels.label_turns`; a turn with no
    action is not best). Unlike ``Q - V`` of the played move, the label asks whether the
    move was the best of *all* the legal moves, each valued by ``rollouts`` continuations
    of ``horizon`` actions.

    ``objective="linear"``: the label itself, 1 or 0: the policy gradient of the expected
    label, ``sum_s pi(best | s)``. For a policy that does not yet tell the states apart its
    ascent leads to the one move that is best most often, whatever the state.

    ``objective="log"``: ``label / p_s - 1``, with ``p_s`` the fraction of the step's turns
    played from the same state (level, turn index and grid) whose move was best: the
    REINFORCE estimate, with a baseline, of the gradient of ``sum_s log pi(best | s)``, the
    objective of behaviour cloning on the label. Its optimum for a policy blind to the state
    plays each move as often as it is best (probability matching), not one move. A state
    played once, or where no turn's move or every turn's move was best, gives 0: there is no
    estimate of ``p_s``, or nothing to push toward.

    ``objective="state"``: ``label - b_s``, with ``b_s`` the share of the state's legal moves
    that are best (uniformly random play's label there): the linear objective's gradient
    with a baseline of the state alone, so the same gradient in expectation, but every move
    that was not best at its state is pushed down, also one that the step never saw best
    anywhere (which centring per move, ``center_actions``, leaves at 0). A turn with no
    action gives 0.

    ``actions="each"`` (linear and state objectives): a tuple per turn, one advantage per
    played action, each from that action's own label at the state it was played in
    (:func:`spa.agent.labels.label_actions`); the trainer gives each action's tokens its
    own (:attr:`spa.rl.batch.Sample.action_of`). With ``"first"`` the first action's label
    is the whole turn's, so a turn ``Left || Up || Up`` whose ``Left`` was best pushes its
    two ``Up`` up too, wherever they were played. A turn with no action gives ``(0.0,)``.
    """
    if actions == "each":
        if objective not in ("linear", "state"):
            raise ValueError(f"value_actions='each' goes with the linear and state objectives, not {objective!r}")
        per_action = label_actions(trajectories, rollouts, horizon, 0.0, zlib.crc32(repr(seed).encode()))
        baseline = objective == "state"
        return [[tuple(float(best) - (share if baseline else 0.0) for best, share in turn) or (0.0,)
                 for turn in episode] for episode in per_action]
    shares = label_turns(trajectories, rollouts, horizon, 0.0, zlib.crc32(repr(seed).encode()))
    labels = [[float(turn.value_first) for turn in trajectory.turns] for trajectory in trajectories]
    if objective == "linear":
        return labels
    if objective == "state":
        return [[label - share for label, share in zip(episode_labels, episode_shares)]
                for episode_labels, episode_shares in zip(labels, shares)]
    if objective != "log":
        raise ValueError(f"objective {objective!r} is not known; valid: {', '.join(VALUE_OBJECTIVES)}")
    # The state before turn t is the grid turn t - 1 left (label_turns checked it on replay);
    # every sample of a level starts from the same one.
    keys = [[(trajectory.env, json.dumps(trajectory.env_config, sort_keys=True), trajectory.seed, t,
              trajectory.turns[t - 1].grid_after if t else None) for t in range(len(trajectory.turns))]
            for trajectory in trajectories]
    visits, best = Counter(), Counter()
    for episode_keys, episode_labels in zip(keys, labels):
        visits.update(episode_keys)
        best.update(key for key, label in zip(episode_keys, episode_labels) if label)
    return [[label * visits[key] / best[key] - 1.0 if visits[key] > 1 and 0 < best[key] < visits[key] else 0.0
             for key, label in zip(episode_keys, episode_labels)]
            for episode_keys, episode_labels in zip(keys, labels)]


def vine_advantages(rewards: list[float], values: list[float]) -> list[float]:
    """VinePPO's per-turn advantages ``A_t = r_t + V(s_{t+1}) - V(s_t)`` of one episode.

    ``rewards[t]``: turn t's reward (format penalty and bonuses included); ``values[t]``:
    the Monte-Carlo value of the state before turn t. A rollout stops an episode only when
    it ended or ran out of turns or actions, so after its last turn ``V = 0``.
    """
    if len(values) != len(rewards):
        raise ValueError(f"{len(rewards)} turns need as many values, got {len(values)}")
    after = list(values[1:]) + [0.0]
    return [r + v_next - v for r, v_next, v in zip(rewards, after, values)]


def policy_advantages(engine, tokenizer, trajectories: list[Trajectory], config: RolloutConfig, rollouts: int,
                      sampling: SamplingParams) -> list[list[float]]:
    """VinePPO's advantages (:func:`vine_advantages`) for every turn of every trajectory,
    with ``V(s_t)`` the mean return of ``rollouts`` continuations the policy plays from the
    state before turn t, with the episode's history and limits (:func:`spa.agent.rollout.play_on`,
    all of them batched). Slips in the continuations draw from generators seeded by
    ``sampling.seed`` and the episode's group, sample and turn."""
    starts, owners = [], []
    for e, trajectory in enumerate(trajectories):
        history, used = [], 0
        for t, env in replay(trajectory):
            rng = np.random.default_rng((sampling.seed or 0, trajectory.group, trajectory.sample, t))
            starts += [Start(env.fork(rng), list(history), used) for _ in range(rollouts)]
            owners += [(e, t)] * rollouts
            turn = trajectory.turns[t]
            history.append((state_block(env, config.prompt.mode), turn.response, turn.reward))
            used += len(turn.actions_valid)
    config = replace(config, solver_labels=False)
    returns = play_on(engine, tokenizer, starts, config, sampling) if starts else []
    values = [[0.0] * len(t.turns) for t in trajectories]
    for (e, t), value in zip(owners, returns):
        values[e][t] += value / rollouts
    return [vine_advantages([turn.reward for turn in trajectory.turns], values[e])
            for e, trajectory in enumerate(trajectories)]

