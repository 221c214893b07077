"""The PPO/GRPO trainer: bookkeeping of samples and advantages, and CPU smoke runs."""

import copy

import pytest
import torch

from spa.agent.prompts import PromptConfig
from spa.agent.rollout import RolloutConfig, Trajectory, Turn
from spa.rl.batch import (collate, critic_advantages, group_advantages, place_rewards, policy_forward,
                          turn_samples)
from spa.rl.critic import Critic
from spa.rl.ppo import PPOConfig, group_spread, resume_point, top_groups, train
from spa.rl.logger import read_metrics
from tests.scripted import ScriptedEngine


def turn(prompt, response, reward):
    return Turn(prompt_messages=[], prompt_ids=prompt, response="", response_ids=response,
                logprobs=[-1.0] * len(response), finish_reason="stop", think="", observation="",
                prediction="", answer="", actions=[], actions_valid=[], format_ok=True, state_before="",
                grid_before="", state_after="", grid_after="", env_reward=reward, reward=reward)


def episode(group, rewards, sample=0, lengths=None):
    lengths = lengths or [2] * len(rewards)
    t = Trajectory("sokoban", {}, seed=group, group=group, sample=sample, mode="state")
    t.turns = [turn([1, 2, 3], [10 + k] * n, r) for k, (r, n) in enumerate(zip(rewards, lengths))]
    return t


def test_group_filter_prefers_the_groups_whose_rewards_vary():
    trajectories = [episode(0, [1.0]), episode(0, [1.0], 1), episode(1, [0.0]), episode(1, [5.0], 1),
                    episode(2, [0.0]), episode(2, [1.0], 1)]
    spread = group_spread(trajectories)
    assert top_groups(spread, 0.25) == {1}
    assert top_groups(spread, 0.5) == {1, 2}
    assert top_groups(spread, 1.0) == {0, 1, 2}


def test_rewards_are_placed_on_turn_ends():
    t = episode(0, [-0.1, 0.0, 1.0], lengths=[2, 3, 1])
    assert place_rewards(t, [2, 3, 1], "episode").tolist() == pytest.approx([0, 0, 0, 0, 0, 0.9])
    assert place_rewards(t, [2, 3, 1], "turn").tolist() == pytest.approx([0, -0.1, 0, 0, 0.0, 1.0])
    with pytest.raises(ValueError, match="valid: episode, turn"):
        place_rewards(t, [2, 3, 1], "step")


def test_gae_over_an_episode_chains_its_turns():
    """gamma = lambda = 1, episode reward on the last token: every token's advantage is
    R - V(token), across turn boundaries (values here: 0.5 on the second turn)."""
    trajectories = [episode(0, [-0.1, 1.0], lengths=[2, 3])]
    samples = turn_samples(trajectories)
    samples[0].old_values, samples[1].old_values = torch.zeros(2), torch.full((3,), 0.5)
    critic_advantages(samples, trajectories, "gae", "episode", 1.0, 1.0)
    assert samples[0].advantages.tolist() == pytest.approx([0.9, 0.9])
    assert samples[1].advantages.tolist() == pytest.approx([0.4, 0.4, 0.4])
    assert samples[1].returns.tolist() == pytest.approx([0.9] * 3)
    # per-turn rewards and gamma < 1: the first turn's return discounts the second turn's reward
    critic_advantages(samples, trajectories, "turn_gae", "turn", 0.5, 1.0)
    assert samples[0].advantages.tolist() == pytest.approx([-0.1 + 0.5 * 1.0] * 2)
    assert samples[1].advantages.tolist() == pytest.approx([0.5] * 3)


def test_group_advantages_give_each_episode_one_score():
    trajectories = [episode(0, [1.0]), episode(0, [0.0], 1), episode(1, [2.0]), episode(1, [2.0], 1)]
    samples = turn_samples(trajectories)
    group_advantages(samples, trajectories, normalize_std=False)
    assert [s.advantages[0].item() for s in samples] == pytest.approx([0.5, -0.5, 0.0, 0.0])
    assert all(len(set(s.advantages.tolist())) == 1 for s in samples)


