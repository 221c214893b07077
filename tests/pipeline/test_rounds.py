"""Expert-iteration learning curves per group of replicates in ``spa compare``."""

import json
from dataclasses import asdict, replace

from spa.agent.prompts import PromptConfig
from spa.eval.baselines import evaluate_policy
from spa.eval.evaluate import EvalConfig
from spa.eval.metrics import bootstrap_interval, pct_with_interval
from spa.eval.paired import paired_difference, paired_rate_difference, signed_pct_with_interval
from spa.pipeline.replicates import group_runs
from spa.pipeline import rounds as rounds_module
from spa.pipeline.report import wall_seconds
from spa.pipeline.rounds import group_rounds, plot_rounds, round_table, run_round_table


def run_with_rounds(tmp_path, name: str, seed: int, rounds: list[list[int]], method: str = "spa") -> dict:
    """A run dict whose round ``r`` succeeded ``rounds[r][l]`` of 2 samples on level ``l``."""
    folder = tmp_path / name
    for r, wins in enumerate(rounds):
        out = folder / "rl" / f"round-{r}" / "eval"
        out.mkdir(parents=True)
        levels = {str(100 + level): [s < w for s in range(2)] for level, w in enumerate(wins)}
        (out / "levels.json").write_text(json.dumps({"env": "frozenlake", "env_config": {}, "levels": levels}))
        rate = sum(wins) / (2 * len(wins))
        (out / "metrics.json").write_text(json.dumps({"pass_at_k": {"pass@1": rate}, "best_first_rate": 0.1 * r,
                                                      "pass_at_k_ci95": {"pass@1": [rate - 0.1, rate + 0.1]}}))
    config = f"method: {method}\nseed: {seed}\nenv: {{name: frozenlake}}\nrl: iterate\n"
    return {"name": name, "dir": folder, "config": config}


def test_round_table_pools_the_seeds_of_each_round(tmp_path):
    runs = [run_with_rounds(tmp_path, "a", 0, [[0, 1, 2], [1, 1, 2], [2, 2, 2]]),
            run_with_rounds(tmp_path, "b", 1, [[0, 0, 2], [2, 1, 2]]),  # one round behind
            {"name": "ppo", "dir": tmp_path / "ppo", "config": "method: vanilla\nseed: 0\nrl: ppo\n"}]
    groups = group_runs(runs)
    assert [len(found) for found in map(group_rounds, groups)] == [3, 0]
    rows = round_table(groups, resamples=400).splitlines()
    assert rows[0].startswith("| group | method | env | variant | seeds | round 0 | round 1 | round 2 |")
    assert len(rows) == 3  # the PPO group has no rounds
    cells = rows[2].split(" | ")
    for r, column in ((0, 5), (1, 6)):
        a = [w / 2 for w in ([0, 1, 2], [1, 1, 2])[r]]
        b = [w / 2 for w in ([0, 0, 2], [2, 1, 2])[r]]
        mean, low, high = bootstrap_interval([a, b], resamples=400)
        assert low < mean < high and cells[column] == pct_with_interval(mean, (low, high))
    assert cells[7] == "100.0 [90.0, 110.0] (n=1)"  # only run a reached round 2: its own interval
    assert cells[3] == "-"  # the only group with rounds: no variant
    assert cells[8:] == ["0.0% -> 20.0%", "- |"]  # best first action at round 0 and the last; no settings recorded
    assert plot_rounds(groups, tmp_path / "rounds.png").stat().st_size > 1000


def test_no_rounds_no_table(tmp_path):
    groups = group_runs([{"name": "ppo", "dir": tmp_path / "ppo", "config": "method: spa\nrl: ppo\n"}])
    assert round_table(groups) is None and plot_rounds(groups, tmp_path / "rounds.png") is None


