"""Replicate runs in ``spa compare``: grouped by recipe but for the seeds and the
result-neutral keys, and each group against plain RL."""

import json

import pytest

from spa.agent.keep import KEEP
from spa.eval.metrics import bootstrap_difference
from spa.eval.paired import signed_pct_with_interval
from spa.pipeline.layout import eval_dir
from spa.rl.expert_iteration import LABEL
from spa.pipeline.replicates import (SEED_KEYS, difference_table, group_runs, group_table, recipe_key, seeds_of,
                                     spread_table, variants)

RECIPE = """method: spa
seed: {seed}
keep_optimizer: {keep}
env: {{name: sokoban, options: {{}}}}
selfplay: {{episodes: 4, seed: {selfplay}}}
sft: {{epochs: {epochs}, seed: null}}
ppo: {{steps: 2, seed: null}}
rwml: {{steps: 1, seed: null}}
"""


def run(name: str, seed=0, selfplay=None, epochs=1, keep="false") -> dict:
    config = RECIPE.format(seed=seed, selfplay="null" if selfplay is None else selfplay, epochs=epochs, keep=keep)
    return {"name": name, "dir": name, "config": config}


def test_runs_that_differ_only_in_seeds_are_one_group():
    runs = [run("a"), run("b", seed=1), run("c", seed=2, selfplay=5, keep="true"), run("d", epochs=2),
            run("e", seed=1, epochs=2)]
    assert [[r["name"] for r in g] for g in group_runs(runs)] == [["a", "b", "c"], ["d", "e"]]
    assert recipe_key(runs[0]["config"]) == recipe_key(runs[2]["config"]) != recipe_key(runs[3]["config"])


def test_the_seeds_of_a_run_are_read_from_every_seed_key():
    assert SEED_KEYS == ("seed", "selfplay.seed", "sft.seed", "ppo.seed", "rwml.seed", "iterate.seed")
    assert seeds_of(run("c", seed=2, selfplay=5)["config"]) == (2, 5, None, None, None, None)


def test_a_run_without_a_saved_recipe_is_a_group_of_its_own():
    runs = [{"name": "x", "dir": "x", "config": ""}, {"name": "y", "dir": "y", "config": ""}, run("a")]
    assert [[r["name"] for r in g] for g in group_runs(runs)] == [["x"], ["y"], ["a"]]


def test_leaving_out_the_base_evaluation_does_not_split_a_group():
    skipped = {**run("b", seed=1), "config": run("b", seed=1)["config"] + "eval: {base: false}\n"}
    assert [[r["name"] for r in g] for g in group_runs([run("a"), skipped])] == [["a", "b"]]


def evaluated(tmp_path, name: str, method: str, env: str, rl: str, evals: dict[tuple[str, str], dict],
              rl_options: str = "null", keep: str = "winners") -> dict:
    """A run dict as ``report.load_run`` gives it, with ``levels.json`` per evaluation:
    ``evals[(stage, mode)] = {level seed: [success per sample]}``."""
    folder = tmp_path / name
    for (stage, mode), levels in evals.items():
        out = eval_dir(folder, stage, mode)
        out.mkdir(parents=True)
        (out / "levels.json").write_text(json.dumps({"env": env, "env_config": {}, "levels": levels}))
    config = (f"method: {method}\nseed: {len(name)}\nrl: {rl}\n"
              f"env: {{name: {env}, options: {{}}, rl_options: {rl_options}}}\niterate: {{keep: {keep}}}\n")
    return {"name": name, "dir": folder, "config": config, "evals": {key: {} for key in evals}}


