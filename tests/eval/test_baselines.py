"""Baseline policies: the oracle against solvers written here, random validity, determinism,
the same accounting as a model rollout, and the ``spa eval --policy`` command.

The shortest-path checks use BFS solvers written here from the rendered grid and the
gymnasium-letter layout, independent of ``spa.eval.baselines``'s own solvers.
"""

from __future__ import annotations

import json
from collections import deque

import pytest
from typer.testing import CliRunner

from spa.agent.prompts import PromptConfig
from spa.agent.rollout import RolloutConfig, rollout
from spa.agent.seeds import eval_seeds
from spa.cli import app
from spa.envs import make
from spa.eval.baselines import play
from spa.eval.metrics import pass_at_k_interval, summarize
from spa.models.engine import SamplingParams
from scripted import ScriptedEngine

DELTAS = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
SEEDS = eval_seeds(48)


def config(env: str, options: dict | None = None, turns: int = 5, per_turn: int = 3,
           mode: str = "state") -> RolloutConfig:
    return RolloutConfig(env, options or {}, PromptConfig(mode, turns, per_turn))


def sokoban_shortest(grid: str) -> int | None:
    """Fewest moves solving a rendered Sokoban grid (BFS over player and boxes)."""
    cells = {(r, c): ch for r, row in enumerate(grid.split("\n")) for c, ch in enumerate(row)}
    walls = {p for p, ch in cells.items() if ch == "#"}
    targets = frozenset(p for p, ch in cells.items() if ch in "O√S")
    boxes = frozenset(p for p, ch in cells.items() if ch in "X√")
    player = next(p for p, ch in cells.items() if ch in "PS")
    seen, queue = {(player, boxes)}, deque([(player, boxes, 0)])
    while queue:
        pos, boxes, moves = queue.popleft()
        if boxes == targets:
            return moves
        for dr, dc in DELTAS.values():
            ahead = (pos[0] + dr, pos[1] + dc)
            beyond = (ahead[0] + dr, ahead[1] + dc)
            if ahead in walls or (ahead in boxes and (beyond in walls or beyond in boxes)):
                continue
            moved = (boxes - {ahead}) | {beyond} if ahead in boxes else boxes
            if (ahead, moved) not in seen:
                seen.add((ahead, moved))
                queue.append((ahead, moved, moves + 1))
    return None


def lake_distance(layout: list[str], start: tuple[int, int]) -> int | None:
    """Fewest moves from ``start`` to ``G`` over non-hole tiles of a gymnasium-letter map."""
    cells = {(r, c): ch for r, row in enumerate(layout) for c, ch in enumerate(row)}
    seen, queue = {start}, deque([(start, 0)])
    while queue:
        (r, c), moves = queue.popleft()
        if cells[(r, c)] == "G":
            return moves
        for dr, dc in DELTAS.values():
            nxt = (r + dr, c + dc)
            if cells.get(nxt, "H") != "H" and nxt not in seen:
                seen.add(nxt)
                queue.append((nxt, moves + 1))
    return None


def initial(env_name: str, seed: int, **options):
    env = make(env_name, **options)
    env.reset(seed=seed)
    return env


# -- the oracle ---------------------------------------------------------------------


def test_oracle_solves_deterministic_frozenlake_in_the_fewest_moves():
    trajectories = play("oracle", SEEDS, 1, config("frozenlake", {"is_slippery": False}, turns=12))
    for t in trajectories:
        env = initial("frozenlake", t.seed, is_slippery=False)
        assert t.success, f"seed {t.seed} not solved"
        assert t.num_actions == lake_distance(env.layout(), env.player), f"seed {t.seed}"


def test_oracle_solves_sokoban_in_the_fewest_moves():
    trajectories = play("oracle", SEEDS, 1, config("sokoban", turns=12))
    for t in trajectories:
        assert t.success, f"seed {t.seed} not solved"
        assert t.num_actions == sokoban_shortest(initial("sokoban", t.seed).render()), f"seed {t.seed}"


def test_oracle_solves_sudoku_one_cell_per_action():
    trajectories = play("oracle", SEEDS[:16], 1, config("sudoku", turns=4))
    for t in trajectories:
        assert t.success and t.num_actions == len(initial("sudoku", t.seed).empty_cells())


