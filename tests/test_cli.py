import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from spa.cli import app

runner = CliRunner()


def flat(output: str) -> str:
    """CLI output with rich's panel borders and line wrapping removed."""
    return " ".join(output.replace("│", " ").split())


def test_envs_lists_every_env_with_defaults():
    result = runner.invoke(app, ["envs"], terminal_width=200)
    assert result.exit_code == 0, result.output
    for name in ("sokoban", "frozenlake", "sudoku", "num_boxes", "is_slippery", "difficulty"):
        assert name in result.output


def test_play_reads_actions_and_quits_on_eof():
    # Seed 0 of the default FrozenLake, without slipping: the first move is deterministic.
    result = runner.invoke(app, ["play", "-e", "frozenlake", "-o", "is_slippery=false"], input="jump\nRight\n")
    assert result.exit_code == 0, result.output
    assert "invalid action" in result.output
    assert "reward" in result.output and "Player at" in result.output


def test_play_quit_command():
    result = runner.invoke(app, ["play", "--env", "sokoban", "--seed", "2"], input="quit\n")
    assert result.exit_code == 0 and "Box at" in result.output


def test_play_still_takes_the_environment_as_its_first_argument_with_a_note():
    result = runner.invoke(app, ["play", "sokoban", "--seed", "2"], input="quit\n")
    assert result.exit_code == 0 and "Box at" in result.output
    assert "note: the environment is given as -e: spa play -e sokoban" in result.output


def test_play_rejects_bad_options_with_a_clear_message():
    result = runner.invoke(app, ["play", "-e", "sokoban", "-o", "dim=2"], terminal_width=200)
    assert result.exit_code == 2 and "dim=2" in flat(result.output)
    result = runner.invoke(app, ["play", "-e", "sokoban", "-o", "nokey"], terminal_width=200)
    assert result.exit_code == 2 and "key=value" in flat(result.output)
    result = runner.invoke(app, ["play", "-e", "tetris"], terminal_width=200)
    assert result.exit_code == 2 and "sokoban" in flat(result.output)


def test_demo_no_train_only_plays_and_shows_every_turn(monkeypatch, tmp_path):
    monkeypatch.setattr("spa.demo.spa_home", lambda: tmp_path)
    result = runner.invoke(
        app, ["demo", "--model", "tiny", "-e", "sudoku", "--episodes", "1", "--turns", "2",
              "--max-new-tokens", "8", "--seed", "0", "--no-train"], terminal_width=200,
    )
    assert result.exit_code == 0, result.output
    assert "sudoku, seed 0" in result.output and "0/1 episodes solved" in result.output
    assert "format bootstrap" not in result.output and not (tmp_path / "demo").exists()
    assert "Next, the whole method" in result.output


def test_demo_trains_a_cached_format_bootstrap_and_shows_before_and_after(monkeypatch, tmp_path):
    monkeypatch.setattr("spa.demo.spa_home", lambda: tmp_path)
    args = ["demo", "--model", "tiny", "--episodes", "2", "--turns", "2", "--max-new-tokens", "6",
            "--bootstrap-episodes", "3", "-o", "is_slippery=false"]
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    out = flat(result.output)
    assert "one epoch of SFT" in out and "trained in" in out
    (cache,) = (tmp_path / "demo").iterdir()
    assert (cache / "model" / "config.json").is_file() and not (cache / "model" / "trainer_state.pt").exists()
    info = json.loads((cache / "bootstrap.json").read_text())
    assert info["key"]["options"] == {"is_slippery": False} and info["key"]["bootstrap_episodes"] == 3
    for row in ("format-valid turns", "valid actions", "levels solved", "level 10000000: actions",
                "level 10000001: actions", "true state", "observation", "true next state", "prediction"):
        assert row in out, row
    assert "before" in out and "after" in out
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("Next, the whole method") and last.endswith(
        "spa run configs/frozenlake-spa.yaml --preset quick env.options.is_slippery=false")

    stamp = (cache / "bootstrap.json").stat().st_mtime_ns
    again = runner.invoke(app, args, terminal_width=200)
    assert again.exit_code == 0, again.output
    assert "cached in" in again.output and "no training" in again.output and "trained in" not in again.output
    assert (cache / "bootstrap.json").stat().st_mtime_ns == stamp and len(list((tmp_path / "demo").iterdir())) == 1
    # Another bootstrap size is another checkpoint.
    other = runner.invoke(app, [*args[:-4], "--bootstrap-episodes", "2", *args[-2:]], terminal_width=200)
    assert other.exit_code == 0 and "trained in" in other.output
    assert len(list((tmp_path / "demo").iterdir())) == 2


