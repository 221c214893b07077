"""Sokoban: push every box onto a target.

Levels are generated as in gym-sokoban, the generator behind the SPA paper's setup: a
random walk carves a room out of solid wall, the boxes start on their targets, and a
reverse play from that solved state, in which the player can only *pull* boxes, moves
them away. Undoing a pull is a push, so every generated level is solvable by
construction, and it is never handed out already solved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import numpy as np

from spa.envs.base import TextEnv, check_range, field, match_name, register

Cell = tuple[int, int]

WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "#_OX√PS"
#: Action name (lower case) -> (row, col) offset.
MOVES: dict[str, Cell] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
#: The action names as the agent writes them (``match_name`` reads any case).
ACTIONS: tuple[str, ...] = tuple(name.capitalize() for name in MOVES)
STEP_REWARD, BOX_ON_REWARD, BOX_OFF_REWARD, SOLVED_REWARD = -0.1, 1.0, -1.0, 10.0

_TURN_PROB = 0.35  # chance the carving walk changes direction at a step (as gym-sokoban)
_WIDEN_PROB = 0.6  # chance a step also carves a neighbour, so rooms are not all 1-wide tunnels
_MAX_ATTEMPTS = 200  # rooms tried per reset before giving up
_MAX_SEARCH_STATES = 2000  # caps the reverse search so big rooms with many boxes stay fast
#: States the solver (:func:`solve`) may visit before it gives up (big rooms, many boxes).
MAX_SOLVER_STATES = 500_000


def _max_boxes(dim: int) -> int:
    """The most boxes a ``dim`` room may hold: beyond this, generation mostly fails."""
    return max(1, (dim - 2) ** 2 // 6)


@dataclass
class SokobanConfig:
    """Options of the Sokoban environment."""

    dim: int = field(6, "room side length, outer wall included (rooms are dim x dim)")
    num_boxes: int = field(1, "boxes (and targets) per room")
    max_steps: int = field(100, "episode is truncated after this many valid steps")
    search_depth: int = field(100, "most box pulls in the reverse play that scrambles the room")
    walk_steps: int = field(0, "random-walk steps carving the room; 0 = 1.5 x interior cells")

    def __post_init__(self) -> None:
        for name in ("dim", "num_boxes", "max_steps", "search_depth", "walk_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"{name}={value!r} is not allowed; it must be an integer")
        check_range("dim", self.dim, 5, 20)
        check_range("num_boxes", self.num_boxes, 1, _max_boxes(self.dim))
        check_range("max_steps", self.max_steps, 1, 100_000)
        check_range("search_depth", self.search_depth, 1, 10_000)
        check_range("walk_steps", self.walk_steps, 0, 100_000)


def _neighbours(cell: Cell) -> list[Cell]:
    return [(cell[0] + dr, cell[1] + dc) for dr, dc in MOVES.values()]


def _carve_room(dim: int, steps: int, rng: np.random.Generator) -> set[Cell]:
    """Floor cells carved by a random walk that stays inside the outer wall."""
    lo, hi = 1, dim - 2
    cell = (int(rng.integers(lo, hi + 1)), int(rng.integers(lo, hi + 1)))
    step = list(MOVES.values())[int(rng.integers(4))]
    floor = {cell}
    for _ in range(steps):
        if rng.random() < _TURN_PROB:
            step = list(MOVES.values())[int(rng.integers(4))]
        cell = (min(max(cell[0] + step[0], lo), hi), min(max(cell[1] + step[1], lo), hi))
        floor.add(cell)
        if rng.random() < _WIDEN_PROB:
            side = _neighbours(cell)[int(rng.integers(4))]
            if lo <= side[0] <= hi and lo <= side[1] <= hi:
                floor.add(side)
    return floor


def _reachable(start: Cell, adjacent: dict[Cell, list[Cell]], boxes: set[Cell]) -> set[Cell]:
    """Cells the player can walk to from ``start`` without moving a box.

    ``adjacent`` maps each floor cell to its floor neighbours (precomputed: this is the
    inner loop of the reverse search).
    """
    seen, stack = {start}, [start]
    while stack:
        for nxt in adjacent[stack.pop()]:
            if nxt not in boxes and nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def _reverse_play(
    floor: set[Cell], targets: list[Cell], player: Cell, depth: int, rng: np.random.Generator
) -> tuple[list[Cell], Cell] | None:
    """Scramble the solved room by pulls only; ``(boxes, player)`` or ``None``.

    Breadth-first over states ``(boxes, player's reachable area)`` up to ``depth`` pulls
    (free walking is folded into the area). A pull: the player stands next to a box,
    steps away from it, and drags it along. Among the states with no box on a target,
    pick the one whose boxes lie farthest (summed Manhattan distance to the nearest
    target), deeper first on ties, then at random; the player goes to a random cell of
    its area.
    """
    adjacent = {cell: [n for n in _neighbours(cell) if n in floor] for cell in floor}
    start = tuple(sorted(targets))
    area = _reachable(player, adjacent, set(start))
    seen = {(start, min(area))}
    tried = set()  # (boxes, player cell) pairs already reached: skips their flood fill
    frontier = [(start, area)]
    best_score, best = (0, 0), []
    for level in range(1, depth + 1):
        found = []
        for boxes, area in frontier:
            for box in boxes:
                for dr, dc in MOVES.values():
                    stand, dest = (box[0] + dr, box[1] + dc), (box[0] + 2 * dr, box[1] + 2 * dc)
                    if stand not in area or dest not in area:
                        continue
                    moved = tuple(sorted(stand if b == box else b for b in boxes))
                    if (moved, dest) in tried:
                        continue
                    tried.add((moved, dest))
                    new_area = _reachable(dest, adjacent, set(moved))
                    key = (moved, min(new_area))
                    if key in seen:
                        continue
                    seen.add(key)
                    found.append((moved, new_area))
                    if any(b in targets for b in moved):
                        continue
                    spread = sum(min(abs(b[0] - t[0]) + abs(b[1] - t[1]) for t in targets)
                                 for b in moved)
                    if (spread, level) > best_score:
                        best_score, best = (spread, level), []
                    if (spread, level) == best_score:
                        best.append((moved, new_area))
            if len(seen) >= _MAX_SEARCH_STATES:
                break
        frontier = found
        if not frontier or len(seen) >= _MAX_SEARCH_STATES:
            break
    if not best:
        return None
    boxes, area = best[int(rng.integers(len(best)))]
    cells = sorted(area)
    return list(boxes), cells[int(rng.integers(len(cells)))]


@register
class Sokoban(TextEnv):
    """Sokoban on a ``dim`` x ``dim`` grid with ``num_boxes`` boxes.

    The layout is readable through ``walls``, ``boxes``, ``targets`` and ``player``
    (0-indexed ``(row, col)``). A move into a wall, or a push against a wall or a second
    box, is a valid action that changes nothing: it still costs the step penalty and
    counts as a step (``last_move_blocked`` is then True), as in gym-sokoban.
    """

    name: ClassVar[str] = "sokoban"
    Config: ClassVar[type] = SokobanConfig
    action_help: ClassVar[str] = "Answer with one of Up, Down, Left, Right."
    _mutable_state = ("_boxes",)  # pushes change the set in place; the rest is reassigned or fixed

    def __init__(self, config: SokobanConfig | None = None) -> None:
        super().__init__(config)
        self._height = self._width = 0
        self._walls: frozenset[Cell] = frozenset()
        self._targets: frozenset[Cell] = frozenset()
        self._boxes: set[Cell] = set()
        self._player: Cell = (0, 0)
        self.last_move_blocked = False

    # -- read-only layout ---------------------------------------------------------
    @property
    def walls(self) -> frozenset[Cell]:
        return self._walls

    @property
    def targets(self) -> frozenset[Cell]:
        return self._targets

    @property
    def boxes(self) -> frozenset[Cell]:
        return frozenset(self._boxes)

    @property
    def player(self) -> Cell:
        return self._player

    # -- levels -------------------------------------------------------------------
    def _new_episode(self, rng: np.random.Generator) -> None:
        cfg = self.config
        steps = cfg.walk_steps or (3 * (cfg.dim - 2) ** 2) // 2
        for _ in range(_MAX_ATTEMPTS):
            floor = _carve_room(cfg.dim, steps, rng)
            if len(floor) < 2 * cfg.num_boxes + 2:
                continue
            cells = sorted(floor)
            picks = rng.choice(len(cells), size=cfg.num_boxes + 1, replace=False)
            targets = [cells[int(i)] for i in picks[:-1]]
            found = _reverse_play(floor, targets, cells[int(picks[-1])], cfg.search_depth, rng)
            if found is not None:
                walls = {(r, c) for r in range(cfg.dim) for c in range(cfg.dim)} - floor
                self._set_layout(walls, set(targets), set(found[0]), found[1], cfg.dim, cfg.dim)
                return
        raise RuntimeError(
            f"could not generate a Sokoban level with dim={cfg.dim}, num_boxes={cfg.num_boxes} "
            f"in {_MAX_ATTEMPTS} attempts; use a larger dim, fewer boxes or more walk_steps"
        )

    def _set_layout(self, walls: set[Cell], targets: set[Cell], boxes: set[Cell],
                    player: Cell, height: int, width: int) -> None:
        self._walls, self._targets = frozenset(walls), frozenset(targets)
        self._boxes, self._player = set(boxes), player
        self._height, self._width = height, width
        self.last_move_blocked = False

    @classmethod
    def from_text(cls, grid: str, **config: object) -> "Sokoban":
        """An environment holding the level drawn in ``grid`` (``render()``'s format).

        Handy for hand-made rooms; ``config`` sets the other options (``dim`` is only
        used by ``reset``, which generates a fresh random level).
        """
        rows = grid.strip("\n").split("\n")
        if len({len(row) for row in rows}) != 1:
            raise ValueError("grid rows must all have the same length")
        walls, targets, boxes, players = set(), set(), set(), []
        for r, row in enumerate(rows):
            for c, ch in enumerate(row):
                if ch not in (WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET):
                    raise ValueError(f"unknown symbol {ch!r} at ({r},{c})")
                if ch == WALL:
                    walls.add((r, c))
                if ch in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET):
                    targets.add((r, c))
                if ch in (BOX, BOX_ON_TARGET):
                    boxes.add((r, c))
                if ch in (PLAYER, PLAYER_ON_TARGET):
                    players.append((r, c))
        if len(players) != 1:
            raise ValueError(f"grid must hold exactly one player, found {len(players)}")
        if not boxes or len(boxes) != len(targets):
            raise ValueError(f"grid must hold as many boxes as targets (at least one), "
                             f"found {len(boxes)} boxes and {len(targets)} targets")
        env = cls(SokobanConfig(**config))  # type: ignore[arg-type]
        env._set_layout(walls, targets, boxes, players[0], len(rows), len(rows[0]))
        env.steps = 0
        return env

    # -- dynamics -------------------------------------------------------------------
    def _parse_action(self, text: str) -> str | None:
        return match_name(text, ACTIONS)

    def _blocked(self, cell: Cell) -> bool:
        inside = 0 <= cell[0] < self._height and 0 <= cell[1] < self._width
        return not inside or cell in self._walls or cell in self._boxes

    def _apply(self, action: str) -> tuple[float, bool]:
        dr, dc = MOVES[action.lower()]
        ahead = (self._player[0] + dr, self._player[1] + dc)
        beyond = (ahead[0] + dr, ahead[1] + dc)
        reward = STEP_REWARD
        if ahead in self._boxes and not self._blocked(beyond):
            self._boxes.remove(ahead)
            self._boxes.add(beyond)
            reward += BOX_ON_REWARD * (beyond in self._targets)
            reward += BOX_OFF_REWARD * (ahead in self._targets)
            self._player = ahead
        elif not self._blocked(ahead):
            self._player = ahead
        self.last_move_blocked = self._player != ahead
        solved = self.is_success()
        return reward + SOLVED_REWARD * solved, solved

    def random_action(self, rng: np.random.Generator) -> str:
        return list(MOVES)[int(rng.integers(len(MOVES)))].capitalize()

    def legal_actions(self) -> tuple[str, ...]:
        return ACTIONS

    def best_actions(self) -> frozenset[str] | None:
        """The moves whose successor is one step closer to solved (:func:`solve`'s
        ``first_moves``); ``None`` once solved, or when the search hits ``MAX_SOLVER_STATES``."""
        if self.is_success():
            return None
        solution = solve(self)
        return None if solution is None else solution.first_moves

    def is_success(self) -> bool:
        return self._boxes == self._targets

    # -- text -------------------------------------------------------------------------
    def render(self) -> str:
        return "\n".join(
            "".join(self._symbol((r, c)) for c in range(self._width))
            for r in range(self._height)
        )

    def _symbol(self, cell: Cell) -> str:
        on_target = cell in self._targets
        if cell in self._walls:
            return WALL
        if cell in self._boxes:
            return BOX_ON_TARGET if on_target else BOX
        if cell == self._player:
            return PLAYER_ON_TARGET if on_target else PLAYER
        return TARGET if on_target else FLOOR

    def describe(self) -> str:
        boxes, targets = (", ".join(f"({r},{c})" for r, c in sorted(group))
                          for group in (self._boxes, self._targets))
        r, c = self._player
        return f"Player at ({r},{c}); Box at {boxes}; Target at {targets}."

    def rules(self) -> str:
        return (
            "You are solving Sokoban. Push every box onto a target; you win when all boxes "
            "are on targets. You can push a box by walking into it (only one box at a time, "
            "and not into a wall or another box) but never pull it. Symbols: # wall, _ empty "
            "floor, O target, X box, √ box on a target, P player, S player on a target. "
            "Coordinates are (row, col), 0-indexed from the top-left; a box on a target is "
            "listed both as a Box and as a Target. Rewards: -0.1 per step, +1 for a box "
            "pushed onto a target, -1 for a box pushed off one, +10 when solved. "
            "Actions: Up, Down, Left, Right."
        )


class Solution(NamedTuple):
    """What :func:`solve` finds: one shortest solution, and how every shortest one starts."""

    plan: list[str]  # the actions of one shortest solution
    first_moves: frozenset[str]  # the first action of each shortest solution


def solve(env: Sokoban, max_states: int = MAX_SOLVER_STATES) -> Solution | None:
    """The shortest solutions of ``env``'s current state, or ``None``.

    BFS over ``(player, boxes)``, one layer per move; moves that change nothing (into a
    wall, or a blocked push) are skipped since they only cost a step. Each state carries
    the first moves of all the shortest paths reaching it (merged when another path of
    the same length arrives), so the union over the first layer holding a solved state is
    exactly the moves whose successor has a strictly shorter solution. ``plan`` leads to
    the first solved state found, trying moves in ``MOVES`` order. ``None`` when no
    solution exists or more than ``max_states`` states were visited; an already solved
    state gives an empty plan and no first moves.
    """
    height, width, walls, targets = env._height, env._width, env.walls, env.targets

    def free(cell: Cell, boxes: frozenset) -> bool:
        inside = 0 <= cell[0] < height and 0 <= cell[1] < width
        return inside and cell not in walls and cell not in boxes

    def successors(state: tuple) -> list[tuple[str, tuple]]:
        player, boxes = state
        found = []
        for name, (dr, dc) in MOVES.items():
            ahead = (player[0] + dr, player[1] + dc)
            beyond = (ahead[0] + dr, ahead[1] + dc)
            if ahead in boxes and free(beyond, boxes):
                found.append((name.capitalize(), (ahead, (boxes - {ahead}) | {beyond})))
            elif ahead not in boxes and free(ahead, boxes):
                found.append((name.capitalize(), (ahead, boxes)))
        return found

    start = (env.player, env.boxes)
    if start[1] == targets:
        return Solution([], frozenset())
    parent: dict = {start: None}  # state -> (previous state, move), for the plan
    firsts: dict = {}  # the last layer's states -> first moves of the shortest paths reaching them
    layer = [start]
    while layer:
        fresh: dict = {}  # this layer's new states -> their first moves (insertion-ordered)
        for state in layer:
            for move, nxt in successors(state):
                via = firsts.get(state) or frozenset({move})  # the start's successors begin a path
                if nxt in fresh:
                    fresh[nxt] |= via
                elif nxt not in parent:
                    parent[nxt] = (state, move)
                    fresh[nxt] = via
                    if len(parent) > max_states:
                        return None
        firsts = fresh
        solved = [state for state in fresh if state[1] == targets]
        if solved:
            plan, state = [], solved[0]
            while parent[state] is not None:
                state, move = parent[state]
                plan.append(move)
            return Solution(plan[::-1], frozenset().union(*(fresh[state] for state in solved)))
        layer = list(fresh)
    return None
