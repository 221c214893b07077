"""Sudoku: fill the grid so every row, column and box holds each digit exactly once.

The paper's setting is a 4x4 grid (2x2 boxes) with a 9x9 option (3x3 boxes). Every
puzzle has exactly one solution, so "complete and correct" has a single meaning and
the reward can compare the board with the stored solution.

Generation: a random full grid by randomised backtracking (every valid grid can come
out), then cells are removed in a random order, each only if the puzzle stays
uniquely solvable, until the target clue count is reached or no cell can be removed.
A removal that fails once can never succeed later (removing more cells only adds
solutions), so one pass over the cells is enough.

Actions are ``r,c,v`` with 1-indexed row, column and value, as in the paper's setup, and
``describe()`` lists cells 1-indexed too (``coordinate_base = 1``): unlike Sokoban and
FrozenLake, whose actions are directions, here the model copies coordinates from the
state description into its actions, and one convention for both leaves nothing to
translate. ``rules()`` says so. The Python-side ``clues`` and
``empty_cells()`` stay 0-indexed list indices. Any non-clue cell may be written, even
with a wrong or conflicting value: the agent has to learn the rules, and may overwrite
its own mistakes.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from spa.envs.base import TextEnv, check_choice, check_range, clean_action, field, register

#: Target clue counts per grid size and difficulty (fewer clues: more cells to fill).
#: Greedy removal may stop above the target when no more cells can be removed.
CLUES: dict[int, dict[str, int]] = {
    4: {"easy": 10, "medium": 8, "hard": 6},
    9: {"easy": 40, "medium": 32, "hard": 26},
}
#: The fewest clues a uniquely solvable puzzle can have (17 for 9x9: McGuire et al. 2012).
MIN_CLUES: dict[int, int] = {4: 4, 9: 17}

#: ``r,c,v`` with optional spaces around the numbers; ``clean_action`` and the
#: parentheses are stripped before.
_ACTION = re.compile(r"\s*([0-9]{1,6})\s*,\s*([0-9]{1,6})\s*,\s*([0-9]{1,6})\s*")


@dataclasses.dataclass
class SudokuConfig:
    """Options of the ``sudoku`` environment."""

    size: int = field(4, help="grid side: 4 (2x2 boxes) or 9 (3x3 boxes)")
    difficulty: str = field(
        "easy", help="easy | medium | hard: target clue count (4x4: 10/8/6, 9x9: 40/32/26)"
    )
    num_clues: int | None = field(
        None, help="exact target clue count, overriding difficulty (None: use difficulty)"
    )
    max_steps: int = field(100, help="truncate the episode after this many valid steps")

    def __post_init__(self) -> None:
        check_choice("size", self.size, tuple(CLUES))
        check_choice("difficulty", self.difficulty, tuple(CLUES[self.size]))
        if self.num_clues is not None:
            if not isinstance(self.num_clues, int) or isinstance(self.num_clues, bool):
                raise ValueError(f"num_clues={self.num_clues!r} must be an integer or None")
            # At least one cell must stay empty, or there is nothing to do.
            check_range("num_clues", self.num_clues, MIN_CLUES[self.size], self.size**2 - 1)
        if not isinstance(self.max_steps, int) or isinstance(self.max_steps, bool):
            raise ValueError(f"max_steps={self.max_steps!r} must be an integer")
        check_range("max_steps", self.max_steps, 1, 1_000_000)

    @property
    def target_clues(self) -> int:
        """The clue count generation aims for."""
        return self.num_clues if self.num_clues is not None else CLUES[self.size][self.difficulty]


def solve(
    cells: list[int], box: int, limit: int = 2, rng: np.random.Generator | None = None
) -> tuple[int, list[int] | None]:
    """Count the solutions of a flat row-major grid (0 = empty), stopping at ``limit``.

    Returns ``(count, first solution found or None)``. Backtracking over bit masks of
    the digits used per row, column and box, always branching on the empty cell with
    the fewest candidates. With ``rng`` the candidates are tried in random order, which
    turns the solver into a random full-grid generator when given an empty grid.
    """
    n = box * box
    full = (1 << (n + 1)) - 2  # bits 1..n: the digits
    rows, cols, boxes = [0] * n, [0] * n, [0] * n
    empty: list[tuple[int, int, int, int]] = []
    for i, v in enumerate(cells):
        r, c = divmod(i, n)
        b = (r // box) * box + c // box
        if v == 0:
            empty.append((i, r, c, b))
            continue
        bit = 1 << v
        if (rows[r] | cols[c] | boxes[b]) & bit:
            return 0, None  # the givens already clash
        rows[r] |= bit
        cols[c] |= bit
        boxes[b] |= bit
    grid = list(cells)
    count = 0
    first: list[int] | None = None

    def search(todo: list[tuple[int, int, int, int]]) -> bool:
        """Fill ``todo``; True once ``limit`` solutions were found (stop searching)."""
        nonlocal count, first
        if not todo:
            count += 1
            if first is None:
                first = list(grid)
            return count >= limit
        best, best_mask, best_n = 0, 0, n + 1
        for k, (_, r, c, b) in enumerate(todo):
            mask = full & ~(rows[r] | cols[c] | boxes[b])
            m = mask.bit_count()
            if m < best_n:
                best, best_mask, best_n = k, mask, m
                if m <= 1:
                    break
        if best_n == 0:
            return False
        i, r, c, b = todo[best]
        rest = todo[:best] + todo[best + 1 :]
        digits = [v for v in range(1, n + 1) if best_mask >> v & 1]
        if rng is not None:
            digits = [digits[j] for j in rng.permutation(len(digits))]
        for v in digits:
            bit = 1 << v
            grid[i] = v
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
            stop = search(rest)
            rows[r] &= ~bit
            cols[c] &= ~bit
            boxes[b] &= ~bit
            grid[i] = 0
            if stop:
                return True
        return False

    search(empty)
    return count, first


def generate(box: int, clues: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """A uniquely solvable puzzle with about ``clues`` givens, and its solution (flat)."""
    n = box * box
    _, solution = solve([0] * (n * n), box, limit=1, rng=rng)
    assert solution is not None  # an empty grid always has a solution
    puzzle = list(solution)
    remaining = n * n
    for i in rng.permutation(n * n):
        if remaining <= clues:
            break
        puzzle[i] = 0
        if solve(puzzle, box, limit=2)[0] == 1:
            remaining -= 1
        else:
            puzzle[i] = solution[i]
    return puzzle, solution


@register
class SudokuEnv(TextEnv):
    """Sudoku with text actions ``r,c,v`` (1-indexed); reward 1 when solved, else 0.

    Public state: ``board`` and ``solution`` (lists of rows of ints, 0 = empty) and
    ``clues`` (the 0-indexed ``(row, col)`` list indices of the cells given at the start,
    read-only). ``render()`` shows one row per line, cells separated by single spaces,
    ``_`` for an empty cell; ``describe()`` lists the empty cells 1-indexed, as actions
    name them, e.g. ``Empty at (1,2), (3,4).``, or ``Empty at none.`` when the grid is full.
    A complete but wrong board does not end the episode: the agent may still fix it.
    """

    name = "sudoku"
    Config = SudokuConfig
    coordinate_base = 1  # describe() names cells as the r,c,v actions do
    _mutable_state = ("board",)  # moves write into the board's rows
    action_help = (
        "write r,c,v to put value v in row r, column c, all counted from 1 (e.g. 1,2,3)"
    )

    def _new_episode(self, rng: np.random.Generator) -> None:
        n = self.config.size
        self.box = int(round(n**0.5))
        puzzle, solution = generate(self.box, self.config.target_clues, rng)
        self.board: list[list[int]] = [puzzle[r * n : (r + 1) * n] for r in range(n)]
        self.solution: list[list[int]] = [solution[r * n : (r + 1) * n] for r in range(n)]
        self.clues: frozenset[tuple[int, int]] = frozenset(
            (r, c) for r in range(n) for c in range(n) if self.board[r][c]
        )

    def _parse_action(self, text: str) -> tuple[int, int, int] | None:
        text = clean_action(text)
        if text.startswith("(") and text.endswith(")"):
            text = text[1:-1]
        match = _ACTION.fullmatch(text)
        if match is None:
            return None
        r, c, v = (int(g) for g in match.groups())
        return r, c, v

    def _apply(self, action: tuple[int, int, int]) -> tuple[float, bool] | str:
        r, c, v = action
        n = self.config.size
        if not (1 <= r <= n and 1 <= c <= n):
            return f"row and column must be 1 to {n}; got row {r}, column {c}"
        if not 1 <= v <= n:
            return f"value must be 1 to {n}; got {v}"
        if (r - 1, c - 1) in self.clues:
            return f"cell {r},{c} holds a given clue and cannot be changed"
        self.board[r - 1][c - 1] = v
        solved = self.is_success()
        return (1.0 if solved else 0.0), solved

    def _action_text(self, action: tuple[int, int, int]) -> str:
        return ",".join(map(str, action))  # "1, 2 ,3." and "(01,2,3)" are both "1,2,3"

    def best_actions(self) -> frozenset[str] | None:
        """The solution's value for every cell that differs from it: each empty cell and
        each cell the agent filled wrongly needs exactly one action, in any order."""
        if self.is_success():
            return None
        n, want = len(self.board), self.solution
        return frozenset(f"{r + 1},{c + 1},{want[r][c]}" for r in range(n) for c in range(n)
                         if self.board[r][c] != want[r][c])

    def random_action(self, rng: np.random.Generator) -> str:
        """A random value in a random non-clue cell (1-indexed, as actions are written)."""
        n = len(self.board)
        free = [(r, c) for r in range(n) for c in range(n) if (r, c) not in self.clues]
        r, c = free[int(rng.integers(len(free)))]
        return f"{r + 1},{c + 1},{int(rng.integers(1, n + 1))}"

    def is_success(self) -> bool:
        return self.board == self.solution

    def empty_cells(self) -> list[tuple[int, int]]:
        """The 0-indexed ``(row, col)`` of every empty cell, row by row."""
        return [(r, c) for r, row in enumerate(self.board) for c, v in enumerate(row) if v == 0]

    def render(self) -> str:
        return "\n".join(" ".join(str(v) if v else "_" for v in row) for row in self.board)

    def describe(self) -> str:
        base = self.coordinate_base
        cells = ", ".join(f"({r + base},{c + base})" for r, c in self.empty_cells())
        return f"Empty at {cells or 'none'}."

    def rules(self) -> str:
        n, b = self.config.size, int(round(self.config.size**0.5))
        return (
            f"Sudoku on a {n}x{n} grid made of {b}x{b} boxes. Goal: fill every empty cell so "
            f"that each row, each column and each {b}x{b} box contains every digit 1-{n} "
            "exactly once; the puzzle has exactly one solution. Symbols: a digit is a filled "
            "cell, _ is an empty cell. The grid is shown one row per line, cells separated "
            "by spaces. Rows and columns are 1-indexed, counted from 1 at the top-left, both "
            "in the state description's (row, col) and in actions: an action is r,c,v with "
            "row r, column c and value v, so the cell described as (1,2) is written with "
            "1,2,v. The digits given at the start cannot be changed; any other cell can be "
            "written again to fix a mistake. Reward 1 when the grid is complete and correct, "
            "otherwise 0."
        )
