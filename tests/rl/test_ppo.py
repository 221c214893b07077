"""The PPO/GRPO trainer: bookkeeping of samples and advantages, and CPU smoke runs."""

import copy
import os
import signal

import numpy as np
import pytest
import torch

from spa.agent.prompts import PromptConfig
from spa.agent.rollout import RolloutConfig, Trajectory, Turn
from spa.models.engine import Engine, SamplingParams
from spa.rl import core
from spa.rl.batch import (Sample, collate, loss_masks, pad_responses, policy_forward, state_spans, state_token_mask,
                          turn_samples)
from spa.rl.critic import Critic
from spa.rl.advantages import (balance_episodes, compute_advantages, critic_advantages, grpo_advantages,
                               place_rewards, whiten_advantages)
from spa.rl.minibatches import group_spread, local_table, top_groups
from spa.rl.config import PPOConfig
from spa.rl.ppo import frozen_reference, resume_point, train, update_actor
from spa.rl.logger import read_metrics
from tests.scripted import ScriptedEngine, wm


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
    assert top_groups(spread, 0.25, drop_flat=False) == {1}
    assert top_groups(spread, 0.5, drop_flat=False) == {1, 2}
    assert top_groups(spread, 1.0, drop_flat=False) == {0, 1, 2}


def test_flat_groups_are_left_out_of_the_kept_fraction():
    """Group 0's samples all scored 1 (and group 3's differ by float noise only): they are
    left out; the fraction counts all four groups, so half keeps both informative ones."""
    trajectories = [episode(0, [1.0]), episode(0, [1.0], 1), episode(1, [0.0]), episode(1, [5.0], 1),
                    episode(2, [0.0]), episode(2, [1.0], 1), episode(3, [0.1 + 0.2]), episode(3, [0.3], 1)]
    spread = group_spread(trajectories)
    assert 0 < spread[3] < 1e-8
    assert top_groups(spread, 1.0) == {1, 2}
    assert top_groups(spread, 0.5) == {1, 2}
    assert top_groups(spread, 0.25) == {1}
    assert top_groups({0: 0.0, 1: 0.0}, 1.0) == set()
    assert PPOConfig().drop_flat_groups


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


def test_grpo_advantages_give_each_episode_one_score():
    trajectories = [episode(0, [1.0]), episode(0, [0.0], 1), episode(1, [2.0]), episode(1, [2.0], 1)]
    samples = turn_samples(trajectories)
    grpo_advantages(samples, trajectories, normalize_std=False)
    assert [s.advantages[0].item() for s in samples] == pytest.approx([0.5, -0.5, 0.0, 0.0])
    assert all(len(set(s.advantages.tolist())) == 1 for s in samples)


def test_balanced_episodes_weigh_alike_and_zero_a_groups_mass():
    """A winner of one 2-token turn against a loser of three turns (9 tokens): under a
    token-mean the raw GRPO advantages push the group's sampled tokens down on balance;
    balanced (mean 5.5 loss tokens per episode), each episode's tokens sum to +-5.5 x A."""
    trajectories = [episode(0, [1.0]), episode(0, [0.0, 0.0, 0.0], 1, lengths=[2, 3, 4])]
    samples = turn_samples(trajectories)
    compute_advantages(samples, trajectories, None, PPOConfig(algorithm="grpo", advantage="grpo_no_std"), 0, None)
    assert sum(s.advantages.sum().item() for s in samples) == pytest.approx(0.5 * 2 - 0.5 * 9)
    samples = turn_samples(trajectories)
    compute_advantages(samples, trajectories, None, PPOConfig(algorithm="grpo", advantage="grpo_no_std",
                                                              balance_episodes=True), 0, None)
    assert samples[0].advantages.tolist() == pytest.approx([0.5 * 5.5 / 2] * 2)
    assert torch.cat([s.advantages for s in samples[1:]]).tolist() == pytest.approx([-0.5 * 5.5 / 9] * 9)
    assert sum(s.advantages.sum().item() for s in samples) == pytest.approx(0.0, abs=1e-6)
    # the loss mask decides the counts: tokens outside it do not lengthen an episode
    samples = turn_samples(trajectories)
    samples[1].loss_mask = torch.tensor([True, False])
    grpo_advantages(samples, trajectories, normalize_std=False)
    balance_episodes(samples)
    assert samples[0].advantages[0].item() == pytest.approx(0.5 * 5 / 2)
    assert samples[1].advantages[0].item() == pytest.approx(-0.5 * 5 / 8)


