"""The scripts of experiments/: the reward-only filters of reward_filters.py on hand-built
episodes, seed_spread.py and paired_table.py on hand-built evaluations, and the cells comparison.sh
runs."""

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

SCRIPT = Path(__file__).parent.parent / "experiments" / "reward_filters.py"


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPT.with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def filters():
    return script("reward_filters")


@pytest.fixture(scope="module")
def spread():
    return script("seed_spread")


def write_rounds(run: Path, curve: list[tuple[float, float]], rl: bool = True) -> Path:
    """An archived run's evaluations: (Pass@1, actions a turn) for round 0, 1, ..."""
    for r, (pass1, actions) in enumerate(curve):
        folder = (run / "rl" if rl else run) / f"round-{r}" / "eval"
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps({
            "pass_at_k": {"pass@1": pass1}, "mean_turns": 2.0, "mean_actions": 2.0 * actions,
            "best_first_rate": 0.3}))
    return run


def test_seed_spread_reads_rounds_and_ranks_ties(spread, tmp_path):
    run = write_rounds(tmp_path / "a-s0", [(0.2, 2.0), (0.3, 1.5)])
    assert [spread.measures(m)["actions_per_turn"] for m in spread.rounds_of(run)] == [2.0, 1.5]
    assert spread.rounds_of(write_rounds(tmp_path / "it", [(0.2, 1.0)], rl=False))[0]["pass_at_k"]["pass@1"] == 0.2
    assert spread.ranks(np.array([3.0, 1.0, 3.0, 2.0])).tolist() == [3.5, 1.0, 3.5, 2.0]
    assert spread.recipe_of(Path("frozenlake-spa-iterate-s12")) == "frozenlake-spa-iterate"
    assert spread.t975(6) == 2.447 and spread.t975(11) == 2.228  # between rows: the lower df's, wider


def test_seed_spread_recovers_method_differences_at_equal_answer_length(spread, tmp_path, capsys):
    # end = 100 - 30 x actions + 10 (method b), exactly: the start's length hides b's lead,
    # which the covariate recovers; a difference alone misses it
    starts = {"a": [1.0, 1.5, 2.0], "b": [1.6, 2.0, 2.2]}
    runs = [write_rounds(tmp_path / f"{m}-s{i}", [(0.2, x), (0.3, x), ((100 - 30 * x + 10 * (m == "b")) / 100, x)])
            for m, xs in starts.items() for i, x in enumerate(xs)]
    result = spread.main([str(r) for r in runs] + ["--round", "2"])
    adjusted = result["difference_at_equal_actions_per_turn"]
    assert adjusted["b - a"]["points"] == pytest.approx(10.0) and adjusted["slope"]["points"] == pytest.approx(-30.0)
    assert adjusted["residual_sd"] == pytest.approx(0.0, abs=1e-6) and adjusted["df"] == 3
    plain = result["difference"]["b - a"]
    assert plain["points"] == pytest.approx(10 - 30 * (np.mean(starts["b"]) - np.mean(starts["a"])), abs=0.05)
    assert plain["ci95"][0] < plain["points"] < plain["ci95"][1]
    assert result["correlation_with_start"]["actions_per_turn"]["runs"] == 6
    assert "| a-s0 | 1.00 |" in capsys.readouterr().out


def test_seed_spread_holds_a_later_rounds_length_equal(spread, tmp_path):
    # every run starts at 1 action a turn; round 1 sets the length that the end follows
    # (end = 100 - 30 x round-1 length + 10 for b): only --length-round 1 recovers b's lead
    after = {"a": [1.0, 1.5, 2.0], "b": [1.6, 2.0, 2.2]}

    def curve(m: str, i: int, x: float) -> list[tuple[float, float]]:
        return [(0.2, 1.0 + 0.01 * i), (0.3, x), ((100 - 30 * x + 10 * (m == "b")) / 100, x)]

    runs = [write_rounds(tmp_path / f"{m}-s{i}", curve(m, i, x)) for m, xs in after.items() for i, x in enumerate(xs)]
    later = spread.main([str(r) for r in runs] + ["--round", "2", "--length-round", "1"])
    assert later["length_round"] == 1
    assert later["difference_at_equal_actions_per_turn"]["b - a"]["points"] == pytest.approx(10.0)
    start = spread.main([str(r) for r in runs] + ["--round", "2"])["difference_at_equal_actions_per_turn"]
    assert start["b - a"]["points"] != pytest.approx(10.0, abs=1.0)
    with pytest.raises(SystemExit, match="--length-round 3: must lie in 0..2"):
        spread.main([str(r) for r in runs] + ["--round", "2", "--length-round", "3"])


