import copy
import io
import re
from functools import partial

import numpy as np
import pytest
from rich.console import Console

from scripted import ScriptedEngine, wm
from spa.agent.labels import label_turns
from spa.progress import Bar
from spa.worldmodel import selfplay
from spa.worldmodel.selfplay import SelfPlayConfig, build_examples, collect, randomize_coordinates

FL = {"desc": "SFFF/FHFH/FFFH/HFFG", "is_slippery": False}


def play(tiny, **overrides):
    _, tokenizer = tiny
    config = SelfPlayConfig(env="frozenlake", env_config=FL, episodes=2, samples=2, max_turns=2,
                            max_actions_per_turn=2, **overrides)
    script = [
        [wm("Down || Down || Down", obs="imagined now", pred="imagined next"), "garbage"],
        [wm("Right", obs="still imagined", pred="more imagination"), wm("Up")],
    ]
    trajectories = collect(ScriptedEngine(tokenizer, script), tokenizer, config)
    return build_examples(trajectories, config)


def test_ground_truth_replaces_both_states_and_filters_malformed(tiny):
    examples, stats = play(tiny)
    assert (stats["turns"], stats["kept"], stats["dropped_malformed"]) == (4, 3, 1)
    first = examples[0]
    # The answer is cut to the two applied actions, and the states are the true ones.
    assert first["actions"] == ["Down", "Down"]
    expected = (f"<think><observation>{first['state_before']}</observation>go<prediction>"
                f"{first['state_after']}</prediction></think><answer>Down || Down</answer>")
    assert first["response"] == expected
    assert first["state_before"].startswith("P___") and first["state_after"].splitlines()[2] == "P__O"
    assert "imagined" not in "".join(e["response"] for e in examples)
    assert first["messages"][-1]["role"] == "user" and first["state_before"] in first["messages"][-1]["content"]


def test_self_belief_keeps_the_imagined_states(tiny):
    examples, _ = play(tiny, states="self_belief")
    assert "<observation>imagined now</observation>" in examples[0]["response"]
    assert "<prediction>imagined next</prediction>" in examples[0]["response"]


def test_random_coords_keep_the_format_but_not_the_values(tiny):
    examples, _ = play(tiny, coords="random")
    coord = re.compile(r"\((\d+),(\d+)\)")
    for example in examples:
        observation = example["response"].split("<observation>")[1].split("</observation>")[0]
        grid, description = observation.rsplit("\n", 1)
        true_grid, true_description = example["state_before"].rsplit("\n", 1)
        assert grid == true_grid  # only coordinates change
        assert coord.sub("", description) == coord.sub("", true_description)
        assert all(0 <= int(r) < 4 and 0 <= int(c) < 4 for r, c in coord.findall(description))
    changed = [e for e in examples if e["state_before"] not in e["response"]]
    assert changed  # with 6+ coordinates per state, some differ from the truth


def test_random_exploration_writes_valid_templated_turns(tiny):
    _, tokenizer = tiny
    config = SelfPlayConfig(env="sokoban", episodes=4, samples=2, max_turns=3, exploration="random")
    trajectories = collect(None, tokenizer, config)
    examples, stats = build_examples(trajectories, config)
    assert stats["episodes"] == 4 and stats["kept"] == stats["turns"] > 0
    for example in examples:
        assert example["response"].startswith(f"<think><observation>{example['state_before']}</observation>")
        assert f"<prediction>{example['state_after']}</prediction>" in example["response"]
        assert all(a in {"Up", "Down", "Left", "Right"} for a in example["actions"])
        # The prompt is the rollout's: turn number and last turn's reward as the agent sees them.
        assert f"Turn {example['turn'] + 1}. Current state:" in example["messages"][-1]["content"]
        assert ("Reward from your last turn" in example["messages"][-1]["content"]) == (example["turn"] > 0)
    assert any(example["turn"] > 0 for example in examples)


def test_randomize_coordinates_is_seeded():
    import numpy as np

    text = "Player at (0,0); Goal at (3,3)."
    a = randomize_coordinates(text, 4, 4, np.random.default_rng(1))
    assert a == randomize_coordinates(text, 4, 4, np.random.default_rng(1))
    assert re.fullmatch(r"Player at \(\d,\d\); Goal at \(\d,\d\)\.", a)