def test_oracle_replans_after_every_slip():
    # Half the moves slide. Replaying each episode's actions from the level's start (the
    # slides come from the level's seed, so the replay slides the same way), every action
    # must head down a shortest path from where the player actually is, also within a turn.
    trajectories = play("oracle", SEEDS, 1, config("frozenlake", {"success_rate": 0.5}, turns=10))
    slides = 0
    for t in trajectories:
        env = initial("frozenlake", t.seed, success_rate=0.5)
        layout = env.layout()
        for action in (a for turn in t.turns for a in turn.actions):
            before = env.player
            intended = (before[0] + DELTAS[action][0], before[1] + DELTAS[action][1])
            assert lake_distance(layout, intended) == lake_distance(layout, before) - 1, f"seed {t.seed}"
            env.step(action)
            slides += env.player != intended
        assert env.state_text() == t.turns[-1].state_after
    assert slides > 10
    assert summarize(trajectories)["success_rate"] > 0.5


# -- the best-first-action rate -----------------------------------------------------


@pytest.mark.parametrize("env,options", [("frozenlake", {"is_slippery": False}), ("frozenlake", {}),
                                         ("sokoban", {}), ("sudoku", {})])
def test_the_oracle_always_starts_a_shortest_solution_and_random_play_rarely(env, options):
    # The oracle plays a best action every turn, slippery or not (slips happen after the
    # choice). Random play picks one of the four moves; on these small lakes one or two of
    # them lead closer, on Sokoban usually one; on Sudoku a random cell and value.
    oracle = summarize(play("oracle", SEEDS[:24], 1, config(env, options)))
    assert oracle["best_first_rate"] == 1.0
    random_rate = summarize(play("random", SEEDS, 2, config(env, options)))["best_first_rate"]
    assert 0.15 < random_rate < 0.5


# -- the random policy --------------------------------------------------------------


@pytest.mark.parametrize("env", ["sokoban", "frozenlake", "sudoku"])
def test_random_actions_are_always_valid_and_varied(env):
    trajectories = play("random", SEEDS[:16], 2, config(env, turns=5, per_turn=3))
    actions = [a for t in trajectories for turn in t.turns for a in turn.actions]
    valid = [v for t in trajectories for turn in t.turns for v in turn.actions_valid]
    assert len(actions) == len(valid) > 100 and all(valid)
    # Uniform, not a fixed move: every direction shows up, Sudoku writes many cells.
    assert len(set(actions)) >= (4 if env != "sudoku" else 20)
    assert all(turn.format_ok and turn.reward == turn.env_reward for t in trajectories for turn in t.turns)


def test_runs_are_reproducible_and_seeded_by_sample_and_seed():
    cfg = config("frozenlake")
    first, again = play("random", SEEDS[:8], 4, cfg), play("random", SEEDS[:8], 4, cfg)
    assert [t.to_json() for t in first] == [t.to_json() for t in again]
    answers = [[turn.answer for turn in t.turns] for t in first]
    assert len({tuple(map(tuple, answers[i:i + 4])) for i in range(0, 32, 4)}) > 1
    assert answers[0] != answers[1]  # two samples of one level play differently
    other = play("random", SEEDS[:8], 4, cfg, seed=1)
    assert [t.to_json() for t in other] != [t.to_json() for t in first]


# -- the same accounting as a model --------------------------------------------------


@pytest.mark.parametrize("env,policy", [("frozenlake", "oracle"), ("frozenlake", "random"),
                                        ("sokoban", "random"), ("sudoku", "oracle")])
def test_a_model_writing_the_same_responses_gets_the_same_episodes(tiny, env, policy):
    _, tokenizer = tiny
    cfg = config(env, turns=4, per_turn=2, mode="world_model")
    baseline = play(policy, SEEDS[:6], 1, cfg)
    script = [[t.turns[i].response for t in baseline if len(t.turns) > i]
              for i in range(cfg.prompt.max_turns)]
    script = [responses for responses in script if responses]
    replayed = rollout(ScriptedEngine(tokenizer, script), tokenizer, SEEDS[:6], 1, cfg, SamplingParams())
    keys = ("answer", "actions", "actions_valid", "format_ok", "state_before", "state_after",
            "reward", "prompt_messages", "best_first")
    for ours, theirs in zip(baseline, replayed):
        assert (ours.success, ours.terminated, len(ours.turns)) == \
               (theirs.success, theirs.terminated, len(theirs.turns))
        for a, b in zip(ours.turns, theirs.turns):
            assert {k: getattr(a, k) for k in keys} == {k: getattr(b, k) for k in keys}
    ours, theirs = summarize(baseline), summarize(replayed)
    for key in ("success_rate", "pass_at_k", "mean_reward", "mean_actions", "format_valid_rate", "best_first_rate"):
        assert ours[key] == theirs[key]


