"""Baseline policies for ``spa eval``: uniformly random valid actions, a solver, and the
greedy policy on Monte-Carlo values.

All three play the same evaluation seeds under the same turn and action limits as a model
and go through the same accounting: each turn the policy writes a response
``<think>..</think><answer>A1 || A2 || A3</answer>`` that ``spa.agent.rollout``'s
turn function parses and applies, so ``summarize`` scores them exactly as it scores a
model. No model is loaded.

* ``random``: each action is ``env.random_action(rng)``, the environment's own notion of
  a valid action (Sokoban and FrozenLake: any of the four moves; Sudoku: any value in
  any non-clue cell). ``rng`` is seeded from ``(sampling seed, level seed, sample)``.
* ``oracle``: Sokoban, the first move of a BFS-shortest solution over (player, boxes)
  (``spa.envs.sokoban.solve``); FrozenLake, the first move of a shortest path to the goal
  around the holes (``FrozenLakeEnv.best_actions``, ties in the order Left, Down, Right,
  Up); Sudoku, the solution's value for the first wrong cell. It acts on the state after each
  action, so on slippery ice it replans after every slide. It is deterministic: the
  samples of a level (which share the level's slip draws) play identically.
* ``value``: the action with the highest Monte-Carlo value under random continuation
  (``spa.envs.lookahead.action_values``: ``VALUE_ROLLOUTS`` forks per action, each played
  on for ``VALUE_HORIZON`` actions in all; ties broken at random). One step of policy
  improvement over random play from the task's reward alone, no solver: the value label
  of the learner (``ppo.advantage=value``, ``spa iterate --keep value``) marks this
  policy's moves, so it is what a policy that learnt that label perfectly would play.

A turn's actions are chosen one at a time on a copy of the environment, which holds
the same random generator and so sees the same slides the real one will; the real
environment then replays the turn, and a check confirms both ended in the same state.
The policy thus sees each action's outcome before choosing the next, more than a model
gets within a turn: the oracle is a reference, not a bound (a shortest path is not the
safest one on slippery ice).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np

from spa.agent.parsing import ACTION_SEPARATOR
from spa.agent.prompts import build_messages, state_block
from spa.agent.rollout import RolloutConfig, play_turn
from spa.agent.trajectory import Trajectory
from spa.agent.seeds import eval_seeds
from spa.envs import TextEnv, make
from spa.envs.frozen_lake import ACTIONS as LAKE_ACTIONS
from spa.envs.frozen_lake import FrozenLakeEnv
from spa.envs.lookahead import VALUE_HORIZON, VALUE_ROLLOUTS, action_values
from spa.envs.sokoban import Sokoban
from spa.envs.sokoban import solve as solve_sokoban
from spa.envs.sudoku import SudokuEnv
from spa.eval.evaluate import EvalConfig, write_outputs
from spa.eval.metrics import summarize
from spa.models.engine import Generation

#: Who can play in ``spa eval``: the language model, or one of the baselines here.
POLICIES = ("model", "random", "oracle", "value")
BASELINES = POLICIES[1:]

Policy = Callable[[TextEnv], str]  # the next action in the env's current state


def check_policy(name: str) -> str:
    """Return ``name`` or raise an error naming it and listing the valid policies."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; valid policies: {', '.join(POLICIES)}")
    return name


# -- solvers (Sokoban's and FrozenLake's live with their environments) ----------------


def sudoku_move(env: SudokuEnv) -> str | None:
    """The solution's value for the first cell (row by row) that differs from it, as ``r,c,v``."""
    for r, (row, solved) in enumerate(zip(env.board, env.solution)):
        for c, (value, want) in enumerate(zip(row, solved)):
            if value != want:
                return f"{r + 1},{c + 1},{want}"
    return None


# -- policies -----------------------------------------------------------------------


def random_policy(rng: np.random.Generator) -> Policy:
    """Uniformly random valid actions, drawn from ``rng``."""
    return lambda env: env.random_action(rng)


def oracle_policy(rng: np.random.Generator) -> Policy:
    """The solver's move in the current state; ``rng`` only serves states with no solution
    (none is reachable on a solvable level, but a BFS cut off on a huge room gives none)."""
    sokoban_plan: dict = {}  # (player, boxes) -> move, for the states along the last plan

    def act(env: TextEnv) -> str:
        move = None
        if isinstance(env, Sokoban):
            key = (env.player, env.boxes)
            if key not in sokoban_plan:
                solution = solve_sokoban(env)
                sokoban_plan.update(_sokoban_states(env, solution.plan if solution else []))
                sokoban_plan.setdefault(key, None)  # no solution: do not search again
            move = sokoban_plan.get(key)
        elif isinstance(env, FrozenLakeEnv):
            best = env.best_actions() or frozenset()  # moves one step closer, around the holes
            move = next((name for name in LAKE_ACTIONS if name in best), None)
        elif isinstance(env, SudokuEnv):
            move = sudoku_move(env)
        else:
            raise ValueError(f"the oracle has no solver for environment {env.name!r}")
        return move if move is not None else env.random_action(rng)

    return act


