"""Prompts for the three agent modes, rendered through the model's chat template.

* ``base``: rules and the raw grid; the model answers ``<think>..</think><answer>..</answer>``.
* ``state``: as ``base``, with the coordinate description after the grid (the paper's
  state estimation, ``s_t = concat(s'_t, b_t)``).
* ``world_model``: as ``state``, and the model writes ``<observation>`` (the current
  state) and ``<prediction>`` (the state after its actions) inside ``<think>``.

A multi-turn prompt is the system message, then for each earlier turn kept in the
history a user message (that turn's state) and the assistant's answer, then the
current state. ``history_turns`` says how many earlier turns are kept: 0 (the default)
keeps none, which suits these fully observable environments and keeps prompts short on
a CPU; ``None`` keeps the whole episode.
"""

from __future__ import annotations

from dataclasses import dataclass

from spa.agent.parsing import ACTION_SEPARATOR
from spa.envs.base import TextEnv

MODES = ("base", "state", "world_model")

_FORMATS = {
    "base": "<think>your reasoning</think><answer>your actions</answer>",
    "state": "<think>your reasoning</think><answer>your actions</answer>",
    "world_model": (
        "<think><observation>the current state, grid then coordinates</observation> "
        "your reasoning <prediction>the state after your actions, grid then coordinates"
        "</prediction></think><answer>your actions</answer>"
    ),
}


def check_mode(mode: str) -> str:
    """Return ``mode`` or raise an error listing the valid modes."""
    if mode not in MODES:
        raise ValueError(f"unknown prompt mode {mode!r}; valid modes: {', '.join(MODES)}")
    return mode


@dataclass
class PromptConfig:
    """How the agent is prompted and how much it may do per turn."""

    mode: str = "world_model"  # base | state | world_model
    max_turns: int = 5  # turns per episode (paper: 5)
    max_actions_per_turn: int = 3  # actions per answer, joined by '||'; extra ones are dropped
    history_turns: int | None = 0  # earlier turns kept in the prompt; None keeps the episode

    def __post_init__(self) -> None:
        check_mode(self.mode)
        for name in ("max_turns", "max_actions_per_turn"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be at least 1")
        if self.history_turns is not None and self.history_turns < 0:
            raise ValueError(f"history_turns={self.history_turns!r} must be >= 0 or None")

    @property
    def world_model(self) -> bool:
        return self.mode == "world_model"


def state_block(env: TextEnv, mode: str) -> str:
    """The state as the prompt shows it: the raw grid in ``base``, grid + coordinates otherwise."""
    return env.render() if check_mode(mode) == "base" else env.state_text()


def system_prompt(env: TextEnv, config: PromptConfig) -> str:
    """Rules of the environment and the answer format of the mode."""
    return (
        f"{env.rules()}\n\n"
        f"You may give up to {config.max_actions_per_turn} action(s) per turn, separated by "
        f"'{ACTION_SEPARATOR}'. Answer in exactly this format:\n{_FORMATS[config.mode]}"
    )


def turn_message(state: str, turn: int, reward: float | None = None) -> str:
    """The user message of one turn: last turn's reward (after the first turn) and the state."""
    feedback = "" if reward is None else f"Reward from your last turn: {reward:g}.\n"
    return f"{feedback}Turn {turn + 1}. Current state:\n{state}"


def build_messages(
    env: TextEnv,
    config: PromptConfig,
    history: list[tuple[str, str, float]] = (),
) -> list[dict]:
    """Chat messages for the current turn of ``env``.

    ``history`` holds ``(state shown, assistant response, reward)`` of the episode's
    earlier turns, oldest first; the last ``config.history_turns`` of them are kept.
    """
    kept = len(history) if config.history_turns is None else min(config.history_turns, len(history))
    keep = list(history)[len(history) - kept:]
    first = len(history) - len(keep)
    messages = [{"role": "system", "content": system_prompt(env, config)}]
    previous_reward = history[first - 1][2] if first > 0 else None
    for i, (state, response, reward) in enumerate(keep):
        messages.append({"role": "user", "content": turn_message(state, first + i, previous_reward)})
        messages.append({"role": "assistant", "content": response})
        previous_reward = reward
    current = state_block(env, config.mode)
    messages.append({"role": "user", "content": turn_message(current, len(history), previous_reward)})
    return messages