def test_negative_weight_scales_only_the_pushes_down():
    assert core.weigh_negatives(torch.tensor([1.5, -0.5, 0.0, -2.0]), 0.25).tolist() == [1.5, -0.125, 0.0, -0.5]
    with pytest.raises(ValueError, match="negative weight 1.5"):
        core.weigh_negatives(torch.tensor([1.0]), 1.5)
    with pytest.raises(ValueError, match="negative_weight=-0.1"):
        PPOConfig(negative_weight=-0.1)
    # A winner against a loser, GRPO without the std: +-0.5; at weight 0 (applied after the
    # balancing) the loser's tokens get 0.
    trajectories = [episode(0, [1.0]), episode(0, [0.0], 1)]
    config = PPOConfig(algorithm="grpo", advantage="grpo_no_std", negative_weight=0.0, balance_episodes=True)
    samples = turn_samples(trajectories)
    compute_advantages(samples, trajectories, None, config, 0, None)
    assert samples[0].advantages.tolist() == pytest.approx([0.5, 0.5])
    assert samples[1].advantages.tolist() == [0.0, 0.0]


def test_key_means_by_hand():
    # keys 0, 1, 0, 2 (key 3 unseen): (3 + 1) / (2 + 2), -4 / 4, 0 / 1, none
    means = core.key_means(torch.tensor([3.0, -4.0, 1.0, 0.0]), torch.tensor([2, 4, 2, 1]),
                           torch.tensor([0, 1, 0, 2]), 4)
    assert means.tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0])


def test_centred_actions_leave_no_net_push_on_any_first_action():
    """Two lakes, each with a winner and a loser. `Right` wins in lake 0 and loses in lake 1:
    centred, its turns cancel; `Down` wins in lake 1 and `Up` loses in lake 0, and each
    alone is shifted to 0. A turn with no action keeps its advantages."""
    trajectories = [episode(0, [1.0]), episode(0, [0.0], 1), episode(1, [1.0]), episode(1, [0.0], 1),
                    episode(2, [1.0]), episode(2, [0.0], 1)]
    for t, move in zip(trajectories, ["Right", "Up", "Down", "Right", "Left", None]):
        t.turns[0].actions = [move] if move else []
    config = PPOConfig(algorithm="grpo", advantage="grpo_no_std", center_actions=True)
    samples = turn_samples(trajectories)
    compute_advantages(samples, trajectories, None, config, 0, None)
    assert [s.advantages[0].item() for s in samples] == pytest.approx([0.5, 0.0, 0.0, -0.5, 0.0, -0.5])
    # Loss masks count: a Right turn with one loss token of two weighs half as much.
    samples = turn_samples(trajectories)
    samples[0].loss_mask = torch.tensor([True, False])
    compute_advantages(samples, trajectories, None, config, 0, None)
    right = (0.5 * 1 - 0.5 * 2) / 3
    assert samples[0].advantages.tolist() == pytest.approx([0.5 - right] * 2)
    assert samples[3].advantages.tolist() == pytest.approx([-0.5 - right] * 2)
    assert not PPOConfig().center_actions


def test_episode_balance_scales_by_mean_over_own_length():
    assert core.episode_balance(torch.tensor([2, 6, 4])).tolist() == pytest.approx([2.0, 2 / 3, 1.0])
    assert core.episode_balance(torch.tensor([2, 0]), mean_tokens=3.0).tolist() == [1.5, 0.0]
    assert core.episode_balance(torch.tensor([], dtype=torch.long)).numel() == 0


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


