"""Tests of the Sokoban environment.

Solvability is checked by a breadth-first solver written here from the rendered text
alone, independent of the environment's own reverse-play search.
"""

from __future__ import annotations

import copy
import random
import re
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spa.envs import env_names, make
from spa.envs.sokoban import Sokoban
from spa.envs.sokoban import solve as env_solve

DELTAS = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}


def parse(text: str) -> tuple[set, set, set, tuple]:
    """(walls, boxes, targets, player) read back from a rendered grid."""
    walls, boxes, targets, players = set(), set(), set(), []
    for r, row in enumerate(text.split("\n")):
        for c, ch in enumerate(row):
            assert ch in "#_OX√PS", f"unexpected symbol {ch!r}"
            if ch == "#":
                walls.add((r, c))
            if ch in "O√S":
                targets.add((r, c))
            if ch in "X√":
                boxes.add((r, c))
            if ch in "PS":
                players.append((r, c))
    assert len(players) == 1
    return walls, boxes, targets, players[0]


def solve(text: str) -> list[str] | None:
    """A shortest action sequence solving the level, by BFS over (player, boxes)."""
    walls, boxes, targets, player = parse(text)
    start = (player, frozenset(boxes))
    parent: dict = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        pos, boxes_now = state
        if boxes_now == targets:
            plan = []
            while parent[state] is not None:
                state, action = parent[state]
                plan.append(action)
            return plan[::-1]
        for action, (dr, dc) in DELTAS.items():
            ahead = (pos[0] + dr, pos[1] + dc)
            if ahead in walls:
                continue
            new_boxes = boxes_now
            if ahead in boxes_now:
                beyond = (ahead[0] + dr, ahead[1] + dc)
                if beyond in walls or beyond in boxes_now:
                    continue
                new_boxes = (boxes_now - {ahead}) | {beyond}
            nxt = (ahead, new_boxes)
            if nxt not in parent:
                parent[nxt] = (state, action)
                queue.append(nxt)
    return None


def check_level(text: str, dim: int, num_boxes: int) -> list[str]:
    """Assert the level is well formed, unsolved and solvable; return a solution."""
    rows = text.split("\n")
    assert len(rows) == dim and all(len(row) == dim for row in rows)
    assert set(rows[0]) == set(rows[-1]) == {"#"}
    assert all(row[0] == row[-1] == "#" for row in rows)
    walls, boxes, targets, _ = parse(text)
    assert len(boxes) == len(targets) == num_boxes
    assert boxes != targets, "level handed out already solved"
    plan = solve(text)
    assert plan, f"unsolvable level:\n{text}"
    return plan


@pytest.mark.parametrize("dim,num_boxes,seeds", [(6, 1, range(200)), (8, 2, range(50))])
def test_generated_levels_are_solvable_and_unsolved(dim, num_boxes, seeds):
    env = make("sokoban", dim=dim, num_boxes=num_boxes)
    for seed in seeds:
        obs, info = env.reset(seed=seed)
        assert obs == env.render() and info == {"action_valid": True, "success": False}
        check_level(obs, dim, num_boxes)


def test_larger_rooms_generate():
    env = make("sokoban", dim=10, num_boxes=3)
    for seed in range(3):
        text, _ = env.reset(seed=seed)
        walls, boxes, targets, _ = parse(text)
        assert len(text.split("\n")) == 10 and len(boxes) == len(targets) == 3
        assert boxes != targets


@pytest.mark.parametrize("dim,num_boxes,seeds", [(6, 1, range(30)), (8, 2, range(5))])
def test_replaying_the_solution_solves(dim, num_boxes, seeds):
    env = make("sokoban", dim=dim, num_boxes=num_boxes)
    for seed in seeds:
        text, _ = env.reset(seed=seed)
        plan = solve(text)
        for i, action in enumerate(plan):
            _, reward, terminated, truncated, info = env.step(action)
            assert info["action_valid"] and not truncated
            assert terminated == info["success"] == (i == len(plan) - 1)
        assert reward == pytest.approx(-0.1 + 1 + 10)
        assert env.is_success() and env.boxes == env.targets


def test_determinism_per_seed():
    env = make("sokoban")
    first = [env.reset(seed=s)[0] for s in range(10)]
    again = [make("sokoban").reset(seed=s)[0] for s in range(10)]
    assert first == again
    assert len(set(first)) > 5