def test_seed_spread_compares_recipes_within_seeds(spread, tmp_path):
    # end = seed's level + 5 (method b) + a small interaction; the seeds' levels (30, 50,
    # 70) swamp the plain difference's interval, the blocked one keeps b's lead; seed 9,
    # run by one recipe only, changes neither the estimate nor the degrees of freedom
    level, wobble = {0: 30, 1: 50, 2: 70}, {0: 1.0, 1: -1.0, 2: 0.0}
    runs = [write_rounds(tmp_path / f"{m}-s{i}", [(0.2, 1.0), ((level[i] + (5 + wobble[i]) * (m == "b")) / 100, 1.0)])
            for m in ("a", "b") for i in level]
    runs.append(write_rounds(tmp_path / "b-s9", [(0.2, 1.0), (0.9, 1.0)]))
    result = spread.main([str(r) for r in runs] + ["--round", "1"])
    blocked = result["difference_within_seeds"]
    assert blocked["b - a"]["points"] == pytest.approx(5.0) and blocked["df"] == 2
    # by hand: residuals +-0.5 (seeds 0, 1) and 0, so RSS 1 on 2 df; the mean of three
    # paired differences has variance 2 x 0.5 / 3, and t(2) = 4.303
    assert blocked["residual_sd"] == pytest.approx(0.7)
    half = 4.303 * np.sqrt(2 * 0.5 / 3)
    assert blocked["b - a"]["ci95"] == pytest.approx([5 - half, 5 + half], abs=0.051)
    plain = result["difference"]["b - a"]
    assert plain["ci95"][0] < 0 < plain["ci95"][1]
    assert spread.seed_of(Path("x-iterate-s12")) == "s12" and spread.seed_of(Path("it")) == "it"


def test_seed_spread_leaves_out_runs_short_of_the_round(spread, tmp_path, capsys):
    runs = [write_rounds(tmp_path / f"a-s{i}", [(0.2, 1.0 + i), (0.1 * i, 1.0)]) for i in range(3)]
    short = write_rounds(tmp_path / "a-s9", [(0.2, 1.0)])
    result = spread.main([str(r) for r in [*runs, short]] + ["--round", "1"])
    assert result["correlation_with_start"]["actions_per_turn"]["pearson"] == pytest.approx(1.0)
    assert "a-s9: 0 rounds, fewer than 1: left out" in capsys.readouterr().out


def test_seed_spread_counts_a_live_run_and_its_archive_once(spread, tmp_path):
    # the archive (results/runs) stopped a round before the live run (runs/): one run, read
    # from the live copy, whichever order the two are given in
    runs = [write_rounds(tmp_path / "results" / f"a-s{i}", [(0.2, 1.0 + i), (0.1 * i, 1.0)]) for i in range(3)]
    archived = write_rounds(tmp_path / "results" / "a-s3", [(0.2, 4.0)])
    live = write_rounds(tmp_path / "runs" / "a-s3", [(0.2, 4.0), (0.9, 1.0)])
    for order in ([*runs, archived, live], [live, *runs, archived]):
        assert sorted(spread.distinct(order)) == sorted([*runs, live])
        result = spread.main([str(r) for r in order] + ["--round", "1"])
        assert result["correlation_with_start"]["actions_per_turn"]["runs"] == 4


def episode(seed: int, sample: int, success: bool, turns: list[tuple[int, bool]]) -> dict:
    """``turns``: (actions played, first action best) per well-formed turn."""
    return {"env": "sokoban", "seed": seed, "sample": sample, "success": success,
            "turns": [{"format_ok": True, "actions_valid": [True] * n, "best_first": best} for n, best in turns]}


def test_discount_counts_every_step_to_the_goal(filters):
    won = episode(0, 0, True, [(2, True), (1, False)])
    assert filters.discounted(won, 0.5) == pytest.approx(0.25)  # reward on the third step
    assert filters.discounted(episode(0, 1, False, [(3, True)]), 0.5) == 0.0
    weights = [w for _, w in filters.to_go(0.5)([won])]
    assert weights == pytest.approx([0.25, 1.0])  # the last turn reached the goal