def test_advantages_are_whitened_over_the_loss_tokens_of_the_step():
    """PPO: after GAE the step's advantages have mean 0 and variance 1 over the tokens the
    policy loss reads (the loss masks), the same transform as core.masked_whiten; the returns
    are untouched. GRPO keeps its group-normalised advantages."""
    trajectories = [episode(0, [-0.1, 1.0], lengths=[2, 3]), episode(0, [0.0, 2.0], 1, lengths=[4, 1])]
    samples = turn_samples(trajectories)
    samples[0].loss_mask = torch.tensor([True, False])
    for s, v in zip(samples, ([0.1, 0.2], [0.5, 0.4, 0.3], [0.0, -0.2, 0.3, 1.0], [0.7])):
        s.old_values = torch.tensor(v)
    critic_advantages(samples, trajectories, "gae", "episode", 1.0, 1.0)
    raw = [s.advantages.clone() for s in samples]
    returns = [s.returns.clone() for s in samples]
    whiten_advantages(samples)
    adv, mask = pad_responses(raw)
    expected = core.masked_whiten(adv, loss_masks(samples))
    in_loss = loss_masks(samples)
    for row, s in enumerate(samples):
        keep = in_loss[row, : s.response_length]
        assert s.advantages[keep].tolist() == pytest.approx(expected[row, : s.response_length][keep].tolist(),
                                                            abs=1e-6)
        assert torch.equal(s.returns, returns[row])
    flat = torch.cat([s.advantages[in_loss[row, : s.response_length]] for row, s in enumerate(samples)])
    assert flat.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert flat.var(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)
    # the token outside the loss gets the same affine map (its value is never read)
    a, b = raw[0][0].item(), raw[0][1].item()
    scale = (samples[0].advantages[0] - samples[0].advantages[1]).item() / (a - b)
    assert samples[0].advantages[1].item() == pytest.approx(samples[0].advantages[0].item() - scale * (a - b))


def test_compute_advantages_whitens_ppo_by_default_and_not_grpo(tiny):
    model, tokenizer = tiny
    trajectories = [episode(0, [-0.1, 1.0], lengths=[2, 3]), episode(0, [0.0, 3.0], 1, lengths=[4, 1])]
    critic = Critic(model)
    whitened = turn_samples(trajectories)
    compute_advantages(whitened, trajectories, critic, PPOConfig(precision="fp32"), 0, torch.autocast("cpu",
                                                                                                      enabled=False))
    values = torch.cat([s.advantages for s in whitened])
    assert values.mean().item() == pytest.approx(0.0, abs=1e-6) and values.std(unbiased=False).item() == \
        pytest.approx(1.0, abs=1e-5)
    raw = turn_samples(trajectories)
    compute_advantages(raw, trajectories, critic, PPOConfig(precision="fp32", whiten_advantages=False), 0,
                       torch.autocast("cpu", enabled=False))
    # a zero-initialised critic: the raw advantage is the episode's reward on every token
    assert torch.cat([s.advantages for s in raw]).tolist() == pytest.approx([0.9] * 5 + [3.0] * 5)
    grpo = turn_samples(trajectories)
    compute_advantages(grpo, trajectories, None, PPOConfig(algorithm="grpo", advantage="grpo_no_std"), 0, None)
    assert torch.cat([s.advantages for s in grpo]).tolist() == pytest.approx([-1.05] * 5 + [1.05] * 5)


def test_state_spans_are_the_contents_the_parser_reads():
    text = "<think><observation>A\nB</observation> go <prediction>C</prediction></think><answer>Up</answer>"
    (o0, o1), (p0, p1) = state_spans(text)
    assert (text[o0:o1], text[p0:p1]) == ("A\nB", "C")
    assert state_spans("<think>x</think><answer>Up</answer>") == []
    assert state_spans("<observation>unclosed") == []


