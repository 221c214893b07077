"""Rollout bookkeeping with a scripted engine (exact control over every response)."""

import json

import pytest

from spa.agent.prompts import PromptConfig
from spa.agent.rollout import RolloutConfig, rollout
from spa.agent.trajectory import Trajectory, Turn
from spa.agent.seeds import EVAL_SEED_OFFSET, eval_seeds, train_seeds
from spa.envs import make
from spa.eval.metrics import summarize
from spa.models.engine import SamplingParams
from scripted import ScriptedEngine, wm


FL = {"desc": "SFFF/FHFH/FFFH/HFFG", "is_slippery": False}


def test_turns_rewards_and_states_are_recorded(tiny):
    _, tokenizer = tiny
    # Two samples of one seed: one walks to the goal over three turns, one only babbles.
    script = [
        [wm("Down || Down"), "no format at all"],
        [wm("Right || Right"), "<think>x</think><answer>jump</answer>"],
        [wm("Down || Right"), wm("Up")],
    ]
    engine = ScriptedEngine(tokenizer, script)
    config = RolloutConfig("frozenlake", FL, PromptConfig(max_turns=3, max_actions_per_turn=2))
    good, bad = rollout(engine, tokenizer, [5], 2, config, SamplingParams())
    assert engine.calls == 3
    assert good.success and good.terminated and len(good.turns) == 3
    assert [t.reward for t in good.turns] == [0.0, 0.0, 1.0]
    assert good.turns[2].state_after.splitlines()[3] == "O__√"
    assert good.turns[0].state_before.startswith("P___") and good.turns[0].grid_before.startswith("P___")
    assert good.turns[0].grid_after.splitlines()[2] == "P__O"
    # Format penalty for turns without a valid action; the third turn's "Up" is valid.
    assert [t.reward for t in bad.turns] == [-0.1, -0.1, 0.0]
    assert [t.format_ok for t in bad.turns] == [False, False, True]  # world_model needs states
    assert bad.turns[1].actions_valid == [False]
    assert not bad.success and not bad.terminated and len(bad.turns) == 3  # max_turns
    # Token bookkeeping: ids are the templated prompt, log-probs one per response token.
    turn = good.turns[0]
    assert tokenizer.decode(turn.prompt_ids).endswith("<|im_start|>assistant\n")
    assert len(turn.logprobs) == len(turn.response_ids) > 0
    assert (good.group, good.sample, bad.sample) == (0, 0, 1)


def test_episode_stops_at_max_turns_and_action_budget(tiny):
    _, tokenizer = tiny
    engine = ScriptedEngine(tokenizer, [[wm("Right || Left || Right")]] * 3)
    config = RolloutConfig("frozenlake", FL, PromptConfig(max_turns=3, max_actions_per_turn=3),
                           max_actions=4)
    (trajectory,) = rollout(engine, tokenizer, [1], 1, config, SamplingParams())
    assert [len(t.actions_valid) for t in trajectory.turns] == [3, 1]
    assert trajectory.num_actions == 4 and not trajectory.terminated


def test_summary_counts_pass_at_k_per_group(tiny):
    _, tokenizer = tiny
    script = [[wm(actions), "x", "x", "x"] for actions in ("Down || Down", "Right || Right", "Down || Right")]
    engine = ScriptedEngine(tokenizer, script)
    config = RolloutConfig("frozenlake", FL, PromptConfig(max_turns=3, max_actions_per_turn=2))
    trajectories = rollout(engine, tokenizer, [0, 1], 2, config, SamplingParams())
    metrics = summarize(trajectories, ks=(1, 2))
    assert metrics["groups"] == 2 and metrics["samples_per_group"] == 2
    assert metrics["success_rate"] == 0.25
    assert metrics["pass_at_k"] == {"pass@1": 0.25, "pass@2": 0.5}
    assert "world_model" in metrics


def test_history_turns_keeps_earlier_turns_in_the_prompt(tiny):
    _, tokenizer = tiny
    engine = ScriptedEngine(tokenizer, [[wm("Right")], [wm("Right")]])
    config = RolloutConfig("frozenlake", FL, PromptConfig(max_turns=2, history_turns=None))
    (trajectory,) = rollout(engine, tokenizer, [0], 1, config, SamplingParams())
    messages = trajectory.turns[1].prompt_messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[2]["content"] == wm("Right")
    assert "Reward from your last turn: 0" in messages[3]["content"]


def test_seed_ranges_are_disjoint():
    assert max(train_seeds(1000)) < min(eval_seeds(128)) == EVAL_SEED_OFFSET
    with pytest.raises(ValueError, match="training seeds"):
        train_seeds(10, start=EVAL_SEED_OFFSET - 5)