def test_group_filters_compare_within_a_group(filters):
    slow = episode(0, 0, True, [(3, False), (3, True)])
    quick = episode(0, 1, True, [(2, True)])
    lost = episode(0, 2, False, [(3, False)])
    assert [t["best_first"] for t, _ in filters.fastest([slow, quick, lost])] == [True]
    # returns 0.9^5 = 0.59, 0.9, 0: mean 0.50, so both winners are above it
    assert len(filters.above_group(0.9)([slow, quick, lost])) == 3
    # at 0.5 the slow win is worth 0.03, below the mean of 0.18
    assert len(filters.above_group(0.5)([slow, quick, lost])) == 1


def test_groups_split_each_level_in_sample_order(filters):
    episodes = [episode(seed, sample, False, []) for seed in (7, 3) for sample in (3, 1, 0, 2)]
    groups = filters.groups_of(episodes, 2)
    assert [[(e["seed"], e["sample"]) for e in g] for g in groups] == [
        [(7, 0), (7, 1)], [(7, 2), (7, 3)], [(3, 0), (3, 1)], [(3, 2), (3, 3)]]


def test_main_scores_each_filter_by_the_solver_label(filters, tmp_path, capsys):
    path = tmp_path / "trajectories.jsonl"
    episodes = [episode(0, 0, True, [(1, True)]), episode(0, 1, False, [(1, False), (1, False)])]
    path.write_text("".join(json.dumps(e) + "\n" for e in episodes))
    filters.main(path, group=2)
    out = capsys.readouterr().out
    assert "| all turns | 3 | 3 | 33.3% |" in out
    assert "| winners (spa iterate --keep winners) | 1 | 1 | 100.0% |" in out
    assert "| losers | 2 | 2 | 0.0% |" in out


def test_chance_of_best_reads_the_lake_from_the_grid(filters):
    # Player top-left, goal two to the right, a hole below the middle: only Right is best.
    assert filters.chance_of_best({"grid_before": "P_G\n_O_\n___"}) == 0.25
    # Goal diagonal, nothing in the way: Right and Down both shorten the path.
    assert filters.chance_of_best({"grid_before": "P__\n___\n__G"}) == 0.5


def test_main_adds_the_chance_column_on_the_lake(filters, tmp_path, capsys):
    won = episode(0, 0, True, [(1, True)])
    won["env"] = "frozenlake"
    won["turns"][0]["grid_before"] = "P_G\n_O_\n___"
    path = tmp_path / "trajectories.jsonl"
    path.write_text(json.dumps(won) + "\n")
    filters.main(path, group=1)
    assert "| winners (spa iterate --keep winners) | 1 | 1 | 100.0% | 25.0% |" in capsys.readouterr().out


def test_main_adds_the_value_label_on_saved_trajectories(filters, tmp_path, capsys):
    """Random play on a lake without slips, saved as an evaluation saves it: the value label
    keeps fewer turns than all of them, and more of them begin a shortest path."""
    from spa.worldmodel.selfplay import SelfPlayConfig, collect

    config = SelfPlayConfig(env="frozenlake", env_config={"size": 3, "is_slippery": False}, episodes=16, samples=4,
                            max_turns=3, max_actions_per_turn=1, exploration="random", mode="base")
    path = tmp_path / "trajectories.jsonl"
    episodes = [t.to_json() for t in collect(None, None, config)]
    for episode in episodes:  # random exploration leaves the solver's label unset; the rows need it
        env = make_lake(episode)
        for turn in episode["turns"]:
            turn["best_first"] = turn["actions"][0] in (env.best_actions() or ())
            env.step(turn["actions"][0])
    path.write_text("".join(json.dumps(e) + "\n" for e in episodes))
    filters.main(path, group=4, value=True, rollouts=32, horizon=3)
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in capsys.readouterr().out.splitlines()}
    value = rows["first move best by value, 32 x 3 (spa iterate --keep value)"]
    assert 0 < int(value[1]) < int(rows["all turns"][1])
    assert float(value[3].rstrip("%")) > float(rows["all turns"][3].rstrip("%"))
    # the per-move table: every played first move, its count and its rates, by hand
    filters.label_by_value(episodes, 32, 3)  # what main did to its own copy
    rates = filters.move_rates(episodes)
    played = [t for e in episodes for t in e["turns"] if t["format_ok"] and t["actions"]]
    assert sum(n for n, _, _ in rates.values()) == len(played)
    for move, (n, by_value_rate, by_solver_rate) in rates.items():
        mine = [t for t in played if t["actions"][0] == move]
        assert n == len(mine) and by_value_rate == sum(t["value_first"] for t in mine) / n
        assert by_solver_rate == sum(t["best_first"] for t in mine) / n
        assert rows[move][1] == str(n)