def value_policy(rng: np.random.Generator, rollouts: int = VALUE_ROLLOUTS,
                 horizon: int = VALUE_HORIZON) -> Policy:
    """Greedy on ``Q_rand``: each action is one of those whose ``rollouts`` random
    continuations of ``horizon`` actions return the most, drawn from ``rng``."""

    def act(env: TextEnv) -> str:
        values = action_values(env, rollouts, horizon, rng)
        top = max(values.values())
        return str(rng.choice([action for action, value in values.items() if value >= top]))

    return act


def _sokoban_states(env: Sokoban, plan: list[str]) -> dict:
    """``(player, boxes) -> move`` along ``plan`` from ``env``'s state (on a copy)."""
    sim, states = copy.deepcopy(env), {}
    for move in plan:
        states[(sim.player, sim.boxes)] = move
        sim.step(move)
    return states


def make_policy(name: str, rng: np.random.Generator) -> Policy:
    """A fresh per-episode baseline policy (``random``, ``oracle`` or ``value``)."""
    if check_policy(name) == "model":
        raise ValueError("the model policy is played by spa.eval.evaluate, not by a baseline")
    return {"random": random_policy, "oracle": oracle_policy, "value": value_policy}[name](rng)


# -- episodes -----------------------------------------------------------------------


def plan_turn(env: TextEnv, policy: Policy, count: int) -> tuple[list[str], TextEnv]:
    """Up to ``count`` actions chosen one by one on a copy of ``env``; the copy after them."""
    sim, actions = copy.deepcopy(env), []
    for _ in range(count):
        action = policy(sim)
        actions.append(action)
        _, _, terminated, truncated, _ = sim.step(action)
        if terminated or truncated:
            break
    return actions, sim


def play(policy: str, seeds: list[int], samples: int, config: RolloutConfig,
         seed: int = 0) -> list[Trajectory]:
    """Play ``samples`` episodes of every seed with a baseline; grouped as ``rollout`` groups them.

    The turn and action limits, the format penalty and the recorded fields are the model
    rollout's (its turn function applies each response). Token fields are empty: nothing
    is generated.
    """
    check_policy(policy)
    cfg = config.prompt
    max_actions = config.max_actions or cfg.max_turns * cfg.max_actions_per_turn
    trajectories = []
    for group, level in enumerate(seeds):
        for sample in range(samples):
            env = make(config.env, **config.env_config)
            env.reset(seed=level)
            act = make_policy(policy, np.random.default_rng([seed, level, sample]))
            trajectory = Trajectory(config.env, dict(config.env_config), level, group, sample, cfg.mode)
            history: list[tuple[str, str, float]] = []
            for _ in range(cfg.max_turns):
                budget = max_actions - trajectory.num_actions
                messages, shown = build_messages(env, cfg, history), state_block(env, cfg.mode)
                actions, sim = plan_turn(env, act, min(cfg.max_actions_per_turn, budget))
                text = _response(policy, actions, shown, state_block(sim, cfg.mode), cfg.world_model)
                turn, done = play_turn(env, messages, [], Generation([], text, [], "stop"), cfg,
                                        budget, config.format_penalty)
                if env.state_text() != sim.state_text():
                    raise RuntimeError(f"{config.env} seed {level}: replaying the planned turn "
                                       "gave another state; the environment is not reproducible")
                trajectory.turns.append(turn)
                history.append((shown, turn.response, turn.reward))
                trajectory.success, trajectory.terminated = env.is_success(), done
                if done or trajectory.num_actions >= max_actions:
                    break
            trajectories.append(trajectory)
    return trajectories


def _response(policy: str, actions: list[str], before: str, after: str, world_model: bool) -> str:
    """A well-formed answer; in world-model mode with the true states (known from the copy)."""
    think = f"{policy} policy"
    if world_model:
        think = f"<observation>{before}</observation> {think} <prediction>{after}</prediction>"
    return f"<think>{think}</think><answer>{f' {ACTION_SEPARATOR} '.join(actions)}</answer>"


def evaluate_policy(policy: str, config: EvalConfig, out_dir: str | Path | None = None) -> dict:
    """``spa.eval.evaluate.evaluate`` for a baseline: same seeds, metrics and output files.

    Sampling options (temperature, top-p, new-token cap) do not apply. World-model
    accuracy is left out: a baseline's observation and prediction are the true states.
    """
    rollout_config = RolloutConfig(config.env, config.env_config, config.prompt,
                                   format_penalty=config.format_penalty)
    start = time.perf_counter()
    trajectories = play(policy, eval_seeds(config.num_envs), config.samples, rollout_config, config.seed)
    seconds = time.perf_counter() - start
    metrics = summarize(trajectories, intervals=True)
    metrics.pop("world_model", None)
    metrics.update(model=f"{policy} policy", policy=policy, config=asdict(config),
                   wall_seconds=round(seconds, 1), generated_tokens=0, tokens_per_second=0.0)
    write_outputs(out_dir, trajectories, metrics)
    return metrics