def test_state_token_mask_leaves_the_state_contents_out():
    """A hand-built response over a toy vocabulary: tokens wholly inside an observation or
    prediction block get no loss; the tags, the reasoning, the answer and the tokens that
    straddle a tag and the state ("n>#") keep it."""
    pieces = ["<think>", "<obs", "ervation>", "##", "P_", "\n", "#", "</observation>", " I go", " <", "predictio",
              "n>#", "P", "#", "</", "prediction>", "</think>", "<answer>", "Right", " || ", "Up", "</answer>"]
    ids = list(range(len(pieces)))
    mask = state_token_mask(ids, lambda xs: "".join(pieces[i] for i in xs))
    out = [pieces[i] for i in ids if not mask[i]]
    assert out == ["##", "P_", "\n", "#", "P", "#"]
    # nothing to mask: every token keeps the loss
    assert state_token_mask([17, 18, 19, 20], lambda xs: "".join(pieces[i] for i in xs)).all()
    assert state_token_mask([], lambda xs: "").shape == (0,)


def test_state_token_mask_with_the_real_tokenizer(tiny):
    """Multi-byte characters split across tokens (the box-on-target symbol) do not shift the
    spans: the masked tokens decode to exactly the two states."""
    _, tokenizer = tiny
    obs, pred = "#####\n#_√P#\nPlayer at (1,3); Box at (1,2).", "##√##\n#√P_#"
    text = f"<think><observation>{obs}</observation> push √ <prediction>{pred}</prediction></think>" \
           "<answer>Left || Up</answer><|im_end|>"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    mask = state_token_mask(ids, tokenizer.decode)
    assert tokenizer.decode([i for i, keep in zip(ids, mask) if not keep]) == obs + pred
    assert tokenizer.decode([i for i, keep in zip(ids, mask) if keep]).endswith("<answer>Left || Up</answer><|im_end|>")


def test_turn_samples_carry_the_loss_mask_when_state_tokens_are_out(tiny):
    _, tokenizer = tiny
    response = tokenizer(wm("Up", "#P#\nPlayer at (0,1).", "#_#"), add_special_tokens=False)["input_ids"]
    t = Trajectory("sokoban", {}, seed=0, group=0, sample=0, mode="world_model")
    t.turns = [turn([1, 2, 3], response, 0.0)]
    (kept_in,) = turn_samples([t])
    assert kept_in.loss_mask is None and kept_in.loss_tokens == len(response)
    (out,) = turn_samples([t], tokenizer, state_tokens_in_loss=False)
    assert tokenizer.decode([i for i, keep in zip(response, out.loss_mask) if not keep]) == \
        "#P#\nPlayer at (0,1).#_#"
    assert out.loss_tokens == int(out.loss_mask.sum()) < len(response)
    with pytest.raises(ValueError, match="tokenizer"):
        turn_samples([t], state_tokens_in_loss=False)


