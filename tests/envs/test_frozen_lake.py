"""FrozenLake: gymnasium equivalence (deterministic and slippery), map generation, text API."""

from __future__ import annotations

import re
from collections import Counter, deque

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spa.envs import make
from spa.envs.frozen_lake import ACTIONS, FrozenLakeEnv

#: What every environment accepts around a name (spa.envs.base.clean_action), written out.
VALID_SPELLING = re.compile(r"\s*(left|down|right|up)[\s.,;:!?]*", re.IGNORECASE)

GYM_4X4 = ["SFFF", "FHFH", "FFFH", "HFFG"]
GYM_8X8 = [
    "SFFFFFFF", "FFFFFFFF", "FFFHFFFF", "FFFFFHFF",
    "FFFHFFFF", "FHHFFFHF", "FHFFHFHF", "FFFHFFFG",
]


def gym_lake(rows: list[str], **kwargs) -> gym.Env:
    return gym.make("FrozenLake-v1", desc=rows, **kwargs)


def state_index(env: FrozenLakeEnv) -> int:
    row, col = env.player
    return row * len(env.layout()[0]) + col


def bfs_reachable(rows: list[str]) -> bool:
    """An independent check that ``G`` can be reached from ``S`` over non-hole tiles."""
    cells = {(r, c): ch for r, line in enumerate(rows) for c, ch in enumerate(line)}
    start = next(pos for pos, ch in cells.items() if ch == "S")
    seen, queue = {start}, deque([start])
    while queue:
        r, c = queue.popleft()
        if cells[(r, c)] == "G":
            return True
        for nxt in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if cells.get(nxt, "H") != "H" and nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return False


# -- equivalence with gymnasium ------------------------------------------------------


def generated_layouts() -> list[list[str]]:
    layouts = []
    for size, seed in ((4, 1), (6, 2), (8, 3)):
        env = make("frozenlake", size=size)
        env.reset(seed=seed)
        layouts.append(env.layout())
    return layouts