def make_lake(episode: dict):
    from spa.envs import make

    env = make("frozenlake", **episode["env_config"])
    env.reset(seed=episode["seed"])
    return env


COMPARISON = Path(__file__).parent.parent / "experiments" / "comparison.sh"


def comparison_calls(tmp_path: Path, *groups: str, archived: tuple[str, ...] = (),
                     env: dict | None = None) -> tuple[list[list[str]], list[str]]:
    """The spa commands experiments/comparison.sh issues, recorded by a stand-in for spa, in a
    copy of the script's folder layout (``archived``: runs archived as finished before), and
    the run folders left in ``runs/``. Each run's OMP_NUM_THREADS goes to ``calls.threads``; the
    run named in ``env["SLOW"]`` takes a second."""
    env = env or {}
    root = tmp_path / "project"
    (root / "experiments").mkdir(parents=True)
    shutil.copy(COMPARISON, root / "experiments")
    for name in archived:
        (root / "results" / "runs" / name).mkdir(parents=True)
        (root / "results" / "runs" / name / "stages.json").write_text('{"report": {}}')
    fake = tmp_path / "spa"  # a run writes its folder, as spa run does
    fake.write_text('#!/usr/bin/env bash\necho "$*" >> "$CALLS"\n'
                    'if [ "$1" = run ]; then mkdir -p "runs/${@: -1}"; echo "$OMP_NUM_THREADS" >> "$CALLS.threads"; '
                    'sleep 0.02; if [ "${@: -1}" = "${SLOW:-}" ]; then sleep 1; fi; fi\n')
    fake.chmod(0o755)
    result = subprocess.run(["bash", str(root / "experiments" / "comparison.sh"), *groups], capture_output=True,
                            text=True, env={"PATH": "/usr/bin:/bin", "SPA": str(fake), "CALLS": str(tmp_path / "calls"),
                                            **env})
    assert result.returncode == 0, result.stderr
    left = sorted(p.name for p in (root / "runs").iterdir() if p.is_dir())
    return [line.split() for line in (tmp_path / "calls").read_text().splitlines()], left


def test_the_comparison_runs_every_cell_of_a_group_from_an_existing_recipe_and_archives_it(tmp_path):
    calls, left = comparison_calls(tmp_path, "sudoku", "frozenlake-transfer")
    assert left == []  # archived, then removed
    names = {c[c.index("--name") + 1] for c in calls if c[0] == "run"}
    assert names == {f"{g}-{m}-iterate-s{s}" for g in ("sudoku", "frozenlake-transfer") for m in ("spa", "vanilla")
                     for s in range(3)}
    assert sorted(c[1] for c in calls if c[0] == "archive") == sorted(f"runs/{name}" for name in names)
    assert calls[-1] == ["compare", "results/runs/*", "--out", "results/comparison"]  # none archived: the glob stays


def test_two_lanes_run_every_cell_of_every_group_once_from_its_recipe(tmp_path):
    calls, _ = comparison_calls(tmp_path, "frozenlake", "sokoban", "frozenlake-ablations", "sokoban-ablations",
                                "frozenlake-rows", "sokoban-rows", "frozenlake-value", "sokoban-value", "sudoku",
                                "frozenlake-transfer")
    runs = [c for c in calls if c[0] == "run"]
    names = [c[c.index("--name") + 1] for c in runs]
    assert len(names) == len(set(names)) == 2 * (9 + 4 + 9 + 6) + 6 + 6  # each claimed by one lane
    for c in runs:
        assert (COMPARISON.parent.parent / c[1]).is_file(), c[1]  # the recipe exists
        assert c[c.index("--name") + 1].startswith(c[1].removeprefix("configs/").removesuffix(".yaml"))
        assert c[2] == f"seed={c[c.index('--name') + 1][-1]}"
    logs = sorted(p.name for p in (tmp_path / "project" / "runs").glob("comparison-sudoku-lane*.log"))
    assert logs == ["comparison-sudoku-lane1.log", "comparison-sudoku-lane2.log"]