def test_tokens_outside_the_loss_mask_get_no_gradient_and_no_entropy(tiny):
    """Advantages at masked tokens change nothing in the update; entropy and the stats are
    averaged over the loss tokens only (the masked ones have old log-probs far off, so a
    ratio over all tokens would be far from 1)."""
    model, _ = tiny
    sharp = copy.deepcopy(model)
    with torch.no_grad():  # a sharper random model: entropies that differ from token to token
        sharp.get_output_embeddings().weight.mul_(10)
    mask = torch.tensor([True, False, False, True, True])
    sample = Sample([1, 2, 3, 40, 41, 42, 43, 44], 3, torch.zeros(5), 0, 0, loss_mask=mask)
    with torch.no_grad():
        logprobs, entropy, _ = policy_forward(sharp, *collate([sample], 0))
    sample.old_logprobs = torch.where(mask, logprobs[0], logprobs[0] - 3.0)

    def run(masked_advantage):
        policy = copy.deepcopy(sharp)
        sample.advantages = torch.where(mask, torch.tensor([1.0, 0, 0, -0.5, 2.0]), torch.tensor(masked_advantage))
        config = PPOConfig(algorithm="grpo", minibatch_size=1, micro_batch_size=1, precision="fp32")
        optimizer = torch.optim.SGD(policy.parameters(), lr=1e-2)
        stats = update_actor(policy, None, optimizer, [sample], local_table([sample], config.aggregation), config,
                             0, torch.autocast("cpu", enabled=False), np.random.default_rng(0))
        return policy, stats

    a, stats = run(0.0)
    b, _ = run(1e4)
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.equal(x, y)
    assert stats["actor/entropy"] == pytest.approx(entropy[0][mask].mean().item(), rel=1e-5)
    assert stats["actor/entropy"] != pytest.approx(entropy[0].mean().item(), rel=1e-3)
    assert stats["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-5) and stats["actor/clipfrac"] == 0.0


def test_the_logged_policy_loss_is_the_clipped_surrogate_alone(tiny):
    """actor/policy_loss is the clipped loss only; the entropy and KL terms are
    logged apart, and the three add up to actor/loss. With old log-probs equal to the
    policy's the ratio is 1, so the clipped loss is the token mean of -A."""
    model, _ = tiny
    reference = copy.deepcopy(model)
    with torch.no_grad():  # a reference that differs, so the KL term is not 0
        reference.get_output_embeddings().weight.mul_(3)
    sample = Sample([1, 2, 3, 40, 41, 42, 43], 3, torch.zeros(4), 0, 0)
    with torch.no_grad():
        logprobs, entropy, _ = policy_forward(model, *collate([sample], 0))
    sample.old_logprobs, sample.advantages = logprobs[0], torch.tensor([1.0, -0.5, 2.0, 0.25])
    config = PPOConfig(algorithm="grpo", minibatch_size=1, micro_batch_size=1, precision="fp32",
                       entropy_coef=0.5, kl_coef=0.25)
    policy = copy.deepcopy(model)
    stats = update_actor(policy, reference, torch.optim.SGD(policy.parameters(), lr=0.0), [sample],
                         local_table([sample], config.aggregation), config, 0, torch.autocast("cpu", enabled=False),
                         np.random.default_rng(0))
    assert stats["actor/policy_loss"] == pytest.approx(-sample.advantages.mean().item(), rel=1e-5)
    assert stats["actor/entropy_loss"] == pytest.approx(-0.5 * entropy[0].mean().item(), rel=1e-5)
    assert stats["actor/kl_loss"] == pytest.approx(0.25 * stats["actor/kl_ref"], rel=1e-5)
    assert stats["actor/kl_loss"] > 1e-4
    assert stats["actor/loss"] == pytest.approx(
        stats["actor/policy_loss"] + stats["actor/entropy_loss"] + stats["actor/kl_loss"], rel=1e-5)


def test_the_exact_kl_term_is_the_token_mean_of_the_full_distributions_kl(tiny):
    """kl_estimator=full: actor/kl_ref is the token mean over the response of the exact
    KL between the policy's and the reference's next-token distributions."""
    model, _ = tiny
    reference = copy.deepcopy(model)
    with torch.no_grad():
        reference.get_output_embeddings().weight.mul_(3)
    sample = Sample([1, 2, 3, 40, 41, 42, 43], 3, torch.zeros(4), 0, 0)
    ids, attention, targets = collate([sample], 0)
    with torch.no_grad():
        logprobs, _, _ = policy_forward(model, ids, attention, targets)
        positions = targets[0, 1:].nonzero()[:, 0]  # position i predicts token i + 1
        p = torch.log_softmax(model(ids, attention_mask=attention).logits[0, positions].float(), -1)
        q = torch.log_softmax(reference(ids, attention_mask=attention).logits[0, positions].float(), -1)
    expected = (p.exp() * (p - q)).sum(-1).mean().item()
    sample.old_logprobs, sample.advantages = logprobs[0], torch.ones(4)
    config = PPOConfig(algorithm="grpo", minibatch_size=1, micro_batch_size=1, precision="fp32",
                       kl_coef=0.25, kl_estimator="full")
    policy = copy.deepcopy(model)
    stats = update_actor(policy, reference, torch.optim.SGD(policy.parameters(), lr=0.0), [sample],
                         local_table([sample], config.aggregation), config, 0, torch.autocast("cpu", enabled=False),
                         np.random.default_rng(0))
    assert stats["actor/kl_ref"] == pytest.approx(expected, rel=1e-4) and expected > 1e-3
    assert stats["actor/kl_loss"] == pytest.approx(0.25 * expected, rel=1e-4)


def test_the_reference_is_a_frozen_copy_of_the_policy_as_loaded(tiny):
    """kl_coef > 0: the reference holds the policy's starting weights in tensors of its own
    (the policy's steps leave it), without gradients, in eval mode. (Under a launcher, the
    main process's weights: tests/test_distributed.py.)"""
    model, _ = tiny
    reference = frozen_reference(model)
    assert not reference.training and not any(p.requires_grad for p in reference.parameters())
    assert all(p.requires_grad for p in model.parameters())
    for (name, own), (ref_name, ref) in zip(model.state_dict().items(), reference.state_dict().items(), strict=True):
        assert name == ref_name and torch.equal(own, ref) and own.data_ptr() != ref.data_ptr(), name


def test_recompute_applies_the_sampling_temperature(tiny):
    """The engine samples from softmax(logits / T) and records those log-probs; the
    trainer's recompute must give the same numbers (fp32: to float precision)."""
    model, tokenizer = tiny
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Go."}], add_generation_prompt=True,
                                           tokenize=True, return_dict=True)["input_ids"]
    (generation,) = Engine(model, tokenizer).generate([prompt], SamplingParams(max_new_tokens=12, temperature=0.7,
                                                                               stop=(), seed=3))
    sample = Sample(prompt + generation.token_ids, len(prompt), torch.tensor(generation.logprobs), 0, 0)
    with torch.no_grad():
        logprobs, _, mask = policy_forward(model, *collate([sample], 0), temperature=0.7)
        raw, _, _ = policy_forward(model, *collate([sample], 0))
    assert logprobs[mask].tolist() == pytest.approx(generation.logprobs, abs=1e-4)
    assert raw[mask].tolist() != pytest.approx(generation.logprobs, abs=1e-2)
    with pytest.raises(ValueError, match="temperature"):
        PPOConfig(temperature=0.0)


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
    # Scripted answers: in each group one sample makes two valid moves a turn (-0.1 a step),
    # one writes nonsense (-0.1 a turn), so rewards differ inside the groups and GRPO has a
    # signal. (One move a turn would score -0.1 too: flat groups, dropped.)
    script = [["<answer>Up || Down</answer>", "nonsense"] * 2] * 4
    history = train(policy, tokenizer, ROLLOUT, small_run(algorithm), tmp_path, progress=False,
                    engine=ScriptedEngine(tokenizer, script))
    assert [h["step"] for h in history] == [1, 2]
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
    for key in ("rollout/reward_mean", "rollout/pass@1", "actor/approx_kl", "actor/clipfrac", "actor/entropy",
                "actor/ratio_mean", "actor/first_ratio", "actor/first_clipfrac"):
        assert key in history[0]
    assert ("critic/value_loss" in history[0]) == (algorithm == "ppo")
    changed = any(not torch.equal(a, b) for a, b in zip(policy.parameters(), model.parameters()))
    assert changed
    assert resume_point(tmp_path) is not None