def test_random_coordinates_count_from_the_envs_coordinate_base():
    """Sudoku describes cells 1-indexed: its random coordinates stay in 1..n."""
    import numpy as np

    text = ", ".join(["(1,1)"] * 200)
    cells = re.findall(r"\((\d),(\d)\)", randomize_coordinates(text, 4, 4, np.random.default_rng(0), base=1))
    assert {int(x) for cell in cells for x in cell} == {1, 2, 3, 4}


def test_bad_switch_values_are_errors():
    with pytest.raises(ValueError, match="states='dream'.*ground_truth, self_belief"):
        SelfPlayConfig(states="dream")
    with pytest.raises(ValueError, match="multiple of samples"):
        SelfPlayConfig(episodes=10, samples=8)


@pytest.mark.parametrize("mode", ["base", "state"])
def test_random_exploration_in_a_plain_mode_writes_no_state_text(mode):
    from spa.agent.parsing import parse_response

    config = SelfPlayConfig(env="frozenlake", env_config=FL, episodes=4, samples=1, max_turns=2,
                            exploration="random", mode=mode)
    examples, stats = build_examples(collect(None, None, config), config)
    assert stats["kept"] == stats["turns"] > 0
    for example in examples:
        response = example["response"]
        assert "<observation>" not in response and "<prediction>" not in response
        parsed = parse_response(response)
        assert parsed.format_ok and parsed.actions == example["actions"]
        system = example["messages"][0]["content"]
        assert ("<observation>" in system) is False  # the prompt is the plain mode's too
    world = SelfPlayConfig(env="frozenlake", env_config=FL, episodes=4, samples=1, max_turns=2,
                           exploration="random")
    assert "<observation>" in build_examples(collect(None, None, world), world)[0][0]["response"]


def test_exploration_actions_caps_the_actions_of_a_random_turn():
    def actions_per_turn(**options):
        config = SelfPlayConfig(env="sokoban", episodes=16, samples=2, max_turns=3, exploration="random",
                                mode="base", **options)
        return {len(t.actions) for e in collect(None, None, config) for t in e.turns}

    assert actions_per_turn(exploration_actions=1) == {1}
    assert actions_per_turn(exploration_actions=2) == {1, 2}
    assert actions_per_turn() == {1, 2, 3}  # 0: up to max_actions_per_turn
    with pytest.raises(ValueError, match="exploration_actions=4 must be 0 .* or 1..3"):
        SelfPlayConfig(exploration="random", exploration_actions=4)


def test_a_plain_mode_needs_random_exploration_or_a_filter():
    with pytest.raises(ValueError, match="mode='base'.*needs keep='winners' or 'best'.*exploration='random'"):
        SelfPlayConfig(env="frozenlake", mode="base")
    with pytest.raises(ValueError, match="unknown prompt mode 'planner'"):
        SelfPlayConfig(env="frozenlake", mode="planner", exploration="random")


def test_oracle_exploration_plays_only_best_actions_and_varies_among_them():
    from spa.envs import make

    lake = {"size": 3, "is_slippery": False}
    config = SelfPlayConfig(env="frozenlake", env_config=lake, episodes=40, samples=1, max_turns=4,
                            max_actions_per_turn=1, exploration="oracle", mode="state")
    trajectories = collect(None, None, config)
    ties = []  # (best set, chosen) where two moves were equally good
    for trajectory in trajectories:
        env = make("frozenlake", **lake)
        env.reset(seed=trajectory.seed)
        for turn in trajectory.turns:
            best = env.best_actions()
            assert turn.actions[0] in best
            if len(best) > 1:
                ties.append((sorted(best), turn.actions[0]))
            env.step(turn.actions[0])
    # Every level is solvable within 4 moves on 3x3 but for long detours; random play wins ~a quarter.
    assert sum(t.success for t in trajectories) >= 36
    # Ties are broken at random, not by a fixed order of the names.
    assert len(ties) > 10 and {chosen for best, chosen in ties if chosen != best[0]}