def test_eval_writes_metrics_report_and_trajectories(tmp_path):
    out = tmp_path / "eval"
    result = runner.invoke(
        app, ["eval", "--model", "tiny", "--env", "frozenlake", "--mode", "world_model", "--levels", "2",
              "--samples", "2", "--max-turns", "2", "--max-new-tokens", "6", "--out", str(out)], terminal_width=200,
    )
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["episodes"] == 4 and set(metrics["pass_at_k"]) == {"pass@1", "pass@2"}
    assert "observation_exact" in metrics["world_model"]
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[0])["seed"] >= 10_000_000
    assert "| success rate (Pass@1) |" in (out / "report.md").read_text()
    assert "pass@2" in result.output


def test_eval_rejects_a_bad_mode():
    result = runner.invoke(app, ["eval", "--model", "tiny", "--env", "sokoban", "--mode", "dream"],
                           terminal_width=200)
    assert result.exit_code == 2 and "base, state, world_model" in flat(result.output)


def eval_folder(folder, outcomes, first_seed=10_000_000):
    """An evaluation folder's trajectories.jsonl: per level, the successes of its samples."""
    from spa.agent.trajectory import Trajectory

    folder.mkdir()
    runs = [Trajectory("frozenlake", {"size": 3}, seed=first_seed + level, group=level, sample=s, mode="state",
                       success=ok) for level, samples in enumerate(outcomes) for s, ok in enumerate(samples)]
    (folder / "trajectories.jsonl").write_text("".join(json.dumps(t.to_json()) + "\n" for t in runs))
    return str(folder)


def test_paired_tables_the_level_by_level_difference_and_prints_json(tmp_path):
    # Pass@1 per level 0.5, 0, 1 -> 1, 0.5, 1: +33.3 points, 1.96 / 6 either side; Pass@2
    # 1, 0, 1 -> 1, 1, 1: +33.3 points, 1.96 / 3 either side (tests/eval/test_paired.py).
    before = eval_folder(tmp_path / "before", [(True, False), (False, False), (True, True)])
    after = eval_folder(tmp_path / "after", [(True, True), (True, False), (True, True)])
    result = runner.invoke(app, ["paired", before, after])
    assert result.exit_code == 0, result.output
    assert "frozenlake, 3 levels x 2 samples" in result.output
    rows = {line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:-1]]
            for line in result.output.splitlines() if line.startswith("│")}
    assert rows["before"] == ["50.0 [0.0, 100.0]", "66.7 [1.3, 100.0]"]  # 2/3 ± 1.96 / 3, clipped at 1
    assert rows["after - before"] == ["+33.3 [+0.7, +66.0]", "+33.3 [-32.0, +98.7]"]
    assert rows["levels up / down / same"] == ["2 / 0 / 1", "1 / 0 / 2"]
    assert max(map(len, result.output.splitlines())) <= 80
    data = json.loads(runner.invoke(app, ["paired", before, after, "--json"]).output)
    assert data["levels"] == 3 and data["samples"] == {"before": 2, "after": 2}
    assert data["pass@1"]["difference"] == pytest.approx(1 / 3)
    assert data["pass@1"]["difference_ci95"] == pytest.approx([1 / 3 - 1.96 / 6, 1 / 3 + 1.96 / 6])


