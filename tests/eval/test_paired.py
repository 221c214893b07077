"""``spa.eval.paired``: the paired difference of two evaluations on the same levels, worked
out by hand, and its refusals."""

import json

import pytest

from spa.agent.trajectory import Trajectory
from spa.eval.metrics import normal_interval, summarize
from spa.eval.paired import (compare_evaluations, paired_difference, paired_rate_difference, read_levels,
                             signed_pct_with_interval)
from spa.io import write_json, write_jsonl

# Three levels of two samples. Pass@1 before 0.5, 0, 1 and after 1, 0.5, 1: differences
# 0.5, 0.5, 0, mean 1/3, sample sd sqrt(1/12), so the half-width is 1.96 * sqrt(1/12) / sqrt(3)
# = 1.96 / 6. Pass@2 before 1, 0, 1 and after 1, 1, 1: differences 0, 1, 0, mean 1/3, sd
# sqrt(1/3), half-width 1.96 / 3, reaching below 0 (a difference is clipped to [-1, 1] only).
BEFORE = {"a": [True, False], "b": [False, False], "c": [True, True]}
AFTER = {"c": [True, True], "b": [True, False], "a": [True, True]}  # another order: levels pair by name


def test_pass_at_1_difference_by_hand():
    d = paired_difference(BEFORE, AFTER)
    assert (d.k, d.levels, d.improved, d.worsened, d.tied) == (1, 3, 2, 0, 1)
    assert d.before == pytest.approx(0.5) and d.after == pytest.approx(5 / 6)
    assert d.difference == pytest.approx(1 / 3)
    assert d.difference_ci95 == pytest.approx((1 / 3 - 1.96 / 6, 1 / 3 + 1.96 / 6))
    assert d.difference_ci95[0] < d.difference < d.difference_ci95[1]
    # each side's interval is the one every evaluation reports (normal, over levels, in [0, 1])
    assert d.before_ci95 == pytest.approx(normal_interval([0.5, 0.0, 1.0]))
    assert d.after_ci95 == pytest.approx(normal_interval([1.0, 0.5, 1.0]))


def test_pass_at_2_difference_by_hand_keeps_a_negative_bound():
    d = paired_difference(BEFORE, AFTER, k=2)
    assert (d.before, d.after, d.difference) == pytest.approx((2 / 3, 1.0, 1 / 3))
    assert d.difference_ci95 == pytest.approx((1 / 3 - 1.96 / 3, 1 / 3 + 1.96 / 3))
    assert d.difference_ci95[0] < 0 and (d.improved, d.worsened, d.tied) == (1, 0, 2)
    with pytest.raises(ValueError, match="Pass@3 needs .* the fewest is 2"):
        paired_difference(BEFORE, AFTER, k=3)


def test_the_same_evaluation_twice_differs_by_nothing():
    d = paired_difference(BEFORE, BEFORE)
    assert d.difference == 0 and d.difference_ci95 == (0, 0) and d.tied == 3


def test_levels_that_differ_are_named():
    before = {seed: [True] for seed in range(10)}
    after = {seed: [False] for seed in range(3, 11)}
    with pytest.raises(ValueError, match=r"not play the same levels: 3 only in before \(0, 1, 2\); "
                                         r"1 only in after \(10\)"):
        paired_difference(before, after)
    with pytest.raises(ValueError, match=r"8 only in after \(10, 11, 12, 13, 14, \.\.\.\)"):
        paired_difference({1: [True], 2: [True]}, {1: [True], 2: [True], **{s: [True] for s in range(10, 18)}})


def test_a_level_without_samples_or_a_single_level_is_refused():
    with pytest.raises(ValueError, match=r"1 level\(s\) without samples in after \(b\)"):
        paired_difference(BEFORE, {**AFTER, "b": []})
    with pytest.raises(ValueError, match="at least 2 levels; got 1"):
        paired_difference({"a": [True]}, {"a": [False]})


def write_eval(folder, outcomes, env_config=None):
    """An evaluation folder with ``spa eval``'s trajectories and metrics, with chosen
    successes per level (the episodes have no turns)."""
    runs = [Trajectory("frozenlake", env_config or {}, seed=10_000_000 + level, group=level, sample=s, mode="state",
                       success=ok) for level, samples in enumerate(outcomes) for s, ok in enumerate(samples)]
    write_jsonl(folder / "trajectories.jsonl", (t.to_json() for t in runs))
    write_json(folder / "metrics.json", summarize(runs, intervals=True))
    return folder


def test_compare_evaluations_reads_levels_by_seed_and_agrees_with_each_evaluation(tmp_path):
    before = write_eval(tmp_path / "before", list(BEFORE.values()))
    after = write_eval(tmp_path / "after", [AFTER[name] for name in BEFORE])
    played, levels = read_levels(before)
    assert played == {"env": "frozenlake", "env_config": {}}
    assert levels == {10_000_000 + i: outcomes for i, outcomes in enumerate(BEFORE.values())}
    result = compare_evaluations(before, after)
    assert result["levels"] == 3 and result["samples"] == {"before": 2, "after": 2}
    assert set(result) >= {"pass@1", "pass@2"}
    assert result["pass@1"]["difference"] == pytest.approx(1 / 3)
    for side, folder in (("before", before), ("after", after)):  # the same numbers as metrics.json
        metrics = json.loads((folder / "metrics.json").read_text())
        for k in ("pass@1", "pass@2"):
            assert result[k][side] == pytest.approx(metrics["pass_at_k"][k])
            assert result[k][f"{side}_ci95"] == pytest.approx(metrics["pass_at_k_ci95"][k])