def test_the_curves_stand_beside_random_valid_actions_on_the_same_levels(tmp_path):
    run = run_with_rounds(tmp_path, "a", 0, [[0, 1, 2], [2, 2, 2]])
    settings = EvalConfig("frozenlake", {}, PromptConfig("base", 5, 3), num_envs=3, samples=2, seed=7)
    metrics = tmp_path / "a" / "rl" / "round-0" / "eval" / "metrics.json"
    metrics.write_text(json.dumps({**json.loads(metrics.read_text()), "config": asdict(settings)}))
    random = evaluate_policy("random", replace(settings, seed=0))  # the recorded levels, sampling seed 0
    row = round_table(group_runs([run]), resamples=100).splitlines()[2].split(" | ")
    assert row[-1] == pct_with_interval(random["pass_at_k"]["pass@1"], random["pass_at_k_ci95"]["pass@1"]) + " |"
    assert plot_rounds(group_runs([run]), tmp_path / "rounds.png").stat().st_size > 1000


def test_the_plot_names_each_groups_label_and_draws_one_random_line_per_score(tmp_path, monkeypatch):
    settings = EvalConfig("frozenlake", {}, PromptConfig("base", 5, 3), num_envs=3, samples=2, seed=7)
    runs = []
    for name, keep, mode in (("solver", "best", "base"), ("value", "value", "base"), ("state", "best", "state")):
        run = run_with_rounds(tmp_path, name, 0, [[0, 1, 2], [2, 2, 2]])
        run["config"] += f"iterate: {{keep: {keep}}}\nprompt: {{mode: {mode}}}\n"
        metrics = tmp_path / name / "rl" / "round-0" / "eval" / "metrics.json"
        played = asdict(replace(settings, prompt=PromptConfig(mode, 5, 3)))
        metrics.write_text(json.dumps({**json.loads(metrics.read_text()), "config": played}))
        runs.append(run)
    figures = []
    monkeypatch.setattr(rounds_module.plt, "close", figures.append)
    plot_rounds(group_runs(runs), tmp_path / "rounds.png")
    _, labels = figures[0].axes[0].get_legend_handles_labels()
    # Random play reads no prompt: the state prompt's levels score the same, one line for both.
    # Each group but the first (the first of the largest) is named by its overrides of it.
    assert labels == ["G1: spa frozenlake, iterate, solver label (1 seed)",
                      "G2: spa frozenlake, iterate, value label, iterate.keep=value (1 seed)",
                      "G3: spa frozenlake, iterate, solver label, prompt.mode=state (1 seed)",
                      "random valid actions (frozenlake)"]


def test_a_runs_wall_time_counts_its_rounds_where_its_rl_stage_shows_less(tmp_path):
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "rounds.json").write_text(json.dumps([
        {"round": 0, "eval_seconds": 7.0},  # the before-RL evaluation's, copied: counted there
        {"round": 1, "play_seconds": 100.0, "sft_seconds": 200.0, "eval_seconds": 30.0}]))
    stages = {"bootstrap": {"seconds": 5.0}, "eval_bootstrap": {"seconds": 7.0}}
    assert wall_seconds({"dir": tmp_path, "stages": stages}) == 342.0  # running: 12 + round 1's 330
    resumed = {**stages, "rl": {"seconds": 40.0}}  # recorded by its last process alone
    assert wall_seconds({"dir": tmp_path, "stages": resumed}) == 342.0
    whole = {**stages, "rl": {"seconds": 400.0}}  # summed over its processes: covers its rounds
    assert wall_seconds({"dir": tmp_path, "stages": whole}) == 412.0