def test_paired_adds_the_best_first_action_where_turns_were_scored(tmp_path):
    # Best first action a 1 of 2 -> 2 of 2, b 0 of 4 -> 3 of 4: 16.7% -> 83.3%, +66.7 with
    # 1.96 / 9 either side (tests/eval/test_paired.py).
    def scored(folder, best):
        folder.mkdir()
        records = [{"env": "sokoban", "env_config": {}, "seed": level, "success": False,
                    "turns": [{"best_first": b} for b in turns]} for level, turns in enumerate(best)]
        (folder / "trajectories.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
        return str(folder)

    before = scored(tmp_path / "before", [[True, False], [False] * 4])
    after = scored(tmp_path / "after", [[True, True], [True, True, True, False]])
    result = runner.invoke(app, ["paired", before, after])
    assert result.exit_code == 0, result.output
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in result.output.splitlines()
            if line.startswith("│")]
    assert rows[4:] == [["before", "16.7 [0.0, 60.2]"], ["after", "83.3 [61.6, 100.0]"],
                        ["after - before", "+66.7 [+44.9, +88.4]"], ["levels up / down / same", "2 / 0 / 0"]]
    assert "best first action" in result.output and max(map(len, result.output.splitlines())) <= 80
    data = json.loads(runner.invoke(app, ["paired", before, after, "--json"]).output)
    assert data["best_first"]["difference"] == pytest.approx(2 / 3)


def test_paired_names_a_missing_evaluation_and_levels_that_differ(tmp_path):
    before = eval_folder(tmp_path / "before", [(True,), (False,), (True,)])
    result = runner.invoke(app, ["paired", before, str(tmp_path / "nothing")], terminal_width=200)
    missing = tmp_path / "nothing" / "trajectories.jsonl"
    assert result.exit_code == 2 and f"{missing} does not exist" in flat(result.output)
    other = eval_folder(tmp_path / "other", [(True,), (False,), (True,)], first_seed=10_000_002)
    result = runner.invoke(app, ["paired", before, other], terminal_width=200)
    assert result.exit_code == 2
    assert "not play the same levels: 2 only in before (10000000, 10000001); 2 only in after" in flat(result.output)


def test_iterate_evaluates_the_start_and_names_a_round_without_winners(tmp_path):
    """The tiny random model never writes the answer format, so round 1 keeps nothing: a
    clean error after the start's evaluation, with one-epoch SFT settings recorded."""
    out = tmp_path / "iterate"
    args = ["iterate", "-e", "frozenlake", "-o", "size=3", "-m", "tiny", "--out", str(out), "--rounds", "1",
            "--episodes", "2", "--samples", "2", "--max-turns", "1", "--eval-levels", "2", "--eval-samples", "2",
            "--keep", "winners", "--set", "max_new_tokens=4"]
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 1
    assert "round 0; eval Pass@1 0.0 [0.0, 0.0]" in flat(result.output)
    assert "round-1 kept no turn: none of 2 episodes passed keep='winners'" in flat(result.output)
    assert (out / "round-0" / "eval" / "trajectories.jsonl").is_file()
    settings = json.loads((out / "settings.json").read_text())
    assert settings["iterate"]["sft"]["epochs"] == 1 and settings["iterate"]["sft"]["val_fraction"] == 0.0
    result = runner.invoke(app, args[:-2] + ["--keep", "all"], terminal_width=200)
    assert result.exit_code == 2
    assert "keep='all' is not allowed; valid: winners, best, best_prefix, best_grounded" in flat(result.output)
    result = runner.invoke(app, args[:-2] + ["--keep", "best_grounded"], terminal_width=200)
    assert result.exit_code == 1  # before any model loads
    assert "keep='best_grounded' needs mode='world_model' (mode='base'" in flat(result.output)
    valued = [str(tmp_path / "valued") if arg == str(out) else arg for arg in args]
    result = runner.invoke(app, valued + ["--keep", "value", "--set", "value_rollouts=8"], terminal_width=200)
    assert result.exit_code == 1  # no turn well-formed: the round labels them and keeps none
    assert "round-1 kept no turn: none of 2 episodes passed keep='value'" in flat(result.output)


