"""State perplexity, the paper's Table 1: how surprising the state text is to the model.

Definition used here. States are collected by random valid play from evaluation seeds.
For each state the prompt is the chat-templated system message (the environment's
rules and answer format) and the first user message, whose content ends with the
state. Only the state's own tokens are scored: with ``t_1..t_n`` those tokens and
``p`` everything before them,

    PPL = exp( sum over states and i of -log P(t_i | p, t_<i) / total state tokens )

(token-weighted over all states). The *raw* state is the grid alone (``base`` mode's
prompt); the *structured* state is the grid followed by the coordinate description
(``state`` mode's prompt). Token boundaries come from the tokenizer's offset mapping, so
a token is scored when its characters lie inside the state.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

from spa.agent.prompts import PromptConfig, build_messages
from spa.agent.seeds import eval_seeds
from spa.envs import make
from spa.envs.base import TextEnv
from spa.models.device import model_device
from spa.models.kv import cache_arg, returned_cache
from spa.models.tokens import encode_with_mask


def sample_states(env_name: str, num_states: int, env_config: dict | None = None,
                  steps_per_episode: int = 4, seed: int = 0) -> list[TextEnv]:
    """``num_states`` environments left in states reached by a few random valid actions."""
    rng = np.random.default_rng(seed)
    snapshots = []
    for env_seed in eval_seeds(num_states):
        env = make(env_name, **(env_config or {}))
        env.reset(seed=env_seed)
        _random_actions(env, rng, int(rng.integers(0, steps_per_episode + 1)))
        snapshots.append(env)
    return snapshots


def _random_actions(env: TextEnv, rng: np.random.Generator, count: int) -> None:
    """Play up to ``count`` random valid actions on ``env``, stopping at the episode's end."""
    for _ in range(count):
        _, _, terminated, truncated, _ = env.step(env.random_action(rng))
        if terminated or truncated:
            break


@torch.no_grad()
def state_perplexity(model, tokenizer, envs: list[TextEnv], structured: bool) -> dict:
    """Perplexity of the states of ``envs`` (raw grid, or grid + coordinates).

    All prompts share their beginning (the system message), so its KV cache is computed
    once and each state runs only its own tokens on top of it: the result is the same
    as a full forward pass per state, about ten times faster. Logits are computed only
    where a state token is predicted (the vocabulary projection dominates otherwise).
    """
    mode = "state" if structured else "base"
    examples = [_scored_tokens(tokenizer, env, mode) for env in envs]
    # The cached prefix is what all prompts share, and it must end before the first state
    # token's predecessor, whose output predicts that token (grids often share a first row).
    first_scored = min(scored.index(True) for _, scored in examples)
    shared = min(_common_prefix([ids for ids, _ in examples]), first_scored) - 1
    device = model_device(model)
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    cache = returned_cache(decoder(input_ids=torch.tensor([examples[0][0][:shared]], device=device),
                                   use_cache=True)) if shared > 0 else None
    total_nll, total_tokens = 0.0, 0
    for ids, scored in examples:
        rest = torch.tensor([ids[max(shared, 0):]], device=device)
        # A fresh copy of the prefix cache per state (the forward appends to it).
        past = copy.deepcopy(cache)
        hidden = decoder(input_ids=rest, use_cache=past is not None, **cache_arg(past)).last_hidden_state[0]
        # Token i of ``rest`` is predicted by the hidden state at i - 1.
        targets = torch.tensor(scored[max(shared, 0) + 1:], device=device)
        logits = head(hidden[:-1][targets]).float()
        picked = torch.tensor(ids[max(shared, 0) + 1:], device=device)[targets]
        total_nll -= torch.log_softmax(logits, dim=-1).gather(-1, picked[:, None]).sum().item()
        total_tokens += int(targets.sum())
    return {
        "ppl": math.exp(total_nll / max(total_tokens, 1)),
        "states": len(envs),
        "state_tokens": total_tokens,
    }


def _common_prefix(sequences: list[list[int]]) -> int:
    """Length of the longest prefix all ``sequences`` share."""
    shortest = min(sequences, key=len)
    for i, token in enumerate(shortest):
        if any(seq[i] != token for seq in sequences):
            return i
    return len(shortest)


def _scored_tokens(tokenizer, env: TextEnv, mode: str) -> tuple[list[int], list[bool]]:
    """Token ids of the templated prompt and, per token, whether it belongs to the state."""
    state = env.render() if mode == "base" else env.state_text()
    messages = build_messages(env, PromptConfig(mode=mode))
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    begin = text.rindex(state)
    encoded = encode_with_mask(tokenizer, text, [(begin, begin + len(state))])
    return encoded.input_ids, encoded.loss_mask
