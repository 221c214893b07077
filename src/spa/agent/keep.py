"""The per-turn labels that pick which played turns become training examples (``keep``).

Self-play data (:mod:`spa.worldmodel.selfplay`) and expert iteration
(:mod:`spa.rl.expert_iteration`) keep a turn when its label passes; reports name the
rounds of expert iteration by the label's signal. Every fact about a label lives in its
:class:`KeepFilter` entry of :data:`FILTERS`, and the config checks, the reports' learner
names and the commands' help are read from there, so a new label is one entry here plus
whatever it does that no label did before.

The signals: ``outcome`` is the episode's success, the task's own sparse reward; ``solver``
a shortest solution's first move, an oracle's label, so that training on it is imitation
and the tables say so; ``value`` the highest Monte-Carlo value under random continuation
on copies of the environment (:mod:`spa.agent.labels`), the task's reward again; ``none``
keeps every turn. ``spa compare`` pairs runs of expert iteration only with runs of the
same signal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from spa.agent.prompts import MODES
from spa.agent.trajectory import Trajectory, Turn
from spa.envs import env_names, has_solver, lists_actions

SIGNALS = ("none", "outcome", "solver", "value")


@dataclass(frozen=True)
class KeepFilter:
    """One label: what it keeps, what it needs and how the tables name training on it."""

    name: str
    signal: str  # one of SIGNALS: what decides a turn, and which runs `spa compare` pairs
    help: str  # one line: the turns it keeps, for the commands' and recipes' help
    predicate: Callable[[Trajectory, Turn], bool]  # on a well-formed turn, after its labels are set
    learner: str | None = None  # the rounds of expert iteration on it, as the tables name them; None: none
    modes: tuple[str, ...] = MODES  # the prompt modes whose turns it can keep
    modes_why: str = ""  # after "(mode=M": why the modes not in ``modes`` are refused
    cut_answer: bool = False  # the answer is cut to its leading best actions (Turn.best_run)
    own_states: bool = False  # the model's own states are trained, the wrong ones masked out of the loss

    def __post_init__(self) -> None:
        if self.signal not in SIGNALS:
            raise ValueError(f"signal={self.signal!r} of keep={self.name!r}; valid: {', '.join(SIGNALS)}")
        if (self.learner is None) != (self.signal == "none"):
            raise ValueError(f"keep={self.name!r}: a label that filters names its learner, and only such a one")
        if not set(self.modes) <= set(MODES) or (self.modes != MODES) != bool(self.modes_why):
            raise ValueError(f"keep={self.name!r}: modes among {', '.join(MODES)}, and a reason where some are refused")

    @property
    def filters(self) -> bool:
        """Whether it drops turns at all; expert iteration needs a label that does."""
        return self.signal != "none"

    @property
    def needs_solver(self) -> bool:
        """Whether it reads ``Turn.best_first``, which only an environment with ``best_actions`` sets."""
        return self.signal == "solver"

    @property
    def lists_actions(self) -> bool:
        """Whether it needs ``legal_actions``: the look-ahead tries every action of a state."""
        return self.signal == "value"

    def kept(self, trajectory: Trajectory, turn: Turn) -> bool:
        """Whether a well-formed turn passes. A solver's label is checked here, per turn,
        rather than when the config is made: an environment with a solver still leaves
        ``best_first`` None where a state has no solution, and such a turn just goes."""
        if self.needs_solver and turn.best_first is None and not has_solver(trajectory.env):
            raise ValueError(f"keep={self.name!r} needs a solver, and {trajectory.env} has none (best_actions)")
        return self.predicate(trajectory, turn)

    def check_mode(self, mode: str) -> None:
        if mode not in self.modes:
            raise ValueError(f"keep={self.name!r} needs mode={_either(self.modes)} (mode={mode!r} {self.modes_why})")

    def check_env(self, env: str) -> None:
        if self.lists_actions and not lists_actions(env):
            listing = [name for name in env_names() if lists_actions(name)]
            raise ValueError(f"keep={self.name!r} needs an environment that lists its actions (legal_actions); "
                             f"{env} does not. Valid: {', '.join(listing)}")

    def describe(self) -> str:
        """``name (limits): help``, the limits being the prompt modes and environments it needs."""
        limits = [f"mode {' or '.join(self.modes)}"] if self.modes != MODES else []
        if self.lists_actions:
            limits.append("an environment that lists its actions: "
                          + ", ".join(name for name in env_names() if lists_actions(name)))
        return self.name + (f" ({'; '.join(limits)})" if limits else "") + f": {self.help}"


def _either(values: tuple[str, ...]) -> str:
    return " or ".join(repr(value) for value in values)


def _best_first(trajectory: Trajectory, turn: Turn) -> bool:
    # None with a solver: no solution from this state (a Sokoban box pushed into a
    # corner) or none within the search budget, so no move is best and the turn goes.
    return bool(turn.best_first)


_SOLVER_LEARNER = "solver-label rounds"  # imitation of an oracle, whichever part of its label is kept

FILTERS: dict[str, KeepFilter] = {f.name: f for f in (
    KeepFilter("all", "none", "every well-formed turn", lambda trajectory, turn: True),
    KeepFilter("winners", "outcome", "the turns of episodes that succeeded, the task's reward alone",
               lambda trajectory, turn: trajectory.success, learner="winner rounds"),
    KeepFilter("best", "solver", "the turns whose first action begins a shortest solution, a solver's label",
               _best_first, learner=_SOLVER_LEARNER),
    KeepFilter("best_prefix", "solver", "the best turns, the answer cut to its leading best actions so that no "
               "unlabelled move rides along", _best_first, learner=_SOLVER_LEARNER, modes=("base", "state"),
               modes_why="predicts the state after all the answer's actions, which a cut answer would no longer "
                         "match", cut_answer=True),
    KeepFilter("best_grounded", "solver", "the best turns as written, each own observation and prediction in the "
               "loss only where right: VAGEN's reward for grounded states as a loss mask", _best_first,
               learner=_SOLVER_LEARNER, modes=("world_model",),
               modes_why="writes no observation or prediction to check", own_states=True),
    KeepFilter("value", "value", "the turns whose first action is best by Monte-Carlo value, the task's reward "
               "under random continuation on copies of the environment; no solver",
               lambda trajectory, turn: bool(turn.value_first), learner="Monte-Carlo-value rounds"),
)}

#: Every label's name, in the order the help lists them.
KEEP = tuple(FILTERS)
#: The labels that drop turns: the ones expert iteration can train on.
LABELLED = tuple(name for name, f in FILTERS.items() if f.filters)


def keep_filter(name: str, allowed: tuple[str, ...] = KEEP) -> KeepFilter:
    """The entry of ``name``; a name not in ``allowed`` is an error listing the valid ones."""
    if name not in allowed:
        raise ValueError(f"keep={name!r} is not allowed; valid: {', '.join(allowed)}")
    return FILTERS[name]


def keep_help(names: tuple[str, ...] = KEEP) -> str:
    """The labels ``names`` for a command's or recipe's help, one clause each."""
    return "; ".join(FILTERS[name].describe() for name in names) + "."
