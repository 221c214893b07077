"""Gradient checkpointing changes the memory a step takes, not what it computes."""

import copy

import pytest
import torch

import spa.models.shared_prefix as shared
from spa.models.recompute import enable_recompute, recomputes
from spa.rl.batch import Sample, collate, policy_forward
from spa.worldmodel.selfplay import SelfPlayConfig, build_examples, collect
from spa.worldmodel.sft import SFTConfig, masked_lm_loss, train
from spa.worldmodel.sft import collate as sft_collate
from spa.worldmodel.tokenize import tokenize_example


def random_play_examples(tokenizer, episodes=8):
    config = SelfPlayConfig(env="frozenlake", episodes=episodes, samples=2, max_turns=2, exploration="random")
    return build_examples(collect(None, tokenizer, config), config)[0]


def sft_batch(tokenizer):
    """Four turns of random play: rows that share the system prompt."""
    examples = random_play_examples(tokenizer, episodes=4)[:4]
    return sft_collate([tokenize_example(tokenizer, e["messages"], e["response"]) for e in examples],
                       tokenizer.pad_token_id)


def step(model, loss_of) -> tuple[float, dict[str, torch.Tensor], float]:
    """One training pass: the loss, every parameter's gradient, and how often layer 0's MLP
    was called per call of the decoder (a pre-hook: the recompute stops inside the MLP,
    once it has what the backward needs; the shared prefix calls the decoder twice)."""
    calls = {"mlp": 0, "decoder": 0}

    def count(name):
        return lambda *args: calls.__setitem__(name, calls[name] + 1)

    hooks = [model.model.layers[0].mlp.register_forward_pre_hook(count("mlp")),
             model.get_decoder().register_forward_pre_hook(count("decoder"))]
    loss = loss_of(model)
    loss.backward()
    for hook in hooks:
        hook.remove()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}, calls["mlp"] / calls["decoder"]


def rl_batch(tokenizer):
    prompt = tokenizer("<|im_start|>user\nPush the box onto the target.<|im_end|>\n", add_special_tokens=False)
    answers = ["<answer>Up</answer>", "<think>left is a wall</think><answer>Right || Down</answer>"]
    samples = []
    for a in answers:
        response = tokenizer(a, add_special_tokens=False)["input_ids"]
        samples.append(Sample(prompt["input_ids"] + response, len(prompt["input_ids"]), torch.zeros(len(response)),
                              0, 0))
    return collate(samples, tokenizer.pad_token_id)


@pytest.mark.parametrize("loss", ["sft", "policy"])
def test_a_recomputed_step_has_the_loss_and_gradients_of_a_plain_one(tiny, loss):
    model, tokenizer = tiny
    if loss == "sft":
        batch = sft_batch(tokenizer)
        assert shared.shared_prefix_length(*batch) > 0  # which the recomputing pass runs whole

        def loss_of(m):
            total, count = masked_lm_loss(m, *batch)
            return total / count
    else:
        batch = rl_batch(tokenizer)

        def loss_of(m):
            logprobs, entropy, mask = policy_forward(m, *batch)
            return -(logprobs[mask].mean() + 0.01 * entropy[mask].mean())

    plain = copy.deepcopy(model).train()
    recomputing = copy.deepcopy(model).train()
    enable_recompute(recomputing)
    assert recomputes(recomputing.get_decoder()) and not recomputes(plain.get_decoder())
    loss_a, grads_a, runs_a = step(plain, loss_of)
    loss_b, grads_b, runs_b = step(recomputing, loss_of)
    assert (runs_a, runs_b) == (1, 2)  # the layer ran again in the backward pass
    assert loss_b == pytest.approx(loss_a, rel=1e-5)
    assert grads_a.keys() == grads_b.keys() and all(g is not None for g in grads_b.values())
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], atol=1e-6, rtol=1e-4, msg=name)
    with torch.no_grad():  # generation and validation keep the shared prefix and the cache
        recomputing.eval()
        assert not recomputes(recomputing.get_decoder())


def test_sft_with_gradient_checkpointing_trains_the_same_step(tiny, tmp_path):
    model, tokenizer = tiny
    examples = random_play_examples(tokenizer)
    weights, losses = [], []
    for on in (False, True):
        trained = copy.deepcopy(model)
        config = SFTConfig(lr=1e-3, epochs=1, batch_size=4, grad_accum=64, val_fraction=0.2, val_examples_generate=1,
                           val_max_new_tokens=4, precision="fp32", gradient_checkpointing=on)
        history = train(trained, tokenizer, examples, config, tmp_path / str(on), progress=False)
        assert trained.model.layers[0].gradient_checkpointing is on
        weights.append(torch.cat([p.detach().flatten() for p in trained.parameters()]))
        losses.append(history[-1]["train_loss"])
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert not torch.equal(weights[0], torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(weights[1], weights[0], atol=1e-6, rtol=1e-5)
