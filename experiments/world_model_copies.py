"""Whether a run's world model predicts transitions or copies the state, round by round.

A prediction exact match can rise while nothing is learnt about transitions: a model
that writes the observation again as its prediction is right on every turn whose moves
leave the state unchanged (into a wall). This script sets, for every round's evaluation
in the world-model prompt, the prediction exact match beside that floor (the share of
unchanged turns), the exact match on the turns whose state changed (where a copy scores
0) and the share of predictions that repeat the grid before the actions:

    python experiments/world_model_copies.py runs/sokoban-vagen-iterate-s0 \\
        results/runs/frozenlake-spa-iterate-world_model-s?

Each evaluation is scored from its ``trajectories.jsonl`` where the run kept it (with
``spa.eval.metrics.world_model_accuracy``, as ``spa eval`` does); an archived run keeps
only ``metrics.json``, whose older records lack the last two columns (printed "-").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from spa.agent.trajectory import Trajectory
from spa.eval.metrics import pct_with_interval, world_model_accuracy

COLUMNS = ("prediction_exact", "unchanged_rate", "prediction_changed_exact", "prediction_copied")


def round_evals(run: Path) -> list[Path]:
    """The evaluation folders of round 0, 1, 2... of a run (``rl/round-N/eval``) or of an
    ``spa iterate`` output, in order, as far as they go."""
    base = run / "rl" if (run / "rl").is_dir() else run
    found = []
    while (folder := base / f"round-{len(found)}" / "eval").joinpath("metrics.json").is_file():
        found.append(folder)
    return found


def scores(folder: Path) -> dict | None:
    """The world-model scores of one evaluation; None when it was not in the world-model prompt."""
    path = folder / "trajectories.jsonl"
    if path.exists():
        with path.open() as f:
            trajectories = [Trajectory.from_json(json.loads(line)) for line in f if line.strip()]
        if trajectories and trajectories[0].mode == "world_model":
            return world_model_accuracy([turn for t in trajectories for turn in t.turns])
        return None
    return json.loads((folder / "metrics.json").read_text()).get("world_model")


def table(runs: list[Path]) -> str:
    rows = ["| run | round | pred exact | unchanged | pred exact, changed | pred copies |",
            "|---|---:|---:|---:|---:|---:|"]
    for run in runs:
        for round_, folder in enumerate(round_evals(run)):
            wm = scores(folder)
            if wm is not None:
                cells = " | ".join(pct_with_interval(wm.get(k)) for k in COLUMNS)
                rows.append(f"| {run.name} | {round_} | {cells} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (live or archived)")
    args = parser.parse_args(argv)
    missing = [str(r) for r in args.runs if not r.is_dir()]
    if missing:
        parser.error(f"not a folder: {', '.join(missing)}")
    print(table(args.runs))


if __name__ == "__main__":
    main()
