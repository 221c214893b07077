"""Seeds of a recipe: one ``seed`` derives every stage's seed, a stage's
own seed wins, and the data of a stage changes with its seed and only with it."""

import pytest

from spa.config import ConfigError, to_dict
from spa.models.engine import Engine
from spa.pipeline import run as run_module
from spa.pipeline.recipe import CONFIGS, load_recipe
from spa.pipeline.run import Run, _diff, _stage_seeds_as_used
from spa.worldmodel.selfplay import SelfPlayConfig, collect

#: A recipe whose self-play explores at random: its data needs no model, and the stage
#: runs in a second (the tiny random model never writes a well-formed self-play turn).
DATA_ONLY = ["model=tiny", "selfplay.episodes=4", "selfplay.samples=2", "selfplay.exploration=random",
             "selfplay.bootstrap_episodes=0", "prompt.max_turns=2"]


def recipe(*overrides):
    return load_recipe(CONFIGS / "frozenlake-spa.yaml", list(overrides), preset="quick")


def seeds(r) -> dict:
    return {name: r.stage_seed(getattr(r, name)) for name in ("selfplay", "sft", "ppo", "rwml")}


def test_the_recipe_seed_derives_every_stage_seed():
    assert seeds(recipe("seed=7")) == {"selfplay": 7, "sft": 7, "ppo": 7, "rwml": 7}
    assert seeds(recipe()) == {"selfplay": 0, "sft": 0, "ppo": 0, "rwml": 0}


def test_a_stage_seed_set_in_the_recipe_wins_even_zero():
    r = recipe("seed=7", "selfplay.seed=3", "ppo.seed=0")
    assert seeds(r) == {"selfplay": 3, "sft": 7, "ppo": 0, "rwml": 7}


def test_a_stage_seed_must_be_an_integer_or_null():
    with pytest.raises(ConfigError, match="selfplay.seed"):
        recipe("selfplay.seed=abc")
    assert seeds(recipe("seed=5", "sft.seed=null"))["sft"] == 5


def test_each_stage_runs_on_its_own_seed(tiny, tmp_path, monkeypatch):
    """The run hands every stage its seed: earlier versions overwrote them all with the
    recipe's, so ppo.seed, sft.seed and rwml.seed were silently ignored."""
    seen = {}
    monkeypatch.setattr(run_module, "load_model", lambda *_, **__: tiny)
    monkeypatch.setattr(run_module, "train_sft", lambda _lm, _tok, _ex, config, *_, **__: seen.update(sft=config.seed))
    monkeypatch.setattr(run_module, "load_examples", lambda _: [])
    monkeypatch.setattr(run_module, "train_rl", lambda _lm, _tok, _roll, config, *_, **__: seen.update(ppo=config.seed))
    from spa.rl import rwml_train

    monkeypatch.setattr(rwml_train, "run",
                        lambda _lm, _tok, _env, _opt, config, *_, **__: seen.update(rwml=config.seed))
    run = Run(recipe("seed=7", "sft.seed=1", "ppo.seed=2", "rwml.seed=3", *DATA_ONLY), tmp_path, log=lambda _: None)
    run._fine_tune("tiny", "unused.jsonl", tmp_path / "sft", epochs=1)
    run._rl()
    run._rwml()
    assert seen == {"sft": 1, "ppo": 2, "rwml": 3}


def test_selfplay_seed_changes_the_data_and_the_same_seed_reproduces_it(tmp_path):
    def data(name: str, *overrides) -> str:
        Run(recipe(*DATA_ONLY, *overrides), tmp_path / name, log=lambda _: None).run(until="selfplay")
        return (tmp_path / name / "data" / "selfplay.jsonl").read_text()

    one, two, again = data("a", "selfplay.seed=1"), data("b", "selfplay.seed=2"), data("c", "selfplay.seed=1")
    assert one == again and one != two
    assert data("d", "seed=1") == one  # unset: the recipe's seed


def test_self_play_sampling_follows_the_seed(tiny):
    """Self-play proper (the tiny random model samples the turns): another seed, other
    responses; the same seed, the same ones."""
    model, tokenizer = tiny
    engine = Engine(model, tokenizer)

    def responses(seed: int) -> list[str]:
        config = SelfPlayConfig(env="frozenlake", env_config={"size": 3}, episodes=2, samples=2, max_turns=1,
                                max_new_tokens=12, seed=seed)
        return [turn.response for t in collect(engine, tokenizer, config) for turn in t.turns]

    assert responses(1) == responses(1) != responses(2)


def test_a_run_saved_before_stage_seeds_existed_still_resumes():
    """Old run folders saved sft/ppo/rwml.seed = 0 while every stage used the recipe's
    seed; they compare as unset, so the same recipe resumes and a new stage seed is refused."""
    saved = to_dict(recipe("seed=4"))
    del saved["selfplay"]["seed"]
    for stage in ("sft", "ppo", "rwml"):
        saved[stage]["seed"] = 0
    assert _diff(_stage_seeds_as_used(saved), to_dict(recipe("seed=4"))) == set()
    assert _diff(_stage_seeds_as_used(saved), to_dict(recipe("seed=4", "ppo.seed=0"))) == {"ppo.seed"}
