import math

import torch

from spa.eval.perplexity import _scored_tokens, sample_states, state_perplexity


def full_forward_ppl(model, tokenizer, envs, mode):
    """Reference: one plain forward pass per state over the whole prompt."""
    nll, count = 0.0, 0
    for env in envs:
        ids, scored = _scored_tokens(tokenizer, env, mode)
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
        logprobs = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        mask = torch.tensor(scored[1:])
        nll -= logprobs[mask].sum().item()
        count += int(mask.sum())
    return math.exp(nll / count), count


def test_scored_tokens_cover_exactly_the_state(tiny):
    _, tokenizer = tiny
    (env,) = sample_states("sokoban", 1)
    for mode, state in (("base", env.render()), ("state", env.state_text())):
        ids, scored = _scored_tokens(tokenizer, env, mode)
        text = tokenizer.decode([i for i, s in zip(ids, scored) if s])
        assert text.strip() == state.strip()


def test_prefix_cached_ppl_equals_full_forward(tiny):
    model, tokenizer = tiny
    for name in ("sokoban", "frozenlake", "sudoku"):
        envs = sample_states(name, 4)
        for structured, mode in ((False, "base"), (True, "state")):
            result = state_perplexity(model, tokenizer, envs, structured=structured)
            reference, count = full_forward_ppl(model, tokenizer, envs, mode)
            assert result["state_tokens"] == count
            assert math.isclose(result["ppl"], reference, rel_tol=1e-4)


def test_structured_states_have_more_tokens(tiny):
    model, tokenizer = tiny
    envs = sample_states("frozenlake", 3)
    raw = state_perplexity(model, tokenizer, envs, structured=False)
    structured = state_perplexity(model, tokenizer, envs, structured=True)
    assert structured["state_tokens"] > raw["state_tokens"] and raw["states"] == 3
