"""A short self-play demonstration: the model plays a few turns in world-model mode.

This is the smallest complete loop: prompt -> sampled response -> parsed actions ->
environment steps. It plays one episode at a time with ``model.generate``; the batched
rollout engine is what training uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spa.agent.parsing import parse_response
from spa.agent.prompts import build_messages
from spa.envs.base import TextEnv


@dataclass
class DemoTurn:
    """What happened in one turn of the demo."""

    state: str
    response: str
    actions: list[str]
    rewards: list[float]
    format_ok: bool
    next_state: str


def play_episode(
    model,
    tokenizer,
    env: TextEnv,
    seed: int,
    mode: str = "world_model",
    max_turns: int = 3,
    max_actions: int = 3,
    max_new_tokens: int = 200,
    temperature: float = 1.0,
) -> tuple[list[DemoTurn], bool]:
    """Play one episode; returns the turns and whether the task was solved."""
    env.reset(seed=seed)
    turns: list[DemoTurn] = []
    generator_seed = torch.Generator().manual_seed(seed)
    for turn in range(max_turns):
        messages = build_messages(env, mode, max_actions, turn)
        inputs = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        ).to(model.device)
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator_seed)))
        output = model.generate(
            **inputs, max_new_tokens=max_new_tokens, do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None, top_p=1.0, top_k=0,
        )
        response = tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        parsed = parse_response(response, world_model=mode == "world_model", max_actions=max_actions)
        state, rewards, done = env.state_text(), [], False
        for action in parsed.actions:
            _, reward, terminated, truncated, info = env.step(action)
            rewards.append(reward)
            done = terminated or truncated
            if done:
                break
        turns.append(DemoTurn(state, response, parsed.actions, rewards, parsed.format_ok, env.state_text()))
        if done:
            break
    return turns, env.is_success()