def test_a_lane_goes_on_to_the_next_group_while_the_other_finishes_its_cell(tmp_path):
    calls, _ = comparison_calls(tmp_path, "sudoku", "frozenlake-transfer", env={"SLOW": "sudoku-spa-iterate-s0"})
    slow_done = calls.index(["archive", "runs/sudoku-spa-iterate-s0", "--out", "results/runs"])
    transfer = [i for i, c in enumerate(calls) if c[0] == "run" and c[1].startswith("configs/frozenlake-transfer")]
    assert len(transfer) == 6 and transfer[-1] < slow_done  # the other lane ran the whole next group meanwhile
    logs = sorted(p.name for p in (tmp_path / "project" / "runs").glob("comparison-*-lane*.log"))
    assert logs == [f"comparison-{g}-lane{n}.log" for g in ("frozenlake-transfer", "sudoku") for n in (1, 2)]


def test_the_comparison_skips_archived_cells_and_names_its_variants(tmp_path):
    calls, left = comparison_calls(tmp_path, "frozenlake", "frozenlake-ablations", "frozenlake-rows",
                                   archived=("frozenlake-spa-iterate-s0",), env={"KEEP_RUNS": "1"})
    runs = {c[c.index("--name") + 1]: c[1:c.index("--name")] for c in calls if c[0] == "run"}
    assert left == sorted(runs)  # KEEP_RUNS: the run folders stay
    core = {f"frozenlake-{m}-iterate-s{s}" for m in ("vanilla", "state_estimation", "spa") for s in range(3)}
    assert set(list(runs)[:8]) == core - {"frozenlake-spa-iterate-s0"}  # the core first: groups run in order
    assert len(runs) == 8 + 4 + 9
    assert runs["frozenlake-rwml-iterate-s2"] == ["configs/frozenlake-rwml-iterate.yaml", "seed=2"]
    assert runs["frozenlake-vagen-iterate-s1"] == ["configs/frozenlake-vagen-iterate.yaml", "seed=1"]
    assert runs["frozenlake-spa-iterate-world_model-s1"] == [
        "configs/frozenlake-spa-iterate.yaml", "seed=1", "prompt.mode=world_model", "iterate.max_new_tokens=200",
        "eval.max_new_tokens=200"]
    assert runs["frozenlake-spa-iterate-masked_states-s0"][2:] == ["sft.mask_states=true"]


def test_the_value_group_runs_vanilla_and_spa_with_the_reward_s_label(tmp_path):
    calls, _ = comparison_calls(tmp_path, "sokoban-value", env={"LANES": "1"})
    runs = {c[c.index("--name") + 1]: c[1:c.index("--name")] for c in calls if c[0] == "run"}
    assert list(runs) == [f"sokoban-{m}-iterate-value-s{s}" for s in range(3) for m in ("spa", "vanilla")]
    assert runs["sokoban-vanilla-iterate-value-s2"] == ["configs/sokoban-vanilla-iterate.yaml", "seed=2",
                                                        "iterate.keep=value"]


def test_the_comparison_names_the_groups_it_knows(tmp_path):
    result = subprocess.run(["bash", str(COMPARISON), "frozen"], capture_output=True, text=True)
    assert result.returncode == 2
    assert ("unknown group 'frozen'; valid: frozenlake, sokoban, frozenlake-ablations, sokoban-ablations, "
            "frozenlake-rows, sokoban-rows, frozenlake-value, sokoban-value, sudoku, "
            "frozenlake-transfer") in result.stderr


def test_one_lane_runs_every_cell_in_order_on_every_core(tmp_path):
    calls, _ = comparison_calls(tmp_path, "sudoku", env={"LANES": "1"})
    names = [c[c.index("--name") + 1] for c in calls if c[0] == "run"]
    assert names == [f"sudoku-{m}-iterate-s{s}" for s in range(3) for m in ("spa", "vanilla")]
    logs = sorted(p.name for p in (tmp_path / "project" / "runs").glob("comparison-sudoku-lane*.log"))
    assert logs == ["comparison-sudoku-lane1.log"]


