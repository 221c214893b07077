"""``spa run`` end to end on the tiny model: stages, report, resume, compare."""

import json
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from typer.testing import CliRunner

from spa.cli import app
from spa.config import ConfigError
from spa.eval.metrics import bootstrap_interval
from spa.models import load_model
from spa.pipeline import replicates
from spa.pipeline import report as report_module
from spa.pipeline.layout import archive, eval_dir
from spa.pipeline.recipe import CONFIGS, load_recipe
from spa.pipeline.run import Run
from spa.rl import logger as logger_module
from spa.rl.ppo import resume_point
from spa.worldmodel.sft import last_checkpoint

# The smallest budget that exercises every stage. Self-play uses the random-exploration
# switch: the random tiny model never writes a well-formed turn, even after the bootstrap.
# Eight evaluation levels leave two for the in-RL evaluation, the fewest with an interval.
TINY = """
model: tiny
selfplay: {episodes: 4, samples: 2, max_new_tokens: 8, bootstrap_episodes: 4, exploration: random}
sft: {epochs: 1, batch_size: 4, val_fraction: 0.0, precision: fp32}
ppo: {steps: 2, groups: 2, samples: 2, keep_fraction: 1.0, max_new_tokens: 8, minibatch_size: 4,
      micro_batch_size: 2, eval_every: 1, save_every: 1, tensorboard: false, precision: fp32}
eval: {num_envs: 8, samples: 2, max_new_tokens: 8}
prompt: {max_turns: 2}
"""


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    path = tmp_path_factory.mktemp("preset") / "tiny.yaml"
    path.write_text(TINY)
    return path