def test_pass_at_k_interval_is_over_levels():
    class T:
        def __init__(self, group, success):
            self.group, self.success = group, success

    # Six levels of two samples, Pass@1 of 1, 0 and four of 0.5: mean 0.5, sample variance
    # 0.5 / 5 = 0.1, half-width 1.96 * sqrt(0.1 / 6). Episodes would give sqrt(0.25 / 11).
    outcomes = [(True, True), (False, False)] + [(True, False)] * 4
    runs = [T(level, s) for level, pair in enumerate(outcomes) for s in pair]
    half = 1.96 * (0.1 / 6) ** 0.5
    assert pass_at_k_interval(runs, 1) == pytest.approx((0.5 - half, 0.5 + half))
    # Pass@2 of those levels: 1, 0 and four of 1; the interval is clipped at 1.
    assert pass_at_k_interval(runs, 2)[1] == 1.0
    assert pass_at_k_interval([T(0, True), T(1, True)], 1) == (1.0, 1.0)


# -- the command --------------------------------------------------------------------


def test_cli_random_policy_writes_the_usual_outputs_without_a_model(tmp_path, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("a baseline must not load a model")

    monkeypatch.setattr("spa.cli.evaluation.load", no_model)
    out = tmp_path / "tmp"
    result = CliRunner().invoke(app, ["eval", "--policy", "random", "-e", "frozenlake", "--levels", "4",
                                      "--samples", "2", "--out", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["episodes"] == 8 and metrics["policy"] == "random"
    assert metrics["action_valid_rate"] == 1.0 and "world_model" not in metrics
    assert set(metrics["pass_at_k_ci95"]) == {"pass@1", "pass@2"}
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 8 and json.loads(lines[0])["seed"] == SEEDS[0]
    report = (out / "report.md").read_text()
    assert "| success rate (Pass@1) |" in report and "| pass@2 95% interval |" in report
    assert "random policy" in result.output and "pass@2 95% interval" in result.output
    assert 0 < metrics["best_first_rate"] < 1
    assert "| best first action |" in report and "best first action" in result.output


def test_cli_rejects_an_unknown_policy():
    result = CliRunner().invoke(app, ["eval", "-e", "sokoban", "--policy", "greedy"], terminal_width=200)
    output = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2 and "'greedy'" in output and "model, random, oracle" in output


# -- the value policy ---------------------------------------------------------------


def test_the_value_policy_takes_the_move_that_wins_at_once():
    # Right reaches the goal now (value exactly 1); every other move leaves it to random
    # play, which misses it on some forks, so greedy play wins every episode in one move.
    cfg = config("frozenlake", {"desc": "SGF/FFF/FFF", "is_slippery": False}, turns=2, per_turn=1, mode="base")
    trajectories = play("value", SEEDS[:4], 2, cfg)
    assert all(t.success and [turn.actions for turn in t.turns] == [["Right"]] for t in trajectories)


def test_the_value_policy_beats_random_play_without_asking_a_solver(monkeypatch):
    import numpy as np

    from spa.envs.frozen_lake import FrozenLakeEnv
    from spa.eval.baselines import value_policy

    cfg = config("frozenlake", {"size": 3, "is_slippery": False}, turns=4, per_turn=1, mode="base")
    value, chance = (summarize(play(policy, SEEDS[:24], 2, cfg))["success_rate"] for policy in ("value", "random"))
    assert value >= chance + 0.3, (value, chance)

    def no_solver(self):
        raise AssertionError("the value policy must not ask the solver")

    monkeypatch.setattr(FrozenLakeEnv, "best_actions", no_solver)  # the metrics ask it; the policy must not
    env, act = make("frozenlake"), value_policy(np.random.default_rng(0), rollouts=8)
    env.reset(seed=SEEDS[0])
    for _ in range(5):
        if env.step(act(env))[2]:
            break


def test_cli_value_policy_plays_without_a_model(tmp_path, monkeypatch):
    monkeypatch.setattr("spa.cli.evaluation.load", lambda *a, **k: pytest.fail("a baseline must not load a model"))
    out = tmp_path / "value"
    result = CliRunner().invoke(app, ["eval", "--policy", "value", "-e", "frozenlake", "--levels", "2",
                                      "--samples", "1", "--out", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["policy"] == "value" and metrics["episodes"] == 2 and metrics["action_valid_rate"] == 1.0