def test_each_lane_takes_its_share_of_the_cores(tmp_path):
    cores = int(subprocess.run(["env", "-u", "OMP_NUM_THREADS", "-u", "OMP_THREAD_LIMIT", "nproc"], capture_output=True,
                               text=True).stdout)
    for lanes in (1, 2):
        (tmp_path / str(lanes)).mkdir()
        comparison_calls(tmp_path / str(lanes), "sudoku", env={"LANES": str(lanes)})
        threads = set((tmp_path / str(lanes) / "calls.threads").read_text().split())
        assert threads == {str(max(1, cores // lanes))}


def test_seeds_chooses_the_seeds_of_every_group_but_the_ablations(tmp_path):
    calls, _ = comparison_calls(tmp_path, "frozenlake-rows", "sudoku", "sokoban-ablations",
                                env={"LANES": "1", "SEEDS": "0 2"})
    names = [c[c.index("--name") + 1] for c in calls if c[0] == "run"]
    assert names[:6] == [f"frozenlake-{m}-s{s}" for s in (0, 2)
                         for m in ("spa-iterate-world_model", "vagen-iterate", "rwml-iterate")]
    assert names[6:10] == [f"sudoku-{m}-iterate-s{s}" for s in (0, 2) for m in ("spa", "vanilla")]
    assert len(names) == 14 and all(n.endswith("-s0") for n in names[10:])  # the ablations: seed 0 only


@pytest.mark.parametrize("seeds", ["one", "0,1", "-1"])
def test_the_comparison_names_a_bad_seed(seeds):
    result = subprocess.run(["bash", str(COMPARISON), "sudoku"], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "SEEDS": seeds})
    assert result.returncode == 2
    assert f"SEEDS='{seeds}'" in result.stderr and "is not a seed" in result.stderr


@pytest.mark.parametrize("lanes", ["0", "two", "-1"])
def test_the_comparison_names_a_bad_number_of_lanes(lanes):
    result = subprocess.run(["bash", str(COMPARISON), "sudoku"], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "LANES": lanes})
    assert result.returncode == 2
    assert f"LANES='{lanes}' is not a number of lanes" in result.stderr


def test_resume_check_finds_both_resumes_exact_on_the_cpu(tmp_path, capsys):
    report = script("resume_check").main([str(tmp_path / "check"), "--levels", "2", "--samples", "2",
                                          "--hidden", "32", "--episodes", "8"])
    assert report["eval_trajectories_identical"] and report["resume_point"]["epoch"] == 1
    assert report["sft_resumed_vs_whole"] == 0.0 == report["sft_whole_vs_whole_again"]
    assert json.loads(capsys.readouterr().out) == report


@pytest.fixture(scope="module")
def pairs():
    return script("paired_table")


def write_levels(folder: Path, wins: list[int], samples: int = 2) -> Path:
    """An evaluation's levels.json: level ``l`` won ``wins[l]`` of ``samples``."""
    folder.mkdir(parents=True)
    levels = {str(10 + level): [s < w for s in range(samples)] for level, w in enumerate(wins)}
    (folder / "levels.json").write_text(json.dumps({"env": "sokoban", "env_config": {}, "levels": levels}))
    return folder


def test_paired_table_finds_runs_by_name_and_lists_what_is_missing(pairs, tmp_path, capsys):
    write_levels(tmp_path / "archived" / "sokoban-spa-iterate-s0" / "rl" / "round-0" / "eval", [0, 1, 2])
    write_levels(tmp_path / "live" / "sokoban-spa-iterate-s0" / "rl" / "round-1" / "eval", [0, 0, 0])  # shadowed
    write_levels(tmp_path / "archived" / "sokoban-spa-iterate-s0" / "rl" / "round-1" / "eval", [2, 2, 2])
    write_levels(tmp_path / "random", [1, 1, 1])
    listing = tmp_path / "pairs.txt"
    listing.write_text("# a comment\n\nsokoban-spa-iterate-s0:1 sokoban-spa-iterate-s0:0\n"
                       "sokoban-spa-iterate-s0:1 random  # against random play\nsokoban-spa-iterate-s0:2 random\n")
    assert pairs.main([str(listing), "--runs", str(tmp_path / "archived"), "--runs", str(tmp_path / "live"),
                       "--random", str(tmp_path / "random"), "--strip", "sokoban-", "--strip=-iterate"]) == 0
    out = capsys.readouterr().out.splitlines()
    # Per level 0 -> 1, 1/2 -> 1, 1 -> 1: Pass@1 gains 1, 1/2, 0 (mean 1/2, sd 1/2 over 3 levels,
    # 95% interval 1/2 +- 1.96 * 0.5 / sqrt(3), clipped at +100 points); Pass@2 gains 1, 0, 0.
    assert out[2] == "| spa-s0 round 1 - spa-s0 start | +50.0 [-6.6, +100.0] | 2 / 0 | +33.3 [-32.0, +98.7] | 1 / 0 |"
    assert out[3].startswith("| spa-s0 round 1 - random valid actions | +50.0 [+50.0, +50.0] | 3 / 0 |")
    assert "- sokoban-spa-iterate-s0:2 random: " in "\n".join(out)  # round 2 not evaluated: listed, not dropped
    listing.write_text("sokoban-spa-iterate-s0:1\n")
    with pytest.raises(SystemExit):
        pairs.main([str(listing)])
    assert "a line names two evaluations, AFTER BEFORE; got 'sokoban-spa-iterate-s0:1'" in capsys.readouterr().err


def test_world_model_copies_tells_a_copy_from_a_prediction(tmp_path, capsys):
    copies = script("world_model_copies")
    before, after = "_P\n__\nPlayer at (0,1).", "__\n_P\nPlayer at (1,1)."

    def turn(prediction: str, state_after: str) -> dict:
        return {"prompt_messages": [], "prompt_ids": [], "response": "", "response_ids": [], "logprobs": [],
                "finish_reason": "stop", "think": "", "observation": before, "prediction": prediction,
                "answer": "Down", "actions": ["Down"], "actions_valid": [True], "format_ok": True,
                "state_before": before, "grid_before": "_P\n__", "state_after": state_after,
                "grid_after": "\n".join(state_after.splitlines()[:2]), "env_reward": 0.0, "reward": 0.0}

    run = tmp_path / "sokoban-vagen-iterate-s0"
    rounds = [[turn(after, after), turn(before, before)],  # predicts the move, and the blocked one
              [turn(before, after), turn(before, before)]]  # copies: right only where nothing moved
    for r, turns in enumerate(rounds):
        folder = run / "rl" / f"round-{r}" / "eval"
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text("{}")
        record = {"env": "sokoban", "env_config": {}, "seed": 0, "group": 0, "sample": 0, "mode": "world_model",
                  "turns": turns, "success": False, "terminated": False}
        (folder / "trajectories.jsonl").write_text(json.dumps(record) + "\n")
    archived = write_rounds(tmp_path / "archived-s0", [(0.2, 1.0)])  # metrics.json without world_model: no row
    copies.main([str(run), str(archived)])
    rows = capsys.readouterr().out.splitlines()
    assert rows[2:] == ["| sokoban-vagen-iterate-s0 | 0 | 100.0 | 50.0 | 100.0 | 50.0 |",
                        "| sokoban-vagen-iterate-s0 | 1 | 50.0 | 50.0 | 0.0 | 100.0 |"]
    with pytest.raises(SystemExit):
        copies.main([str(tmp_path / "nowhere")])


CENTRED = Path(__file__).parent.parent / "experiments" / "value_learner.sh"


def centred_calls(tmp_path: Path, *args: str, env: dict | None = None) -> tuple[int, list[list[str]]]:
    """The spa commands experiments/value_learner.sh issues, recorded by a stand-in for spa."""
    fake = tmp_path / "spa"
    fake.write_text('#!/usr/bin/env bash\necho "$*" >> "$CALLS"\n')
    fake.chmod(0o755)
    result = subprocess.run(["bash", str(CENTRED), *args], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "SPA": str(fake), "CALLS": str(tmp_path / "calls"),
                                 "RUNS": str(tmp_path / "runs"), **(env or {})})
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return result.returncode, [line.split() for line in calls]