def test_iterate_drops_the_rounds_optimizer_states_once_done_unless_kept(tmp_path, monkeypatch):
    import spa.rl.expert_iteration as expert_iteration

    def rounds(model, load, config, rollout, out, **kwargs):  # two finished rounds, as run leaves them
        for n in (1, 2):
            epoch = Path(out) / f"round-{n}" / "sft" / "epoch-1"
            epoch.mkdir(parents=True)
            (epoch / "model.safetensors").write_bytes(b"w")
            (epoch / "trainer_state.pt").write_bytes(b"s" * 1000)
        return []

    monkeypatch.setattr(expert_iteration, "run", rounds)
    for name, extra in (("dropped", []), ("kept", ["--keep-optimizer"])):
        out = tmp_path / name
        result = runner.invoke(app, ["iterate", "-e", "frozenlake", "-m", "tiny", "--out", str(out)] + extra,
                               terminal_width=200)
        assert result.exit_code == 0, result.output
        assert len(list(out.rglob("model.safetensors"))) == 2
        assert len(list(out.rglob("trainer_state.pt"))) == (2 if extra else 0)
        assert ("dropped the rounds' optimizer states" in flat(result.output)) is not bool(extra)


def test_ppl_prints_raw_and_structured(tmp_path):
    out = tmp_path / "ppl.json"
    result = runner.invoke(app, ["ppl", "--model", "tiny", "-e", "sudoku", "--levels", "2",
                                 "--out", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    precision = next(param for param in _commands()["ppl"].params if param.name == "precision_name")
    assert precision.default == "auto"  # as every command; it was fp32
    results = json.loads(out.read_text())["results"]["sudoku"]
    assert results["raw"]["ppl"] > 1 and results["structured"]["states"] == 2


def test_selfplay_random_exploration_then_sft_then_resume(tmp_path):
    data = tmp_path / "fl.jsonl"
    result = runner.invoke(app, ["selfplay", "-e", "frozenlake", "--out", str(data), "--episodes", "8",
                                 "--samples", "2", "--max-turns", "2", "--exploration", "random"])
    assert result.exit_code == 0, result.output
    stats = json.loads((tmp_path / "fl.stats.json").read_text())
    assert stats["kept"] == len(data.read_text().splitlines()) > 0
    out = tmp_path / "ckpt"
    args = ["sft", "--model", "tiny", "--data", str(data), "--out", str(out), "--epochs", "1",
            "--batch-size", "4", "--val-fraction", "0.25"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (out / "epoch-1" / "model.safetensors").is_file() and "epoch 1: train loss" in result.output
    result = runner.invoke(app, args[:-6] + ["--epochs", "2", "--batch-size", "4", "--val-fraction", "0.25",
                                             "--resume"])
    assert result.exit_code == 0, result.output
    assert "resuming from" in result.output and (out / "epoch-2").is_dir()
    assert [e["epoch"] for e in json.loads((out / "metrics.json").read_text())["epochs"]] == [1, 2]


def test_selfplay_oracle_data_in_the_state_mode(tmp_path):
    data = tmp_path / "fl.jsonl"
    result = runner.invoke(app, ["selfplay", "-e", "frozenlake", "--out", str(data), "--episodes", "4",
                                 "--samples", "1", "--max-turns", "2", "--exploration", "oracle", "--mode", "state",
                                 "-o", "is_slippery=false"])
    assert result.exit_code == 0, result.output
    examples = [json.loads(line) for line in data.read_text().splitlines()]
    assert examples and all("<observation>" not in e["response"] for e in examples)
    assert json.loads((tmp_path / "fl.stats.json").read_text())["config"]["exploration"] == "oracle"
    result = runner.invoke(app, ["selfplay", "-e", "frozenlake", "--out", str(data), "--mode", "state"],
                           terminal_width=200)
    assert result.exit_code == 2
    assert "mode='state' with exploration='self_play' needs keep='winners' or 'best'" in flat(result.output)


def test_selfplay_rejects_bad_ablation_values(tmp_path):
    result = runner.invoke(app, ["selfplay", "-e", "sokoban", "--out", str(tmp_path / "x.jsonl"),
                                 "--coords", "fuzzy", "--exploration", "random"], terminal_width=200)
    assert result.exit_code == 2 and "coords='fuzzy'" in flat(result.output)


def test_selfplay_that_keeps_no_example_fails_naming_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr("spa.demo.spa_home", lambda: tmp_path)
    out = tmp_path / "x.jsonl"
    args = ["selfplay", "-e", "frozenlake", "-m", "tiny", "--out", str(out), "--episodes", "2", "--samples", "1",
            "--max-turns", "1", "--max-new-tokens", "4"]
    result = runner.invoke(app, args, terminal_width=200)  # a random model never writes the format
    assert result.exit_code == 1, result.output
    text = flat(result.output)
    assert "no example kept (2 turns played, 2 malformed," in text
    assert "Add --bootstrap-episodes 64" in text and "spa run configs/frozenlake-spa.yaml --preset quick" in text
    assert not out.exists() and not out.with_suffix(".partial.jsonl").exists()
    result = runner.invoke(app, args + ["--bootstrap-episodes", "2"], terminal_width=200)
    assert result.exit_code == 1, result.output
    text = flat(result.output)
    assert "format bootstrap: " in text and "after a 2-episode format bootstrap" in text
    (cache,) = (tmp_path / "demo").iterdir()
    assert json.loads((cache / "bootstrap.json").read_text())["key"]["turns"] == 1
    result = runner.invoke(app, args + ["--bootstrap-episodes", "2", "--exploration", "random"], terminal_width=200)
    assert result.exit_code == 2 and "needs --exploration self_play" in flat(result.output)


def test_sft_with_lora_writes_a_plain_checkpoint_and_its_adapters(tmp_path):
    data = tmp_path / "fl.jsonl"
    runner.invoke(app, ["selfplay", "-e", "frozenlake", "--out", str(data), "--episodes", "4", "--samples", "2",
                        "--max-turns", "1", "--exploration", "random"])
    out = tmp_path / "ckpt"
    result = runner.invoke(app, ["sft", "--model", "tiny", "--data", str(data), "--out", str(out), "--epochs", "1",
                                 "--batch-size", "4", "--val-fraction", "0", "--lora-rank", "2"])
    assert result.exit_code == 0, result.output
    assert (out / "epoch-1" / "model.safetensors").is_file()
    assert (out / "epoch-1" / "adapter" / "adapter_config.json").is_file()


def test_rl_trains_logs_checkpoints_and_resumes(tmp_path):
    out = tmp_path / "rl"
    args = ["rl", "-e", "sokoban", "-m", "tiny", "--out", str(out), "--mode", "state", "--groups", "2",
            "--samples", "2", "--max-turns", "1", "--set", "max_new_tokens=4", "--set", "precision=fp32",
            "--set", "tensorboard=false"]
    result = runner.invoke(app, args + ["--steps", "1"])
    assert result.exit_code == 0, result.output
    assert (out / "checkpoint" / "policy" / "model.safetensors").is_file()
    result = runner.invoke(app, args + ["--steps", "2", "--resume"])
    assert result.exit_code == 0, result.output
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]


def test_rl_rejects_an_unknown_setting_with_a_suggestion(tmp_path):
    result = runner.invoke(app, ["rl", "-e", "sokoban", "-m", "tiny", "--out", str(tmp_path),
                                 "--set", "actor_lrr=1e-5"], terminal_width=200)
    assert result.exit_code == 2 and "did you mean 'actor_lr'" in flat(result.output)


def test_ppo_is_a_hidden_alias_of_rl_that_still_runs_with_a_note(tmp_path):
    assert "ppo" not in runner.invoke(app, ["--help"]).output.split("Commands:")[1]
    result = runner.invoke(app, ["ppo", "-e", "sokoban", "-m", "tiny", "--out", str(tmp_path),
                                 "--set", "actor_lrr=1e-5"], terminal_width=200)
    assert result.exit_code == 2 and "did you mean 'actor_lr'" in flat(result.output)
    assert "note: spa ppo is now spa rl" in flat(result.output)


@pytest.mark.parametrize("command", ["selfplay", "sft", "eval", "rl", "iterate", "rwml", "demo"])
def test_every_command_with_a_config_takes_set_and_names_an_unknown_key(command, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("")
    required = {"selfplay": ["-e", "frozenlake", "--out", str(tmp_path / "x.jsonl")],
                "sft": ["--data", str(data), "--out", str(tmp_path / "ckpt")], "eval": ["-e", "frozenlake"],
                "rl": ["-e", "frozenlake", "--out", str(tmp_path / "rl")],
                "iterate": ["-e", "frozenlake", "--out", str(tmp_path / "it")],
                "rwml": ["-e", "frozenlake", "--out", str(tmp_path / "rwml")], "demo": []}[command]
    result = runner.invoke(app, [command, "-m", "tiny", *required, "--set", "seeed=1"], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert "unknown key 'seeed'" in flat(result.output) and "did you mean 'seed'" in flat(result.output)


def test_old_option_names_are_errors_naming_the_new_form(tmp_path):
    result = runner.invoke(app, ["eval", "-e", "frozenlake", "--policy", "random", "--num-envs", "2",
                                 "--samples", "1", "--out", str(tmp_path / "eval")], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert "--num-envs is now --levels: use spa eval --levels 2" in flat(result.output)
    assert not (tmp_path / "eval").exists()  # nothing ran
    for args, fix in [(["eval", "-e", "frozenlake", "--num-envs=4"],
                       "--num-envs is now --levels: use spa eval --levels 4"),
                      (["ppl", "--num-states", "8"], "--num-states is now --levels: use spa ppl --levels 8"),
                      (["rl", "-e", "frozenlake", "--out", str(tmp_path), "--eval-envs", "32"],
                       "--eval-envs is now --eval-levels: use spa rl --eval-levels 32"),
                      (["ppo", "-e", "frozenlake", "--out", str(tmp_path), "--eval-envs", "32"],  # names spa rl
                       "--eval-envs is now --eval-levels: use spa rl --eval-levels 32"),
                      (["iterate", "-e", "frozenlake", "--out", str(tmp_path), "--eval-envs", "0"],
                       "--eval-envs is now --eval-levels: use spa iterate --eval-levels 0"),
                      (["rwml", "-e", "frozenlake", "--out", str(tmp_path), "--eval-seeds", "16"],
                       "--eval-seeds is now --eval-levels: use spa rwml --eval-levels 16"),
                      (["rwml", "-e", "frozenlake", "--out", str(tmp_path), "--batch", "4"],
                       "--batch is now --batch-size: use spa rwml --batch-size 4"),
                      (["sft", "--data", "d.jsonl", "--out", str(tmp_path), "--dtype", "fp32"],
                       "--dtype is now --precision: use spa sft --precision fp32")]:
        result = runner.invoke(app, args, terminal_width=200)
        assert result.exit_code == 2 and fix in flat(result.output), (args, result.output)
    result = runner.invoke(app, ["eval", "-e", "frozenlake", "--policy", "random", "--eval-levels=2"],
                           terminal_width=200)
    assert result.exit_code == 2 and "No such option: --eval-levels" in result.output  # not eval's name


def test_a_command_that_loads_a_model_says_once_which_precision_it_computes_in(monkeypatch):
    from spa import precision

    monkeypatch.setattr(precision, "_announced", set())
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    result = runner.invoke(app, ["demo", "--model", "tiny", "--env", "frozenlake", "--episodes", "1", "--turns",
                                 "1", "--max-new-tokens", "4", "--no-train", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert result.output.count("compute: fp32 on cpu (this CPU") == 1
    result = runner.invoke(app, ["demo", "--model", "tiny", "--precision", "int8"], terminal_width=200)
    assert result.exit_code == 2 and "precision 'int8' is not known" in flat(result.output)
    result = runner.invoke(app, ["demo", "--model", "tiny", "--dtype", "int8"], terminal_width=200)  # the old name
    assert result.exit_code == 2 and "--dtype is now --precision: use spa demo --precision int8" in flat(result.output)


#: Every command that loads a model, with the least it needs to get as far as loading one.
LOADING = {"eval": ["-e", "frozenlake"], "ppl": ["-e", "sudoku"], "demo": [],
           "selfplay": ["-e", "frozenlake", "--out", "{tmp}/data.jsonl"], "sft": ["--data", "{data}", "--out", "{tmp}/c"],
           "rl": ["-e", "frozenlake", "--out", "{tmp}/r"], "iterate": ["-e", "frozenlake", "--out", "{tmp}/i"],
           "rwml": ["-e", "frozenlake", "--out", "{tmp}/w"]}
#: The commands that train: fp32 master weights, the decided precision under autocast.
TRAINING = {"sft", "rl", "iterate", "rwml"}


class Loaded(Exception):
    """Raised by a load_model stand-in: the command got as far as loading its model."""


def loading_args(command: str, tmp_path) -> list[str]:
    data = tmp_path / "data.jsonl"
    data.write_text("")
    return [command, "-m", "tiny"] + [a.format(tmp=tmp_path, data=data) for a in LOADING[command]]


def test_every_command_that_loads_a_model_takes_device_as_it_takes_precision():
    commands = _commands()
    takes_precision = {name for name, command in commands.items() if any(p.name == "precision_name"
                                                                           for p in command.params)}
    assert takes_precision == set(LOADING) | {"ppo"}  # spa ppo: the old name of spa rl
    for name in takes_precision:
        device = next(p for p in commands[name].params if p.name == "device")
        assert (device.opts, device.default) == (["--device"], "auto"), name


@pytest.mark.parametrize("command", sorted(LOADING))
def test_a_bad_device_is_a_usage_error_naming_it_and_what_is_allowed(command, tmp_path, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    result = runner.invoke(app, loading_args(command, tmp_path) + ["--device", "gpu"], terminal_width=200)
    assert result.exit_code == 2
    assert "device 'gpu' is not known; valid: auto, cpu, cuda, cuda:N" in flat(result.output)
    result = runner.invoke(app, loading_args(command, tmp_path) + ["--device", "cuda"], terminal_width=200)
    assert result.exit_code == 2
    assert "device 'cuda' was asked for, but torch sees no CUDA GPU here" in flat(result.output)


def test_a_bad_device_fails_even_where_no_model_loads():
    result = runner.invoke(app, ["eval", "-e", "frozenlake", "--policy", "random", "--device", "cuda:one"],
                           terminal_width=200)
    assert result.exit_code == 2 and "device 'cuda:one' is not known" in flat(result.output)


@pytest.mark.parametrize("command", sorted(LOADING))
@pytest.mark.parametrize("launched", [False, True])
def test_the_model_loads_on_the_device_made_current_before_it(command, launched, tmp_path, monkeypatch):
    """``--device cuda:1``, or ``auto`` under a launcher as process 1: torch.cuda.set_device(cuda:1)
    comes first, then the model loads there (GPUs mocked; the load stops the command)."""
    from spa import precision

    claimed, loads = [], []
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    monkeypatch.setattr("torch.cuda.set_device", claimed.append)
    monkeypatch.setattr(precision, "cuda_has_bf16", lambda device: True)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "")

    def load_model(name, dtype="auto", device="auto"):
        loads.append((list(claimed), device, dtype))
        raise Loaded

    monkeypatch.setattr("spa.models.load_model", load_model)
    if launched:
        monkeypatch.setenv("LOCAL_RANK", "1")
    else:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    result = runner.invoke(app, loading_args(command, tmp_path) + ["--device", "auto" if launched else "cuda:1"])
    assert isinstance(result.exception, Loaded), result.output
    gpu = torch.device("cuda", 1)
    assert loads == [([gpu], gpu, "fp32" if command in TRAINING else torch.bfloat16)]


# -- help at 80 columns --------------------------------------------------------------
def _commands():
    import typer.main

    return typer.main.get_command(app).commands


@pytest.mark.parametrize("columns", [None, "80", "200"])
@pytest.mark.parametrize("command", [None, *(name for name, c in _commands().items() if not c.hidden)])
def test_help_is_readable_at_80_columns_and_shows_an_example(command, columns):
    """Where the terminal width is unknown (logs, CI) or wide, help stays within 80
    columns, an option's help is not squeezed into a narrow box (its first words stay
    on one line), and each help ends with one example invocation of its command."""
    args = [command, "--help"] if command else ["--help"]
    result = runner.invoke(app, args, env={"COLUMNS": columns}, prog_name="spa")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(map(len, lines)) <= 80, max(lines, key=len)
    example = lines.index("  Example:")
    assert (lines[example + 1].strip() + " ").startswith(f"spa {command} " if command else "spa ")
    params = _commands()[command].params if command else []
    for param in params:
        words = " ".join((getattr(param, "help", None) or "").split()[:4])
        assert any(words in line for line in lines), f"{command}: {words!r} is wrapped"
