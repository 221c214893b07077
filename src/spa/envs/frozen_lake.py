"""FrozenLake as a text environment: cross a slippery lake to the goal without falling in.

The dynamics are gymnasium's ``FrozenLake-v1``: actions Left/Down/Right/Up, moving into
the edge leaves the player in place, a hole or the goal ends the episode, reward 1 on
the goal and 0 otherwise. On slippery ice the intended move happens with probability
``success_rate`` and each perpendicular move with probability ``(1 - success_rate) / 2``;
``success_rate = 1/3`` is exactly ``FrozenLake-v1`` with ``is_slippery=True``.

Two departures from gymnasium, both for the LLM setting of the SPA paper:

* Random maps place the start and the goal on two random distinct tiles (gymnasium pins
  them to the corners). Episodes then differ in more than the hole pattern, so a policy
  cannot memorise "go down-right"; and because the goal may land next to the start, the
  "regenerate until solvable" loop ends quickly for any ``p``, even ``p = 0``.
* The default ``success_rate`` is 0.8, not 1/3: the paper does not state the value, and
  with 1/3 two moves in three go astray, so the next state a world model must predict is
  mostly noise and a 4x4 lake is rarely crossed. 0.8 keeps the ice slippery (one move in
  five slides) while planning still pays. Set ``success_rate=1/3`` for gymnasium's lake.

Grid symbols (the paper's): ``P`` player, ``_`` ice (the start tile included once the
player has left it), ``O`` hole, ``G`` goal, ``X`` player in a hole, ``√`` player on the
goal. A fixed map can be loaded in gymnasium's letters (``S`` start, ``F`` ice, ``H``
hole, ``G`` goal) through ``Config.desc`` or ``FrozenLakeEnv.from_desc``.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from spa.envs.base import TextEnv, check_range, field, match_name, register

Pos = tuple[int, int]

#: Action names in gymnasium's index order (0 Left, 1 Down, 2 Right, 3 Up), so the two
#: perpendicular moves of action ``i`` are ``(i - 1) % 4`` and ``(i + 1) % 4``.
ACTIONS: tuple[str, ...] = ("Left", "Down", "Right", "Up")
_MOVES: dict[str, Pos] = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}


def _check_int(option: str, value: Any, low: int, high: float) -> None:
    """Reject non-integers (bools included) before the range check, with a clear error."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{option}={value!r} must be an integer from {low} to {high}")
    check_range(option, value, low, high)


