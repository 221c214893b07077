"""The pieces of ``spa demo`` (its CLI runs are in test_cli.py)."""

from spa.demo import DemoConfig, cache_dir, marked, next_command


def _red(text) -> list[str]:
    return [text.plain[span.start:span.end] for span in text.spans if "red" in str(span.style)]


def test_marked_reds_the_characters_that_differ_from_the_true_state():
    text = marked("_P\nG_\nextra\n", "_P\nGH")
    assert text.plain == "_P\nG_\nextra"
    assert _red(text) == ["_", *"extra"]  # G_ against GH; a line the truth lacks is all wrong
    assert _red(marked("_P\nGH", "_P\nGH\nPlayer at (0,1).")) == []  # a missing line is left to the truth column
    assert marked("  \n", "_P").plain == "(none)"


def test_the_cache_is_keyed_by_what_changes_the_weights(monkeypatch, tmp_path):
    monkeypatch.setattr("spa.demo.spa_home", lambda: tmp_path)
    base = DemoConfig()
    folder = cache_dir("smollm2-135m-instruct", base)
    assert folder.parent == tmp_path / "demo" and folder.name.startswith("smollm2-135m-instruct-frozenlake-")
    same = DemoConfig(episodes=2, max_new_tokens=50, seed=3)  # how the demo plays: the same weights
    assert cache_dir("smollm2-135m-instruct", same) == folder
    for other in (DemoConfig(bootstrap_episodes=32), DemoConfig(turns=5), DemoConfig(options={"size": 6}),
                  DemoConfig(env="sokoban"), DemoConfig(precision="fp32")):
        assert cache_dir("smollm2-135m-instruct", other) != folder
    assert cache_dir("tiny", base) != folder


def test_next_command_is_the_spa_recipe_with_the_same_options():
    assert next_command("sokoban", {}) == "spa run configs/sokoban-spa.yaml --preset quick"
    assert next_command("frozenlake", {"size": 6, "is_slippery": False}) == (
        "spa run configs/frozenlake-spa.yaml --preset quick env.options.size=6 env.options.is_slippery=false")
