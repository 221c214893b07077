"""What a rollout records: a :class:`Turn` per assistant turn, a :class:`Trajectory` per episode.

Plain data, apart from the loop that plays them (:mod:`spa.agent.rollout`), so that the
code that stores, labels, scores or trains on turns (:mod:`spa.agent.turnlog`,
:mod:`spa.agent.labels`, evaluation, RL) reads them without importing the rollout.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class Turn:
    """One assistant turn: what was asked, what was answered, what happened."""

    prompt_messages: list[dict]
    prompt_ids: list[int]
    response: str
    response_ids: list[int]
    logprobs: list[float]  # sampling log-prob of each response token
    finish_reason: str
    think: str
    observation: str
    prediction: str
    answer: str
    actions: list[str]
    actions_valid: list[bool]
    format_ok: bool
    state_before: str  # grid + coordinates before the turn
    grid_before: str
    state_after: str  # grid + coordinates after the turn's actions
    grid_after: str
    env_reward: float  # sum of the environment's rewards over the turn's actions
    reward: float  # env_reward plus the format penalty, if any
    # Whether the first action begins a shortest solution from state_before (TextEnv.best_actions);
    # None where the env has no solver. Defaulted so trajectories saved without it still load.
    best_first: bool | None = None
    # How many of the turn's leading played actions each began a shortest solution from the
    # state it was taken in (0 when the first did not); None where the env has no solver.
    best_run: int | None = None
    # Whether the first action is among the best by Monte-Carlo value under random continuation
    # (spa.agent.labels.label_turns); None until labelled, which only keep="value" asks for.
    value_first: bool | None = None

    @property
    def any_valid(self) -> bool:
        return any(self.actions_valid)

    @classmethod
    def from_json(cls, record: dict) -> Turn:
        """The turn an ``asdict`` record describes (keys it does not know are ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in names})


@dataclass
class Trajectory:
    """One episode of one environment."""

    env: str
    env_config: dict[str, Any]
    seed: int
    group: int  # index of the seed in the rollout: samples of a group share a level
    sample: int
    mode: str
    turns: list[Turn] = field(default_factory=list)
    success: bool = False
    terminated: bool = False

    @property
    def total_reward(self) -> float:
        return sum(turn.reward for turn in self.turns)

    @property
    def num_actions(self) -> int:
        return sum(len(turn.actions_valid) for turn in self.turns)

    def to_json(self) -> dict:
        record = asdict(self)
        record["total_reward"] = self.total_reward
        return record

    @classmethod
    def from_json(cls, record: dict) -> Trajectory:
        """The trajectory a :meth:`to_json` record (a line of ``trajectories.jsonl``) describes."""
        names = {f.name for f in fields(cls)} - {"turns"}
        return cls(**{k: v for k, v in record.items() if k in names},
                   turns=[Turn.from_json(turn) for turn in record["turns"]])