def _check_prob(option: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{option}={value!r} must be a number from 0 to 1")
    check_range(option, value, 0.0, 1.0)


def parse_desc(desc: str | Sequence[str]) -> list[str]:
    """Validate a map in gymnasium's letters and return its rows.

    ``desc`` is a list of rows or one string with rows joined by ``/``, e.g.
    ``"SFFF/FHFH/FFFH/HFFG"``. The map must be rectangular, at least 1x2, use only
    ``S F H G``, and hold exactly one ``S`` and one ``G``.
    """
    rows = desc.split("/") if isinstance(desc, str) else list(desc)
    rows = [row.strip().upper() for row in rows]
    if not rows or not rows[0] or any(len(row) != len(rows[0]) for row in rows):
        raise ValueError(f"desc={desc!r} must be non-empty rows of equal length")
    bad = sorted(set("".join(rows)) - set("SFHG"))
    if bad:
        raise ValueError(f"desc={desc!r} has invalid letter(s) {bad}; allowed: S, F, H, G")
    for letter, name in (("S", "start"), ("G", "goal")):
        count = "".join(rows).count(letter)
        if count != 1:
            raise ValueError(
                f"desc={desc!r} has {count} {letter!r} tiles; needs exactly one {name}"
            )
    return rows


def reachable(holes: np.ndarray, start: Pos, goal: Pos) -> bool:
    """Whether ``goal`` can be reached from ``start`` by 4-neighbour moves avoiding holes."""
    nrow, ncol = holes.shape
    seen = {start}
    queue = deque([start])
    while queue:
        row, col = queue.popleft()
        if (row, col) == goal:
            return True
        for dr, dc in _MOVES.values():
            nxt = (row + dr, col + dc)
            if 0 <= nxt[0] < nrow and 0 <= nxt[1] < ncol and not holes[nxt] and nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return False


def goal_distances(holes: np.ndarray, goal: Pos) -> dict[Pos, int]:
    """Fewest moves from every tile to ``goal`` around the holes (BFS from the goal).

    Holes, and tiles the holes cut off from the goal, are absent. Used by the per-turn
    best-action check and by the oracle baseline (``spa.eval.baselines``).
    """
    nrow, ncol = holes.shape
    dist = {goal: 0}
    queue = deque([goal])
    while queue:
        row, col = queue.popleft()
        for dr, dc in _MOVES.values():
            nxt = (row + dr, col + dc)
            if 0 <= nxt[0] < nrow and 0 <= nxt[1] < ncol and not holes[nxt] and nxt not in dist:
                dist[nxt] = dist[(row, col)] + 1
                queue.append(nxt)
    return dist


def moved(pos: Pos, move: str, shape: tuple[int, int]) -> Pos:
    """The tile ``move`` leads to from ``pos`` on a lake of ``shape``: a move into the edge stays."""
    dr, dc = _MOVES[move]
    return min(max(pos[0] + dr, 0), shape[0] - 1), min(max(pos[1] + dc, 0), shape[1] - 1)


def generate_map(rng: np.random.Generator, size: int, p: float) -> tuple[np.ndarray, Pos, Pos]:
    """A random ``size x size`` lake ``(holes, start, goal)`` whose goal is reachable.

    Each tile is a hole with probability ``1 - p``; start and goal go on two distinct
    random tiles (forced to ice). Maps are redrawn from the same ``rng`` until a path
    exists, so the result is a deterministic function of the generator's state.
    """
    while True:
        holes = rng.random((size, size)) >= p
        start_idx, goal_idx = rng.choice(size * size, size=2, replace=False)
        start, goal = divmod(int(start_idx), size), divmod(int(goal_idx), size)
        holes[start] = holes[goal] = False
        if reachable(holes, start, goal):
            return holes, start, goal


@register
class FrozenLakeEnv(TextEnv):
    """FrozenLake with text actions ``Left``/``Down``/``Right``/``Up`` (see the module doc).

    After the episode ends (player in a hole or on the goal) the state is absorbing, as
    in gymnasium: further actions are valid, change nothing and give reward 0.
    """

    name = "frozenlake"
    action_help = "write exactly one of: Left, Down, Right, Up"
    _mutable_state = ()  # the position and step count are reassigned, the map never changes

    @dataclasses.dataclass
    class Config:
        size: int = field(4, help="side of the random square lake, 2 to 16 (paper: 4 and 6)")
        p: float = field(0.8, help="probability that a random tile is ice rather than a hole")
        is_slippery: bool = field(True, help="whether moves may slide perpendicular")
        success_rate: float = field(
            0.8, help="probability a slippery move goes where intended (1/3 = gymnasium)"
        )
        max_steps: int = field(100, help="truncate the episode after this many valid steps")
        desc: str | None = field(
            None, help="fixed map in gymnasium letters, rows joined by '/' (overrides size, p)"
        )

        def __post_init__(self) -> None:
            _check_int("size", self.size, 2, 16)
            _check_prob("p", self.p)
            if not isinstance(self.is_slippery, bool):
                raise ValueError(f"is_slippery={self.is_slippery!r} must be True or False")
            _check_prob("success_rate", self.success_rate)
            _check_int("max_steps", self.max_steps, 1, math.inf)
            if self.desc is not None:
                if not isinstance(self.desc, str):
                    raise ValueError(
                        f"desc={self.desc!r} must be a string like 'SFFF/FHFH/FFFH/HFFG'"
                    )
                parse_desc(self.desc)

    @classmethod
    def from_desc(cls, rows: str | Sequence[str], **config: Any) -> FrozenLakeEnv:
        """An env on the fixed map ``rows`` (gymnasium letters), e.g. ``["SFFF", "FHFH", ...]``."""
        joined = rows if isinstance(rows, str) else "/".join(rows)
        return cls(cls.Config(desc=joined, **config))

    # -- episode ------------------------------------------------------------------
    def _new_episode(self, rng: np.random.Generator) -> None:
        cfg = self.config
        if cfg.desc is None:
            self._holes, self._start, self._goal = generate_map(rng, cfg.size, cfg.p)
        else:
            grid = np.array([list(row) for row in parse_desc(cfg.desc)])
            self._holes = grid == "H"
            (r, c), (gr, gc) = np.argwhere(grid == "S")[0], np.argwhere(grid == "G")[0]
            self._start, self._goal = (int(r), int(c)), (int(gr), int(gc))
        self._pos: Pos = self._start
        # The map is fixed for the episode: one BFS serves every turn's best_actions.
        self._dist = goal_distances(self._holes, self._goal)

    def _parse_action(self, text: str) -> str | None:
        return match_name(text, ACTIONS)

    def _apply(self, action: str) -> tuple[float, bool]:
        if self._ended():
            return 0.0, True
        move = action
        if self.config.is_slippery:
            # One uniform draw: [0, s) intended, then the two perpendicular halves.
            index = ACTIONS.index(action)
            u = self.np_random.random()
            sr = self.config.success_rate
            if u >= sr:
                move = ACTIONS[(index - 1) % 4 if u < sr + (1 - sr) / 2 else (index + 1) % 4]
        self._pos = moved(self._pos, move, self._holes.shape)
        return (1.0 if self._pos == self._goal else 0.0), self._ended()

    def _ended(self) -> bool:
        return self._pos == self._goal or bool(self._holes[self._pos])

    def random_action(self, rng: np.random.Generator) -> str:
        return ACTIONS[int(rng.integers(len(ACTIONS)))]

    def legal_actions(self) -> tuple[str, ...]:
        return ACTIONS

    def best_actions(self) -> frozenset[str] | None:
        """The moves whose intended tile is strictly closer to the goal around the holes
        (slips ignored; a move into the edge stays put, so it is never one of them)."""
        if self._ended():
            return None
        dist = self._dist
        here = dist.get(self._pos)
        if here is None:  # cut off from the goal (only on a hand-made map)
            return None
        shape = self._holes.shape
        return frozenset(a for a in ACTIONS if dist.get(moved(self._pos, a, shape), here) < here)

    def is_success(self) -> bool:
        return self._pos == self._goal

    # -- read-only views ----------------------------------------------------------
    @property
    def player(self) -> Pos:
        """The player's ``(row, col)``."""
        return self._pos

    @property
    def goal(self) -> Pos:
        return self._goal

    @property
    def holes(self) -> list[Pos]:
        """Hole positions in reading order."""
        return [(int(r), int(c)) for r, c in np.argwhere(self._holes)]

    def distances(self) -> dict[Pos, int]:
        """Fewest moves from every tile to the goal around the holes (:func:`goal_distances`)."""
        return dict(self._dist)

    def layout(self) -> list[str]:
        """The map in gymnasium's letters (``S`` at the start), e.g. for ``FrozenLake-v1``."""
        rows = [["H" if hole else "F" for hole in line] for line in self._holes]
        rows[self._start[0]][self._start[1]] = "S"
        rows[self._goal[0]][self._goal[1]] = "G"
        return ["".join(row) for row in rows]

    # -- text ---------------------------------------------------------------------
    def render(self) -> str:
        rows = [["O" if hole else "_" for hole in line] for line in self._holes]
        rows[self._goal[0]][self._goal[1]] = "G"
        row, col = self._pos
        rows[row][col] = "√" if self._pos == self._goal else "X" if self._holes[row, col] else "P"
        return "\n".join("".join(line) for line in rows)

    def describe(self) -> str:
        parts = [f"Player at {_fmt(self._pos)}", f"Goal at {_fmt(self._goal)}"]
        if self.holes:
            parts.append("Hole at " + ", ".join(_fmt(pos) for pos in self.holes))
        return "; ".join(parts) + "."

    def rules(self) -> str:
        if self.config.is_slippery:
            slide = (1 - self.config.success_rate) / 2
            ice = (
                f"The ice is slippery: a move goes in the intended direction with probability "
                f"{self.config.success_rate:.2g}, otherwise to one of the two perpendicular "
                f"directions (probability {slide:.2g} each)."
            )
        else:
            ice = "The ice is not slippery: every move goes in the intended direction."
        return (
            "FrozenLake: move the player across the frozen lake to the goal without falling "
            "into a hole. Symbols: P player, _ frozen ice, O hole, G goal, X player fallen into "
            "a hole (episode lost), √ player on the goal (episode won). Positions are "
            "(row, col), 0-indexed from the top-left. "
            f"{ice} Moving into the edge of the lake leaves the player in place. Reaching the "
            "goal gives reward 1; every other step gives 0. Valid actions: Left, Down, Right, Up."
        )


def _fmt(pos: Pos) -> str:
    return f"({pos[0]},{pos[1]})"