def _sets(call: list[str]) -> dict[str, str]:
    return dict(call[i + 1].split("=", 1) for i, word in enumerate(call) if word == "--set")


@pytest.mark.parametrize("task,recipe,steps", [("lake3", "frozenlake-sanity-3x3", "8"),
                                               ("lake3-fixed", "frozenlake-sanity-3x3", "6"),
                                               ("lake4", "frozenlake-vanilla", "12"),
                                               ("sokoban", "sokoban-vanilla", "12")])
def test_the_centred_learner_script_bootstraps_then_trains_with_settings_the_rl_config_knows(tmp_path, task,
                                                                                          recipe, steps):
    from spa.rl.config import PPOConfig

    code, calls = centred_calls(tmp_path, task, "--resume")
    assert code == 0
    boot, rl = calls
    assert boot[:2] == ["run", f"configs/{recipe}.yaml"] and boot[boot.index("--until") + 1] == "bootstrap"
    assert rl[0] == "rl" and rl[-1] == "--resume" and rl[rl.index("--steps") + 1] == steps
    assert rl[rl.index("--model") + 1].endswith("/bootstrap/epoch-1")
    sets = _sets(rl)
    assert sets["center_actions"] == "true" and sets["kl_estimator"] == "full" and sets["advantage"] == "value"
    PPOConfig(**{key: yaml.safe_load(value) for key, value in sets.items()})  # an unknown key raises
    assert ("-o" in rl and "desc=SFF/FHG/FFF" in rl) == (task == "lake3-fixed")