def test_a_step_with_only_flat_groups_skips_the_update(tiny, tmp_path):
    """Every sample writes nonsense: all groups are flat, nothing is trained, and the step
    is still logged (kept_groups 0, rollout metrics) and checkpointed."""
    model, tokenizer = tiny
    policy = copy.deepcopy(model)
    history = train(policy, tokenizer, ROLLOUT, small_run("ppo", steps=1), tmp_path, progress=False,
                    engine=ScriptedEngine(tokenizer, [["nonsense"] * 4] * 2))
    (step,) = history
    assert step["charts/kept_groups"] == 0 and step["charts/train_turns"] == 0
    assert step["rollout/reward_mean"] == pytest.approx(-0.2)
    assert not any(k.startswith(("actor/", "critic/")) for k in step)
    for a, b in zip(policy.parameters(), model.parameters()):
        assert torch.equal(a, b)
    assert resume_point(tmp_path) is not None
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["charts/kept_groups"] == 0


def test_first_minibatch_ratio_is_one_at_a_sampling_temperature(tiny, tmp_path):
    """Real engine at T = 0.7, fp32 everywhere: before any optimizer step the trainer's
    log-probs are the sampler's, so the first minibatch's ratio is 1 and nothing is clipped."""
    model, tokenizer = tiny
    history = train(copy.deepcopy(model), tokenizer, ROLLOUT,
                    small_run("grpo", steps=1, temperature=0.7, drop_flat_groups=False), tmp_path, progress=False)
    assert history[0]["actor/first_ratio"] == pytest.approx(1.0, abs=1e-4)
    assert history[0]["actor/first_clipfrac"] == 0.0


