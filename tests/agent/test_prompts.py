"""The prompts show one concrete, correct answer per mode, never placeholders."""

import dataclasses

import pytest

from spa.agent.parsing import parse_response
from spa.agent.prompts import EXAMPLE_SEED, MODES, PromptConfig, build_messages, format_example, system_prompt
from spa.envs import make

ENVS = [("sokoban", {}), ("frozenlake", {}), ("sudoku", {}), ("frozenlake", {"desc": "SFG/FHF/FFF"}),
        ("sokoban", {"dim": 8, "num_boxes": 2})]


def replay(name, options, actions):
    """The example level's states before and after ``actions``, on non-slippery ice."""
    env = make(name, **options)
    if "is_slippery" in {f.name for f in dataclasses.fields(env.config)}:
        env = make(name, **{**options, "is_slippery": False})
    env.reset(seed=EXAMPLE_SEED)
    before, valid = env.state_text(), []
    for action in actions:
        valid.append(env.step(action)[4]["action_valid"])
    return before, valid, env.state_text()


@pytest.mark.parametrize("name, options", ENVS)
@pytest.mark.parametrize("mode", MODES)
def test_the_format_is_shown_by_a_correct_example(name, options, mode):
    env = make(name, **options)
    prompt = system_prompt(env, PromptConfig(mode))
    example = format_example(env, mode)
    assert prompt.endswith("\n" + example)
    assert "your" not in example  # no placeholder ("your actions") for the model to copy
    parsed = parse_response(example, world_model=mode == "world_model")
    assert parsed.format_ok and len(parsed.actions) == 2
    before, valid, after = replay(name, options, parsed.actions)
    assert all(valid)
    if mode == "world_model":
        # the states the ground-truth SFT data writes: grid then coordinates, before and after
        assert (parsed.observation, parsed.prediction) == (before, after)
        assert after != before  # not a turn a copied observation would predict
        assert "<observation>" in prompt and "<prediction>" in prompt
    else:
        assert "<observation>" not in example and before not in prompt


def test_sudoku_example_writes_correct_digits():
    env = make("sudoku")
    actions = parse_response(format_example(env, "base")).actions
    env.reset(seed=EXAMPLE_SEED)
    for action in actions:
        r, c, v = (int(x) for x in action.split(","))
        assert env.solution[r - 1][c - 1] == v


def test_the_example_respects_the_action_cap_and_is_shared_by_every_level():
    env = make("frozenlake")
    one = system_prompt(env, PromptConfig("state", max_actions_per_turn=1))
    assert "<answer>" in one and "||" not in one.rsplit("<answer>", 1)[1]
    prompts = set()
    for seed in (0, 1, 2):
        env = make("frozenlake")
        env.reset(seed=seed)
        prompts.add(build_messages(env, PromptConfig("world_model"))[0]["content"])
    assert len(prompts) == 1  # one system message per run: prefilled once
