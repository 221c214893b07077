"""Grouping of replicate runs in ``spa compare``: same recipe but for the
seeds and the result-neutral keys."""

from spa.pipeline.replicates import SEED_KEYS, group_runs, recipe_key, seeds_of

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