def test_levels_json_stands_in_for_the_trajectories(tmp_path):
    from spa.pipeline.layout import write_levels

    before = write_eval(tmp_path / "before", list(BEFORE.values()))
    after = write_eval(tmp_path / "after", [AFTER[name] for name in BEFORE])
    expected = compare_evaluations(before, after)
    for folder in (before, after):
        write_levels(folder)
        (folder / "trajectories.jsonl").unlink()
    assert json.loads((before / "levels.json").read_text())["levels"] == {"10000000": [1, 0], "10000001": [0, 0],
                                                                          "10000002": [1, 1]}
    assert read_levels(before) == ({"env": "frozenlake", "env_config": {}},
                                   {10_000_000 + i: outcomes for i, outcomes in enumerate(BEFORE.values())})
    assert compare_evaluations(before, after) == expected


def test_compare_evaluations_refuses_other_environments_and_missing_files(tmp_path):
    before = write_eval(tmp_path / "before", list(BEFORE.values()))
    other = write_eval(tmp_path / "other", list(BEFORE.values()), env_config={"size": 6})
    with pytest.raises(ValueError, match="different environments"):
        compare_evaluations(before, other)
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nothing" / "trajectories.jsonl")):
        compare_evaluations(before, tmp_path / "nothing")


# Best first action as (hits, scored turns): a 1 of 2 -> 2 of 2, b 0 of 4 -> 3 of 4. Pooled
# shares 1/6 -> 5/6, difference 2/3 (the mean of the levels' own shares would say 0.625).
# Pseudo-values share + (hits - share * scored) / 3: before 1/6 + 2/9, 1/6 - 2/9; after
# 5/6 + 1/9, 5/6 - 1/9; their differences 2/3 - 1/9, 2/3 + 1/9: sd sqrt(2) / 9, so the
# half-width is 1.96 * (sqrt(2) / 9) / sqrt(2) = 1.96 / 9; before's is 1.96 * 2 / 9.
BEST_BEFORE = {"a": (1, 2), "b": (0, 4)}
BEST_AFTER = {"b": (3, 4), "a": (2, 2)}


def test_best_first_difference_pools_turns_and_pairs_levels_by_hand():
    d = paired_rate_difference(BEST_BEFORE, BEST_AFTER)
    assert (d.levels, d.turns_before, d.turns_after, d.improved, d.worsened, d.tied) == (2, 6, 6, 2, 0, 0)
    assert (d.before, d.after, d.difference) == pytest.approx((1 / 6, 5 / 6, 2 / 3))
    assert d.difference_ci95 == pytest.approx((2 / 3 - 1.96 / 9, 2 / 3 + 1.96 / 9))
    assert d.before_ci95 == pytest.approx((0.0, 1 / 6 + 1.96 * 2 / 9))  # clipped at 0
    assert d.after_ci95 == pytest.approx((5 / 6 - 1.96 / 9, 1.0))
    same = paired_rate_difference(BEST_BEFORE, BEST_BEFORE)
    assert same.difference == 0 and same.difference_ci95 == (0, 0) and same.tied == 2
    with pytest.raises(ValueError, match="no turn of after was scored"):
        paired_rate_difference(BEST_BEFORE, {"a": (0, 0), "b": (0, 0)})


def write_scored_eval(folder, best):
    """An evaluation whose level ``i`` has one episode with turns ``best[i]`` (True, False
    or None: not scored); returns its folder and ``summarize``'s metrics of the same turns."""
    from types import SimpleNamespace

    runs, records = [], []
    for level, turns in enumerate(best):
        episode = Trajectory("sokoban", {}, seed=10_000_000 + level, group=level, sample=0, mode="base")
        records.append({**episode.to_json(), "turns": [{"best_first": b} for b in turns]})
        episode.turns = [SimpleNamespace(best_first=b, best_run=None, reward=0.0, actions_valid=[True],
                                         format_ok=True, response_ids=[]) for b in turns]
        runs.append(episode)
    write_jsonl(folder / "trajectories.jsonl", records)
    return folder, summarize(runs)


def test_compare_evaluations_pairs_the_best_first_action_and_levels_json_keeps_it(tmp_path):
    from spa.pipeline.layout import write_levels

    before, metrics = write_scored_eval(tmp_path / "before", [[True, False, None], [False, False, False, False]])
    after, _ = write_scored_eval(tmp_path / "after", [[True, True], [True, None, True, True, False]])
    result = compare_evaluations(before, after)
    assert result["best_first"]["before"] == pytest.approx(metrics["best_first_rate"])  # what spa eval reports
    assert result["best_first"]["difference"] == pytest.approx(2 / 3)
    assert result["best_first"]["difference_ci95"] == pytest.approx([2 / 3 - 1.96 / 9, 2 / 3 + 1.96 / 9])
    write_levels(before)
    assert json.loads((before / "levels.json").read_text())["best_first"] == {"10000000": [1, 2],
                                                                              "10000001": [0, 4]}
    (before / "trajectories.jsonl").unlink()
    assert compare_evaluations(before, after) == result
    unscored, _ = write_scored_eval(tmp_path / "unscored", [[None], [None]])
    assert "best_first" not in compare_evaluations(unscored, after)


def test_a_difference_reads_in_signed_points():
    assert signed_pct_with_interval(0.09375, (0.0642, 0.1233)) == "+9.4 [+6.4, +12.3]"
    assert signed_pct_with_interval(-0.0078, (-0.0344, 0.0188)) == "-0.8 [-3.4, +1.9]"
