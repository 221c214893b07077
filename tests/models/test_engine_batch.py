"""The engine batch as a setting: ``engine_batch`` on every config that builds an engine,
checked at load time with an error naming the value, and handed to the engine."""

import pytest
from typer.testing import CliRunner

from spa.agent import sharding
from spa.agent.prompts import PromptConfig
from spa.agent.rollout import RolloutConfig
from spa.agent.trajectory import Trajectory
from spa.cli import app
from spa.config import ConfigError
from spa.eval import evaluate as evaluate_module
from spa.eval.evaluate import EvalConfig, evaluate
from spa.models.engine import DEFAULT_BATCH, Engine, check_batch
from spa.pipeline.recipe import CONFIGS, load_recipe
from spa.pipeline.run import Run
from spa.rl import ppo
from spa.rl.config import PPOConfig
from spa.rl.expert_iteration import IterateConfig, selfplay_config
from spa.rl.rwml_config import RWMLConfig
from spa.worldmodel.selfplay import SelfPlayConfig

CONFIGS_WITH_AN_ENGINE = (EvalConfig, SelfPlayConfig, IterateConfig, RWMLConfig, PPOConfig)


def test_one_default_everywhere():
    assert {cls().engine_batch for cls in CONFIGS_WITH_AN_ENGINE} == {DEFAULT_BATCH}


@pytest.mark.parametrize("cls", [EvalConfig, SelfPlayConfig, IterateConfig, RWMLConfig])
@pytest.mark.parametrize("bad", [0, -3])
def test_configs_reject_a_batch_below_one_naming_it(cls, bad):
    with pytest.raises(ValueError, match=f"engine_batch={bad}"):
        cls(engine_batch=bad)


def test_check_batch_rejects_non_integers_and_engine_names_its_own_argument(tiny):
    for bad in (True, 2.0, "8"):
        with pytest.raises(ValueError, match="must be an integer >= 1"):
            check_batch(bad)
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="max_batch_size=0"):
        Engine(model, tokenizer, max_batch_size=0)


def test_ppo_train_checks_the_batch_before_anything_runs(tiny, tmp_path):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="engine_batch=0"):
        ppo.train(model, tokenizer, RolloutConfig("frozenlake"), PPOConfig(engine_batch=0), tmp_path / "rl")
    assert not (tmp_path / "rl").exists()


@pytest.mark.parametrize("section", ["ppo", "rwml", "eval", "selfplay", "iterate"])
def test_recipe_sections_reject_a_bad_batch_at_load_time(section):
    with pytest.raises(ConfigError, match="engine_batch=0"):
        load_recipe(CONFIGS / "frozenlake-spa.yaml", [f"{section}.engine_batch=0"])


def test_spa_rl_rejects_a_bad_batch_before_loading_the_model(tmp_path):
    result = CliRunner().invoke(app, ["rl", "-e", "frozenlake", "-m", "no-such-model", "--out", str(tmp_path),
                                      "--set", "engine_batch=0"], terminal_width=200)
    assert result.exit_code == 2 and "engine_batch=0" in " ".join(result.output.replace("│", " ").split())


def test_evaluate_builds_its_engine_with_the_batch(tiny, monkeypatch):
    model, tokenizer = tiny
    built = []
    monkeypatch.setattr(evaluate_module, "Engine", lambda model, tokenizer, max_batch_size, dtype=None:
                        built.append(max_batch_size) or Engine(model, tokenizer, max_batch_size, dtype))
    won = Trajectory("frozenlake", {}, seed=0, group=0, sample=0, mode="base", success=True, terminated=True)
    monkeypatch.setattr(sharding, "rollout", lambda *args, **kwargs: [won])
    config = EvalConfig("frozenlake", prompt=PromptConfig("base", max_turns=1), num_envs=1, samples=1,
                        engine_batch=3)
    assert evaluate(model, tokenizer, config, progress=False)["config"]["engine_batch"] == 3
    assert built == [3]


def test_iterate_rounds_play_with_the_batch():
    rollout = RolloutConfig("frozenlake", {}, PromptConfig("base", 1, 2, 0))
    assert selfplay_config(IterateConfig(engine_batch=5), rollout, 1).engine_batch == 5


def test_the_recipe_hands_each_stage_its_batch(tmp_path):
    recipe = load_recipe(CONFIGS / "frozenlake-spa.yaml", ["eval.engine_batch=7", "ppo.engine_batch=9",
                                                            "iterate.engine_batch=11"])
    run = Run(recipe, tmp_path, log=lambda _: None)
    assert run._eval_config("base").engine_batch == 7
    assert recipe.ppo.engine_batch == 9  # spa.rl.ppo.train reads it from the section itself
    assert recipe.iterate.config(seed=0).engine_batch == 11

