"""Prompts for the three agent modes, rendered through the model's chat template.

* ``base``: rules and the raw grid; the model answers ``<think>..</think><answer>..</answer>``.
* ``state``: as ``base``, with the coordinate description after the grid (the paper's
  state estimation, ``s_t = concat(s'_t, b_t)``).
* ``world_model``: as ``state``, and the model writes ``<observation>`` (the current
  state) and ``<prediction>`` (the state after its actions) inside ``<think>``.
"""

from __future__ import annotations

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


def state_block(env: TextEnv, mode: str) -> str:
    """The state as the prompt shows it: the raw grid, plus coordinates beyond ``base``."""
    return env.render() if check_mode(mode) == "base" else env.state_text()


def system_prompt(env: TextEnv, mode: str, max_actions: int) -> str:
    """Rules of the environment and the answer format of ``mode``."""
    return (
        f"{env.rules()}\n\n"
        f"You may give up to {max_actions} action(s) per turn, separated by "
        f"'{ACTION_SEPARATOR}'. Answer in exactly this format:\n{_FORMATS[check_mode(mode)]}"
    )


def turn_message(env: TextEnv, mode: str, turn: int) -> str:
    """The user message of one turn: the current state."""
    return f"Turn {turn + 1}. Current state:\n{state_block(env, mode)}"


def build_messages(env: TextEnv, mode: str, max_actions: int, turn: int = 0) -> list[dict]:
    """Chat messages for the current turn of ``env`` (no history)."""
    return [
        {"role": "system", "content": system_prompt(env, mode, max_actions)},
        {"role": "user", "content": turn_message(env, mode, turn)},
    ]