def test_the_centred_learner_script_seeds_its_training_levels_and_refuses_an_unknown_task(tmp_path):
    code, calls = centred_calls(tmp_path, "lake3", env={"SEED": "2"})
    assert code == 0 and _sets(calls[-1])["seed_start"] == "200000"
    assert calls[-1][calls[-1].index("--out") + 1].endswith("exp-centred-lake3-2")
    (tmp_path / "other").mkdir()
    code, calls = centred_calls(tmp_path / "other", "lake5")
    assert code == 2 and calls == []


def test_the_learner_script_swaps_in_the_baseline_of_the_state_and_starts_from_a_given_checkpoint(tmp_path):
    from spa.config import load
    from spa.rl.config import PPOConfig

    code, calls = centred_calls(tmp_path, "lake4", env={"LEARNER": "state", "START": "spa-run/bridge/epoch-1"})
    assert code == 0 and len(calls) == 1  # no bootstrap: the run starts from START
    rl = calls[0]
    assert rl[rl.index("--model") + 1] == "spa-run/bridge/epoch-1"
    assert rl[rl.index("--out") + 1].endswith("exp-state-lake4")
    sets = [rl[i + 1] for i, word in enumerate(rl) if word == "--set"]
    config = load(PPOConfig, {}, sets)  # the later --set wins, as on the command line
    assert config.value_objective == "state" and not config.center_actions
    (tmp_path / "x").mkdir()
    code, calls = centred_calls(tmp_path / "x", "lake3", env={"LEARNER": "greedy"})
    assert code == 2 and calls == []


def test_action_labels_counts_first_and_later_actions_and_the_label_s_agreement(tiny, capsys):
    """On ``SFG/FFF/FFF`` with one action of look-ahead, no first move from the start is
    best (none wins at once), while a second ``Right`` from (0,1) is and a second ``Down``
    is not; the script's JSON says so, and at the one starting state two look-aheads agree
    (neither finds a best move)."""
    from spa.agent.prompts import PromptConfig
    from spa.agent.rollout import RolloutConfig, rollout
    from spa.models.engine import SamplingParams
    from tests.scripted import ScriptedEngine

    labels = script("action_labels")
    _, tokenizer = tiny
    config = RolloutConfig("frozenlake", {"desc": "SFG/FFF/FFF", "is_slippery": False},
                           PromptConfig("base", max_turns=1, max_actions_per_turn=2))
    script_ = [["<answer>Right || Right</answer>", "<answer>Right || Down</answer>"]]
    episodes = rollout(ScriptedEngine(tokenizer, script_), tokenizer, [0], 2, config, SamplingParams())
    rates = labels.position_rates(episodes, labels.label_actions(episodes, 200, 1, 0.0, 0))
    assert rates["first"] == {"plays": 2, "best": 0.0} and rates["later"] == {"plays": 2, "best": 0.5}
    assert rates["later_moves"] == {"Right": {"plays": 1, "best": 1.0}, "Down": {"plays": 1, "best": 0.0}}
    assert labels.agreement(episodes, 200, 1) == {"states": 1, "same_best": 1.0, "median_gap": 0.0}
