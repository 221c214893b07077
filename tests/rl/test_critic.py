"""PPO's critic kinds (PPOConfig.critic): a copy of the policy's decoder, or a value head on
the policy's own decoder that the value loss cannot reach through."""

import copy

import numpy as np
import pytest
import torch

from spa.agent.prompts import PromptConfig
from spa.agent.rollout import RolloutConfig, Trajectory, Turn
from spa.io import TRAINER_STATE
from spa.rl.advantages import compute_advantages
from spa.rl.batch import collate, turn_samples
from spa.rl.config import CRITICS, PPOConfig
from spa.rl.critic import KINDS, Critic, ValueHead, build_critic, restore_critic
from spa.rl.minibatches import sample_table
from spa.rl.ppo import resume_point, train, update_critic

ROLLOUT = RolloutConfig("sokoban", {}, PromptConfig("state", max_turns=2))
NO_AUTOCAST = torch.autocast("cpu", enabled=False)


def episode(group, sample, rewards, lengths):
    t = Trajectory("sokoban", {}, seed=group, group=group, sample=sample, mode="state")
    t.turns = [Turn(prompt_messages=[], prompt_ids=[1, 2, 3], response="", response_ids=[10 + k] * n,
                    logprobs=[-1.0] * n, finish_reason="stop", think="", observation="", prediction="", answer="",
                    actions=[], actions_valid=[], format_ok=True, state_before="", grid_before="", state_after="",
                    grid_after="", env_reward=r, reward=r)
               for k, (r, n) in enumerate(zip(rewards, lengths))]
    return t


def ppo(**overrides) -> PPOConfig:
    """A tiny PPO run; the random tiny model's groups are flat, kept so that it trains."""
    config = dict(algorithm="ppo", steps=1, groups=2, samples=2, keep_fraction=1.0, max_new_tokens=6,
                  minibatch_size=4, micro_batch_size=2, actor_lr=1e-3, critic_lr=1e-3, save_every=1,
                  tensorboard=False, precision="fp32", drop_flat_groups=False)
    return PPOConfig(**{**config, **overrides})


def saved(run) -> dict:
    return torch.load(resume_point(run) / TRAINER_STATE, weights_only=False)


def random_head(critic, seed: int = 0) -> None:
    """Non-zero head weights (a zero head passes no gradient back to the hidden states)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in critic.head.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.1)


def test_the_critic_kind_is_checked_by_name():
    assert PPOConfig().critic == "copy" and PPOConfig(critic="head").critic == "head"
    with pytest.raises(ValueError, match="critic 'shared' is not known; valid: copy, head"):
        PPOConfig(critic="shared")
    with pytest.raises(ValueError, match="critic 'shared' is not known; valid: copy, head"):
        build_critic(None, "shared")
    assert CRITICS == tuple(KINDS)


def test_the_value_head_holds_no_second_decoder(tiny):
    model, _ = tiny
    head, full = build_critic(model, "head"), build_critic(model, "copy")
    assert isinstance(head, ValueHead) and isinstance(full, Critic)
    hidden = model.config.hidden_size
    assert [name for name, _ in head.named_parameters()] == ["head.weight", "head.bias"]
    assert sum(p.numel() for p in head.parameters()) == hidden + 1
    assert set(head.state_dict()) == {"head.weight", "head.bias"}
    assert head.decoder is model.get_decoder()
    # the copy holds a decoder of its own, as large as the policy's
    decoder = sum(p.numel() for p in model.get_decoder().parameters())
    assert full.decoder is not model.get_decoder()
    assert sum(p.numel() for p in full.parameters()) == decoder + hidden + 1


def test_the_value_head_reads_the_policys_current_decoder(tiny):
    """With the same head weights a value head and a fresh copy give the same values; once the
    policy moves, the head's values move with it and the copy's do not."""
    model, _ = tiny
    policy = copy.deepcopy(model)
    head, full = ValueHead(policy), Critic(policy)
    assert [v.tolist() for v in head.values([collate(turn_samples([episode(0, 0, [0.0], [3])]), 0)])] == [[0.0] * 3]
    random_head(head)
    full.head.load_state_dict(head.head.state_dict())
    batch = collate(turn_samples([episode(0, 0, [0.0, 1.0], [2, 4])]), pad_id=0)
    before = head.values([batch])
    for a, b in zip(before, full.values([batch])):
        torch.testing.assert_close(a, b)
    with torch.no_grad():
        for p in policy.get_decoder().parameters():
            p.add_(0.05)
    after, unchanged = head.values([batch]), full.values([batch])
    assert all(not torch.allclose(a, b) for a, b in zip(after, before))
    for a, b in zip(unchanged, before):
        torch.testing.assert_close(a, b)


def test_the_value_loss_trains_the_head_and_leaves_the_policy_alone(tiny):
    """A value update with a non-zero head (one that would pass gradients back): the head
    moves, the policy's weights do not and none of them has a gradient."""
    model, _ = tiny
    policy = copy.deepcopy(model)
    critic = ValueHead(policy)
    random_head(critic)
    head_before = [p.detach().clone() for p in critic.parameters()]
    kept = [episode(0, 0, [-0.1, 1.0], [2, 3]), episode(0, 1, [0.0, -1.0], [4, 1])]
    samples = turn_samples(kept)
    config = ppo(minibatch_size=2, micro_batch_size=1)
    compute_advantages(samples, kept, critic, config, 0, NO_AUTOCAST)
    optimizer = torch.optim.AdamW(critic.parameters(), lr=1e-2, weight_decay=0.0)
    stats = update_critic(critic, optimizer, samples, sample_table(samples, kept, config.aggregation), config, 0,
                          NO_AUTOCAST, np.random.default_rng(0))
    assert stats["critic/value_loss"] > 0
    assert all(not torch.equal(p, q) for p, q in zip(critic.parameters(), head_before))
    for p, q in zip(policy.parameters(), model.parameters()):
        assert torch.equal(p, q) and p.grad is None