def plain(actions: str) -> str:
    """A well-formed base-mode response."""
    return f"<think>go</think><answer>{actions}</answer>"


def test_keep_filters_turns_by_episode_outcome_or_by_the_solver(tiny):
    """On SFG/FHF/FFF, sample 0 wins in one turn; sample 1 starts with the best move (Right)
    and then steps into the hole: winners keeps sample 0's turn, best both first turns."""
    _, tokenizer = tiny
    script = [[plain("Right || Right"), plain("Right")], [plain("Down")]]
    kept = {}
    for keep in ("winners", "best"):
        config = SelfPlayConfig(env="frozenlake", env_config={"desc": "SFG/FHF/FFF", "is_slippery": False},
                                episodes=2, samples=2, max_turns=2, max_actions_per_turn=2, mode="base", keep=keep)
        examples, stats = build_examples(collect(ScriptedEngine(tokenizer, script), tokenizer, config), config)
        kept[keep] = [(e["sample"], e["turn"], e["response"]) for e in examples]
        assert stats["kept"] + stats["dropped_by_filter"] == stats["turns"] == 3
        kept[keep + " best-first"] = (stats["best_first_kept"], stats["best_first_dropped"])
    assert kept["winners"] == [(0, 0, plain("Right || Right"))]
    assert kept["best"] == [(0, 0, plain("Right || Right")), (1, 0, plain("Right"))]
    assert kept["winners best-first"] == (1.0, 0.5) and kept["best best-first"] == (1.0, 0.0)


def test_best_prefix_cuts_the_answer_to_its_leading_best_actions(tiny):
    """On SFG/FHF/FFF, Right is one step closer to the goal and Down from (0,1) falls into the
    hole: best keeps the turn as played, best_prefix keeps its answer's first action only."""
    _, tokenizer = tiny
    responses = {}
    for keep in ("best", "best_prefix"):
        config = SelfPlayConfig(env="frozenlake", env_config={"desc": "SFG/FHF/FFF", "is_slippery": False},
                                episodes=2, samples=2, max_turns=1, max_actions_per_turn=2, mode="base", keep=keep)
        said = "<think>I will try Right || Down.</think><answer>Right || Down</answer>"
        engine = ScriptedEngine(tokenizer, [[plain("Right || Down"), said]])
        examples, _ = build_examples(collect(engine, tokenizer, config), config)
        responses[keep] = [e["response"] for e in examples]
    # The reasoning's listing of the played moves is cut with the answer.
    assert responses == {"best": [plain("Right || Down"), said],
                         "best_prefix": [plain("Right"), "<think>I will try Right.</think><answer>Right</answer>"]}


def test_best_grounded_keeps_best_moves_as_written_and_masks_the_wrong_states(tiny):
    """On SFG/FHF/FFF, Right is the best first move and Down is not. The three Right turns
    are kept as the model wrote them (no ground-truth replacement), each naming the own
    states that were wrong, which the SFT loss then leaves out (VAGEN's grounded states)."""
    from spa.envs import make

    _, tokenizer = tiny
    lake = {"desc": "SFG/FHF/FFF", "is_slippery": False}
    env = make("frozenlake", **lake)
    env.reset(seed=0)
    before = env.state_text()
    env.step("Right")
    after = env.state_text()
    down = make("frozenlake", **lake)
    down.reset(seed=0)
    down.step("Down")
    script = [[wm("Right", obs=before, pred=after), wm("Right", obs=before, pred=before),
               wm("Right", obs=after, pred=after), wm("Down", obs=before, pred=down.state_text())]]
    config = SelfPlayConfig(env="frozenlake", env_config=lake, episodes=4, samples=4, max_turns=1,
                            max_actions_per_turn=2, keep="best_grounded")
    examples, stats = build_examples(collect(ScriptedEngine(tokenizer, script), tokenizer, config), config)
    assert [e["sample"] for e in examples] == [0, 1, 2] and stats["dropped_by_filter"] == 1
    assert [e["response"] for e in examples] == script[0][:3]
    assert [e["masked_states"] for e in examples] == [[], ["prediction"], ["observation"]]
    assert stats["states_right"] == {"observation": 2 / 3, "prediction": 2 / 3}
    # keep=best trains on all three best moves, their states replaced by the true ones.
    config = SelfPlayConfig(env="frozenlake", env_config=lake, episodes=4, samples=4, max_turns=1,
                            max_actions_per_turn=2, keep="best")
    examples, stats = build_examples(collect(ScriptedEngine(tokenizer, script), tokenizer, config), config)
    assert [e["response"] for e in examples] == [wm("Right", obs=before, pred=after)] * 3
    assert "masked_states" not in examples[0] and "states_right" not in stats