def test_world_model_training_runs_with_the_state_tokens_out_of_the_loss(tiny, tmp_path):
    model, tokenizer = tiny
    rollout_config = RolloutConfig("sokoban", {}, PromptConfig("world_model", max_turns=1))
    good = wm("Up || Down", "#####\n#_P_#\nPlayer at (1,2).", "#####\n#_P_#\nPlayer at (1,2).")
    policy = copy.deepcopy(model)
    history = train(policy, tokenizer, rollout_config, small_run("ppo", steps=1), tmp_path, progress=False,
                    engine=ScriptedEngine(tokenizer, [[good, "nonsense"] * 2]))
    assert history[0]["charts/kept_groups"] == 2 and "actor/first_ratio" in history[0]
    assert any(not torch.equal(a, b) for a, b in zip(policy.parameters(), model.parameters()))


@pytest.mark.parametrize("warmup_steps", [0, 5])
def test_resume_gives_the_uninterrupted_result(tiny, tmp_path, warmup_steps):
    # The random tiny model never scores: its groups are flat, kept here so that it trains.
    model, tokenizer = tiny
    run = dict(drop_flat_groups=False, warmup_steps=warmup_steps)
    straight = copy.deepcopy(model)
    train(straight, tokenizer, ROLLOUT, small_run("ppo", **run), tmp_path / "a", progress=False)
    first = copy.deepcopy(model)
    train(first, tokenizer, ROLLOUT, small_run("ppo", steps=1, **run), tmp_path / "b", progress=False)
    from transformers import AutoModelForCausalLM

    checkpoint = resume_point(tmp_path / "b")
    resumed = AutoModelForCausalLM.from_pretrained(checkpoint / "policy", dtype=torch.float32)
    train(resumed, tokenizer, ROLLOUT, small_run("ppo", **run), tmp_path / "b", resume_from=checkpoint,
          progress=False)
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(straight.parameters(), model.parameters()))
    records = read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    # 8 turns a step in minibatches of 4: two optimizer steps a step. With a 5-step warm-up the
    # last rate of step 1 is 2/5 of actor_lr and of step 2 4/5; the resumed run went on counting.
    expected = [1e-3, 1e-3] if warmup_steps == 0 else [0.4e-3, 0.8e-3]
    assert [r["actor/lr"] for r in records] == pytest.approx(expected)


def test_a_signal_stops_after_the_step_with_its_checkpoint(tiny, tmp_path, monkeypatch):
    """SIGTERM during step 1 of 3 with save_every=10: the step ends, is logged and saved."""
    import spa.rl.ppo as ppo
    from spa.interrupt import Interrupted

    model, tokenizer = tiny
    real = ppo.update_actor

    def update_and_signal(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(ppo, "update_actor", update_and_signal)
    with pytest.raises(Interrupted, match="step 1 of 3"):
        train(copy.deepcopy(model), tokenizer, ROLLOUT, small_run("ppo", steps=3, save_every=10,
                                                                  drop_flat_groups=False), tmp_path, progress=False)
    checkpoint = resume_point(tmp_path)
    assert checkpoint is not None and torch.load(checkpoint / "trainer_state.pt", weights_only=False)["step"] == 1
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1]


