import dataclasses
from pathlib import Path

import numpy as np
import pytest

from scripted import ScriptedEngine
from spa.envs import make
from spa.agent.labels import label_turns
from spa.envs.lookahead import action_values, best_by_value
from spa.worldmodel.selfplay import SelfPlayConfig, build_examples, collect

CONFIGS = Path(__file__).parents[2] / "configs"
CORNER = "SG/FF"  # the goal one move Right of the start, or two moves round by (1,0) and (1,1)


def corner(**options):
    env = make("frozenlake", desc=CORNER, **options)
    env.reset(seed=0)
    return env


def test_values_of_one_move_are_the_move_probabilities():
    """Horizon 1 on a slippery corner: Right reaches the goal as intended (0.8), Down and Up by
    a perpendicular slide (0.1 each), Left never (its slides go Up or Down)."""
    env = corner(is_slippery=True, success_rate=0.8)
    values = action_values(env, rollouts=4000, horizon=1, rng=np.random.default_rng(0))
    assert values == pytest.approx({"Left": 0.0, "Down": 0.1, "Right": 0.8, "Up": 0.1}, abs=0.025)
    assert env.player == (0, 0) and not env.is_success()  # the look-ahead played on copies


def test_values_count_the_random_continuation():
    """Horizon 2, no slips: Right wins at once (1); Left and Up stay put, then a random move
    wins one time in four (0.25); Down goes to (1,0), from which no single move wins (0)."""
    values = action_values(corner(is_slippery=False), rollouts=4000, horizon=2, rng=np.random.default_rng(1))
    assert values == pytest.approx({"Left": 0.25, "Down": 0.0, "Right": 1.0, "Up": 0.25}, abs=0.03)


def test_action_values_need_listed_actions():
    env = make("sudoku")
    env.reset(seed=0)
    with pytest.raises(ValueError, match="sudoku does not list its actions"):
        action_values(env, 2, 2, np.random.default_rng(0))


def test_best_by_value_keeps_ties_and_needs_a_difference():
    assert best_by_value({"a": 0.5, "b": 0.5, "c": 0.1}) == {"a", "b"}
    assert best_by_value({"a": 0.5, "b": 0.45, "c": 0.1}, tolerance=0.05) == {"a", "b"}
    assert best_by_value({"a": 0.2, "b": 0.2}) == frozenset()  # nothing stands out
    assert best_by_value({"a": 0.2, "b": 0.1}, tolerance=0.1) == frozenset()


def random_play(episodes=48, **overrides):
    """Random-exploration episodes on slippery 4x4 lakes, as base-prompt turns."""
    config = SelfPlayConfig(env="frozenlake", episodes=episodes, samples=4, max_turns=5, max_actions_per_turn=2,
                            exploration="random", mode="base", **overrides)
    return collect(None, None, config), config


def solver_labels(trajectory):
    """Per turn (value label, whether the first action begins a shortest path), replayed."""
    env = make(trajectory.env, **trajectory.env_config)
    env.reset(seed=trajectory.seed)
    labels = []
    for turn in trajectory.turns:
        best = env.best_actions()
        if best is not None:
            labels.append((turn.value_first, turn.actions[0] in best))
        for action in turn.actions:
            env.step(action)
    return labels


def test_labels_agree_with_the_solver_far_above_chance_and_ignore_episode_order():
    trajectories, _ = random_play()
    label_turns(trajectories, rollouts=64, horizon=5, tolerance=0.0, seed=0)
    assert all(isinstance(turn.value_first, bool) for t in trajectories for turn in t.turns)
    turns = [label for t in trajectories for label in solver_labels(t)]
    labelled = [best for value, best in turns if value]
    purity, chance = sum(labelled) / len(labelled), sum(best for _, best in turns) / len(turns)
    # Measured: all 34 labelled first moves begin a shortest path, against 46 of the 131 turns.
    assert len(labelled) >= 30 and purity >= 0.8 and chance <= 0.5
    again, _ = random_play()
    label_turns(list(reversed(again)), rollouts=64, horizon=5, tolerance=0.0, seed=0)
    assert [turn.value_first for t in again for turn in t.turns] == [turn.value_first for t in trajectories
                                                                    for turn in t.turns]
    label_turns(again, rollouts=64, horizon=5, tolerance=0.0, seed=1)
    assert [turn.value_first for t in again for turn in t.turns] != [turn.value_first for t in trajectories
                                                                    for turn in t.turns]