def test_reward_matches_boxes_on_targets_under_random_play():
    env = make("sokoban", dim=8, num_boxes=2)
    rng = random.Random(0)
    for seed in range(5):
        env.reset(seed=seed)
        for _ in range(60):
            before = len(env.boxes & env.targets)
            _, reward, terminated, _, info = env.step(rng.choice(list(DELTAS)))
            after = len(env.boxes & env.targets)
            assert info["action_valid"]
            assert len(env.boxes) == 2 and not env.boxes & env.walls
            assert env.player not in env.boxes | env.walls
            assert reward == pytest.approx(-0.1 + (after - before) + 10 * terminated)
            if terminated:
                break


ROOM = "\n".join([
    "######",
    "#PXX_#",
    "#X___#",
    "#OOO_#",
    "######",
])


def test_moves_into_walls_and_blocked_pushes_change_nothing():
    env = Sokoban.from_text(ROOM)
    for action in ("Up", "Right"):  # a wall; a box pushed into a second box
        _, reward, terminated, truncated, info = env.step(action)
        assert env.render() == ROOM and env.last_move_blocked
        assert info["action_valid"] and reward == pytest.approx(-0.1)
        assert not terminated and not truncated
    assert env.steps == 2
    _, reward, *_ = env.step("Down")  # box (2,1) onto the target (3,1)
    assert reward == pytest.approx(0.9) and not env.last_move_blocked
    assert env.player == (2, 1) and (3, 1) in env.boxes
    before = env.render()
    _, reward, *_ = env.step("Down")  # that box against the bottom wall
    assert env.render() == before and env.last_move_blocked
    assert reward == pytest.approx(-0.1)


def test_reward_for_plain_move_and_box_off_target():
    env = Sokoban.from_text("######\n#P√__#\n#_X_O#\n######")
    _, reward, *_ = env.step("Down")
    assert reward == pytest.approx(-0.1) and env.player == (2, 1)
    env.step("Up")
    _, reward, terminated, _, info = env.step("Right")
    assert reward == pytest.approx(-1.1) and not terminated and not info["success"]
    assert env.render() == "######\n#_SX_#\n#_X_O#\n######"


def test_solving_step():
    env = Sokoban.from_text("######\n#PXO_#\n#_√__#\n######")
    _, reward, terminated, truncated, info = env.step("right")
    assert reward == pytest.approx(10 + 1 - 0.1)
    assert terminated and not truncated and info["success"] and env.is_success()
    assert env.render() == "######\n#_P√_#\n#_√__#\n######"


def test_truncation_after_max_steps():
    env = Sokoban.from_text("#####\n#P_X#\n#__O#\n#####", max_steps=3)
    results = [env.step(a) for a in ("Down", "Up", "Up")]
    assert [r[3] for r in results] == [False, False, True]
    assert not any(r[2] for r in results)


@pytest.mark.parametrize("text", ["jump", "", "UPP", "up up", "north", "!Up", "U"])
def test_invalid_text_changes_nothing(text):
    env = Sokoban.from_text(ROOM)
    obs, reward, terminated, truncated, info = env.step(text)
    assert obs == ROOM and reward == 0.0 and not terminated and not truncated
    assert info["action_valid"] is False and env.steps == 0


@pytest.mark.parametrize("text,player", [
    ("down", (2, 2)), ("DOWN", (2, 2)), (" Down. ", (2, 2)), ("down.", (2, 2)),
    ("LEFT", (1, 1)), ("right", (1, 3)), ("Up", (1, 2)),
])
def test_action_names_are_case_insensitive(text, player):
    env = Sokoban.from_text("#####\n#_P_#\n#__X#\n#O__#\n#####")
    _, _, _, _, info = env.step(text)
    assert info["action_valid"] and env.player == player
    assert env.last_move_blocked == (text == "Up")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=12))
def test_step_never_raises(text):
    env = Sokoban.from_text(ROOM)
    _, _, _, _, info = env.step(text)
    valid = bool(re.fullmatch(r"\s*(up|down|left|right)[\s.,;:!?]*", text, re.IGNORECASE))
    assert info["action_valid"] == valid


def test_render_round_trip_and_describe():
    text = "######\n#S_X_#\n#_√XO#\n######"
    env = Sokoban.from_text(text)
    assert env.render() == text
    assert env.describe() == (
        "Player at (1,1); Box at (1,3), (2,2), (2,3); Target at (1,1), (2,2), (2,4)."
    )


def test_describe_of_a_generated_level_matches_the_grid():
    env = make("sokoban", dim=8, num_boxes=2)
    env.reset(seed=3)
    walls, boxes, targets, player = parse(env.render())
    fmt = lambda cells: ", ".join(f"({r},{c})" for r, c in sorted(cells))  # noqa: E731
    assert env.describe() == (
        f"Player at ({player[0]},{player[1]}); Box at {fmt(boxes)}; Target at {fmt(targets)}."
    )
    assert (env.walls, env.boxes, env.targets, env.player) == (walls, boxes, targets, player)


