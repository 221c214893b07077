"""What every environment promises, checked the same way for all of them."""

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spa import envs

NAMES = ["sokoban", "frozenlake", "sudoku"]


def test_registry_has_the_three_envs():
    assert envs.env_names() == sorted(NAMES)


def test_unknown_env_lists_valid_names():
    with pytest.raises(ValueError, match="frozenlake, sokoban, sudoku"):
        envs.make("chess")


@pytest.mark.parametrize("name", NAMES)
def test_unknown_option_lists_valid_options(name):
    valid = [option for option, _, _ in envs.config_defaults(name)]
    with pytest.raises(ValueError, match="unknown option.*'colour'") as error:
        envs.make(name, colour="red")
    assert "max_steps" in valid and all(option in str(error.value) for option in valid)


@pytest.mark.parametrize("name", NAMES)
def test_every_option_has_help(name):
    assert all(help_text for _, _, help_text in envs.config_defaults(name))


@pytest.mark.parametrize("name", NAMES)
def test_reset_is_deterministic_and_describes_the_state(name):
    a, b = envs.make(name), envs.make(name)
    obs_a, info = a.reset(seed=7)
    obs_b, _ = b.reset(seed=7)
    assert obs_a == obs_b == a.render() and a.describe() == b.describe()
    assert info == {"action_valid": True, "success": False}
    assert "(" in a.describe() and a.describe().endswith(".")
    assert a.state_text() == f"{a.render()}\n{a.describe()}"
    assert a.rules()


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=150, deadline=None)
@given(text=st.one_of(st.text(max_size=40), st.sampled_from(["", " ", "||", "1,1", "UP!!", "\x00"])))
def test_step_never_raises_and_invalid_text_changes_nothing(name, text):
    env = envs.make(name)
    env.reset(seed=3)
    before, steps = env.state_text(), env.steps
    obs, reward, terminated, truncated, info = env.step(text)
    assert isinstance(obs, str) and isinstance(reward, float)
    assert set(info) >= {"action_valid", "success"}
    if not info["action_valid"]:
        assert env.state_text() == before and env.steps == steps
        assert (reward, terminated, truncated) == (0.0, False, False)


@pytest.mark.parametrize("name", NAMES)
def test_non_string_actions_are_invalid(name):
    env = envs.make(name)
    env.reset(seed=0)
    for action in (None, 3, b"Up", ["Up"]):
        assert env.step(action)[4]["action_valid"] is False


@pytest.mark.parametrize("name", NAMES)
def test_random_actions_are_valid(name):
    import numpy as np

    rng = np.random.default_rng(0)
    env = envs.make(name)
    for seed in range(20):
        env.reset(seed=seed)
        for _ in range(5):
            _, _, terminated, truncated, info = env.step(env.random_action(rng))
            assert info["action_valid"]
            if terminated or truncated:
                break


# -- one action-name matcher for every environment ---------------------------------
SPELLINGS = ["{a}", " {a} ", "{a}.", "{a}!", "{a} .", "\t{a}?\n", "{a}...", "{a},", "{a};", "{a}:"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_env_reads_an_action_the_same_way(name, spelling):
    """Surrounding whitespace and trailing punctuation are ignored, and names in any case
    match, in every environment alike (FrozenLake used to reject "Left.")."""
    import numpy as np

    env = envs.make(name)
    env.reset(seed=1)
    action = env.random_action(np.random.default_rng(0))
    for text in (spelling.format(a=action), spelling.format(a=action.lower()),
                 spelling.format(a=action.upper())):
        assert env._parse_action(text) == env._parse_action(action) is not None, repr(text)
        twin = envs.make(name)
        twin.reset(seed=1)
        assert twin.step(text)[4]["action_valid"], repr(text)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("spelling", [".{a}", "{a}x", "{a} {a}", "'{a}'", "{a}-", ""])
def test_every_env_rejects_the_same_near_misses(name, spelling):
    import numpy as np

    env = envs.make(name)
    env.reset(seed=1)
    action = env.random_action(np.random.default_rng(0))
    assert env._parse_action(spelling.format(a=action)) is None


def test_match_name_and_clean_action():
    from spa.envs.base import clean_action, match_name

    assert clean_action("  Left. !\u00a0.") == "Left" and clean_action(".Left") == ".Left"
    assert match_name("rIGHT!", ("Left", "Right")) == "Right"
    assert match_name("Righty", ("Left", "Right")) is None and match_name("", ("Left",)) is None
    assert clean_action("a" + ". " * 50_000) == "a"  # linear, however long the tail


@pytest.mark.parametrize("name", NAMES)
def test_best_actions_are_canonical_valid_actions(name):
    # Whatever the solver names is an action the env accepts, already in canonical spelling,
    # so the rollout's membership test (canonical_action of the agent's text) can match it.
    env = envs.make(name)
    for seed in range(10):
        env.reset(seed=seed)
        best = env.best_actions()
        assert best, f"{name} seed {seed}: a fresh level always has a best action"
        for action in best:
            assert env.canonical_action(action) == action
            assert env.canonical_action(f" {action.lower()}. ") == action
            probe = copy.deepcopy(env)
            assert probe.step(action)[4]["action_valid"]


@pytest.mark.parametrize("name", NAMES)
def test_a_fork_plays_on_without_touching_the_original(name):
    """A fork with a copy of the original's generator replays exactly what the original
    then does; playing it first changes nothing in the original, its generator included."""
    env = envs.make(name)
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(3):
        env.step(env.random_action(rng))
    before, draws = env.state_text(), copy.deepcopy(env.np_random.bit_generator.state)
    moves = [env.random_action(rng) for _ in range(12)]
    twin = env.fork(copy.deepcopy(env.np_random))
    played = [twin.simulate(move) for move in moves]
    assert env.state_text() == before and env.np_random.bit_generator.state == draws
    for move, (reward, ended) in zip(moves, played):
        _, step_reward, terminated, truncated, _ = env.step(move)
        assert (reward, ended) == (step_reward, terminated or truncated)
    assert twin.state_text() == env.state_text() and twin.steps == env.steps


@pytest.mark.parametrize("name", NAMES)
def test_simulate_ignores_an_invalid_action(name):
    env = envs.make(name)
    env.reset(seed=1)
    before = env.state_text()
    assert env.simulate("fly") == (0.0, False) and env.state_text() == before and env.steps == 0


@pytest.mark.parametrize("name", NAMES)
def test_listed_actions_are_canonical_and_valid(name):
    env = envs.make(name)
    env.reset(seed=2)
    actions = env.legal_actions()
    assert envs.lists_actions(name) == (actions is not None)
    for action in actions or ():
        assert env.canonical_action(action) == action and env.fork(np.random.default_rng(0)).step(action)[4][
            "action_valid"]
