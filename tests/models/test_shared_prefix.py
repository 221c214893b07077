"""Running the batch's shared prompt prefix once gives the numbers of a full forward pass."""

import copy

import pytest
import torch

import spa.models.shared_prefix as shared
from spa.rl.batch import Sample, collate, policy_forward
from spa.worldmodel.selfplay import SelfPlayConfig, build_examples, collect
from spa.worldmodel.sft import collate as sft_collate
from spa.worldmodel.sft import masked_lm_loss
from spa.worldmodel.tokenize import tokenize_example


@pytest.fixture
def without_prefix(monkeypatch):
    """Switch the shared-prefix path off (the reference: one plain forward pass)."""
    def off():
        monkeypatch.setattr(shared, "shared_prefix_length", lambda *args: 0)
    return off


def sft_batch(tokenizer):
    config = SelfPlayConfig(env="frozenlake", episodes=4, samples=2, max_turns=2, exploration="random")
    examples, _ = build_examples(collect(None, tokenizer, config), config)
    tokenized = [tokenize_example(tokenizer, e["messages"], e["response"]) for e in examples[:4]]
    return sft_collate(tokenized, tokenizer.pad_token_id)


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_sft_loss_and_gradients_match_a_full_forward(tiny, without_prefix):
    model, tokenizer = tiny
    batch = sft_batch(tokenizer)
    assert shared.shared_prefix_length(*batch) >= 100  # the rules and format of the system prompt
    a = copy.deepcopy(model)
    loss_a, count_a = masked_lm_loss(a, *batch)
    loss_a.backward()
    without_prefix()
    b = copy.deepcopy(model)
    loss_b, count_b = masked_lm_loss(b, *batch)
    loss_b.backward()
    assert count_a == count_b
    torch.testing.assert_close(loss_a, loss_b, atol=1e-4, rtol=1e-5)
    ga, gb = grads(a), grads(b)
    assert ga.keys() == gb.keys()
    for name in ga:
        torch.testing.assert_close(ga[name], gb[name], atol=1e-5, rtol=1e-4, msg=name)


def test_policy_log_probs_and_entropies_match_a_full_forward(tiny, without_prefix):
    model, tokenizer = tiny
    prompt = list(range(100, 140))  # a 40-token prompt every turn shares
    samples = [Sample(prompt + [7] * n, len(prompt), torch.zeros(n), 0, k) for k, n in enumerate((3, 5, 2))]
    batch = collate(samples, pad_id=0)
    assert shared.shared_prefix_length(*batch) == 39
    with torch.no_grad():
        logprobs, entropy, mask = policy_forward(model, *batch)
        without_prefix()
        logprobs_full, entropy_full, mask_full = policy_forward(model, *batch)
    assert torch.equal(mask, mask_full)
    torch.testing.assert_close(logprobs[mask], logprobs_full[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy[mask], entropy_full[mask], atol=1e-5, rtol=1e-5)


def test_prefix_stops_before_padding_and_targets():
    ids = torch.arange(40).repeat(3, 1)
    attention = torch.ones(3, 40, dtype=torch.long)
    mask = torch.zeros(3, 40, dtype=torch.bool)
    mask[1, 30:] = True  # the first trained token is 30, predicted from position 29
    assert shared.shared_prefix_length(ids, attention, mask) == 29
    ids[2, 20] = 999
    assert shared.shared_prefix_length(ids, attention, mask) == 20
    ids[2, 10] = 999
    assert shared.shared_prefix_length(ids, attention, mask) == 0  # too short to pay off
    assert shared.shared_prefix_length(ids[:1], attention[:1], mask[:1]) == 0  # one row: nothing to share
