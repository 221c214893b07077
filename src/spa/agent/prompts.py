"""Prompts for the three agent modes, rendered through the model's chat template.

* ``base``: rules and the raw grid; the model answers ``<think>..</think><answer>..</answer>``.
* ``state``: as ``base``, with the coordinate description after the grid (the paper's
  state estimation, ``s_t = concat(s'_t, b_t)``).
* ``world_model``: as ``state``, and the model writes ``<observation>`` (the current
  state) and ``<prediction>`` (the state after its actions) inside ``<think>``.

The system message shows the answer format as one concrete answer, never placeholders
(SmolLM2-135M copies placeholders such as "your actions" literally, as RAGEN's and the
SPA release's prompts avoid): real actions of the environment and, in ``world_model``
mode, real states of a fixed example level written exactly as the SFT data writes them
(:func:`format_example`).

A multi-turn prompt is the system message, then for each earlier turn kept in the
history a user message (that turn's state) and the assistant's answer, then the
current state. ``history_turns`` says how many earlier turns are kept: 0 (the default)
keeps none, which suits these fully observable environments and keeps prompts short on
a CPU; ``None`` keeps the whole episode.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

import numpy as np

from spa.agent.parsing import ACTION_SEPARATOR
from spa.envs.base import TextEnv

MODES = ("base", "state", "world_model")

#: The level the format example is played on: beyond the training and evaluation seed
#: ranges (spa.agent.seeds), so it is no level a run trains or is evaluated on.
EXAMPLE_SEED = 20_000_000
_EXAMPLE_ACTIONS = 2  # actions in the example answer (fewer if the per-turn cap is lower)
_EXAMPLE_TRIES = 500
_EXAMPLES: dict[tuple, tuple[str, list[str], str]] = {}  # (class, repr(options), actions) -> turn

_INSTRUCTIONS = {
    "base": "",
    "state": "",
    "world_model": ("Inside <think>, first write the current state in <observation> (grid, then "
                    "coordinates), then your reasoning, then the state after your actions in <prediction>. "),
}


def check_mode(mode: str) -> str:
    """Return ``mode`` or raise an error listing the valid modes."""
    if mode not in MODES:
        raise ValueError(f"unknown prompt mode {mode!r}; valid modes: {', '.join(MODES)}")
    return mode


@dataclass
class PromptConfig:
    """How the agent is prompted and how much it may do per turn."""

    mode: str = field(default="world_model", metadata={"help": "Prompt mode: base, state or world_model."})
    max_turns: int = field(default=5, metadata={"help": "Turns per episode (paper: 5)."})
    max_actions_per_turn: int = field(default=3, metadata={"help": (
        "Actions per turn, joined by '||' in the answer; extra ones are dropped.")})
    history_turns: int | None = field(default=0, metadata={"help": (
        "Earlier turns kept in the prompt; None keeps the whole episode.")})

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
    """Rules of the environment and the answer format of the mode, shown by an example."""
    example = format_example(env, config.mode, min(_EXAMPLE_ACTIONS, config.max_actions_per_turn))
    level = " (with your own states)" if config.world_model else ""
    return (
        f"{env.rules()}\n\n"
        f"You may give up to {config.max_actions_per_turn} action(s) per turn, separated by "
        f"'{ACTION_SEPARATOR}'. {_INSTRUCTIONS[config.mode]}"
        f"Answer in exactly this format, as in this example{level}:\n{example}"
    )


def format_example(env: TextEnv, mode: str, actions: int = _EXAMPLE_ACTIONS) -> str:
    """One complete, correct answer in ``mode``'s format, e.g. in ``base`` mode
    ``<think>I will play Right then Down.</think><answer>Right || Down</answer>``.

    The actions are real ones played on the example level of ``env``'s class and
    options (:data:`EXAMPLE_SEED`); in ``world_model`` mode the observation and the
    prediction are that level's true states before and after them, in the prompt's state
    format (grid, then coordinates), as the ground-truth SFT data writes them. The same
    options always give the same example, so every prompt of a run shares one system
    message (prefilled once).
    """
    before, played, after = example_turn(env, actions)
    joined = f" {ACTION_SEPARATOR} ".join(played)
    reasoning = f"I will play {' then '.join(played)}."
    if check_mode(mode) == "world_model":
        think = f"<observation>{before}</observation> {reasoning} <prediction>{after}</prediction>"
    else:
        think = reasoning
    return f"<think>{think}</think><answer>{joined}</answer>"


def example_turn(env: TextEnv, actions: int = _EXAMPLE_ACTIONS) -> tuple[str, list[str], str]:
    """(state before, actions, state after) of the example level of ``env``'s class and
    options, in the state format (grid, then coordinates); cached, so every prompt that
    shows it (the agent's format example, RWML's worked example) shows the same turn."""
    config = _example_config(env.config)
    key = (type(env), repr(config), actions)  # env configs are mutable dataclasses: no hash
    if key not in _EXAMPLES:
        _EXAMPLES[key] = _example_turn(type(env), config, actions)
    return _EXAMPLES[key]


def _example_config(config):
    """The environment's options for the example: its slippery dynamics switched off, so the
    example shows each action's intended effect rather than a slide."""
    if dataclasses.is_dataclass(config) and any(f.name == "is_slippery" for f in dataclasses.fields(config)):
        return dataclasses.replace(config, is_slippery=False)
    return config


def _example_turn(cls: type[TextEnv], config, actions: int) -> tuple[str, list[str], str]:
    """(state before, actions, state after) of a turn on the example level: random valid
    actions (a fixed stream) until each one leads to a state not seen before in the turn
    (no wall bumps, no "Right then Left" that a copied observation would predict) without
    ending the episode and, where the environment knows the solution (Sudoku), writes a
    correct digit. The stream's first actions stand if no such turn turns up."""
    rng = np.random.default_rng(0)
    start = cls(config)
    start.reset(seed=EXAMPLE_SEED)
    fallback = None
    for _ in range(_EXAMPLE_TRIES):
        env = copy.deepcopy(start)  # a level can take seconds to generate (9x9 Sudoku)
        seen, played, good = {env.render()}, [], True
        for _ in range(actions):
            action = env.random_action(rng)
            _, _, terminated, truncated, info = env.step(action)
            played.append(action)
            good = (good and info["action_valid"] and env.render() not in seen and not (terminated or truncated)
                    and _agrees_with_solution(env))
            seen.add(env.render())
        if good:
            return start.state_text(), played, env.state_text()
        fallback = fallback or (start.state_text(), played, env.state_text())
    return fallback


def _agrees_with_solution(env: TextEnv) -> bool:
    """No filled cell contradicts the solution (environments with a ``solution``: Sudoku)."""
    solution = getattr(env, "solution", None)
    if solution is None:
        return True
    return all(v in (0, s) for row, sol in zip(env.board, solution) for v, s in zip(row, sol))


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