def test_only_response_tokens_are_targets(tiny):
    samples = turn_samples([episode(0, [0.0, 1.0], lengths=[2, 4])])
    ids, attention, targets = collate(samples, pad_id=0)
    assert targets.tolist() == [[False] * 3 + [True] * 2 + [False] * 2, [False] * 3 + [True] * 4]
    assert attention.sum(1).tolist() == [5, 7]


def test_policy_log_probs_match_a_full_forward(tiny):
    model, _ = tiny
    samples = turn_samples([episode(0, [0.0, 1.0], lengths=[2, 4])])
    ids, attention, targets = collate(samples, pad_id=0)
    with torch.no_grad():
        logprobs, entropy, mask = policy_forward(model, ids, attention, targets)
        full = torch.log_softmax(model(input_ids=ids, attention_mask=attention).logits.float(), -1)
    for row, s in enumerate(samples):
        expected = [full[row, t - 1, s.ids[t]].item() for t in range(s.start, len(s.ids))]
        assert logprobs[row][mask[row]].tolist() == pytest.approx(expected, abs=1e-5)
    assert mask.sum(1).tolist() == [2, 4] and (entropy[mask] > 0).all()


def test_critic_starts_at_zero_and_covers_the_response(tiny):
    model, _ = tiny
    samples = turn_samples([episode(0, [0.0, 1.0], lengths=[2, 4])])
    values = Critic(model).values([collate(samples, pad_id=0)])
    assert [v.tolist() for v in values] == [[0.0] * 2, [0.0] * 4]


def small_run(algorithm, **overrides):
    config = dict(algorithm=algorithm, steps=2, groups=2, samples=2, keep_fraction=1.0, max_new_tokens=6,
                  minibatch_size=4, micro_batch_size=2, actor_lr=1e-3, critic_lr=1e-3, save_every=1,
                  tensorboard=False, precision="fp32")
    config.update(overrides)
    return PPOConfig(**config)


ROLLOUT = RolloutConfig("sokoban", {}, PromptConfig("state", max_turns=2))


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_training_updates_the_policy_and_logs(tiny, tmp_path, algorithm):
    model, tokenizer = tiny
    policy = copy.deepcopy(model)
    # Scripted answers: in each group one sample pushes a valid move, one writes nonsense,
    # so rewards differ inside the groups and GRPO has a signal.
    script = [["<answer>Up</answer>", "nonsense"] * 2] * 4
    history = train(policy, tokenizer, ROLLOUT, small_run(algorithm), tmp_path, progress=False,
                    engine=ScriptedEngine(tokenizer, script))
    assert [h["step"] for h in history] == [1, 2]
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
    for key in ("rollout/reward_mean", "rollout/pass@1", "actor/approx_kl", "actor/clipfrac", "actor/entropy"):
        assert key in history[0]
    assert ("critic/value_loss" in history[0]) == (algorithm == "ppo")
    changed = any(not torch.equal(a, b) for a, b in zip(policy.parameters(), model.parameters()))
    assert changed
    assert resume_point(tmp_path) is not None


def test_resume_gives_the_uninterrupted_result(tiny, tmp_path):
    model, tokenizer = tiny
    straight = copy.deepcopy(model)
    train(straight, tokenizer, ROLLOUT, small_run("ppo"), tmp_path / "a", progress=False)
    first = copy.deepcopy(model)
    train(first, tokenizer, ROLLOUT, small_run("ppo", steps=1), tmp_path / "b", progress=False)
    from transformers import AutoModelForCausalLM

    checkpoint = resume_point(tmp_path / "b")
    resumed = AutoModelForCausalLM.from_pretrained(checkpoint / "policy", dtype=torch.float32)
    train(resumed, tokenizer, ROLLOUT, small_run("ppo"), tmp_path / "b", resume_from=checkpoint, progress=False)
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    assert [r["step"] for r in read_metrics(tmp_path / "b" / "metrics.jsonl")] == [1, 2]
