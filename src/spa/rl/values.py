"""Monte-Carlo action values from the task's own reward: a per-turn label without a solver.

At a state ``s`` the value of an action ``a`` is estimated by playing it on copies of the
environment (:meth:`spa.envs.TextEnv.fork`) and continuing with uniformly random valid
actions::

    Q_rand(s, a) = E[ r_1 + r_2 + ... + r_H | a_1 = a, a_2..a_H ~ uniform ]

the mean of ``rollouts`` returns of at most ``horizon`` actions (the episode may end
sooner), slips drawn afresh on every copy. The actions whose estimate is highest are one
step of policy improvement over random play (a rollout policy, Bertsekas' "rollout
algorithm"); VinePPO (Kazemnejad et al., 2024) estimates values the same way, from the
policy's own continuations. Random continuations cost microseconds a move instead of a
language-model call, and with an agent that plays near chance they are close to its own.

``keep="value"`` (``spa.worldmodel.selfplay``) keeps the turns whose first action is among
those best actions, the reward-derived counterpart of ``keep="best"``'s solver label. Where
every action scores the same (no continuation reached a reward) no action stands out and
the turn is not labelled best.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable

import numpy as np

from spa.agent.rollout import Trajectory
from spa.envs import TextEnv, make


def action_values(env: TextEnv, rollouts: int, horizon: int, rng: np.random.Generator) -> dict[str, float]:
    """``Q_rand(s, a)`` for every action of ``env.legal_actions()`` at ``env``'s state (unchanged).

    Each estimate is the mean return of ``rollouts`` forks that play ``a`` and then up to
    ``horizon - 1`` uniformly random valid actions, stopping where the episode ends.
    """
    actions = env.legal_actions()
    if actions is None:
        raise ValueError(f"{env.name} does not list its actions (legal_actions), so no action values")
    values = {}
    for action in actions:
        total = 0.0
        for _ in range(rollouts):
            twin = env.fork(rng)
            reward, ended = twin.simulate(action)
            for _ in range(horizon - 1):
                if ended:
                    break
                step_reward, ended = twin.simulate(twin.random_action(rng))
                reward += step_reward
            total += reward
        values[action] = total / rollouts
    return values


def best_by_value(values: dict[str, float], tolerance: float = 0.0) -> frozenset[str]:
    """The actions within ``tolerance`` of the highest value; none when all lie within it
    (nothing stands out, e.g. no continuation reached a reward)."""
    top, bottom = max(values.values()), min(values.values())
    if top - bottom <= tolerance:
        return frozenset()
    return frozenset(action for action, value in values.items() if value >= top - tolerance)


def label_turns(trajectories: Iterable[Trajectory], rollouts: int, horizon: int, tolerance: float,
                seed: int) -> None:
    """Set ``turn.value_first`` on every turn: whether its first action is among the best by
    :func:`action_values` at the state it was played in (``False`` for a turn with no action).

    Each episode is replayed from its level seed with the actions it played, which
    reproduces its states exactly (an environment's randomness is drawn from its seeded
    generator, one draw per valid move); a replay that ends elsewhere than the recorded
    grid raises. A state's look-ahead draws from a generator seeded by ``seed``, the level
    and the state's text, and is computed once for all the turns played from that state
    (the samples of a level all start from the same one), so a label depends neither on
    the order of the episodes nor on which of them reached the state first.
    """
    best_at: dict[tuple, frozenset[str]] = {}
    for trajectory in trajectories:
        env = make(trajectory.env, **trajectory.env_config)
        env.reset(seed=trajectory.seed)
        level = (trajectory.env, json.dumps(trajectory.env_config, sort_keys=True), trajectory.seed)
        for index, turn in enumerate(trajectory.turns):
            first = env.canonical_action(turn.actions[0]) if turn.actions else None
            if first is not None:
                state = env.render()
                if (level, state) not in best_at:
                    rng = np.random.default_rng((seed, trajectory.seed, zlib.crc32(state.encode())))
                    best_at[level, state] = best_by_value(action_values(env, rollouts, horizon, rng), tolerance)
                turn.value_first = first in best_at[level, state]
            else:
                turn.value_first = False
            for action in turn.actions:
                env.step(action)
            if env.render() != turn.grid_after:
                raise RuntimeError(f"replaying {trajectory.env} level {trajectory.seed} (sample {trajectory.sample}) "
                                   f"did not reach turn {index}'s recorded state")