def test_each_group_is_compared_with_plain_rl_on_the_same_levels(tmp_path):
    def levels(*rates):  # two samples a level
        return {str(100 + i): [s < r for s in range(2)] for i, r in enumerate(rates)}

    def final(name, method, rates, rl="iterate", env="frozenlake", before="eval_sft", rl_options="null"):
        return evaluated(tmp_path, name, method, env, rl, {(before, "base"): levels(1, 0, 0),
                                                            ("eval_final", "base"): levels(*rates)}, rl_options)

    runs = [final("spa0", "spa", (2, 1, 0)), final("van0", "vanilla", (1, 1, 0), before="eval_bootstrap"),
            final("van11", "vanilla", (0, 1, 0), before="eval_bootstrap"),
            final("spappo", "spa", (2, 2, 2), rl="ppo"), final("sok", "spa", (2, 2, 2), env="sokoban"),
            final("spa6", "spa", (2, 2, 2), rl_options="{size: 6}"),
            final("van6", "vanilla", (1, 1, 1), before="eval_bootstrap", rl_options="{size: 6}")]
    groups = group_runs(runs)
    assert [[r["name"] for r in g] for g in groups] == [["spa0"], ["van0", "van11"], ["spappo"], ["sok"], ["spa6"],
                                                        ["van6"]]
    table = difference_table(groups, resamples=300).splitlines()
    # No vanilla group with PPO, none on Sokoban; the transfer group against its own vanilla group.
    assert [line.split(" | ")[:2] for line in table[2:]] == [["| G1 (spa)", "G2"], ["| G5 (spa)", "G6"]]
    assert table[3].split(" | ")[4] == "+50.0 [+50.0, +50.0] (1 vs 1)"
    row = table[2].split(" | ")
    assert row[2] == "frozenlake"
    spa, vanilla = [[1.0, 0.5, 0.0]], [[0.5, 0.5, 0.0], [0.0, 0.5, 0.0]]
    difference, low, high = bootstrap_difference(spa, vanilla, resamples=300)
    assert difference == pytest.approx(0.5 - (1 / 3 + 1 / 6) / 2) and low < difference < high
    assert row[4] == signed_pct_with_interval(difference, (low, high)) + " (1 vs 2)"
    assert row[3] == "+0.0 [+0.0, +0.0] (1 vs 2)"  # the same start, level by level
    assert row[5] == "- |"  # two samples a level: no Pass@8
    moved = final("van22", "vanilla", (0, 1, 0), before="eval_bootstrap")
    (eval_dir(moved["dir"], "eval_final", "base") / "levels.json").write_text(json.dumps(
        {"env": "frozenlake", "env_config": {}, "levels": {"7": [True, False]}}))
    assert difference_table(group_runs(runs[:1] + [moved]), resamples=50).splitlines()[2].split(" | ")[4] == "-"


def test_a_group_of_one_run_borrows_the_seed_spread_of_its_setting(tmp_path):
    def final(name, method, rate, env="frozenlake"):  # every level the same, eight samples
        levels = {str(100 + i): [s < 8 * rate for s in range(8)] for i in range(4)}
        found = evaluated(tmp_path, name, method, env, "iterate", {("eval_final", "base"): levels})
        found["evals"][("eval_final", "base")] = {"pass_at_k": {"pass@1": rate, "pass@8": float(rate > 0)}}
        return found

    # Vanilla seeds 0.25 and 0.75: pooled SD 0.354; the one SPA run at 0.5.
    runs = [final("spa", "spa", 0.5), final("van0", "vanilla", 0.25), final("van1", "vanilla", 0.75),
            final("sok", "spa", 0.5, env="sokoban"), final("sokvan", "vanilla", 0.25, env="sokoban")]
    table = difference_table(group_runs(runs), resamples=4000).splitlines()
    cell = table[2].split(" | ")[4]
    assert cell.startswith("+0.0 [") and cell.endswith(" (1 vs 2, seed SD 35.4)")
    low, high = (float(x) for x in cell[len("+0.0 ["):cell.index("]")].split(", "))
    # The vanilla seeds' resampling alone spans -25..+25; the draw for SPA's seed widens it.
    assert low < -40 and high > 40
    # Sokoban has no recipe with two runs: nothing to borrow, its levels' noise only (none here).
    assert table[3].split(" | ")[4] == "+25.0 [+25.0, +25.0] (1 vs 1)"


def finished(method: str, seed: int, final: float | None, env: str = "frozenlake", rl: str = "iterate",
             keep: str = "best") -> dict:
    """A run dict whose final evaluation scored Pass@1 ``final`` (None: not evaluated yet)."""
    config = (f"method: {method}\nseed: {seed}\nrl: {rl}\nenv: {{name: {env}, options: {{}}}}\n"
              f"iterate: {{keep: {keep}}}\n")
    evals = {("eval_sft", "base"): {"pass_at_k": {"pass@1": 0.2}}}
    if final is not None:
        evals[("eval_final", "base")] = {"pass_at_k": {"pass@1": final}}
    return {"name": f"{method}{seed}", "dir": f"{method}{seed}", "config": config, "evals": evals}


def test_the_seed_spread_is_pooled_per_environment_and_rl_stage():
    runs = [finished("vanilla", 0, 0.60), finished("vanilla", 1, 0.40), finished("vanilla", 2, 0.50),
            finished("spa", 0, 0.45), finished("spa", 1, 0.55), finished("spa", 2, None),  # still running
            finished("state", 0, 0.9),  # one finished run: no spread
            finished("vanilla", 0, 0.1, env="sokoban"), finished("vanilla", 1, 0.3, env="sokoban"),
            finished("vanilla", 0, 0.1, rl="ppo")]
    lines = spread_table(group_runs(runs)).splitlines()
    assert lines[0].endswith("| runs per arm for a gap of 10 / 20 / 30 points |")
    # FrozenLake: squares 100 + 100 + 0 (vanilla) and 25 + 25 (spa) over df 2 + 1: sd 9.1 points;
    # 2 (1.96 + 0.84)^2 9.1^2 / 10^2 = 13.1, so 14 runs at a gap of 10.
    assert lines[2:] == ["| frozenlake | iterate, solver label | 2 | 5 | 9.1 | 3 | 14 / 4 / 2 |",
                         "| sokoban | iterate, solver label | 1 | 2 | 14.1 | 1 | 32 / 8 / 4 |"]
    assert spread_table(group_runs(runs[6:7] + runs[9:])) is None


