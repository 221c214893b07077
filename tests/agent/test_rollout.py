"""Rollout bookkeeping with a scripted engine (exact control over every response)."""

from dataclasses import dataclass

import pytest

from spa.agent.prompts import PromptConfig
from spa.agent.rollout import RolloutConfig, rollout
from spa.agent.seeds import EVAL_SEED_OFFSET, eval_seeds, train_seeds
from spa.eval.metrics import summarize
from spa.models.engine import Generation, SamplingParams


@dataclass
class ScriptedEngine:
    """Answers every prompt with the next response of a script (one list per turn)."""

    tokenizer: object
    script: list[list[str]]
    calls: int = 0

    def generate(self, prompts, params, progress=False):
        responses = self.script[self.calls]
        self.calls += 1
        assert len(responses) == len(prompts)
        out = []
        for text in responses:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Generation(ids, text, [-0.5] * len(ids), "stop"))
        return out


def wm(actions: str, obs: str = "", pred: str = "") -> str:
    return (f"<think><observation>{obs}</observation>go<prediction>{pred}</prediction></think>"
            f"<answer>{actions}</answer>")


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