def test_keep_values():
    with pytest.raises(ValueError, match="keep='some'.*all, winners, best"):
        SelfPlayConfig(keep="some")
    with pytest.raises(ValueError, match="keep='best_prefix' needs mode='base' or 'state'"):
        SelfPlayConfig(keep="best_prefix")
    assert SelfPlayConfig(mode="state", keep="winners").keep == "winners"
    with pytest.raises(ValueError, match="keep='best_grounded' needs mode='world_model'"):
        SelfPlayConfig(mode="base", keep="best_grounded")
    with pytest.raises(ValueError, match="coords='random' does not apply to keep='best_grounded'"):
        SelfPlayConfig(keep="best_grounded", coords="random")


def test_keep_best_drops_a_turn_from_a_state_without_a_solution(tiny, monkeypatch):
    """A Sokoban box pushed into a corner leaves no solution: best_actions() is None, so
    best_first is None. With a solver that means no move is best, and the turn is dropped;
    only an environment without a solver is an error."""
    from dataclasses import replace

    from spa.agent import keep

    _, tokenizer = tiny
    config = SelfPlayConfig(env="frozenlake", env_config={"desc": "SFG/FHF/FFF", "is_slippery": False},
                            episodes=2, samples=2, max_turns=1, max_actions_per_turn=2, mode="base", keep="best")
    played = collect(ScriptedEngine(tokenizer, [[plain("Right"), plain("Right")]]), tokenizer, config)
    played[1].turns[0] = replace(played[1].turns[0], best_first=None, best_run=None)  # as from a dead end
    examples, stats = build_examples(played, config)
    assert [e["sample"] for e in examples] == [0] and stats["dropped_by_filter"] == 1
    monkeypatch.setattr(keep, "has_solver", lambda name: False)
    with pytest.raises(ValueError, match="keep='best' needs a solver, and frozenlake has none"):
        build_examples(played, config)


def test_a_dead_end_sokoban_state_has_no_best_action():
    from spa.envs import has_solver, make

    assert has_solver("sokoban") and has_solver("frozenlake")
    for seed in range(50):  # random moves until a box is stuck (the level then has no solution)
        env = make("sokoban", dim=6, num_boxes=1)
        env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        for _ in range(60):
            if env.best_actions() is None and not env.is_success():
                return
            _, _, terminated, truncated, _ = env.step(env.random_action(rng))
            if terminated or truncated:
                break
    pytest.fail("no dead end reached in 50 random Sokoban episodes")


def test_keep_value_labels_level_by_level_as_one_call_would_with_a_bar(monkeypatch):
    config = SelfPlayConfig(env="frozenlake", episodes=12, samples=4, max_turns=3, max_actions_per_turn=2,
                            exploration="random", mode="base", keep="value", value_rollouts=16)
    trajectories = collect(None, None, config)
    at_once = copy.deepcopy(trajectories)
    label_turns(at_once, config.value_rollouts, config.value_horizon, config.value_tolerance, config.seed)
    out = io.StringIO()
    monkeypatch.setattr(selfplay, "Bar", partial(Bar, console=Console(file=out, force_terminal=False), interval=0))
    build_examples(trajectories, config, progress="round-1 look-ahead")
    assert [turn.value_first for t in trajectories for turn in t.turns] == [
        turn.value_first for t in at_once for turn in t.turns]
    assert "round-1 look-ahead: levels labelled (keep=value): 3/3" in out.getvalue()
