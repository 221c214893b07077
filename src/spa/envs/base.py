"""The text-environment protocol and the registry behind ``spa.envs.make``.

Every environment is a gymnasium ``Env`` whose observations and actions are text:

* ``reset(seed=...) -> (obs, info)``: deterministic for a given seed;
* ``step(action_text) -> (obs, reward, terminated, truncated, info)``: one action
  per call, read by one shared rule (:func:`clean_action`, :func:`match_name`): names
  case-insensitive, surrounding whitespace and trailing punctuation ignored, so
  ``" left. "`` is ``Left`` in every environment. An invalid or unparsable action
  changes nothing, does not count as a step, yields ``info["action_valid"] = False``
  and never raises;
* ``render() -> str``: the raw text grid (the paper's "raw state");
* ``describe() -> str``: the structured ``(row, col)`` description of the key entities
  (the paper's state-estimation text ``b_t``), 0-indexed unless the environment's
  actions name cells themselves: then it counts as they do (``coordinate_base``; Sudoku's
  ``r,c,v`` actions are 1-indexed, so is its description).

``best_actions()`` names the actions that begin a shortest solution from the current
state (moves taken as deterministic), in the spelling ``canonical_action`` gives any
accepted text; the per-turn "best first action" rate (``spa.eval.metrics``) compares the
two. An environment without a solver returns ``None``.

``info`` always carries ``action_valid`` and ``success``. Each environment
declares its options as a dataclass ``Config``; ``make`` turns keyword arguments
into that dataclass, so an unknown key is an error that lists the valid ones.
"""

from __future__ import annotations

import copy
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

#: Characters a grid or an action may contain; gymnasium's ``Text`` space needs a charset.
_CHARSET = "".join(chr(c) for c in range(32, 127)) + "√\n"

#: Punctuation a model puts after an action as if ending a sentence ("Left.", "Up!").
TRAILING_PUNCTUATION = ".,;:!?"


def clean_action(text: str) -> str:
    """``text`` without surrounding whitespace and trailing punctuation: what every
    environment parses, so they all accept the same spellings (FrozenLake once
    rejected ``Left.``, which Sokoban accepted). Leading punctuation is kept: ``.Left``
    is not a sentence ending and stays invalid."""
    # One backwards scan (linear even on adversarial text, unlike an end-anchored regex),
    # through any mix of whitespace and punctuation: "Left. !" and "Left.\u00a0." too.
    end = len(text)
    while end and (text[end - 1] in TRAILING_PUNCTUATION or text[end - 1].isspace()):
        end -= 1
    return text[:end].lstrip()


def match_name(text: str, names: Sequence[str]) -> str | None:
    """The one of ``names`` that ``text`` spells, ignoring case, surrounding whitespace
    and trailing punctuation (:func:`clean_action`); ``None`` when it spells none."""
    word = clean_action(text).lower()
    return next((name for name in names if name.lower() == word), None)