@pytest.mark.parametrize("rows", [GYM_4X4, GYM_8X8, *generated_layouts()])
def test_non_slippery_matches_gymnasium_step_by_step(rows: list[str]) -> None:
    ours = FrozenLakeEnv.from_desc(rows, is_slippery=False)
    theirs = gym_lake(rows, is_slippery=False)
    rng = np.random.default_rng(0)
    for episode in range(60):
        ours.reset(seed=episode)
        state, _ = theirs.reset(seed=episode)
        assert state_index(ours) == state
        # 30 steps: past termination too (both treat holes and the goal as absorbing),
        # and below gymnasium's TimeLimit of 100 steps.
        for action in rng.integers(0, 4, size=30):
            _, reward, terminated, _, info = ours.step(ACTIONS[action])
            state, gym_reward, gym_terminated, _, _ = theirs.step(int(action))
            assert info["action_valid"]
            assert (state_index(ours), reward, terminated) == (state, gym_reward, gym_terminated)
            assert info["success"] == (rows[state // len(rows[0])][state % len(rows[0])] == "G")


# Upper 1e-4 quantiles of the chi-square distribution (df = categories - 1). The seed is
# fixed, so the test is deterministic; alpha only bounds how unlucky that seed could be.
CHI2_CRITICAL = {1: 15.137, 2: 18.421}


def with_start(row: int, col: int) -> list[str]:
    """Gymnasium's 4x4 map with the start moved to (row, col); S is plain ice there."""
    grid = [list(line.replace("S", "F")) for line in GYM_4X4]
    grid[row][col] = "S"
    return ["".join(line) for line in grid]


@pytest.mark.parametrize("success_rate", [1 / 3, 0.8])
@pytest.mark.parametrize(
    ("pos", "action"),
    [((0, 0), 0), ((1, 2), 1), ((2, 1), 2), ((0, 3), 3), ((2, 2), 1)],
    ids=["corner-left", "between-holes-down", "right", "edge-up", "to-goal-down"],
)
def test_slippery_distribution_matches_gymnasium_table(
    success_rate: float, pos: tuple[int, int], action: int
) -> None:
    rows = with_start(*pos)
    table = gym_lake(rows, is_slippery=True, success_rate=success_rate).unwrapped.P
    expected: dict[int, float] = Counter()
    outcome: dict[int, tuple[float, bool]] = {}
    for prob, nxt, reward, terminated in table[pos[0] * 4 + pos[1]][action]:
        expected[nxt] += prob
        outcome[nxt] = (float(reward), terminated)

    env = FrozenLakeEnv.from_desc(rows, success_rate=success_rate)
    env.reset(seed=1234)
    n = 3000
    counts: Counter[int] = Counter()
    for _ in range(n):
        env.reset()  # same map, the rng stream continues
        _, reward, terminated, _, _ = env.step(ACTIONS[action])
        counts[state_index(env)] += 1
        assert (reward, terminated) == outcome[state_index(env)]

    assert set(counts) <= {s for s, prob in expected.items() if prob > 0}
    cats = [s for s, prob in expected.items() if prob > 0]
    chi2 = sum((counts[s] - n * expected[s]) ** 2 / (n * expected[s]) for s in cats)
    assert chi2 < CHI2_CRITICAL[len(cats) - 1], (dict(counts), dict(expected))


def test_success_rate_one_is_deterministic() -> None:
    env = FrozenLakeEnv.from_desc(GYM_4X4, success_rate=1.0)
    env.reset(seed=0)
    for name, pos in [("Right", (0, 1)), ("Right", (0, 2)), ("Down", (1, 2)), ("Down", (2, 2))]:
        env.step(name)
        assert env.player == pos


# -- map generation ------------------------------------------------------------------


@pytest.mark.parametrize("size", [4, 6, 8])
def test_generated_maps_are_solvable_and_well_formed(size: int) -> None:
    env = make("frozenlake", size=size)
    for seed in range(150):
        obs, info = env.reset(seed=seed)
        rows = env.layout()
        assert len(rows) == size and all(len(line) == size for line in rows)
        assert "".join(rows).count("S") == 1 and "".join(rows).count("G") == 1
        assert bfs_reachable(rows), rows
        # The raw grid shows the same map, with the player on the start tile.
        expected = [line.replace("S", "P").replace("F", "_").replace("H", "O") for line in rows]
        assert obs == "\n".join(expected)
        assert info == {"action_valid": True, "success": False}


def test_hole_density_follows_p_and_extremes_work() -> None:
    env = make("frozenlake", size=8, p=0.8)
    fractions = []
    for seed in range(100):
        env.reset(seed=seed)
        fractions.append(len(env.holes) / 62)  # start and goal are never holes
    # Solvability filtering biases towards fewer holes, so only a loose band around 0.2.
    assert 0.1 < np.mean(fractions) < 0.25
    env = make("frozenlake", size=6, p=1.0)
    env.reset(seed=0)
    assert env.holes == []
    env = make("frozenlake", size=6, p=0.0)  # all holes: start must be next to the goal
    env.reset(seed=0)
    (r1, c1), (r2, c2) = env.player, env.goal
    assert abs(r1 - r2) + abs(c1 - c2) == 1 and len(env.holes) == 34


def test_same_seed_same_episode_and_different_seeds_differ() -> None:
    def play(seed: int) -> list[str]:
        env = make("frozenlake", size=6, success_rate=0.5)
        obs, _ = env.reset(seed=seed)
        frames = [obs]
        for i in range(40):
            frames.append(env.step(ACTIONS[i % 4])[0])
        return frames

    assert play(7) == play(7)
    assert len({play(seed)[0] for seed in range(10)}) > 5


# -- text interface ------------------------------------------------------------------


def test_symbols_describe_and_rewards_on_a_fixed_map() -> None:
    env = FrozenLakeEnv.from_desc("SFFF/FHFH/FFFH/HFFG", is_slippery=False)
    obs, _ = env.reset(seed=0)
    assert obs == "P___\n_O_O\n___O\nO__G"
    assert env.describe() == "Player at (0,0); Goal at (3,3); Hole at (1,1), (1,3), (2,3), (3,0)."
    obs, reward, terminated, truncated, info = env.step("Right")
    assert obs.splitlines()[0] == "_P__"  # the start tile becomes plain ice
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, False, False)
    obs, reward, terminated, _, info = env.step("Down")
    assert obs.splitlines()[1] == "_X_O"
    assert (reward, terminated, info["success"]) == (0.0, True, False)
    assert env.describe().startswith("Player at (1,1);")

    env.reset(seed=0)
    for name in ["Down", "Down", "Right", "Right", "Down"]:
        assert env.step(name)[1] == 0.0
    obs, reward, terminated, _, info = env.step("Right")
    assert obs == "____\n_O_O\n___O\nO__√"
    assert (reward, terminated, info["success"]) == (1.0, True, True)
    assert env.describe() == "Player at (3,3); Goal at (3,3); Hole at (1,1), (1,3), (2,3), (3,0)."


def test_describe_without_holes() -> None:
    env = FrozenLakeEnv.from_desc(["SF", "FG"])
    env.reset(seed=0)
    assert env.describe() == "Player at (0,0); Goal at (1,1)."


@pytest.mark.parametrize("text", [" left ", "DOWN", "rIgHt\n", "\tUp", "Left.", "up!", " Down . "])
def test_action_names_are_case_insensitive(text: str) -> None:
    env = FrozenLakeEnv.from_desc(GYM_4X4, is_slippery=False)
    env.reset(seed=0)
    _, _, _, _, info = env.step(text)
    assert info["action_valid"] and info["action"] == text.strip(" .!\n\t").capitalize()


def test_invalid_actions_change_nothing_and_do_not_touch_the_rng() -> None:
    env = make("frozenlake", size=6, success_rate=0.5, max_steps=2)
    clean = make("frozenlake", size=6, success_rate=0.5, max_steps=2)
    env.reset(seed=5)
    clean.reset(seed=5)
    for bad in ["", "  ", "jump", "Left Right", "lef", ".Left", None, 3]:
        before = (env.render(), env.describe())
        obs, reward, terminated, truncated, info = env.step(bad)  # type: ignore[arg-type]
        assert (obs, reward, terminated, truncated) == (before[0], 0.0, False, False)
        assert info["action_valid"] is False and "Left, Down, Right, Up" in info["reason"]
        assert env.describe() == before[1]
    for name in ["Up", "Left"]:
        assert env.step(name) == clean.step(name)  # same slips: no rng was used
    assert env.steps == 2


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=12))
def test_step_never_raises(text: str) -> None:
    env = FrozenLakeEnv.from_desc(GYM_4X4)
    env.reset(seed=0)
    _, _, _, _, info = env.step(text)
    assert info["action_valid"] == bool(VALID_SPELLING.fullmatch(text))