@pytest.fixture(scope="module")
def finished(preset, tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs") / "straight"
    Run(load_recipe(CONFIGS / "sokoban-spa.yaml", preset=str(preset)), folder, log=lambda _: None).run()
    return folder


def test_every_stage_runs_and_the_report_is_written(finished):
    stages = json.loads((finished / "stages.json").read_text())
    assert list(stages) == ["bootstrap", "selfplay", "sft", "eval_base", "eval_sft", "rl", "eval_final", "report"]
    report = (finished / "report.md").read_text()
    for label in ("base model", "after world-model SFT", "final model"):
        assert label in report
    for plot in ("rl_rollouts.png", "rl_eval.png", "world_model.png"):
        assert (finished / plot).stat().st_size > 1000
    # RL started from the SFT checkpoint, which started from the bootstrap checkpoint
    assert stages["sft"]["outputs"]["model"].endswith("sft/epoch-1")
    metrics = (finished / "rl" / "metrics.jsonl").read_text().splitlines()
    assert [r["step"] for r in map(json.loads, metrics)] == [0, 1, 2]
    assert not list(finished.rglob("*.partial.jsonl"))  # the turn logs of plays and evaluations are gone


def with_interval(value, low, high):  # the report's format, written out here
    return f"{100 * value:.1f} [{100 * low:.1f}, {100 * high:.1f}]"


def test_every_evaluation_carries_its_interval_into_the_report(finished):
    stages = json.loads((finished / "stages.json").read_text())
    report = (finished / "report.md").read_text()
    labels = {"eval_base": "base model", "eval_sft": "after world-model SFT", "eval_final": "final model"}
    for stage, label in labels.items():
        for mode, entry in stages[stage]["outputs"].items():
            metrics = json.loads(Path(entry["metrics"]).read_text())
            assert set(metrics["pass_at_k_ci95"]) == set(metrics["pass_at_k"]) == {"pass@1", "pass@2"}
            low, high = metrics["pass_at_k_ci95"]["pass@1"]
            assert 0 <= low <= metrics["pass_at_k"]["pass@1"] <= high <= 1
            best = f"{100 * metrics['best_first_rate']:.1f}"
            assert f"| {label} | {mode} | {with_interval(metrics['pass_at_k']['pass@1'], low, high)} | - | {best} |" \
                in report
    # The in-RL evaluation curve: its log has the bounds, the report a row per evaluation.
    records = [json.loads(line) for line in (finished / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "eval/pass@1" in r] == [0, 1, 2]
    assert "## Evaluation during RL" in report
    assert "| RL step | Pass@1 [95% interval] | Pass@8 | best first action |" in report
    for r in records:
        assert r["eval/pass@1_lo"] <= r["eval/pass@1"] <= r["eval/pass@1_hi"]
        assert f"| {r['step']} | {with_interval(r['eval/pass@1'], r['eval/pass@1_lo'], r['eval/pass@1_hi'])} | - | " \
            f"{100 * r['eval/best_first']:.1f} |" in report


def band_calls(run, folder, monkeypatch):
    """The bands ``plot_rl`` shades: ``(steps, low, high)`` per call."""
    calls = []
    original = report_module.plt.Axes.fill_between

    def record(self, x, low, high, **kwargs):
        calls.append((list(x), list(low), list(high)))
        return original(self, x, low, high, **kwargs)

    monkeypatch.setattr(report_module.plt.Axes, "fill_between", record)
    report_module.plot_rl(run, folder)
    return calls


def test_the_evaluation_plot_shades_the_pass_at_1_interval(finished, tmp_path, monkeypatch):
    run = report_module.load_run(finished)
    evals = [r for r in run["rl"] if "eval/pass@1" in r]
    assert band_calls(run, tmp_path, monkeypatch) == [([r["step"] for r in evals], [r["eval/pass@1_lo"] for r in evals],
                                                        [r["eval/pass@1_hi"] for r in evals])]
    assert (tmp_path / "rl_eval.png").stat().st_size > 1000


def strip_intervals(finished, folder):
    """A copy of the run as it would have been written before evaluations had intervals."""
    shutil.copytree(finished, folder)
    text = (folder / "stages.json").read_text().replace(str(finished), str(folder))
    (folder / "stages.json").write_text(text)
    for path in (folder / "eval").rglob("metrics.json"):
        metrics = json.loads(path.read_text())
        metrics.pop("pass_at_k_ci95", None)
        path.write_text(json.dumps(metrics))
    records = [json.loads(line) for line in (folder / "rl" / "metrics.jsonl").read_text().splitlines()]
    lines = [json.dumps({k: v for k, v in r.items() if not k.endswith(("_lo", "_hi"))}) for r in records]
    (folder / "rl" / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return json.loads(text)


def test_a_run_without_intervals_reports_the_numbers_alone(finished, tmp_path, monkeypatch):
    old = tmp_path / "old"
    stages = strip_intervals(finished, old)
    report = Path(report_module.write_report(old)).read_text()
    for mode, entry in stages["eval_base"]["outputs"].items():
        value = json.loads(Path(entry["metrics"]).read_text())["pass_at_k"]["pass@1"]
        assert f"| base model | {mode} | {100 * value:.1f} | - |" in report
    records = report_module.load_run(old)["rl"]
    assert f"| 0 | {100 * records[0]['eval/pass@1']:.1f} | - |" in report
    assert not re.search(r"\d\.\d \[\d", report)  # no interval anywhere
    assert band_calls(report_module.load_run(old), tmp_path, monkeypatch) == []


def test_an_interrupted_run_continues_to_the_same_result(preset, finished, tmp_path, monkeypatch):
    folder = tmp_path / "interrupted"
    recipe = load_recipe(CONFIGS / "sokoban-spa.yaml", preset=str(preset))
    original = logger_module.MetricsLogger.log

    def crash_at_step_2(self, step, metrics):
        if step == 2:
            raise KeyboardInterrupt
        original(self, step, metrics)

    monkeypatch.setattr(logger_module.MetricsLogger, "log", crash_at_step_2)
    with pytest.raises(KeyboardInterrupt):
        Run(recipe, folder, log=lambda _: None).run()
    assert "rl" not in json.loads((folder / "stages.json").read_text())
    spent = json.loads((folder / "clock.json").read_text())["rl"]  # the interrupted stage's time so far
    monkeypatch.setattr(logger_module.MetricsLogger, "log", original)
    Run(recipe, folder, log=lambda _: None).run()
    assert json.loads((folder / "stages.json").read_text())["rl"]["seconds"] >= spent > 0  # counted on
    assert not (folder / "clock.json").exists()  # nothing unfinished
    a = load_file(finished / "rl" / "checkpoint" / "policy" / "model.safetensors")
    b = load_file(folder / "rl" / "checkpoint" / "policy" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    finals = sorted(p.name for p in (finished / "eval").glob("final-*"))
    assert finals == ["final-world_model"]  # the spa recipes keep the world-model format in RL
    for name in finals:
        ma = json.loads((finished / "eval" / name / "metrics.json").read_text())
        mb = json.loads((folder / "eval" / name / "metrics.json").read_text())
        for volatile in ("wall_seconds", "tokens_per_second", "model"):
            ma.pop(volatile), mb.pop(volatile)
        assert ma == mb
    assert (folder / "rl" / "metrics.jsonl").read_text().count("\n") == 3


def test_a_rerun_skips_finished_stages_and_refuses_another_recipe(preset, finished, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(finished, folder)
    logs = []
    Run(load_recipe(CONFIGS / "sokoban-spa.yaml", preset=str(preset)), folder, log=logs.append).run()
    assert all("skipped" in line for line in logs)
    other = load_recipe(CONFIGS / "sokoban-spa.yaml", ["ppo.steps=3"], preset=str(preset))
    with pytest.raises(ValueError, match="ppo.steps"):
        Run(other, folder)


def test_a_key_added_after_a_run_was_saved_reads_as_its_default(tmp_path):
    # A folder written before iterate.value_horizon existed: resumed at the default, refused with
    # another value (the run played with the default's behaviour, whatever the file lacks).
    recipe = load_recipe(CONFIGS / "frozenlake-vanilla-iterate.yaml")
    Run(recipe, tmp_path)
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    del saved["iterate"]["value_horizon"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    Run(recipe, tmp_path)
    with pytest.raises(ValueError, match=r"differs in: iterate\.value_horizon\)"):
        Run(load_recipe(CONFIGS / "frozenlake-vanilla-iterate.yaml", ["iterate.value_horizon=3"]), tmp_path)


def test_a_finished_run_keeps_weights_and_results_but_no_optimizer_state(finished):
    assert not list(finished.rglob("trainer_state.pt"))  # keep_optimizer defaults to false
    stages = json.loads((finished / "stages.json").read_text())
    for stage in ("bootstrap", "sft", "rl"):
        model = Path(stages[stage]["outputs"]["model"])
        assert (model / "model.safetensors").is_file() and (model / "tokenizer.json").is_file(), stage
    assert (finished / "report.md").is_file() and (finished / "rl" / "metrics.jsonl").is_file()
    # Without their trainer state, the checkpoints are no resume point for anything.
    assert last_checkpoint(finished / "sft") is None and last_checkpoint(finished / "bootstrap") is None
    assert resume_point(finished / "rl") is None
    model, _ = load_model(stages["rl"]["outputs"]["model"], dtype="fp32")  # still a model
    assert sum(p.numel() for p in model.parameters()) > 0


def test_keep_optimizer_keeps_the_trainer_state_and_may_change_on_a_rerun(preset, tmp_path):
    def run(keep: bool) -> list[str]:
        logs = []
        recipe = load_recipe(CONFIGS / "sokoban-spa.yaml", [f"keep_optimizer={str(keep).lower()}"], preset=str(preset))
        Run(recipe, tmp_path, log=logs.append).run(until="bootstrap")
        return logs

    run(keep=True)
    assert (tmp_path / "bootstrap" / "epoch-1" / "trainer_state.pt").is_file()
    logs = run(keep=False)  # not a change of recipe: it changes no result
    assert not list(tmp_path.rglob("trainer_state.pt"))
    assert (tmp_path / "bootstrap" / "epoch-1" / "model.safetensors").is_file()
    assert any("dropped its optimizer state" in line for line in logs) and any("skipped" in line for line in logs)


def per_level_pass_at_1(folder: Path, stage: str) -> list[float]:
    """Each level's Pass@1 in a run's evaluation, from its trajectories (the test's own count)."""
    stages = json.loads((folder / "stages.json").read_text())
    mode = next(iter(stages[stage]["outputs"]))
    levels: dict[int, list[bool]] = {}
    for line in (eval_dir(folder, stage, mode) / "trajectories.jsonl").read_text().splitlines():
        record = json.loads(line)
        levels.setdefault(record["group"], []).append(record["success"])
    return [sum(v) / len(v) for v in levels.values()]


def rl_gain(folder: Path, before: str = "eval_sft") -> str:
    """The paired RL gain cell, from the test's own count: per level final minus before-RL
    Pass@1, mean ± 1.96 sd / sqrt(levels) in signed points."""
    gains = [b - a for a, b in zip(per_level_pass_at_1(folder, before), per_level_pass_at_1(folder, "eval_final"))]
    centre = sum(gains) / len(gains)
    half = 1.96 * statistics.stdev(gains) / len(gains) ** 0.5
    return f"{100 * centre:+.1f} [{100 * (centre - half):+.1f}, {100 * (centre + half):+.1f}]"


def set_successes(folder: Path, stage: str, offset: int) -> None:
    """Rewrite an evaluation's trajectories with successes that vary between levels (the
    tiny random model never succeeds, so its intervals would all be [0, 0])."""
    stages = json.loads((folder / "stages.json").read_text())
    for mode in stages[stage]["outputs"]:
        path = eval_dir(folder, stage, mode) / "trajectories.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for r in records:
            r["success"] = (r["group"] * 7 + r["sample"] * 3 + offset) % 5 < 2
        path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_compare_groups_replicates_by_recipe(preset, finished, tmp_path):
    recipe = CONFIGS / "sokoban-spa.yaml"
    straight = tmp_path / "straight"  # a copy: the test rewrites its trajectories
    shutil.copytree(finished, straight)
    (straight / "stages.json").write_text((straight / "stages.json").read_text().replace(str(finished), str(straight)))
    for name, overrides in (("seed1", ["seed=1"]), ("other", ["seed=1", "ppo.steps=1"])):
        Run(load_recipe(recipe, overrides, preset=str(preset)), tmp_path / name, log=lambda _: None).run()
    folders = [straight, tmp_path / "seed1", tmp_path / "other"]
    for offset, folder in enumerate(folders[:2]):
        set_successes(folder, "eval_final", offset)
    groups = replicates.group_runs([report_module.load_run(f) for f in folders])
    assert [[run["name"] for run in group] for group in groups] == [["straight", "seed1"], ["other"]]
    report_module.compare(folders, tmp_path / "cmp", resamples=500)
    text = (tmp_path / "cmp" / "comparison.md").read_text()
    runs = {line.split(" | ")[0][2:]: line.split(" | ") for line in text.splitlines()
            if line.startswith(("| straight", "| seed1", "| other"))}
    pair, alone = (line.split(" | ") for line in text.splitlines() if line.startswith("| G"))
    import yaml  # the run table names each run's learner, as its resolved recipe says

    assert runs["straight"][2] == report_module.learner_name(yaml.safe_load((straight / "config.yaml").read_text()))
    assert pair[:7] == ["| G1", "spa", "sokoban", "-", runs["straight"][4], "ppo", "2"]
    assert pair[-1] == "straight, seed1 |"
    assert alone[3] == "ppo.steps=1" and alone[6] == "1" and alone[-1] == "other |"  # named by its override
    # Two seeds: mean and bootstrap interval over both runs' levels; Pass@8 needs 8 samples.
    for column, stage in ((7, "eval_base"), (9, "eval_sft"), (11, "eval_final")):
        per_seed = [per_level_pass_at_1(f, stage) for f in folders[:2]]
        assert pair[column] == with_interval(*bootstrap_interval(per_seed, resamples=500))
        assert pair[column + 1] == "-"
    centre, low, high = bootstrap_interval([per_level_pass_at_1(f, "eval_final") for f in folders[:2]], 500)
    assert 0 < low < centre < high < 1  # the rewritten successes: a real interval
    # The RL gain of a run, paired over its levels: the rewritten final successes against
    # the SFT evaluation's (none).
    assert runs["straight"][11] == rl_gain(straight) and runs["straight"][11].startswith("+")
    # One seed: the run's own number and interval over levels, as in the per-run table.
    assert alone[7:13] == runs["other"][5:11]
    assert (tmp_path / "cmp" / "passk.png").stat().st_size > 1000
    # passk.png's final curve of the single run: its Pass@1 and Pass@2, k = 1..samples
    metrics = json.loads((tmp_path / "other" / "eval" / "final-world_model" / "metrics.json").read_text())
    assert replicates.passk_curve(groups[1], ("eval_final",)) == pytest.approx(
        [metrics["pass_at_k"]["pass@1"], metrics["pass_at_k"]["pass@2"]])


def test_compare_command_tables_the_runs(finished, tmp_path):
    # A second run, stopped after the SFT evaluation: its final columns stay empty.
    partial = tmp_path / "partial"
    (tmp_path / "cmp").mkdir()
    (tmp_path / "cmp" / "rounds.png").write_bytes(b"from an earlier comparison with rounds")
    shutil.copytree(finished, partial)
    stages = json.loads((partial / "stages.json").read_text())
    kept = {k: v for k, v in stages.items() if k in ("bootstrap", "selfplay", "sft", "eval_base", "eval_sft")}
    (partial / "stages.json").write_text(json.dumps(kept))
    result = CliRunner().invoke(app, ["compare", str(finished), str(partial), "--out", str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    assert "![curves](curves.png)" in result.output  # printed as text, not read as rich markup
    cmp = tmp_path / "cmp"
    wrote = f"wrote {cmp / 'comparison.md'}, {cmp / 'curves.png'}, {cmp / 'passk.png'}"
    assert "".join(wrote.split()) in "".join(result.output.split())  # wrapped lines joined
    assert not (cmp / "rounds.png").exists()  # PPO runs have no rounds: the stale plot is gone
    rows = [line.split(" | ") for line in (tmp_path / "cmp" / "comparison.md").read_text().splitlines()
            if line.startswith("| straight") or line.startswith("| partial")]
    mode = next(iter(stages["eval_final"]["outputs"]))

    def pct(stage, key):  # the tiny budget samples twice: there is no Pass@8; Pass@1 has its interval
        metrics = json.loads(Path(stages[stage]["outputs"][mode]["metrics"]).read_text())
        value = metrics["pass_at_k"].get(key)
        if value is None:
            return "-"
        return with_interval(value, *metrics["pass_at_k_ci95"][key]) if key == "pass@1" else f"{100 * value:.1f}"

    full, cut = rows
    assert pct("eval_base", "pass@1") != "-"
    assert [full[1], *full[3:5]] == ["spa", "sokoban", mode]
    assert full[5:11] == [pct("eval_base", "pass@1"), pct("eval_base", "pass@8"), pct("eval_sft", "pass@1"),
                          pct("eval_sft", "pass@8"), pct("eval_final", "pass@1"), pct("eval_final", "pass@8")]
    assert cut[5:11] == full[5:9] + ["-", "-"]
    final = json.loads(Path(stages["eval_final"]["outputs"][mode]["metrics"]).read_text())
    assert full[11] == rl_gain(finished) and cut[11] == "-"  # the partial run has no final evaluation
    assert full[12] == f"{100 * final['best_first_rate']:.1f}" and cut[12] == "-"
    assert "(unfinished)" in cut[13] and "(unfinished)" not in full[13]
    # The total wall time: 5 stages of 720 s make the partial run's hour.
    (partial / "stages.json").write_text(json.dumps({k: {**v, "seconds": 720.0} for k, v in kept.items()}))
    report_module.compare([partial], tmp_path / "cmp-total")
    assert ("In all: 1.0 hours of wall time over 1 run, the sum of the column above (1 unfinished, so far)."
            in (tmp_path / "cmp-total" / "comparison.md").read_text().splitlines())
    assert (tmp_path / "cmp" / "curves.png").exists() and (tmp_path / "cmp" / "passk.png").exists()
    # A run written before intervals: its numbers alone.
    strip_intervals(finished, tmp_path / "old")
    report_module.compare([tmp_path / "old"], tmp_path / "cmp-old")
    old = next(line.split(" | ") for line in (tmp_path / "cmp-old" / "comparison.md").read_text().splitlines()
               if line.startswith("| old"))
    assert old[5:11] == [cell.split(" [")[0] for cell in full[5:11]]
    assert all("[" not in cell for cell in old[5:11]) and any("[" in cell for cell in full[5:11])


@pytest.mark.parametrize("recipe", sorted(p.name for p in CONFIGS.glob("*.yaml")))
@pytest.mark.parametrize("budget", ["quick", "learn", "paper", "smoke"])
def test_every_shipped_recipe_loads(recipe, budget):
    loaded = load_recipe(CONFIGS / recipe, preset=budget)
    assert loaded.env.name in recipe


def test_recipe_errors_name_the_bad_value():
    with pytest.raises(ConfigError, match="did you mean 'ppo.steps'"):
        load_recipe(CONFIGS / "sokoban-spa.yaml", ["ppo.stepz=3"])
    with pytest.raises(ValueError, match="valid: learn, paper, quick, smoke"):
        load_recipe(CONFIGS / "sokoban-spa.yaml", preset="huge")
    with pytest.raises(ConfigError, match="method"):
        load_recipe(CONFIGS / "sokoban-spa.yaml", ["method=magic"])


def test_run_command_reports_a_bad_recipe_cleanly(tmp_path):
    result = CliRunner().invoke(app, ["run", str(tmp_path / "missing.yaml")])
    assert result.exit_code != 0 and "does not exist" in result.output
    assert not Path("runs/missing-learn").exists()


def test_vagen_adds_world_model_rewards_to_the_turns(preset, tmp_path):
    folder = tmp_path / "vagen"
    Run(load_recipe(CONFIGS / "sokoban-vagen.yaml", preset=str(preset)), folder, log=lambda _: None).run()
    stages = json.loads((folder / "stages.json").read_text())
    assert list(stages) == ["bootstrap", "eval_base", "eval_bootstrap", "rl", "eval_final", "report"]
    assert stages["rl"]["outputs"]["start"] == stages["bootstrap"]["outputs"]["model"]
    records = [json.loads(line) for line in (folder / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert all("rollout/shaping_reward" in r for r in records if r["step"] > 0)
    assert list(stages["eval_final"]["outputs"]) == ["world_model"]


def where_it_computes(monkeypatch) -> dict:
    """Spies on a run: the device of every model load and of the RWML embedder, the compute
    handed to each trainer, and every compute decided below the run (a stage that was
    handed none decides its own from the strings)."""
    import spa.pipeline.run as run_module
    from spa.rl import expert_iteration, ppo, rwml_train
    from spa.worldmodel import sft

    seen = {"loads": [], "embedders": [], "trainers": [], "fallbacks": []}

    def spy(record: str, real, key: str):
        def wrapper(*args, **kwargs):
            seen[record].append(kwargs.get(key, "not given"))
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(run_module, "load_model", spy("loads", run_module.load_model, "device"))
    monkeypatch.setattr(rwml_train, "SentenceEmbedder", spy("embedders", rwml_train.SentenceEmbedder, "device"))
    for module, name in ((run_module, "train_sft"), (run_module, "train_rl"), (rwml_train, "run"),
                         (expert_iteration, "run")):
        monkeypatch.setattr(module, name, spy("trainers", getattr(module, name), "compute"))
    for module in (sft, ppo, rwml_train, expert_iteration):
        monkeypatch.setattr(module, "for_model", spy("fallbacks", module.for_model, "model"))
    return seen


def assert_on_the_run_device(seen: dict, trainers: int) -> None:
    """Every load, the embedder and each trainer on the recipe's device (cpu here, given by
    name), each trainer in its stage's precision (fp32 in these recipes), nothing decided below."""
    cpu = torch.device("cpu")
    assert seen["loads"] and seen["loads"] == [cpu] * len(seen["loads"])
    assert seen["embedders"] == [cpu]
    assert [(c.device, c.precision.name) for c in seen["trainers"]] == [(cpu, "fp32")] * trainers
    assert seen["fallbacks"] == []


def test_rwml_then_ppo_runs_every_stage(preset, tmp_path, monkeypatch):
    folder = tmp_path / "rwml"
    overrides = ["rwml.exploration=random", "rwml.episodes=4", "rwml.samples=2", "rwml.filter=false",
                 "rwml.steps=1", "rwml.batch_size=2", "rwml.group_size=2", "rwml.max_new_tokens=8",
                 "rwml.eval_seeds=2", "rwml.reward=change", "rwml.precision=fp32", "rwml.tensorboard=false",
                 "device=cpu"]
    seen = where_it_computes(monkeypatch)
    Run(load_recipe(CONFIGS / "sokoban-rwml+ppo.yaml", overrides, preset=str(preset)), folder,
        log=lambda _: None).run()
    stages = json.loads((folder / "stages.json").read_text())
    assert list(stages) == ["bootstrap", "eval_base", "rwml", "eval_rwml", "rl", "eval_final", "report"]
    report = (folder / "report.md").read_text()
    assert "RWML next-state prediction" in report and "copied" in report and "changed_exact" in report
    assert_on_the_run_device(seen, trainers=3)  # the bootstrap's SFT, RWML, PPO


def test_a_stage_computes_on_the_run_device_in_its_own_precision_where_it_sets_one(tmp_path):
    from spa import precision
    from spa.compute import Compute

    recipe = load_recipe(CONFIGS / "sokoban-spa.yaml", ["precision=fp32", "ppo.precision=bf16", "device=cpu"])
    run = Run(recipe, tmp_path)
    cpu = torch.device("cpu")
    assert run.compute == Compute(cpu, precision.Precision("fp32", "asked for"))
    assert run.stage_compute(recipe.sft) is run.compute and run.stage_compute(recipe.rwml) is run.compute
    assert run.stage_compute(recipe.ppo) == Compute(cpu, precision.resolve("bf16", cpu))


def test_the_device_is_a_recipe_key_checked_when_the_recipe_loads(tmp_path):
    assert load_recipe(CONFIGS / "sokoban-spa.yaml").device == "auto"
    assert load_recipe(CONFIGS / "sokoban-spa.yaml", ["device=CUDA:1"]).device == "cuda:1"
    with pytest.raises(ConfigError, match="device 'gpu' is not known; valid: auto, cpu, cuda, cuda:N"):
        load_recipe(CONFIGS / "sokoban-spa.yaml", ["device=gpu"])
    with pytest.raises(ConfigError, match="did you mean 'device'"):
        load_recipe(CONFIGS / "sokoban-spa.yaml", ["devices=cpu"])
    # where a run computes is not what it computes: a run goes on on another device
    recipe = load_recipe(CONFIGS / "sokoban-spa.yaml", ["device=cpu"])
    Run(recipe, tmp_path)
    Run(load_recipe(CONFIGS / "sokoban-spa.yaml"), tmp_path)


def test_run_refuses_a_device_this_machine_lacks_before_any_stage(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(app, ["run", str(CONFIGS / "sokoban-spa.yaml"), "device=cuda:0",
                                      "--runs-dir", str(tmp_path)], terminal_width=200)
    assert result.exit_code == 2 and "device 'cuda:0' was asked for, but torch sees no CUDA GPU" in \
        " ".join(result.output.replace("│", " ").split())
    assert not list(tmp_path.iterdir())  # no run folder
    result = CliRunner().invoke(app, ["run", str(CONFIGS / "sokoban-spa.yaml"), "device=gpu",
                                      "--runs-dir", str(tmp_path)], terminal_width=200)
    assert result.exit_code == 2 and "device 'gpu' is not known" in result.output


def test_until_stops_after_a_stage_and_a_rerun_goes_on(preset, tmp_path):
    recipe = load_recipe(CONFIGS / "sokoban-vanilla.yaml", ["selfplay.bootstrap_episodes=0"], preset=str(preset))
    folder = tmp_path / "partial"
    Run(recipe, folder, log=lambda _: None).run(until="eval_base")
    assert list(json.loads((folder / "stages.json").read_text())) == ["eval_base"]
    with pytest.raises(ValueError, match="valid: eval_base, rl, eval_final, report"):
        Run(recipe, folder).run(until="sft")
    Run(recipe, folder, log=lambda _: None).run()
    stages = json.loads((folder / "stages.json").read_text())
    assert list(stages) == ["eval_base", "rl", "eval_final", "report"]
    assert stages["rl"]["outputs"]["start"] == recipe.model  # without a bootstrap: the base model


def test_the_runs_folder_may_come_from_the_environment(preset, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["run", str(CONFIGS / "sokoban-vanilla.yaml"), "selfplay.bootstrap_episodes=0", "--preset", str(preset),
            "--name", "partial", "--until", "eval_base"]
    result = CliRunner().invoke(app, args, env={"SPA_RUNS_DIR": str(tmp_path / "elsewhere")})
    assert result.exit_code == 0, result.output
    assert list(json.loads((tmp_path / "elsewhere" / "partial" / "stages.json").read_text())) == ["eval_base"]
    assert not (tmp_path / "runs").exists()


def test_the_base_evaluation_is_a_switch_a_rerun_may_flip(preset, tmp_path):
    folder = tmp_path / "no-base"
    overrides = ["selfplay.bootstrap_episodes=0", "eval.base=false"]
    Run(load_recipe(CONFIGS / "sokoban-vanilla.yaml", overrides, preset=str(preset)), folder,
        log=lambda _: None).run(until="rl")
    assert list(json.loads((folder / "stages.json").read_text())) == ["rl"]
    recipe = load_recipe(CONFIGS / "sokoban-vanilla.yaml", overrides[:1], preset=str(preset))
    assert Run(recipe, folder).stage_list() == ["eval_base", "rl", "eval_final", "report"]  # not another recipe


def test_plain_rl_starts_from_a_bootstrap_in_its_own_prompt_mode(preset, tmp_path):
    folder = tmp_path / "vanilla"
    Run(load_recipe(CONFIGS / "frozenlake-vanilla.yaml", preset=str(preset)), folder, log=lambda _: None).run(
        until="rl")
    stages = json.loads((folder / "stages.json").read_text())
    assert list(stages) == ["bootstrap", "eval_base", "eval_bootstrap", "rl"]
    assert stages["rl"]["outputs"]["start"] == stages["bootstrap"]["outputs"]["model"]
    # The model RL starts from is evaluated, in the RL mode: the comparison's "before RL".
    assert list(stages["eval_bootstrap"]["outputs"]) == ["base"]
    assert (folder / "eval" / "bootstrap-base" / "metrics.json").is_file()
    examples = [json.loads(line) for line in (folder / "data" / "bootstrap.jsonl").read_text().splitlines()]
    assert examples and all("<observation>" not in e["response"] for e in examples)
    assert all("<answer>" in e["response"] for e in examples)


def test_bootstrap_actions_makes_the_bootstrap_targets_one_move_answers(preset, tmp_path):
    folder = tmp_path / "one-move"
    recipe = load_recipe(CONFIGS / "sokoban-vanilla.yaml", ["selfplay.bootstrap_actions=1"], preset=str(preset))
    Run(recipe, folder, log=lambda _: None).run(until="bootstrap")
    examples = [json.loads(line) for line in (folder / "data" / "bootstrap.jsonl").read_text().splitlines()]
    assert examples and all(len(e["actions"]) == 1 for e in examples)
    assert all("||" not in e["response"] for e in examples)
    with pytest.raises(ValueError, match="selfplay.bootstrap_actions=4 must be 0 .* or 1..3"):
        load_recipe(CONFIGS / "sokoban-vanilla.yaml", ["selfplay.bootstrap_actions=4"], preset=str(preset))


def test_spa_with_a_plain_rl_prompt_bridges_its_sft_to_that_mode(preset, tmp_path):
    folder = tmp_path / "bridged"
    recipe = load_recipe(CONFIGS / "frozenlake-spa.yaml", ["prompt.mode=base"], preset=str(preset))
    Run(recipe, folder, log=lambda _: None).run(until="rl")
    stages = json.loads((folder / "stages.json").read_text())
    assert list(stages) == ["bootstrap", "selfplay", "sft", "bridge", "eval_base", "eval_sft", "rl"]
    bridged = stages["bridge"]["outputs"]["model"]
    assert bridged.endswith("bridge/epoch-1") and stages["rl"]["outputs"]["start"] == bridged
    assert json.loads(Path(stages["eval_sft"]["outputs"]["base"]["metrics"]).read_text())["model"] == bridged
    examples = [json.loads(line) for line in (folder / "data" / "bridge.jsonl").read_text().splitlines()]
    assert examples and all("<observation>" not in e["response"] and "<answer>" in e["response"] for e in examples)
    assert all("<observation>" in e["response"] for e in map(json.loads, (folder / "data" / "selfplay.jsonl")
                                                             .read_text().splitlines()))


def test_the_bridge_is_a_switch_and_only_for_another_rl_mode(preset):
    def stages(*overrides):
        return Run.stage_list(type("R", (), {"recipe": load_recipe(CONFIGS / "frozenlake-spa.yaml", list(overrides),
                                                                     preset=str(preset))})())

    assert "bridge" in stages("prompt.mode=state")
    assert "bridge" not in stages()  # the recipe's RL keeps the world-model prompt
    assert "bridge" not in stages("prompt.mode=base", "selfplay.bridge=false")
    assert "bridge" not in stages("prompt.mode=base", "selfplay.bootstrap_episodes=0")


WIN, LOSE = "<think>go</think><answer>Right || Right</answer>", "<think>go</think><answer>Down</answer>"


def scripted_rounds(monkeypatch, rounds: int) -> list[str]:
    """Expert-iteration rounds whose play is scripted (one sample wins a fixed 3x3 lake in
    two moves, the other moves Down), and the recipe overrides of that tiny task."""
    from scripted import ScriptedEngine
    from spa.rl import expert_iteration

    monkeypatch.setattr(expert_iteration, "Engine", lambda model, tokenizer, max_batch_size=None, dtype=None:
                        ScriptedEngine(tokenizer, [[WIN, LOSE]], model=model))
    return ["env.options={desc: SFG/FHF/FFF, is_slippery: false}", "prompt.max_turns=1", "prompt.max_actions=2",
            f"iterate.rounds={rounds}", "iterate.episodes=2", "iterate.samples=2", "iterate.max_new_tokens=8",
            "sft.precision=fp32"]


def test_expert_iteration_is_an_rl_stage_that_reuses_its_evaluations(preset, tmp_path, monkeypatch, capsys):
    """``rl: iterate``: rounds from the SFT checkpoint, logged like PPO's steps; the start's and
    the last round's evaluations are the pipeline's eval_sft and eval_final, played once."""
    overrides = scripted_rounds(monkeypatch, rounds=2)
    recipe = load_recipe(CONFIGS / "frozenlake-spa-iterate.yaml", overrides, preset=str(preset))
    folder = tmp_path / "iterate"
    Run(recipe, folder, log=lambda _: None).run()
    stages = json.loads((folder / "stages.json").read_text())
    # eval.base: false, so no eval_base stage
    assert list(stages) == ["bootstrap", "selfplay", "sft", "eval_sft", "rl", "eval_final", "report"]
    rl = stages["rl"]["outputs"]
    assert rl["start"] == stages["sft"]["outputs"]["model"]
    assert rl["model"] == str(folder / "rl" / "round-2" / "sft" / "epoch-1")
    for round_ in (1, 2):  # keep=best: the winning sample's first move begins the shortest path, Down does not
        examples = [json.loads(line) for line in (folder / "rl" / f"round-{round_}" / "data.jsonl").open()]
        assert [e["response"] for e in examples] == [WIN]
    trajectories = "trajectories.jsonl"
    assert ((folder / "rl" / "round-0" / "eval" / trajectories).read_text()
            == (folder / "eval" / "sft-base" / trajectories).read_text())
    final = json.loads(Path(stages["eval_final"]["outputs"]["base"]["metrics"]).read_text())
    assert final == json.loads((folder / "rl" / "round-2" / "eval" / "metrics.json").read_text())
    assert final["model"] == "rl/round-2" and "world_model" in stages["eval_final"]["outputs"]
    records = logger_module.read_metrics(folder / "rl" / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert [(r["rollout/success"], r["iterate/kept"], r["iterate/turns"]) for r in records[1:]] == [(0.5, 1, 2)] * 2
    assert all("eval/pass@1" in r and "eval/pass@1_lo" in r and "eval/best_first" in r for r in records)
    report = (folder / "report.md").read_text()
    assert "RL by expert iteration: 2 rounds, the last one kept 1 of 2 turns" in report
    assert "| round | Pass@1 [95% interval]" in report and (folder / "rl_rollouts.png").stat().st_size > 1000
    printed = capsys.readouterr().out  # lines in a log
    assert "round-2 play: turn 1, 2 episodes playing: 0/1" in printed and "round-2 eval: turn 1" in printed


def test_expert_iteration_settings_are_checked_when_the_recipe_loads():
    with pytest.raises(ValueError, match="keep='all' is not allowed; valid: winners, best, best_prefix, "
                                         "best_grounded"):
        load_recipe(CONFIGS / "frozenlake-spa-iterate.yaml", ["iterate.keep=all"])
    with pytest.raises(ValueError, match="rl 'magic' is not known; valid: ppo, iterate"):
        load_recipe(CONFIGS / "frozenlake-spa.yaml", ["rl=magic"])
    with pytest.raises(ValueError, match="iterate.keep='value' with method 'vagen'.*best_grounded"):
        load_recipe(CONFIGS / "frozenlake-vagen.yaml", ["rl=iterate"])
    with pytest.raises(ValueError, match="best_grounded needs the world-model prompt in RL .*'base'"):
        load_recipe(CONFIGS / "frozenlake-spa-iterate.yaml", ["iterate.keep=best_grounded"])
    with pytest.raises(ValueError, match="rl: iterate does not apply to method 'rwml'"):
        load_recipe(CONFIGS / "frozenlake-rwml.yaml", ["rl=iterate"])
    recipe = load_recipe(CONFIGS / "frozenlake-spa-iterate.yaml", ["seed=3"])
    assert recipe.iterate.config(recipe.stage_seed(recipe.iterate)).seed == 3
    assert not recipe.iterate.config(3).sft.mask_states
    masked = load_recipe(CONFIGS / "frozenlake-spa-iterate.yaml",
                         ["prompt.mode=world_model", "iterate.mask_states=true"])
    # The rounds' SFT loss leaves the states out; the world-model SFT's keeps them.
    assert masked.iterate.config(0).sft.mask_states and not masked.sft.mask_states


def test_plain_expert_iteration_starts_from_the_evaluated_bootstrap(preset, tmp_path, monkeypatch):
    """vanilla with ``rl: iterate``: round 0 is the format bootstrap's evaluation, which the
    comparison shows as the model before RL, with RL's paired gain against it."""
    overrides = scripted_rounds(monkeypatch, rounds=1)
    folder = tmp_path / "vanilla-iterate"
    Run(load_recipe(CONFIGS / "frozenlake-vanilla-iterate.yaml", overrides, preset=str(preset)), folder,
        log=lambda _: None).run()
    stages = json.loads((folder / "stages.json").read_text())
    assert list(stages) == ["bootstrap", "eval_bootstrap", "rl", "eval_final", "report"]  # eval.base: false
    assert stages["rl"]["outputs"]["start"] == stages["bootstrap"]["outputs"]["model"]
    trajectories = "trajectories.jsonl"
    assert ((folder / "rl" / "round-0" / "eval" / trajectories).read_text()
            == (folder / "eval" / "bootstrap-base" / trajectories).read_text())
    report_module.compare([folder], tmp_path / "cmp", resamples=100)
    row = next(line.split(" | ") for line in (tmp_path / "cmp" / "comparison.md").read_text().splitlines()
               if line.startswith("| vanilla-iterate"))
    before = json.loads((folder / "eval" / "bootstrap-base" / "metrics.json").read_text())
    assert row[2] == "winner rounds" or row[2].endswith("rounds")  # its learner
    assert row[7] == with_interval(before["pass_at_k"]["pass@1"], *before["pass_at_k_ci95"]["pass@1"])
    assert row[11] == rl_gain(folder, before="eval_bootstrap")
    table = (tmp_path / "cmp" / "comparison.md").read_text()
    assert "## Learning curves (expert iteration)" in table and (tmp_path / "cmp" / "rounds.png").is_file()
    round_1 = next(line.split(" | ") for line in table.splitlines() if line.startswith("| vanilla-iterate | 1 |"))
    assert round_1[5] == row[11]  # one round: its gain over round 0 is RL's gain over the bootstrap
    assert "after the format bootstrap" in (folder / "report.md").read_text()


def test_rwml_with_expert_iteration_starts_from_the_evaluated_rwml_checkpoint(preset, tmp_path, monkeypatch):
    """The comparison's RWML row: RWML, then the same rounds as SPA's, from the RWML checkpoint."""
    overrides = scripted_rounds(monkeypatch, rounds=1) + [
        "rwml.exploration=random", "rwml.episodes=4", "rwml.samples=2", "rwml.filter=false", "rwml.steps=1",
        "rwml.batch_size=2", "rwml.group_size=2", "rwml.max_new_tokens=8", "rwml.eval_seeds=2",
        "rwml.reward=change", "rwml.precision=fp32", "rwml.tensorboard=false", "device=cpu"]
    seen = where_it_computes(monkeypatch)
    folder = tmp_path / "rwml-iterate"
    Run(load_recipe(CONFIGS / "frozenlake-rwml-iterate.yaml", overrides, preset=str(preset)), folder,
        log=lambda _: None).run()
    stages = json.loads((folder / "stages.json").read_text())
    assert list(stages) == ["bootstrap", "rwml", "eval_rwml", "rl", "eval_final", "report"]
    assert stages["rl"]["outputs"]["start"] == stages["rwml"]["outputs"]["model"]
    assert ((folder / "rl" / "round-0" / "eval" / "trajectories.jsonl").read_text()
            == (folder / "eval" / "rwml-base" / "trajectories.jsonl").read_text())
    assert [json.loads(line)["response"] for line in (folder / "rl" / "round-1" / "data.jsonl").open()] == [WIN]
    assert_on_the_run_device(seen, trainers=3)  # the bootstrap's SFT, RWML, the rounds (their SFT and play)


def test_vagen_with_expert_iteration_learns_only_the_states_it_got_right(preset, tmp_path, monkeypatch):
    """The comparison's VAGEN row: rounds in the world-model prompt from the format bootstrap;
    two best turns are kept as written, the wrong prediction of one out of its loss."""
    from scripted import ScriptedEngine, wm
    from spa.envs import make
    from spa.rl import expert_iteration

    overrides = scripted_rounds(monkeypatch, rounds=1)
    lake = make("frozenlake", desc="SFG/FHF/FFF", is_slippery=False)
    lake.reset(seed=0)
    before = lake.state_text()
    lake.step("Right")
    lake.step("Right")
    grounded, guessed = wm("Right || Right", before, lake.state_text()), wm("Right || Right", before, before)
    monkeypatch.setattr(expert_iteration, "Engine", lambda model, tokenizer, max_batch_size=None, dtype=None:
                        ScriptedEngine(tokenizer, [[grounded, guessed]], model=model))
    folder = tmp_path / "vagen-iterate"
    Run(load_recipe(CONFIGS / "frozenlake-vagen-iterate.yaml", overrides, preset=str(preset)), folder,
        log=lambda _: None).run()
    stages = json.loads((folder / "stages.json").read_text())
    assert list(stages) == ["bootstrap", "eval_bootstrap", "rl", "eval_final", "report"]
    assert stages["rl"]["outputs"]["start"] == stages["bootstrap"]["outputs"]["model"]
    assert ((folder / "rl" / "round-0" / "eval" / "trajectories.jsonl").read_text()
            == (folder / "eval" / "bootstrap-world_model" / "trajectories.jsonl").read_text())
    kept = [json.loads(line) for line in (folder / "rl" / "round-1" / "data.jsonl").open()]
    assert [(e["response"], e["masked_states"]) for e in kept] == [(grounded, []), (guessed, ["prediction"])]
    rounds = json.loads((folder / "rl" / "rounds.json").read_text())
    assert rounds[1]["states_right"] == {"observation": 1.0, "prediction": 0.5}


def test_transfer_with_expert_iteration_trains_small_and_plays_large(preset, tmp_path, monkeypatch):
    """The transfer rows: format bootstrap (and SPA's self-play) on ``env.options``, the rounds
    and every evaluation on ``env.rl_options``."""
    overrides = [o.replace("env.options=", "env.rl_options=") for o in scripted_rounds(monkeypatch, rounds=1)]
    folder = tmp_path / "transfer"
    Run(load_recipe(CONFIGS / "frozenlake-transfer-vanilla-iterate.yaml", overrides, preset=str(preset)), folder,
        log=lambda _: None).run()
    def width(name: str) -> int:  # of the first lake the file's first line saw
        return len(json.loads(next((folder / name).open()))["state_before"].split("\n")[0])

    assert (width("data/bootstrap.jsonl"), width("rl/round-1/data.jsonl")) == (4, 3)
    final = json.loads(next((folder / "eval" / "final-base" / "trajectories.jsonl").open()))
    assert final["env_config"] == {"desc": "SFG/FHF/FFF", "is_slippery": False}


def test_an_archived_run_is_small_and_compares_like_the_run(finished, tmp_path):
    run = tmp_path / "runs" / "varied"  # successes that vary, so that intervals and gains are not all 0
    shutil.copytree(finished, run)
    set_successes(run, "eval_final", 0)
    result = CliRunner().invoke(app, ["archive", str(run), "--out", str(tmp_path / "results")])
    assert result.exit_code == 0, result.output
    copy = tmp_path / "results" / "varied"
    files = {p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file()}
    assert {"config.yaml", "stages.json", "report.md", "rl/metrics.jsonl",
            "eval/final-world_model/metrics.json", "eval/final-world_model/levels.json"} <= files
    assert not [name for name in files if name.endswith((".safetensors", ".pt", ".jsonl")) and "metrics" not in name]
    assert sum((copy / name).stat().st_size for name in files) < 0.01 * sum(
        p.stat().st_size for p in run.rglob("*") if p.is_file())
    for folder, name in ((run, "run"), (copy, "copy")):
        report_module.compare([folder], tmp_path / name, resamples=100)
    table = (tmp_path / "copy" / "comparison.md").read_text()
    assert table == (tmp_path / "run" / "comparison.md").read_text()
    assert rl_gain(run) in table and rl_gain(run) != "+0.0 [+0.0, +0.0]"
    bad = CliRunner().invoke(app, ["archive", str(tmp_path), "--out", str(tmp_path / "x")])
    assert bad.exit_code != 0 and "is not a run folder (no stages.json)" in bad.output


def test_archiving_again_replaces_the_archive_whole(finished, tmp_path):
    """A run archived while in progress, then restarted from scratch under its name: the new
    run's archive must not keep the first run's later evaluations beside its own."""
    run = tmp_path / "runs" / "again"
    shutil.copytree(finished, run)
    archive(run, tmp_path / "results")
    final = tmp_path / "results" / "again" / "eval" / "final-world_model" / "metrics.json"
    assert final.is_file()
    shutil.rmtree(run / "eval" / "final-world_model")
    (run / "report.md").unlink()
    dest = archive(run, tmp_path / "results")
    assert dest == tmp_path / "results" / "again" and (dest / "stages.json").is_file()
    assert not final.exists() and not (dest / "report.md").exists()
    assert [p.name for p in (tmp_path / "results").iterdir()] == ["again"]  # no staging folder left


def test_a_run_imports_every_stage_at_start():
    """A run lasts hours and its stages run code from the checkout: a stage that imported its
    module only when it began would read whatever the source had become by then (an edit half
    done breaks it). So importing the pipeline loads every module of ours that any loaded
    module imports later, inside a function."""
    script = """
import ast, importlib.util, sys
import spa.pipeline.run
missing = set()
for name, module in list(sys.modules.items()):
    if name.startswith('spa.') and getattr(module, '__file__', None):
        tree = ast.parse(open(module.__file__).read())
        for function in ast.walk(tree):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(function):
                    if isinstance(node, ast.ImportFrom) and (node.module or '').split('.')[0] == 'spa':
                        if node.module not in sys.modules:
                            missing.add(f'{name}: from {node.module} import ...')
                            continue
                        for alias in node.names:  # a submodule not loaded yet?
                            target = node.module + '.' + alias.name
                            if target not in sys.modules and hasattr(sys.modules[node.module], '__path__') \\
                                    and importlib.util.find_spec(target) is not None:
                                missing.add(f'{name}: from {node.module} import {alias.name}')
print(sorted(missing))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout
