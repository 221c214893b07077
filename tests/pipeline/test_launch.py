"""``spa run`` under ``accelerate launch`` on 2 CPU processes (gloo), the smoke preset.

The documented command (docs/distributed.md), launched on a run folder whose first stage
one process ran in this one (a launch costs about 30 s of imports on a busy 2-core
machine; a second would double the test): both processes skip that stage by the main
process's record and run the rest. The main process alone writes the run folder: the
appended logs hold each line once, and every stage the launch ran is recorded with
``world_size`` 2, the one before it with 1. The evaluations (the eval stages and RL's own)
are split by level: each process played half of the levels, and the main process wrote
every level's samples exactly once.
"""

import json
import os
import subprocess
import sys

from spa.agent.seeds import eval_seeds
from spa.pipeline.recipe import CONFIGS, load_recipe
from spa.pipeline.run import Run

STAGES = ["bootstrap", "selfplay", "sft", "eval_base", "eval_sft", "rl", "eval_final", "report"]


def launch(runs, *args: str) -> subprocess.CompletedProcess:
    """``accelerate launch --multi_gpu --num_processes 2 -m spa run configs/frozenlake-spa.yaml
    model=tiny --preset smoke --name ddp-smoke`` (``--multi_gpu`` starts the processes, on
    CPUs too; ``--cpu`` would start one)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", "0", "-m", "spa", "run", str(CONFIGS / "frozenlake-spa.yaml"), "model=tiny",
               "--preset", "smoke", "--name", "ddp-smoke", "--runs-dir", str(runs), *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def split_by_level(folder, levels: int, samples: int) -> None:
    """The evaluation in ``folder`` was played half by each process, every sample of a level on
    one of them, and its trajectories hold each level's samples once, in one process's order."""
    metrics = json.loads((folder / "metrics.json").read_text())
    assert [(share["levels"], share["episodes"]) for share in metrics["processes"]] == [
        (levels // 2, levels // 2 * samples)] * 2
    played = [(t["seed"], t["group"], t["sample"]) for t in lines(folder / "trajectories.jsonl")]
    assert played == [(seed, group, sample) for group, seed in enumerate(eval_seeds(levels))
                      for sample in range(samples)]
    assert metrics["groups"] == levels and metrics["samples_per_group"] == samples


def test_spa_run_under_a_launcher_writes_the_run_once_and_resumes_from_the_main_process(tmp_path):
    run = tmp_path / "ddp-smoke"
    recipe = load_recipe(CONFIGS / "frozenlake-spa.yaml", ["model=tiny"], preset="smoke")
    Run(recipe, run, log=lambda _: None).run(until="bootstrap")

    done = launch(tmp_path)
    # the record came from the main process; only the main process logs
    assert done.stdout.count("stage bootstrap: done earlier, skipped") == 1
    assert "stage bootstrap: running" not in done.stdout
    for stage in STAGES[1:]:
        assert done.stdout.count(f"stage {stage}: running") == 1
    stages = json.loads((run / "stages.json").read_text())
    assert list(stages) == STAGES
    assert {stage: record["world_size"] for stage, record in stages.items()} == {
        "bootstrap": 1, **dict.fromkeys(STAGES[1:], 2)}

    # files written once: two writers would append each line twice
    assert [r["step"] for r in lines(run / "rl" / "metrics.jsonl")] == [0, 1, 2]
    for name in ("base", "sft", "final"):
        split_by_level(run / "eval" / f"{name}-world_model", levels=8, samples=2)
    for step in (0, 1, 2):  # RL's evaluations: a quarter of the levels
        split_by_level(run / "rl" / "eval" / f"step-{step}", levels=2, samples=2)
    examples = lines(run / "data" / "bootstrap.jsonl")
    assert len(examples) == stages["bootstrap"]["outputs"]["kept"] > 0
    assert (run / "report.md").is_file() and (run / "rl" / "checkpoint" / "policy" / "model.safetensors").is_file()
    assert not list(run.rglob("*.partial.jsonl")) and not (run / "clock.json").exists()