def test_each_round_of_each_run_shows_its_play_its_paired_gain_and_its_times(tmp_path):
    run = run_with_rounds(tmp_path, "a", 0, [[0, 1, 2], [1, 1, 2], [2, 2, 2]])
    (tmp_path / "a" / "rl" / "rounds.json").write_text(json.dumps([
        {"round": 0, "eval_seconds": 120.0},
        {"round": 1, "kept": 1500, "turns": 6000, "play_success": 0.25, "play_seconds": 600.0,
         "sft_seconds": 1200.0, "eval_seconds": 300.0}]))  # round 2 evaluated, its record not yet written
    metrics = tmp_path / "a" / "rl" / "round-1" / "eval" / "metrics.json"
    metrics.write_text(json.dumps({**json.loads(metrics.read_text()), "mean_actions": 3.0, "mean_turns": 2.0,
                                   "first_valid_rate": 0.4, "best_first_of_valid_rate": 0.25}))
    rows = run_round_table([run, {"name": "ppo", "dir": tmp_path / "ppo", "config": "rl: ppo\n"}]).splitlines()
    assert len(rows) == 2 + 3  # header, rule, rounds 0-2 of run a; the PPO run has none
    assert rows[2] == "| a | 0 | - | - | 50.0 [40.0, 60.0] | - | - | 0.0% | - | - | - / - / 2 |"
    # Level by level, round 1 minus round 0: 0 -> 1/2, 1/2 -> 1/2, 1 -> 1 (one level up, none down).
    gain = paired_difference({1: [False, False], 2: [True, False], 3: [True, True]},
                             {1: [True, False], 2: [True, False], 3: [True, True]})
    assert gain.difference == 1 / 6 and (gain.improved, gain.worsened) == (1, 0)
    expected = signed_pct_with_interval(gain.difference, gain.difference_ci95)
    assert rows[3] == (f"| a | 1 | 1,500 / 6,000 | 25.0% | 66.7 [56.7, 76.7] | {expected} | 1 / 0 "
                       "| 10.0% | 40.0% (25.0%) | 1.50 | 10 / 20 / 5 |")
    assert rows[4].startswith("| a | 2 | - | - | 100.0 [90.0, 110.0] | +33.3 [")
    assert rows[4].endswith(" | 2 / 0 | 20.0% | - | - | - / - / - |")  # metrics from before the valid-first share
    assert run_round_table([{"name": "ppo", "dir": tmp_path / "ppo", "config": "rl: ppo\n"}]) is None


def test_a_rounds_best_first_action_shows_its_paired_gain_where_the_turns_were_scored(tmp_path):
    run = run_with_rounds(tmp_path, "a", 0, [[0, 1, 2], [1, 1, 2], [2, 2, 2]])
    counts = {0: {"100": [1, 2], "101": [0, 4], "102": [0, 0]}, 1: {"100": [2, 2], "101": [3, 4], "102": [0, 0]}}
    for r, best in counts.items():  # round 2 keeps no scores, as an archive made before them
        levels = tmp_path / "a" / "rl" / f"round-{r}" / "eval" / "levels.json"
        levels.write_text(json.dumps({**json.loads(levels.read_text()), "best_first": best}))
    rows = run_round_table([run]).splitlines()
    shares = paired_rate_difference({level: tuple(c) for level, c in counts[0].items()},
                                    {level: tuple(c) for level, c in counts[1].items()})
    assert abs(shares.difference - 2 / 3) < 1e-12 and shares.difference_ci95[0] > 0
    expected = signed_pct_with_interval(shares.difference, shares.difference_ci95)
    assert f" | 10.0% ({expected}) | " in rows[3]  # metrics.json's rate, the gain from the counts
    assert " | 0.0% | " in rows[2] and " | 20.0% | " in rows[4]  # no round before; no counts


def test_the_run_table_names_each_runs_learner():
    from spa.pipeline.report import learner_name

    assert learner_name({"method": "spa", "rl": "iterate", "iterate": {"keep": "best"}}) == "solver-label rounds"
    assert learner_name({"method": "vanilla", "rl": "iterate", "iterate": {"keep": "value"}}) == \
        "Monte-Carlo-value rounds"
    assert learner_name({"method": "spa", "rl": "ppo", "ppo": {"algorithm": "grpo", "advantage": "grpo"}}) == "GRPO"
    assert learner_name({"method": "spa", "rl": "ppo", "ppo": {"algorithm": "grpo", "advantage": "mc"}}) == \
        "GRPO, Monte-Carlo advantages"
    assert learner_name({"method": "vagen", "ppo": {"algorithm": "ppo", "advantage": "turn_gae"}}) == "PPO"
    assert learner_name({"method": "rwml"}) == "RWML (no RL stage)"