def test_truncation_after_max_steps() -> None:
    env = FrozenLakeEnv.from_desc(["SFF", "FFF", "FFG"], is_slippery=False, max_steps=3)
    env.reset(seed=0)
    results = [env.step("Left")[2:4] for _ in range(3)]  # into the border: stays put
    assert results == [(False, False), (False, False), (False, True)]


def test_rules_mention_symbols_coordinates_and_actions() -> None:
    text = FrozenLakeEnv.from_desc(GYM_4X4, success_rate=0.8).rules()
    for token in ["P ", "_ ", "O ", "G ", "X ", "√ ", "(row, col)", "0-indexed", "0.8"]:
        assert token in text
    assert all(name in text for name in ACTIONS)
    assert "not slippery" in FrozenLakeEnv.from_desc(GYM_4X4, is_slippery=False).rules()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"size": 1}, "size=1"),
        ({"size": 17}, "size=17"),
        ({"size": 4.5}, "size=4.5"),
        ({"size": True}, "size=True"),
        ({"p": 1.5}, "p=1.5"),
        ({"p": "high"}, "p='high'"),
        ({"success_rate": -0.1}, "success_rate=-0.1"),
        ({"is_slippery": "yes"}, "is_slippery='yes'"),
        ({"max_steps": 0}, "max_steps=0"),
        ({"desc": "SFX/FFG"}, "invalid letter"),
        ({"desc": "SF/FFG"}, "equal length"),
        ({"desc": "SS/FG"}, "exactly one start"),
        ({"desc": "SF/FF"}, "exactly one goal"),
        ({"colour": "blue"}, "valid options"),
    ],
)
def test_bad_config_is_a_clear_error(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make("frozenlake", **options)


# -- best actions (the per-turn "best first action" metric) -------------------------------
def test_best_actions_step_closer_around_holes_never_into_the_edge_or_a_hole() -> None:
    # S F F     distances to G: 4 3 2
    # F H F                     3 H 1
    # F F G                     2 1 0
    env = FrozenLakeEnv.from_desc(["SFF", "FHF", "FFG"], is_slippery=False)
    env.reset(seed=0)
    assert env.distances() == {(0, 0): 4, (0, 1): 3, (0, 2): 2, (1, 0): 3, (1, 2): 1,
                               (2, 0): 2, (2, 1): 1, (2, 2): 0}
    assert env.best_actions() == {"Down", "Right"}  # Left and Up bump into the edge
    env.step("Right")  # (0,1): Down falls into the hole, Up bumps, Left goes back
    assert env.best_actions() == {"Right"}
    env.step("Right")  # (0,2): Right and Up bump into the edge
    assert env.best_actions() == {"Down"}
    env.step("Down")
    env.step("Down")
    assert env.is_success() and env.best_actions() is None  # the episode has ended


def test_best_actions_ignore_slipping_and_end_in_a_hole_or_when_cut_off() -> None:
    slippery = FrozenLakeEnv.from_desc(["SFF", "FHF", "FFG"], success_rate=1 / 3)
    slippery.reset(seed=0)
    assert slippery.best_actions() == {"Down", "Right"}
    fallen = FrozenLakeEnv.from_desc(["SH", "FG"], is_slippery=False)
    fallen.reset(seed=0)
    assert fallen.best_actions() == {"Down"}
    fallen.step("Right")
    assert fallen.render() == "_X\n_G"
    assert fallen.best_actions() is None  # in the hole
    walled_off = FrozenLakeEnv.from_desc(["SHG"], is_slippery=False)
    walled_off.reset(seed=0)
    assert walled_off.best_actions() is None  # no path around the hole