def test_a_replay_that_misses_the_recorded_state_is_an_error():
    trajectories, _ = random_play(episodes=4)
    moved = next(t for t in trajectories if t.turns[0].actions and t.turns[0].grid_after != t.turns[0].grid_before)
    moved.turns[0] = dataclasses.replace(moved.turns[0], grid_after=moved.turns[0].grid_before)
    with pytest.raises(RuntimeError, match=f"level {moved.seed} .*did not reach turn 0's recorded state"):
        label_turns([moved], rollouts=2, horizon=2, tolerance=0.0, seed=0)


def test_keep_value_trains_on_the_labelled_turns():
    trajectories, config = random_play(keep="value")
    examples, stats = build_examples(trajectories, config)
    labelled = [(t.seed, t.sample, i) for t in trajectories for i, turn in enumerate(t.turns) if turn.value_first]
    assert [(e["seed"], e["sample"], e["turn"]) for e in examples] == labelled
    assert stats["kept"] == len(labelled)


def test_keep_value_from_the_model_s_own_turns(tiny):
    """On SFG/FHF/FFF without slips Right leads to the goal in two moves; Down leads away
    from it and Left and Up stay put, so only the Right turn is kept."""
    _, tokenizer = tiny
    config = SelfPlayConfig(env="frozenlake", env_config={"desc": "SFG/FHF/FFF", "is_slippery": False},
                            episodes=2, samples=2, max_turns=1, max_actions_per_turn=1, mode="base", keep="value")
    script = [["<think>go</think><answer>Right</answer>", "<think>go</think><answer>Down</answer>"]]
    examples, stats = build_examples(collect(ScriptedEngine(tokenizer, script), tokenizer, config), config)
    assert [e["sample"] for e in examples] == [0] and stats["dropped_by_filter"] == 1


def test_keep_value_settings_are_checked():
    with pytest.raises(ValueError, match="keep='value' needs an environment that lists its actions.*sudoku does "
                                         "not. Valid: frozenlake, sokoban"):
        SelfPlayConfig(env="sudoku", mode="base", keep="value")
    with pytest.raises(ValueError, match="value_rollouts=0 must be a positive integer"):
        SelfPlayConfig(env="frozenlake", keep="value", value_rollouts=0)
    with pytest.raises(ValueError, match="value_horizon=1.5 must be a positive integer"):
        SelfPlayConfig(env="frozenlake", keep="value", value_horizon=1.5)
    with pytest.raises(ValueError, match="value_tolerance=-0.1 must be a non-negative number"):
        SelfPlayConfig(env="frozenlake", keep="value", value_tolerance=-0.1)


def test_iterate_and_recipes_pass_the_value_settings_to_the_rounds():
    from spa.agent.prompts import PromptConfig
    from spa.agent.rollout import RolloutConfig
    from spa.pipeline.recipe import load_recipe
    from spa.rl.expert_iteration import IterateConfig, selfplay_config

    recipe = load_recipe(CONFIGS / "frozenlake-vanilla-iterate.yaml",
                         ["iterate.keep=value", "iterate.value_rollouts=16", "iterate.value_horizon=7"])
    config = recipe.iterate.config(seed=3)
    assert (config.keep, config.value_rollouts, config.value_horizon) == ("value", 16, 7)
    play = selfplay_config(config, RolloutConfig("frozenlake", {}, PromptConfig("base")), 2)
    assert (play.keep, play.value_rollouts, play.value_horizon, play.value_tolerance) == ("value", 16, 7, 0.0)
    assert IterateConfig(keep="value").value_rollouts == SelfPlayConfig.value_rollouts
    with pytest.raises(ValueError, match="keep='value' needs an environment that lists its actions.*sudoku"):
        load_recipe(CONFIGS / "sudoku-vanilla-iterate.yaml", ["iterate.keep=value"])
    with pytest.raises(ValueError, match="value_horizon=0 must be a positive integer"):
        load_recipe(CONFIGS / "frozenlake-vanilla-iterate.yaml", ["iterate.keep=value", "iterate.value_horizon=0"])