def test_rules_name_symbols_and_actions():
    rules = make("sokoban").rules()
    for word in ("#", "_", "O", "X", "√", "P", "S", "(row, col)", "0-indexed", "Up", "Down",
                 "Left", "Right"):
        assert word in rules
    assert "sokoban" in env_names()


@pytest.mark.parametrize("options,bad", [
    ({"dim": 3}, "dim"), ({"dim": 6.5}, "dim"), ({"dim": "6"}, "dim"),
    ({"num_boxes": 0}, "num_boxes"), ({"num_boxes": 5}, "num_boxes"),
    ({"max_steps": 0}, "max_steps"), ({"search_depth": 0}, "search_depth"),
    ({"walk_steps": -1}, "walk_steps"),
    ({"size": 6}, "size"),
])
def test_bad_config_is_a_clear_error(options, bad):
    with pytest.raises(ValueError, match=bad):
        make("sokoban", **options)


def test_generation_failure_is_a_runtime_error():
    env = make("sokoban", dim=5, walk_steps=1)  # at most 3 floor cells: never enough room
    with pytest.raises(RuntimeError, match="could not generate"):
        env.reset(seed=0)


@pytest.mark.parametrize("grid,match", [
    ("####\n#PP#\n#XO#\n####", "one player"),
    ("####\n#P_#\n#X_#\n####", "as many boxes"),
    ("####\n#P?#\n#XO#\n####", "unknown symbol"),
    ("####\n#P#\n#XO#\n####", "same length"),
])
def test_from_text_rejects_bad_grids(grid, match):
    with pytest.raises(ValueError, match=match):
        Sokoban.from_text(grid)


# -- the solver and best actions (the per-turn "best first action" metric) ----------------
# Box (2,2) must go down onto the target (3,2): the player walks Up, Up, Up, Left to stand
# above it, then pushes Down. Left and Right lead around the long way; Down is a wall.
ONE_WAY = "######\n#____#\n#_X__#\n#_O__#\n#__P_#\n######"
# The same, one column wider on the right: now walking left first (around the box's left
# side) or right first (around its right side) is as short as Up, Left/Right, Up, Up, ...
TWO_SIDES = "#######\n#_____#\n#__X__#\n#__O__#\n#__P__#\n#######"


def test_solver_finds_the_shortest_plan_and_every_first_move():
    solution = env_solve(Sokoban.from_text(ONE_WAY))
    assert solution.plan == ["Up", "Up", "Up", "Left", "Down"]
    assert solution.first_moves == {"Up"}
    assert Sokoban.from_text(ONE_WAY).best_actions() == {"Up"}
    # Shortest paths of the same length meet at the cell above the box: their first moves merge.
    two_sides = Sokoban.from_text(TWO_SIDES)
    assert len(env_solve(two_sides).plan) == 6
    assert two_sides.best_actions() == {"Left", "Up", "Right"}


def test_best_actions_are_none_when_solved_unsolvable_or_over_the_state_cap():
    assert Sokoban.from_text("######\n#PXO_#\n#_√__#\n######").best_actions() == {"Right"}
    solved = Sokoban.from_text("######\n#P√__#\n######")
    assert solved.best_actions() is None and env_solve(solved) == ([], frozenset())
    cornered = Sokoban.from_text("#####\n#X_O#\n#_P_#\n#####")  # a box in a corner never moves
    assert cornered.best_actions() is None and env_solve(cornered) is None
    assert env_solve(Sokoban.from_text(ONE_WAY), max_states=5) is None


@pytest.mark.parametrize("dim,num_boxes,seeds", [(6, 1, range(30)), (7, 2, range(6))])
def test_best_actions_are_the_moves_whose_successor_has_a_shorter_solution(dim, num_boxes, seeds):
    # Checked against this file's own BFS, at each level's start and along random play.
    rng = random.Random(0)
    env = make("sokoban", dim=dim, num_boxes=num_boxes)
    for seed in seeds:
        env.reset(seed=seed)
        for _ in range(4):
            plan = solve(env.render())
            if plan is None or not plan:
                assert env.best_actions() is None
                break
            shorter = set()
            for move in DELTAS:
                after = copy.deepcopy(env)
                after.step(move)
                rest = solve(after.render())
                if rest is not None and len(rest) < len(plan):
                    shorter.add(move)
            assert env.best_actions() == shorter, f"seed {seed}:\n{env.render()}"
            env.step(rng.choice(list(DELTAS)))

