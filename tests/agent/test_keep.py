"""The registry of per-turn labels drives every place that names them: the configs' checks,
the reports' learner names, the signal ``spa compare`` pairs by, and the help of the
commands and recipes. Each test walks the registry, so a label added there and missed (or
special-cased) elsewhere fails here."""

from pathlib import Path

import pytest
import typer.main

from spa.agent.keep import FILTERS, KEEP, LABELLED, SIGNALS, KeepFilter, keep_filter
from spa.agent.prompts import MODES
from spa.agent.trajectory import Trajectory, Turn
from spa.cli import app
from spa.pipeline.recipe import IterateSection, load_recipe
from spa.pipeline.report import ROUND_LEARNERS, learner_name
from spa.rl.expert_iteration import LABEL, IterateConfig
from spa.worldmodel.selfplay import SelfPlayConfig

CONFIGS = Path(__file__).parents[2] / "configs"


def turn(**labels) -> Turn:
    return Turn(prompt_messages=[], prompt_ids=[], response="", response_ids=[], logprobs=[], finish_reason="stop",
                think="", observation="", prediction="", answer="Right", actions=["Right"], actions_valid=[True],
                format_ok=True, state_before="", grid_before="", state_after="", grid_after="", env_reward=0.0,
                reward=0.0, **labels)


def test_the_registry_is_consistent():
    assert KEEP[0] == "all" and set(KEEP) == set(FILTERS) and all(FILTERS[name].name == name for name in KEEP)
    assert {label.signal for label in FILTERS.values()} == set(SIGNALS)
    assert LABELLED == tuple(name for name in KEEP if name != "all")
    with pytest.raises(ValueError, match="signal='oracle' of keep='new'"):
        KeepFilter("new", "oracle", "a label", lambda trajectory, turn: True, learner="new rounds")
    with pytest.raises(ValueError, match="keep='new': a label that filters names its learner"):
        KeepFilter("new", "outcome", "a label", lambda trajectory, turn: True)
    with pytest.raises(ValueError, match="keep='new': modes among base, state, world_model, and a reason"):
        KeepFilter("new", "outcome", "a label", lambda trajectory, turn: True, learner="new rounds", modes=("base",))


def test_each_label_keeps_the_turns_of_its_signal():
    """One row per label: a label with no row here fails, so its rule gets a test."""
    won = Trajectory("frozenlake", {}, 0, 0, 0, "base", success=True)
    lost = Trajectory("frozenlake", {}, 0, 0, 1, "base")
    good = turn(best_first=True, best_run=1, value_first=True)
    bad = turn(best_first=False, best_run=0, value_first=False)
    cases = [(won, good), (won, bad), (lost, good), (lost, bad)]
    expected = {"all": [True] * 4, "winners": [True, True, False, False],
                **{name: [True, False, True, False] for name in ("best", "best_prefix", "best_grounded", "value")}}
    assert set(expected) == set(KEEP)
    assert {name: [FILTERS[name].kept(t, u) for t, u in cases] for name in KEEP} == expected


def test_a_solver_label_on_an_environment_without_a_solver_is_an_error(monkeypatch):
    from spa.agent import keep

    monkeypatch.setattr(keep, "has_solver", lambda name: False)
    lost = Trajectory("frozenlake", {}, 0, 0, 0, "base")
    for name in KEEP:
        if FILTERS[name].needs_solver:
            with pytest.raises(ValueError, match=f"keep='{name}' needs a solver, and frozenlake has none"):
                FILTERS[name].kept(lost, turn())
        else:
            FILTERS[name].kept(lost, turn())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", KEEP)
def test_self_play_accepts_each_label_in_its_prompt_modes(name, mode):
    label = FILTERS[name]
    # unfiltered self-play in a plain mode is the one combination no label's modes decide
    exploration = "random" if mode != "world_model" and not label.filters else "self_play"
    if mode in label.modes:
        assert SelfPlayConfig(env="frozenlake", mode=mode, keep=name, exploration=exploration).keep == name
    else:
        with pytest.raises(ValueError, match=f"keep='{name}' needs mode="):
            SelfPlayConfig(env="frozenlake", mode=mode, keep=name, exploration=exploration)
    if label.lists_actions:
        with pytest.raises(ValueError, match=f"keep='{name}' needs an environment that lists its actions"):
            SelfPlayConfig(env="sudoku", mode=label.modes[0], keep=name)


def test_unfiltered_self_play_in_a_plain_mode_names_the_labels_of_that_mode():
    with pytest.raises(ValueError) as error:
        SelfPlayConfig(env="frozenlake", mode="base")
    named = [name for name in KEEP if f"'{name}'" in str(error.value)]
    assert named == [name for name in LABELLED if "base" in FILTERS[name].modes]


@pytest.mark.parametrize("name", KEEP)
def test_expert_iteration_accepts_each_label_that_filters(name):
    if FILTERS[name].filters:
        assert IterateConfig(keep=name).keep == name and LABEL[name] == FILTERS[name].signal
    else:
        with pytest.raises(ValueError, match=f"keep='{name}' is not allowed; valid: {', '.join(LABELLED)}$"):
            IterateConfig(keep=name)
    assert set(LABEL) == set(LABELLED)
    with pytest.raises(ValueError, match="keep='some' is not allowed"):
        keep_filter("some")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", LABELLED)
def test_recipes_check_each_label_s_prompt_mode_when_they_load(name, mode):
    overrides = [f"prompt.mode={mode}", f"iterate.keep={name}"]
    if mode in FILTERS[name].modes:
        assert load_recipe(CONFIGS / "frozenlake-spa-iterate.yaml", overrides).iterate.keep == name
    else:
        with pytest.raises(ValueError, match=f"iterate.keep: {name} needs the .* prompt in RL .*'{mode}'"):
            load_recipe(CONFIGS / "frozenlake-spa-iterate.yaml", overrides)


@pytest.mark.parametrize("name", LABELLED)
def test_the_tables_name_the_learner_of_each_label(name):
    assert ROUND_LEARNERS[name] == FILTERS[name].learner
    for method in ("spa", "vanilla"):
        assert learner_name({"method": method, "rl": "iterate", "iterate": {"keep": name}}) == FILTERS[name].learner
    # a solver's label makes imitation, and the tables say so whatever part of it is kept
    assert ("solver-label" in FILTERS[name].learner) == (FILTERS[name].signal == "solver")


def _option_help(command: str, option: str) -> str:
    params = typer.main.get_command(app).commands[command].params
    return " ".join(next(p for p in params if p.name == option).help.split())


@pytest.mark.parametrize(("where", "names"), [("spa selfplay --keep", KEEP), ("spa iterate --keep", LABELLED),
                                              ("recipe iterate.keep", LABELLED)])
def test_every_help_describes_every_label_it_accepts(where, names):
    text = (" ".join(IterateSection.__dataclass_fields__["keep"].metadata["help"].split()) if where.startswith("recipe")
            else _option_help(where.split()[1], "keep"))
    for name in names:
        assert FILTERS[name].describe() in text, f"{where} does not describe {name}"
    for name in set(KEEP) - set(names):
        assert f"{name}:" not in text, f"{where} offers {name}, which it refuses"