def test_warmup_rises_linearly_to_the_full_rate():
    from spa.rl.ppo import warmup_factor

    assert [warmup_factor(done, 4) for done in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_factor(0, 0) == 1.0
    with pytest.raises(ValueError, match="warmup_steps=-1"):
        PPOConfig(warmup_steps=-1)


def test_eval_entries_log_each_pass_at_k_with_its_interval():
    from spa.rl.ppo import _eval_entries

    metrics = {"success_rate": 0.25, "format_valid_rate": 0.5, "pass_at_k": {"pass@1": 0.25, "pass@8": 0.6},
               "pass_at_k_ci95": {"pass@1": [0.1, 0.4], "pass@8": [0.45, 0.75]}}
    entries = _eval_entries(metrics)
    assert entries["eval/pass@1"] == 0.25 and entries["eval/pass@8"] == 0.6
    assert (entries["eval/pass@1_lo"], entries["eval/pass@1_hi"]) == (0.1, 0.4)
    assert (entries["eval/pass@8_lo"], entries["eval/pass@8_hi"]) == (0.45, 0.75)
    # An evaluation without intervals (a single level) logs the numbers alone.
    del metrics["pass_at_k_ci95"]
    assert not any(key.endswith(("_lo", "_hi")) for key in _eval_entries(metrics))


def test_best_move_reward_adds_to_the_turns_that_began_a_shortest_solution():
    from spa.rl.ppo import _shaping, shape_rewards

    assert _shaping(None, 0.0) is None
    trajectories = [episode(0, [0.0, 0.0, 1.0])]
    for turn, best in zip(trajectories[0].turns, [True, False, None]):  # None: no solver, or no action
        turn.best_first = best
    assert shape_rewards(trajectories, _shaping(None, 1.0)) == pytest.approx(1 / 3)
    assert [t.reward for t in trajectories[0].turns] == [1.0, 0.0, 1.0]
    assert shape_rewards(trajectories, _shaping(lambda turn: 0.5, 2.0)) == pytest.approx((2.5 + 0.5 + 0.5) / 3)
    assert [t.reward for t in trajectories[0].turns] == [3.5, 0.5, 1.5]


def test_excess_action_penalty_hits_answers_naming_more_actions_than_a_turn_plays():
    from spa.rl.ppo import _shaping, shape_rewards

    trajectories = [episode(0, [0.0, 0.0, 1.0])]
    for turn, answer in zip(trajectories[0].turns, ["Down", "Down || Up || Right", " Up || ||"]):
        turn.answer = answer  # the rollout kept only the first action of each
    assert shape_rewards(trajectories, _shaping(None, 0.0, 0.5, 1)) == pytest.approx(-0.5 / 3)
    assert [t.reward for t in trajectories[0].turns] == [0.0, -0.5, 1.0]
    assert shape_rewards(trajectories, _shaping(None, 0.0, 0.5, 3)) == 0.0
    assert PPOConfig().excess_action_penalty == 0.0


def test_target_kl_stops_the_step_once_the_policy_moved_that_far(tiny, tmp_path):
    """8 turns a step in minibatches of 4: two optimizer steps. At lr 1e-2 the first moves the
    policy far, so with a tiny target_kl the second minibatch's approx_kl exceeds it and the
    step stops there (one update); without it both run."""
    model, tokenizer = tiny
    runs = {}
    for target in (0.0, 1e-4):
        # the real engine (its log-probs are the trainer's: the first minibatch's KL is 0);
        # the random tiny model's groups are flat, kept so that it trains
        config = small_run("grpo", steps=1, actor_lr=1e-2, target_kl=target, drop_flat_groups=False)
        (step,) = train(copy.deepcopy(model), tokenizer, ROLLOUT, config, tmp_path / str(target), progress=False)
        runs[target] = step
    assert runs[0.0]["actor/updates"] == 2 and runs[0.0]["actor/kl_stop"] == 0
    assert runs[1e-4]["actor/updates"] == 1 and runs[1e-4]["actor/kl_stop"] == 1
    with pytest.raises(ValueError, match="target_kl=-1"):
        PPOConfig(target_kl=-1)