def test_rounds_on_another_label_are_neither_pooled_nor_paired_with_the_solvers(tmp_path):
    runs = [finished("vanilla", 0, 0.60), finished("vanilla", 1, 0.40),
            finished("vanilla", 0, 0.20, keep="value"), finished("vanilla", 1, 0.30, keep="value")]
    lines = spread_table(group_runs(runs)).splitlines()
    # Squares 100 + 100 (solver) and 25 + 25 (values), df 1 + 1: one row would pool them.
    assert lines[2:] == ["| frozenlake | iterate, solver label | 1 | 2 | 14.1 | 1 | 32 / 8 / 4 |",
                         "| frozenlake | iterate, value label | 1 | 2 | 7.1 | 1 | 8 / 2 / 2 |"]

    def run(name, method, keep, rates):  # two samples a level
        levels = {str(100 + i): [s < r for s in range(2)] for i, r in enumerate(rates)}
        return evaluated(tmp_path, name, method, "frozenlake", "iterate", {("eval_final", "base"): levels},
                         keep=keep)

    runs = [run("van", "vanilla", "best", (1, 1)), run("vanv", "vanilla", "value", (0, 0)),
            run("spav", "spa", "value", (2, 2)), run("spa", "spa", "best", (2, 2)),
            run("vagen", "vagen", "best_grounded", (1, 1))]
    table = difference_table(group_runs(runs), resamples=50).splitlines()
    rows = [line.split(" | ")[:2] + line.split(" | ")[4:5] for line in table[2:]]
    # Each against the vanilla group whose rounds kept turns by the same signal; VAGEN's mask
    # of grounded states rides on the solver's label.
    assert rows == [["| G3 (spa)", "G2", "+100.0 [+100.0, +100.0] (1 vs 1)"],
                    ["| G4 (spa)", "G1", "+50.0 [+50.0, +50.0] (1 vs 1)"],
                    ["| G5 (vagen)", "G1", "+0.0 [+0.0, +0.0] (1 vs 1)"]]


def test_every_filter_of_expert_iteration_names_its_label():
    assert set(LABEL) == set(KEEP) - {"all"}
    assert set(LABEL.values()) == {"outcome", "solver", "value"}


def test_a_key_added_after_a_run_was_saved_does_not_split_its_group():
    old = run("old")  # saved before the value label's settings existed
    settings = "iterate: {value_rollouts: 128, value_horizon: 5}\n"  # the defaults
    new = {**run("new", seed=1), "config": run("new", seed=1)["config"] + settings}
    other = {**run("other", seed=2), "config": run("other", seed=2)["config"] + "iterate: {value_horizon: 3}\n"}
    assert [[r["name"] for r in g] for g in group_runs([old, new, other])] == [["old", "new"], ["other"]]


def test_a_group_is_named_by_its_overrides_of_the_largest_group_of_its_method_and_env():
    core = [run("s0"), run("s1", seed=1), run("s2", seed=2)]
    masked = {**run("masked"), "config": run("masked")["config"].replace("epochs: 1,", "epochs: 1, mask_states: true,")}
    two = {**run("two"), "config": run("two")["config"].replace("episodes: 4", "episodes: 8") + "rl: iterate\n"}
    other = {**run("rwml"), "config": run("rwml")["config"].replace("method: spa", "method: rwml")}
    groups = group_runs([{**r, "evals": {}} for r in (masked, *core, two, other)])
    assert variants(groups) == ["sft.mask_states=true", "-", "rl=iterate, selfplay.episodes=8", "-"]
    rows = group_table(groups, resamples=10).splitlines()
    assert rows[0].startswith("| group | method | env | variant | mode |")
    assert rows[2].startswith("| G1 | spa | sokoban | sft.mask_states=true | - |")


def test_filling_an_empty_options_mapping_is_named_by_its_keys_alone():
    core = [run("s0"), run("s1", seed=1)]
    sized = {**run("sized"), "config": run("sized")["config"].replace("options: {}", "options: {size: 8}")}
    both = {**run("both"),
            "config": run("both")["config"].replace("options: {}", "options: {size: 8}, rl_options: {size: 6}")}
    groups = group_runs([{**r, "evals": {}} for r in (*core, sized, both)])
    assert variants(groups) == ["-", "env.options.size=8", "env.options.size=8, env.rl_options.size=6"]


def test_an_empty_mapping_and_an_unset_one_are_one_recipe():
    unset = {**run("unset", seed=1), "config": run("unset", seed=1)["config"].replace("options: {}", "options: null")}
    assert [[r["name"] for r in g] for g in group_runs([run("empty"), unset])] == [["empty", "unset"]]