def test_recorded_logprobs_match_a_forward_pass_over_the_recorded_tokens(tiny):
    """End to end with the real engine: ids and log-probs of every turn line up."""
    import torch

    from spa.models.engine import Engine

    model, tokenizer = tiny
    config = RolloutConfig("sokoban", {}, PromptConfig(mode="base", max_turns=2))
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0, seed=0)
    trajectories = rollout(Engine(model, tokenizer), tokenizer, [0, 1], 2, config, sampling)
    turns = [turn for t in trajectories for turn in t.turns]
    assert len(turns) >= 4
    for turn in turns:
        assert turn.prompt_ids == tokenizer.apply_chat_template(
            turn.prompt_messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        assert len(turn.logprobs) == len(turn.response_ids) > 0
        ids = torch.tensor([turn.prompt_ids + turn.response_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(turn.prompt_ids) - 1:-1].float()
        expected = torch.log_softmax(logits, -1).gather(-1, ids[0, len(turn.prompt_ids):, None])[:, 0]
        torch.testing.assert_close(torch.tensor(turn.logprobs), expected, atol=2e-3, rtol=1e-3)


# -- best first action: does the turn's first action begin a shortest solution? ----------
# On FL (not slippery) the start (0,0) is 6 moves from the goal; Down and Right both go to
# tiles 5 away, Left and Up bump into the edge. After Down, Down the player is at (2,0),
# 4 away, where only Right gets closer.


def test_best_first_marks_the_first_action_against_the_state_the_turn_saw(tiny):
    _, tokenizer = tiny
    script = [[wm("down. || Down"), wm("Up || Right")], [wm("Up || Right"), "no answer at all"]]
    config = RolloutConfig("frozenlake", FL, PromptConfig(max_turns=2, max_actions_per_turn=2))
    first, second = rollout(ScriptedEngine(tokenizer, script), tokenizer, [0], 2, config, SamplingParams())
    assert first.turns[0].actions == ["down.", "Down"]  # the agent's spelling is kept ...
    assert [t.best_first for t in first.turns] == [True, False]  # ... and read canonically
    assert [t.best_first for t in second.turns] == [False, False]  # an edge bump; no action at all
    assert summarize([first, second])["best_first_rate"] == 0.25
    # Down, Down: each one step closer from where it was taken; from (2,0) Up is not.
    assert [t.best_run for t in first.turns] == [2, 0] and [t.best_run for t in second.turns] == [0, 0]


def test_best_run_counts_the_leading_best_actions_each_from_its_own_state(tiny):
    _, tokenizer = tiny
    script = [[wm("Right || Up || Right"), wm("Right || Right || Down")]]  # Up bumps the edge at (0,1)
    config = RolloutConfig("frozenlake", FL, PromptConfig(max_turns=1, max_actions_per_turn=3))
    bump, straight = rollout(ScriptedEngine(tokenizer, script), tokenizer, [0], 2, config, SamplingParams())
    assert (bump.turns[0].best_run, straight.turns[0].best_run) == (1, 3)  # (0,2) then Down to (1,2)


def test_best_first_reads_sudoku_cells_however_they_are_spaced(tiny):
    _, tokenizer = tiny
    level = make("sudoku")
    level.reset(seed=3)
    (r, c), *_ = level.empty_cells()
    right, wrong = level.solution[r][c], level.solution[r][c] % 4 + 1
    script = [[wm(f"( {r + 1} , {c + 1} , {right} )"), wm(f"{r + 1},{c + 1},{wrong}")]]
    config = RolloutConfig("sudoku", {}, PromptConfig(max_turns=1))
    good, bad = rollout(ScriptedEngine(tokenizer, script), tokenizer, [3], 2, config, SamplingParams())
    assert (good.turns[0].best_first, bad.turns[0].best_first) == (True, False)


def test_best_first_is_none_without_a_solution_and_old_turns_still_load(tiny):
    _, tokenizer = tiny
    config = RolloutConfig("frozenlake", {"desc": "SHG", "is_slippery": False}, PromptConfig(max_turns=1))
    (trajectory,) = rollout(ScriptedEngine(tokenizer, [[wm("Right")]]), tokenizer, [0], 1, config,
                            SamplingParams())
    assert trajectory.turns[0].best_first is None  # the hole cuts the start off from the goal
    assert trajectory.turns[0].best_run is None
    assert "best_first_rate" not in summarize([trajectory])
    # A turn saved before best_first existed has no such key; it loads as "not scored".
    record = trajectory.to_json()["turns"][0]
    del record["best_first"]
    assert Turn(**record).best_first is None


def test_a_trajectory_reads_back_from_its_json_record(tiny):
    _, tokenizer = tiny
    config = RolloutConfig("frozenlake", {"desc": "SFG/FHF/FFF", "is_slippery": False}, PromptConfig(max_turns=2))
    (trajectory,) = rollout(ScriptedEngine(tokenizer, [[wm("Right")], [wm("Right")]]), tokenizer, [0], 1, config,
                            SamplingParams())
    record = json.loads(json.dumps(trajectory.to_json()))
    assert Trajectory.from_json(record) == trajectory and trajectory.success
    del record["turns"][0]["value_first"]  # saved before the field existed
    assert Trajectory.from_json(record).turns[0].value_first is None
