"""Per-turn labels from Monte-Carlo look-ahead on copies of the environment (no solver).

:func:`label_turns` replays each episode and marks the turns whose first action has the
highest value under random continuation (:func:`spa.envs.lookahead.action_values`);
:func:`label_actions` does the same for every action a turn played, each at the state it
was played in (a turn of several actions passes through states its record does not keep);
:func:`replay` gives an episode's states again, which the per-turn Monte-Carlo advantages
(:mod:`spa.rl.montecarlo`) also read.
"""

from __future__ import annotations

import copy
import json
import zlib
from collections.abc import Iterable, Iterator

import numpy as np

from spa.agent.rollout import Trajectory
from spa.envs import TextEnv, make
from spa.envs.lookahead import action_values, best_by_value


def label_turns(trajectories: Iterable[Trajectory], rollouts: int, horizon: int, tolerance: float,
                seed: int) -> list[list[float]]:
    """Set ``turn.value_first`` on every turn: whether its first action is among the best by
    :func:`action_values` at the state it was played in (``False`` for a turn with no action).
    Returns, per trajectory and turn, the share of the state's legal actions that are among
    the best: the label uniformly random play would score there on average (0 for a turn
    with no action).

    Each episode is replayed from its level seed with the actions it played, which
    reproduces its states exactly (an environment's randomness is drawn from its seeded
    generator, one draw per valid move); a replay that ends elsewhere than the recorded
    grid raises. A state's look-ahead draws from a generator seeded by ``seed``, the level
    and the state's text, and is computed once for all the turns played from that state
    (the samples of a level all start from the same one), so a label depends neither on
    the order of the episodes nor on which of them reached the state first.
    """
    best_at: dict[tuple, tuple[frozenset[str], float]] = {}
    shares: list[list[float]] = []
    for trajectory in trajectories:
        shares.append([0.0] * len(trajectory.turns))
        for index, env in replay(trajectory):
            turn = trajectory.turns[index]
            first = env.canonical_action(turn.actions[0]) if turn.actions else None
            turn.value_first = False
            if first is not None:
                best, shares[-1][index] = _best_at(best_at, trajectory, env, rollouts, horizon, tolerance, seed)
                turn.value_first = first in best
    return shares


def label_actions(trajectories: Iterable[Trajectory], rollouts: int, horizon: int, tolerance: float,
                  seed: int) -> list[list[list[tuple[bool, float]]]]:
    """Per trajectory, turn and played action: ``(best, share)``, whether the action is among
    the best by :func:`action_values` at the state it was played in, and the share of that
    state's legal actions that are best; ``(False, 0.0)`` for an action the environment
    cannot read. A turn's first action gets what :func:`label_turns` gives it (the same
    look-ahead, seeded alike); a later one is labelled at the state the turn's earlier
    actions led to, replayed on a copy that holds the episode's own random generator, so it
    slides as the episode did.
    """
    best_at: dict[tuple, tuple[frozenset[str], float]] = {}
    labels: list[list[list[tuple[bool, float]]]] = []
    for trajectory in trajectories:
        labels.append([])
        for index, env in replay(trajectory):
            sim, turn_labels = copy.deepcopy(env), []
            for action in trajectory.turns[index].actions:
                name = sim.canonical_action(action)
                if name is None:
                    turn_labels.append((False, 0.0))
                else:
                    best, share = _best_at(best_at, trajectory, sim, rollouts, horizon, tolerance, seed)
                    turn_labels.append((name in best, share))
                sim.step(action)
            labels[-1].append(turn_labels)
    return labels


def _best_at(cache: dict, trajectory: Trajectory, env: TextEnv, rollouts: int, horizon: int, tolerance: float,
             seed: int) -> tuple[frozenset[str], float]:
    """The best actions at ``env``'s state and their share of its legal actions, computed
    once per level and state (the generator is seeded by ``seed``, the level and the
    state's text, so neither the order of the episodes nor the turn matters)."""
    level = (trajectory.env, json.dumps(trajectory.env_config, sort_keys=True), trajectory.seed)
    state = env.render()
    if (level, state) not in cache:
        rng = np.random.default_rng((seed, trajectory.seed, zlib.crc32(state.encode())))
        values = action_values(env, rollouts, horizon, rng)
        best = best_by_value(values, tolerance)
        cache[level, state] = best, len(best) / len(values)
    return cache[level, state]


def replay(trajectory: Trajectory) -> Iterator[tuple[int, TextEnv]]:
    """Yield ``(t, env)`` with ``env`` in the state before turn t, replaying the episode
    from its level seed with the actions it played (an environment's randomness comes from
    its seeded generator, so the states are exactly the episode's). Raises when a replay
    leaves the recorded grid. The caller must not change ``env``; fork it."""
    env = make(trajectory.env, **trajectory.env_config)
    env.reset(seed=trajectory.seed)
    for t, turn in enumerate(trajectory.turns):
        yield t, env
        for action in turn.actions:
            env.step(action)
        if env.render() != turn.grid_after:
            raise RuntimeError(f"replaying {trajectory.env} level {trajectory.seed} (sample {trajectory.sample}) "
                               f"did not reach turn {t}'s recorded state")