class TextEnv(gym.Env, ABC):
    """Base class of every environment: text in, text out.

    Subclasses set ``name``, ``Config`` (a dataclass whose fields have defaults and a
    ``metadata["help"]``), and ``action_help`` (one line telling the model how to write
    an action), and implement the abstract methods below.
    """

    name: ClassVar[str]
    Config: ClassVar[type]
    action_help: ClassVar[str]
    #: The index of the first row and column in ``describe()``. 0 (the paper's convention)
    #: unless actions name cells, which then share one convention with the description.
    coordinate_base: ClassVar[int] = 0
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}

    def __init__(self, config: Any = None) -> None:
        self.config = config if config is not None else self.Config()
        self.observation_space = spaces.Text(max_length=4096, charset=_CHARSET)
        self.action_space = spaces.Text(max_length=64, charset=_CHARSET)
        self.render_mode = "ansi"

    # -- the protocol (implemented here once; subclasses fill in the hooks below) ----
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """Start a new episode; the same seed always gives the same episode."""
        super().reset(seed=seed)
        self.steps = 0
        self._new_episode(self.np_random)
        return self.render(), {"action_valid": True, "success": False}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        """Apply one text action; never raises, whatever the text.

        An unparsable or illegal action changes nothing and does not count as a step.
        The episode is truncated after ``config.max_steps`` valid steps.
        """
        parsed = self._parse_action(action) if isinstance(action, str) else None
        if parsed is None:
            return self._invalid(action, "unparsable action; " + self.action_help)
        outcome = self._apply(parsed)
        if isinstance(outcome, str):
            return self._invalid(action, outcome)
        reward, terminated = outcome
        truncated = self._count_step(terminated)
        info = {"action_valid": True, "success": self.is_success(), "action": parsed}
        return self.render(), float(reward), terminated, truncated, info

    def best_actions(self) -> frozenset[str] | None:
        """The actions, in :meth:`canonical_action`'s spelling, that begin a shortest
        solution from the current state, as if every move went where intended (slips
        ignored); ``None`` when the environment has no solver, the episode has ended, or no
        solution exists or was found within the solver's budget."""
        return None

    #: The attributes an episode changes in place (a set of boxes, a board), which
    #: :meth:`fork` must copy; ``None``: copy every attribute of the episode (safe, slower).
    #: Attributes only ever reassigned (a position tuple) are shared until reassigned.
    _mutable_state: ClassVar[tuple[str, ...] | None] = None

    def legal_actions(self) -> tuple[str, ...] | None:
        """Every action worth trying in the current state, canonically spelt, for look-ahead
        that compares them all (``spa.envs.lookahead``); ``None`` where the environment does not
        list them."""
        return None

    def fork(self, rng: np.random.Generator) -> TextEnv:
        """A copy of the episode in its current state that draws its own randomness (slips)
        from ``rng``; playing it leaves this environment as it was. The configuration and
        spaces are shared, the episode's state is copied."""
        twin = copy.copy(self)
        mutable = self._mutable_state
        for name, value in vars(self).items():
            if name not in _SHARED_ATTRIBUTES and (mutable is None or name in mutable):
                setattr(twin, name, copy.deepcopy(value))
        twin._np_random = rng
        return twin

    def simulate(self, action: str) -> tuple[float, bool]:
        """:meth:`step` without the observation text and info, for fast look-ahead on a
        :meth:`fork`: ``(reward, ended)``, ``ended`` once the episode terminated or was
        truncated. An invalid action changes nothing and gives ``(0.0, False)``."""
        parsed = self._parse_action(action)
        outcome = None if parsed is None else self._apply(parsed)
        if outcome is None or isinstance(outcome, str):
            return 0.0, False
        reward, terminated = outcome
        truncated = self._count_step(terminated)
        return float(reward), terminated or truncated

    def _count_step(self, terminated: bool) -> bool:
        """Count a valid step; whether it truncates the episode (``config.max_steps`` reached)."""
        self.steps += 1
        return not terminated and self.steps >= self.config.max_steps

    def canonical_action(self, text: str) -> str | None:
        """The one spelling of the action ``text`` names (``" left. "`` -> ``"Left"``), the
        one ``best_actions`` uses; ``None`` when ``text`` names no action."""
        parsed = self._parse_action(text) if isinstance(text, str) else None
        return None if parsed is None else self._action_text(parsed)

    def _action_text(self, action: Any) -> str:
        """The canonical text of a parsed action: named actions are their own spelling."""
        return str(action)

    def state_text(self) -> str:
        """The full state as the agent sees it in ``state`` mode: grid, then coordinates."""
        return f"{self.render()}\n{self.describe()}"

    # -- hooks --------------------------------------------------------------------
    @abstractmethod
    def _new_episode(self, rng: np.random.Generator) -> None:
        """Generate a fresh episode from ``rng`` (seeded by ``reset``)."""

    @abstractmethod
    def _parse_action(self, text: str) -> Any | None:
        """The action ``text`` names, or ``None``; must not raise on any string.

        Read ``text`` through :func:`clean_action` (or :func:`match_name` for named
        actions), so that every environment tolerates the same noise around an action."""

    @abstractmethod
    def _apply(self, action: Any) -> tuple[float, bool] | str:
        """Apply a parsed action: ``(reward, terminated)``, or a reason it is illegal."""

    @abstractmethod
    def random_action(self, rng: np.random.Generator) -> str:
        """A random action that is valid in the current state (random exploration)."""

    @abstractmethod
    def is_success(self) -> bool:
        """Whether the task is solved in the current state."""

    @abstractmethod
    def render(self) -> str:
        """The raw text grid of the current state."""

    @abstractmethod
    def describe(self) -> str:
        """The (row, col) coordinate description of the key entities, from ``coordinate_base``."""

    @abstractmethod
    def rules(self) -> str:
        """A short statement of the task, the symbols and the actions, for prompts."""

    def _invalid(self, action: Any, reason: str) -> tuple[str, float, bool, bool, dict]:
        """The step result of an action that could not be applied: nothing changes."""
        info = {"action_valid": False, "success": self.is_success(), "reason": reason,
                "action": action}
        return self.render(), 0.0, False, False, info


