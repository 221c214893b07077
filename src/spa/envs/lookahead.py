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

``keep="value"`` (``spa.worldmodel.selfplay``, through :func:`spa.agent.labels.label_turns`)
keeps the turns whose first action is among those best actions, the reward-derived
counterpart of ``keep="best"``'s solver label. Where every action scores the same (no
continuation reached a reward) no action stands out and the turn is not labelled best.
The per-turn advantages of the policy-gradient learner (:mod:`spa.rl.montecarlo`) use
:func:`continuation_return` for ``Q(s, a_1..a_n)`` of a whole turn's actions.
"""

from __future__ import annotations

import numpy as np

from spa.envs.base import TextEnv

#: The value label's look-ahead by default: random continuations per action and state, and
#: the actions each plays, the first one included (``spa iterate --keep value``, the
#: learner's ``advantage=value``, ``spa eval --policy value``).
VALUE_ROLLOUTS, VALUE_HORIZON = 128, 5


def action_values(env: TextEnv, rollouts: int, horizon: int, rng: np.random.Generator) -> dict[str, float]:
    """``Q_rand(s, a)`` for every action of ``env.legal_actions()`` at ``env``'s state (unchanged).

    Each estimate is the mean return of ``rollouts`` forks that play ``a`` and then up to
    ``horizon - 1`` uniformly random valid actions, stopping where the episode ends.
    """
    actions = env.legal_actions()
    if actions is None:
        raise ValueError(f"{env.name} does not list its actions (legal_actions), so no action values")
    return {action: continuation_return(env, [action], rollouts, horizon - 1, rng) for action in actions}


def best_by_value(values: dict[str, float], tolerance: float = 0.0) -> frozenset[str]:
    """The actions within ``tolerance`` of the highest value; none when all lie within it
    (nothing stands out, e.g. no continuation reached a reward)."""
    top, bottom = max(values.values()), min(values.values())
    if top - bottom <= tolerance:
        return frozenset()
    return frozenset(action for action, value in values.items() if value >= top - tolerance)


def continuation_return(env: TextEnv, actions: list[str], rollouts: int, horizon: int,
                        rng: np.random.Generator) -> float:
    """The mean return of ``rollouts`` forks of ``env`` that play ``actions`` in order (as a
    turn does, stopping where the episode ends), then up to ``horizon`` uniformly random
    valid actions, stopping where the episode ends.

    With ``actions`` empty it is ``V_rand(s)``, random play's value at ``env``'s state; with
    one action and ``horizon - 1`` it is :func:`action_values`' ``Q_rand(s, a)``. ``env`` is
    left unchanged.
    """
    total = 0.0
    for _ in range(rollouts):
        twin = env.fork(rng)
        reward, ended = 0.0, False
        for action in actions:
            step_reward, ended = twin.simulate(action)
            reward += step_reward
            if ended:
                break
        for _ in range(horizon):
            if ended:
                break
            step_reward, ended = twin.simulate(twin.random_action(rng))
            reward += step_reward
        total += reward
    return total / rollouts
