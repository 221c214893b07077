"""Tests of the sudoku environment: puzzle uniqueness (checked by solvers written here,
independent of the environment's), the r,c,v action protocol, rewards and config."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spa.envs import make


# -- independent solution counters ----------------------------------------------------
def _all_4x4_grids() -> list[tuple[tuple[int, ...], ...]]:
    """Every valid 4x4 sudoku grid (there are 288), built row by row."""
    from itertools import permutations

    grids: list[tuple[tuple[int, ...], ...]] = []

    def fits(rows: list[tuple[int, ...]], row: tuple[int, ...]) -> bool:
        r = len(rows)
        for c in range(4):
            if any(prev[c] == row[c] for prev in rows):
                return False
        if r % 2 == 1:  # second row of a band: the two 2x2 boxes must hold 4 digits
            above = rows[-1]
            if len({above[0], above[1], row[0], row[1]}) < 4:
                return False
            if len({above[2], above[3], row[2], row[3]}) < 4:
                return False
        return True

    def extend(rows: list[tuple[int, ...]]) -> None:
        if len(rows) == 4:
            grids.append(tuple(rows))
            return
        for row in permutations(range(1, 5)):
            if fits(rows, row):
                extend(rows + [row])

    extend([])
    return grids


ALL_4X4 = _all_4x4_grids()


def solutions_4x4(board: list[list[int]]) -> list[list[list[int]]]:
    """All completions of a 4x4 board, by matching it against every valid grid."""
    return [
        [list(row) for row in grid]
        for grid in ALL_4X4
        if all(v == 0 or v == grid[r][c] for r, row in enumerate(board) for c, v in enumerate(row))
    ]


def solutions_exact_cover(board: list[list[int]], limit: int = 2) -> list[list[list[int]]]:
    """Up to ``limit`` completions of a square sudoku, by exact cover (Algorithm X)."""
    n = len(board)
    b = int(round(n**0.5))
    choices = {
        (r, c, v): [("cell", r, c), ("row", r, v), ("col", c, v), ("box", r // b * b + c // b, v)]
        for r in range(n)
        for c in range(n)
        for v in range(1, n + 1)
    }
    columns: dict[tuple, set] = {}
    for choice, cons in choices.items():
        for con in cons:
            columns.setdefault(con, set()).add(choice)

    def cover(choice: tuple) -> list[set]:
        removed = []
        for con in choices[choice]:
            for other in columns[con]:
                for con2 in choices[other]:
                    if con2 != con:
                        columns[con2].discard(other)
            removed.append(columns.pop(con))
        return removed

    def search(picked: list[tuple]) -> Iterator[list[tuple]]:
        if not columns:
            yield list(picked)
            return
        con = min(columns, key=lambda k: len(columns[k]))
        for choice in sorted(columns[con]):
            removed = cover(choice)
            picked.append(choice)
            yield from search(picked)
            picked.pop()
            for con2, group in zip(reversed(choices[choice]), reversed(removed)):
                columns[con2] = group
                for other in group:
                    for con3 in choices[other]:
                        if con3 != con2:
                            columns[con3].add(other)

    givens = [(r, c, v) for r in range(n) for c in range(n) if (v := board[r][c])]
    for given_choice in givens:
        cover(given_choice)
    found = []
    for picked in search([]):
        grid = [row[:] for row in board]
        for r, c, v in picked:
            grid[r][c] = v
        found.append(grid)
        if len(found) >= limit:
            break
    return found


def test_independent_solvers_agree_and_see_ambiguity() -> None:
    """The test solvers themselves: 288 grids, and an ambiguous board has 2+ solutions."""
    assert len(ALL_4X4) == 288
    ambiguous = [[1, 2, 3, 4], [3, 4, 1, 2], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert len(solutions_4x4(ambiguous)) == 4
    assert len(solutions_exact_cover(ambiguous, limit=10)) == 4


# -- generation -------------------------------------------------------------------------
@pytest.mark.parametrize("difficulty,clues", [("easy", 10), ("medium", 8), ("hard", 6)])
def test_4x4_puzzles_have_one_solution(difficulty: str, clues: int) -> None:
    env = make("sudoku", difficulty=difficulty)
    for seed in range(100):
        env.reset(seed=seed)
        assert len(env.clues) == clues
        assert env.clues == {(r, c) for r in range(4) for c in range(4) if env.board[r][c]}
        assert all(env.board[r][c] == env.solution[r][c] for r, c in env.clues)
        assert solutions_4x4(env.board) == [env.solution], f"seed {seed}"


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_9x9_puzzles_have_one_solution(difficulty: str) -> None:
    env = make("sudoku", size=9, difficulty=difficulty)
    target = {"easy": 40, "medium": 32, "hard": 26}[difficulty]
    for seed in range(3):
        env.reset(seed=seed)
        # Greedy removal stops early when no cell can go, so the target is a floor.
        assert target <= len(env.clues) <= target + 6
        assert all(env.board[r][c] == env.solution[r][c] for r, c in env.clues)
        assert solutions_exact_cover(env.board) == [env.solution], f"seed {seed}"


def test_num_clues_overrides_difficulty() -> None:
    env = make("sudoku", difficulty="hard", num_clues=12)
    env.reset(seed=3)
    assert len(env.clues) == 12
    assert solutions_4x4(env.board) == [env.solution]


def test_same_seed_same_puzzle_and_seeds_differ() -> None:
    a, b = make("sudoku", size=9), make("sudoku", size=9)
    a.reset(seed=7)
    b.reset(seed=7)
    assert a.board == b.board and a.solution == b.solution and a.clues == b.clues
    boards = set()
    for seed in range(20):
        obs, _ = a.reset(seed=seed)
        boards.add(obs)
    assert len(boards) == 20


# -- actions and rewards ------------------------------------------------------------------
def test_solving_step_by_step_rewards_only_at_the_end() -> None:
    env = make("sudoku", difficulty="hard")
    obs, info = env.reset(seed=11)
    assert info == {"action_valid": True, "success": False}
    empty = [(r, c) for r in range(4) for c in range(4) if env.board[r][c] == 0]
    assert len(empty) == 10
    for k, (r, c) in enumerate(empty):
        obs, reward, terminated, truncated, info = env.step(
            f"{r + 1},{c + 1},{env.solution[r][c]}"
        )
        assert info["action_valid"] and not truncated
        last = k == len(empty) - 1
        expected = (1.0, True, True) if last else (0.0, False, False)
        assert (reward, terminated, info["success"]) == expected
    assert env.board == env.solution and env.is_success()
    assert "_" not in obs
    assert env.describe() == "Empty at none."


def test_9x9_solves_with_solution_actions() -> None:
    env = make("sudoku", size=9, difficulty="hard")
    env.reset(seed=1)
    empty = [(r, c) for r in range(9) for c in range(9) if env.board[r][c] == 0]
    total = 0.0
    for r, c in empty:
        _, reward, terminated, truncated, _ = env.step(f"({r + 1}, {c + 1}, {env.solution[r][c]})")
        total += reward
    assert (total, terminated, truncated) == (1.0, True, False)


@pytest.mark.parametrize(
    "text",
    ["1,2,3", "1, 2, 3", " 1 ,2 , 3 ", "(1,2,3)", "( 1, 2, 3 )", "\t(1,2,3)\n", "01,02,03"],
)
def test_accepted_action_spellings(text: str) -> None:
    env = make("sudoku")
    env.reset(seed=0)
    assert env._parse_action(text) == (1, 2, 3)


@pytest.mark.parametrize(
    "text",
    ["", "1,2", "1,2,3,4", "1 2 3", "(1,2,3", "1,2,3)", "a,b,c", "1.0,2,3", "-1,2,3",
     "put 1 at 1,2", "Up", "9" * 5000 + ",1,1", "\u0661,\u0662,\u0663", "1;2;3"],
)
def test_garbage_is_unparsable_and_changes_nothing(text: str) -> None:
    env = make("sudoku")
    env.reset(seed=0)
    before = copy.deepcopy(env.board)
    obs, reward, terminated, truncated, info = env.step(text)
    assert env._parse_action(text) is None
    assert info["action_valid"] is False and "reason" in info
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert env.board == before and env.steps == 0 and obs == env.render()


def test_illegal_writes_change_nothing() -> None:
    env = make("sudoku")
    env.reset(seed=5)
    r, c = min(env.clues)
    empty_r, empty_c = next((r, c) for r in range(4) for c in range(4) if env.board[r][c] == 0)
    other = env.board[r][c] % 4 + 1  # a different digit
    actions = [
        f"{r + 1},{c + 1},{other}",  # over a clue
        f"{r + 1},{c + 1},{env.board[r][c]}",  # over a clue, even with its own digit
        f"{empty_r + 1},{empty_c + 1},0",
        f"{empty_r + 1},{empty_c + 1},5",
        f"9,{empty_c + 1},1",
        f"{empty_r + 1},0,1",
        f"0,{empty_c + 1},1",
        f"{empty_r + 1},5,1",
    ]
    before = copy.deepcopy(env.board)
    for action in actions:
        assert env._parse_action(action) is not None
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["action_valid"] is False, action
        assert isinstance(info["reason"], str) and info["reason"]
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert env.board == before and env.steps == 0
    assert "clue" in env.step(f"{r + 1},{c + 1},{other}")[4]["reason"]


def test_wrong_values_are_valid_and_can_be_fixed() -> None:
    env = make("sudoku", num_clues=15)
    env.reset(seed=2)
    ((r, c),) = [(r, c) for r in range(4) for c in range(4) if env.board[r][c] == 0]
    right = env.solution[r][c]
    wrong = right % 4 + 1
    # A complete but wrong board is not terminal: the agent may still fix it.
    obs, reward, terminated, truncated, info = env.step(f"{r + 1},{c + 1},{wrong}")
    assert info["action_valid"] and (reward, terminated) == (0.0, False)
    assert not info["success"] and env.board[r][c] == wrong and env.steps == 1
    assert env.describe() == "Empty at none."
    obs, reward, terminated, truncated, info = env.step(f"{r + 1},{c + 1},{right}")
    assert (reward, terminated, info["success"]) == (1.0, True, True)


def test_truncation_after_max_steps() -> None:
    env = make("sudoku", max_steps=3)
    env.reset(seed=4)
    r, c = next((r, c) for r in range(4) for c in range(4) if env.board[r][c] == 0)
    wrong = env.solution[r][c] % 4 + 1
    results = [env.step(f"{r + 1},{c + 1},{wrong}") for _ in range(3)]
    assert [res[3] for res in results] == [False, False, True]
    assert not any(res[2] for res in results)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=40))
def test_step_never_raises(text: str) -> None:
    env = make("sudoku")
    env.reset(seed=0)
    before = copy.deepcopy(env.board)
    _, _, _, _, info = env.step(text)
    if not info["action_valid"]:
        assert env.board == before


# -- text views ----------------------------------------------------------------------------
def test_render_and_describe_agree() -> None:
    for size in (4, 9):
        env = make("sudoku", size=size)
        obs, _ = env.reset(seed=8)
        rows = obs.split("\n")
        assert len(rows) == size
        cells = [row.split(" ") for row in rows]
        assert all(len(row) == size for row in cells)
        assert all(tok == "_" or tok == str(env.board[r][c]) for r, row in enumerate(cells)
                   for c, tok in enumerate(row))
        empty = [(r, c) for r, row in enumerate(cells) for c, tok in enumerate(row) if tok == "_"]
        assert env.describe() == "Empty at " + ", ".join(f"({r + 1},{c + 1})" for r, c in empty) + "."
        assert env.state_text() == obs + "\n" + env.describe()


def test_render_known_board() -> None:
    env = make("sudoku")
    env.reset(seed=0)
    env.board = [[1, 0, 3, 4], [0, 0, 0, 0], [2, 1, 4, 3], [4, 3, 0, 1]]
    assert env.render() == "1 _ 3 4\n_ _ _ _\n2 1 4 3\n4 3 _ 1"
    assert env.describe() == "Empty at (1,2), (2,1), (2,2), (2,3), (2,4), (4,3)."


def test_described_cells_are_written_as_the_description_names_them() -> None:
    """The state description and the r,c,v actions count cells the same way, so
    a cell copied from the description into an action fills that very cell."""
    env = make("sudoku")
    env.reset(seed=4)
    while "none" not in env.describe():
        r, c = (int(x) for x in re.search(r"\((\d+),(\d+)\)", env.describe()).groups())
        before = env.describe()
        _, _, _, _, info = env.step(f"{r},{c},{env.solution[r - 1][c - 1]}")
        assert info["action_valid"], info.get("reason")
        assert f"({r},{c})" in before and f"({r},{c})" not in env.describe()
    assert env.is_success()


def test_rules_state_one_index_convention() -> None:
    env = make("sudoku")
    env.reset(seed=0)
    text = env.rules()
    assert "1-indexed" in text and "0-indexed" not in text and "_" in text and "r,c,v" in text
    assert "described as (1,2) is written with 1,2,v" in text
    assert "1,2,3" in env.action_help


# -- config -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options,bad",
    [
        ({"size": 5}, "size=5"),
        ({"difficulty": "extreme"}, "difficulty='extreme'"),
        ({"num_clues": 3}, "num_clues=3"),
        ({"num_clues": 16}, "num_clues=16"),
        ({"size": 9, "num_clues": 16}, "num_clues=16"),
        ({"size": 9, "num_clues": 81}, "num_clues=81"),
        ({"num_clues": "8"}, "num_clues='8'"),
        ({"max_steps": 0}, "max_steps=0"),
        ({"board": 4}, "'board'"),
    ],
)
def test_config_errors_name_the_bad_value(options: dict, bad: str) -> None:
    with pytest.raises(ValueError, match=bad.replace("(", r"\(")):
        make("sudoku", **options)


def test_default_config() -> None:
    env = make("sudoku")
    assert (env.config.size, env.config.difficulty, env.config.num_clues) == (4, "easy", None)
    assert env.config.max_steps == 100


# -- best actions (the per-turn "best first action" metric) -------------------------------
def test_best_actions_write_the_solution_into_every_cell_that_differs_from_it() -> None:
    env = make("sudoku")
    env.reset(seed=0)
    env.solution = [[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]]
    env.board = [[1, 0, 3, 4], [0, 4, 1, 2], [2, 1, 4, 3], [4, 3, 0, 1]]
    env.clues = frozenset((r, c) for r in range(4) for c in range(4) if env.board[r][c])
    assert env.best_actions() == {"1,2,2", "2,1,3", "4,3,2"}  # 1-indexed, as actions are written
    env.step("1, 2, 4")  # a wrong value: the cell still needs its one fixing action
    assert env.best_actions() == {"1,2,2", "2,1,3", "4,3,2"}
    env.step("(2,1,3).")
    assert env.best_actions() == {"1,2,2", "4,3,2"}
    env.step("1,2,2")
    env.step("4,3,2")
    assert env.is_success() and env.best_actions() is None


@pytest.mark.parametrize(("text", "canonical"), [("1,2,3", "1,2,3"), (" ( 1 , 2 , 3 ). ", "1,2,3"),
                                                 ("01,2,3", "1,2,3"), ("1,2", None), ("one", None)])
def test_canonical_action_is_the_spelling_best_actions_uses(text: str, canonical: str | None) -> None:
    env = make("sudoku")
    env.reset(seed=0)
    assert env.canonical_action(text) == canonical