#: Attributes a :meth:`TextEnv.fork` shares with its original instead of copying: fixed for
#: the environment's life (the random generator is replaced).
_SHARED_ATTRIBUTES = frozenset({"config", "observation_space", "action_space", "render_mode", "_np_random"})


# -- registry -----------------------------------------------------------------------

_REGISTRY: dict[str, type[TextEnv]] = {}


def register(cls: type[TextEnv]) -> type[TextEnv]:
    """Class decorator adding an environment to the registry under ``cls.name``."""
    if cls.name in _REGISTRY:
        raise ValueError(f"environment {cls.name!r} is already registered")
    _REGISTRY[cls.name] = cls
    return cls


def has_solver(name: str) -> bool:
    """Whether environment ``name`` implements :meth:`TextEnv.best_actions`."""
    return env_class(name).best_actions is not TextEnv.best_actions


def lists_actions(name: str) -> bool:
    """Whether environment ``name`` implements :meth:`TextEnv.legal_actions`."""
    return env_class(name).legal_actions is not TextEnv.legal_actions


def env_names() -> list[str]:
    """Names accepted by ``make``, sorted."""
    return sorted(_REGISTRY)


def env_class(name: str) -> type[TextEnv]:
    """The class registered under ``name``; an unknown name lists the valid ones."""
    try:
        return _REGISTRY[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown environment {name!r}; valid names: {', '.join(env_names())}"
        ) from None


def make_config(name: str, **config: Any) -> Any:
    """Build the typed ``Config`` of environment ``name`` from keyword arguments."""
    cls = env_class(name)
    valid = [f.name for f in dataclasses.fields(cls.Config)]
    unknown = sorted(set(config) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for environment {cls.name!r}; "
            f"valid options: {', '.join(valid)}"
        )
    return cls.Config(**config)


def make(name: str, **config: Any) -> TextEnv:
    """Create environment ``name`` (``sokoban``, ``frozenlake``, ``sudoku``) with options."""
    return env_class(name)(make_config(name, **config))


def config_defaults(name: str) -> list[tuple[str, Any, str]]:
    """``(option, default, help)`` for every option of environment ``name``."""
    cls = env_class(name)
    return [
        (f.name, f.default, f.metadata.get("help", ""))
        for f in dataclasses.fields(cls.Config)
    ]


def field(default: Any, help: str) -> Any:  # noqa: A002 - mirrors dataclasses.field
    """A dataclass field with a default and a help text (shown by ``spa envs``)."""
    return dataclasses.field(default=default, metadata={"help": help})


def check_choice(option: str, value: Any, allowed: Any) -> None:
    """Raise a ``ValueError`` naming the bad value and what is allowed."""
    if value not in allowed:
        raise ValueError(f"{option}={value!r} is not allowed; valid values: {allowed}")


def check_range(option: str, value: Any, low: float, high: float) -> None:
    """Raise a ``ValueError`` unless ``low <= value <= high``."""
    if not (low <= value <= high):
        raise ValueError(f"{option}={value!r} is out of range; allowed: {low} to {high}")
