"""``spa.eval.evaluate``, the model path: its metrics.json and report carry the Pass@k
95% interval over levels, worked out by hand here; one level gives none, without error."""

import json

import pytest

from spa.agent import sharding
from spa.agent.prompts import PromptConfig
from spa.agent.trajectory import Trajectory
from spa.eval.evaluate import EvalConfig, evaluate, interval_rows, metric_rows
from spa.eval.metrics import pass_at_k_interval, summarize

# Four levels of two samples: Pass@1 per level 1, 0.5, 0.5, 0 (mean 0.5, sample sd
# sqrt(1/6)); Pass@2 per level 1, 1, 1, 0 (mean 0.75, sample sd 0.5).
OUTCOMES = [(True, True), (True, False), (True, False), (False, False)]
HALF_1 = 1.96 * (1 / 6) ** 0.5 / 2
HALF_2 = 1.96 * 0.5 / 2


def episodes(outcomes):
    """Won episodes end with the environment; of the lost ones, the first sample of a level
    too (a hole), the second by running out of turns."""
    return [Trajectory("sokoban", {}, seed=level, group=level, sample=s, mode="state", success=ok,
                       terminated=ok or s == 0)
            for level, pair in enumerate(outcomes) for s, ok in enumerate(pair)]


@pytest.fixture
def scripted_outcomes(monkeypatch):
    """``evaluate``'s rollout (:mod:`spa.agent.sharding` calls it) replaced by episodes with
    chosen outcomes (the model is not run)."""
    def use(outcomes):
        monkeypatch.setattr(sharding, "rollout", lambda *args, **kwargs: episodes(outcomes))
    return use


def test_summarize_adds_the_interval_of_every_reported_pass_at_k_on_request():
    runs = episodes(OUTCOMES)
    metrics = summarize(runs, intervals=True)
    assert set(metrics["pass_at_k_ci95"]) == set(metrics["pass_at_k"]) == {"pass@1", "pass@2"}
    assert metrics["pass_at_k_ci95"]["pass@1"] == pytest.approx([0.5 - HALF_1, 0.5 + HALF_1])
    assert metrics["pass_at_k_ci95"]["pass@2"] == pytest.approx([0.75 - HALF_2, 1.0])  # clipped at 1
    assert metrics["pass_at_k_ci95"]["pass@1"] == pytest.approx(list(pass_at_k_interval(runs, 1)))
    assert "pass_at_k_ci95" not in summarize(runs)  # the RL rollout statistics do without
    assert "pass_at_k_ci95" not in summarize(episodes(OUTCOMES[:1]), intervals=True)  # one level


def test_summarize_says_how_the_episodes_ended():
    # 4 of 8 won; lost: level 3 sample 0 (the environment ended it); out of turns: the
    # second samples of levels 1, 2 and 3.
    assert summarize(episodes(OUTCOMES))["ended"] == pytest.approx(
        {"success": 4 / 8, "lost": 1 / 8, "out_of_turns": 3 / 8})


def test_model_evaluation_writes_the_intervals(tiny, tmp_path, scripted_outcomes):
    model, tokenizer = tiny
    scripted_outcomes(OUTCOMES)
    config = EvalConfig("sokoban", prompt=PromptConfig("state", max_turns=1), num_envs=4, samples=2)
    returned = evaluate(model, tokenizer, config, tmp_path, progress=False)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["pass_at_k"]["pass@1"] == pytest.approx(0.5)
    assert metrics["pass_at_k_ci95"]["pass@1"] == pytest.approx([0.5 - HALF_1, 0.5 + HALF_1])
    assert metrics["pass_at_k_ci95"]["pass@2"] == pytest.approx([0.75 - HALF_2, 1.0])
    assert returned["pass_at_k_ci95"] == metrics["pass_at_k_ci95"]
    low, high = 100 * (0.5 - HALF_1), 100 * (0.5 + HALF_1)
    assert dict(interval_rows(metrics))["pass@1 95% interval"] == f"[{low:.1f}%, {high:.1f}%]"
    report = (tmp_path / "report.md").read_text()
    assert f"| pass@1 95% interval | [{low:.1f}%, {high:.1f}%] |" in report
    assert "| pass@2 95% interval | [" in report
    assert "| episodes ended | 50.0% success, 12.5% lost, 37.5% out of turns |" in report


def test_one_level_gives_no_interval_and_no_error(tiny, tmp_path, scripted_outcomes):
    model, tokenizer = tiny
    scripted_outcomes(OUTCOMES[1:2])
    config = EvalConfig("sokoban", prompt=PromptConfig("state", max_turns=1), num_envs=1, samples=2)
    evaluate(model, tokenizer, config, tmp_path, progress=False)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["pass_at_k"] == {"pass@1": 0.5, "pass@2": 1.0}
    assert "pass_at_k_ci95" not in metrics and interval_rows(metrics) == []
    assert "95% interval" not in (tmp_path / "report.md").read_text()


def test_the_tables_show_the_best_first_rate_only_where_it_was_measured():
    metrics = summarize(episodes(OUTCOMES))  # episodes without turns: nothing was scored
    assert "best first action" not in dict(metric_rows(metrics))
    metrics["best_first_rate"] = 0.375
    assert dict(metric_rows(metrics))["best first action"] == "37.5%"
    assert "valid first action" not in dict(metric_rows(metrics))  # metrics written before it
    metrics.update(first_valid_rate=0.5, best_first_of_valid_rate=0.75)
    rows = dict(metric_rows(metrics))
    assert rows["valid first action"] == "50.0%" and rows["best first action, of the valid ones"] == "75.0%"

