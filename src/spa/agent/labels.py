"""Per-turn labels from Monte-Carlo look-ahead on copies of the environment (no solver).

:func:`label_turns` replays each episode and marks the turns whose first action has the
highest value under random continuation (:func:`spa.envs.lookahead.action_values`);
:func:`replay` gives an episode's states again, which the per-turn Monte-Carlo advantages
(:mod:`spa.rl.montecarlo`) also read.
"""

from __future__ import annotations

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
        level = (trajectory.env, json.dumps(trajectory.env_config, sort_keys=True), trajectory.seed)
        shares.append([0.0] * len(trajectory.turns))
        for index, env in replay(trajectory):
            turn = trajectory.turns[index]
            first = env.canonical_action(turn.actions[0]) if turn.actions else None
            if first is not None:
                state = env.render()
                if (level, state) not in best_at:
                    rng = np.random.default_rng((seed, trajectory.seed, zlib.crc32(state.encode())))
                    values = action_values(env, rollouts, horizon, rng)
                    best = best_by_value(values, tolerance)
                    best_at[level, state] = best, len(best) / len(values)
                best, share = best_at[level, state]
                turn.value_first = first in best
                shares[-1][index] = share
            else:
                turn.value_first = False
    return shares


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