def test_a_ppo_step_updates_the_policy_alike_with_either_critic(tiny, tmp_path):
    """One PPO step from the same seed: both critics start at zero, so the advantages agree
    and the policies end equal (the head's passes on the policy's decoder leave it as it
    was); no policy weight holds a gradient the value loss sent back (it would add to the
    next step's actor update); the head's run trained and saved the head alone."""
    model, tokenizer = tiny
    policies = {}
    for kind in CRITICS:
        policies[kind] = copy.deepcopy(model)
        train(policies[kind], tokenizer, ROLLOUT, ppo(critic=kind), tmp_path / kind, progress=False)
        assert all(p.grad is None for p in policies[kind].parameters()), kind
    for a, b in zip(policies["copy"].parameters(), policies["head"].parameters()):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(policies["head"].parameters(), model.parameters()))
    head = saved(tmp_path / "head")
    assert set(head["critic"]) == {"head.weight", "head.bias"}
    assert head["critic"]["head.weight"].abs().sum() > 0  # trained from its zero start
    assert len(head["critic_opt"]["state"]) == 2  # Adam's moments of the head's two tensors
    assert any(key.startswith("decoder.") for key in saved(tmp_path / "copy")["critic"])


def test_resume_with_a_value_head_restores_the_head(tiny, tmp_path):
    """Two steps straight, or one then a resumed second: the same policy, head and head
    optimizer (a head started afresh at step 2 would end elsewhere)."""
    from transformers import AutoModelForCausalLM

    model, tokenizer = tiny
    straight = copy.deepcopy(model)
    train(straight, tokenizer, ROLLOUT, ppo(critic="head", steps=2), tmp_path / "a", progress=False)
    train(copy.deepcopy(model), tokenizer, ROLLOUT, ppo(critic="head"), tmp_path / "b", progress=False)
    checkpoint = resume_point(tmp_path / "b")
    step_one = saved(tmp_path / "b")["critic"]
    resumed = AutoModelForCausalLM.from_pretrained(checkpoint / "policy", dtype=torch.float32)
    train(resumed, tokenizer, ROLLOUT, ppo(critic="head", steps=2), tmp_path / "b", resume_from=checkpoint,
          progress=False)
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    a, b = saved(tmp_path / "a"), saved(tmp_path / "b")
    for key in ("head.weight", "head.bias"):
        assert torch.equal(a["critic"][key], b["critic"][key])
        assert not torch.equal(b["critic"][key], step_one[key])  # step 2 trained the head on
    for moments_a, moments_b in zip(a["critic_opt"]["state"].values(), b["critic_opt"]["state"].values()):
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(moments_a[name], moments_b[name])
    # a checkpoint resumes only with the critic it was written with
    with pytest.raises(ValueError, match="holds a critic=head critic, and this run asks for critic=copy"):
        train(copy.deepcopy(model), tokenizer, ROLLOUT, ppo(critic="copy", steps=3), tmp_path / "b",
              resume_from=resume_point(tmp_path / "b"), progress=False)


def test_a_checkpoint_restores_only_the_critic_kind_it_holds(tiny):
    model, _ = tiny
    full, head = Critic(model), ValueHead(model)
    random_head(full)
    with pytest.raises(ValueError, match="holds a critic=copy critic, and this run asks for critic=head"):
        restore_critic(head, full.state_dict())
    with pytest.raises(ValueError, match="holds no critic, and this run asks for critic=copy"):
        restore_critic(full, None)
    restore_critic(head, {"head.weight": full.head.weight.detach(), "head.bias": full.head.bias.detach()})
    assert torch.equal(head.head.weight, full.head.weight)
