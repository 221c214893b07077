"""Where a run folder keeps its results, and a light copy of them (``spa archive``).

A run folder holds gigabytes of checkpoints and data beside a few hundred kilobytes of
results. ``archive`` copies the results alone: the recipe (``config.yaml``), the record
of stages (``stages.json``), ``report.md``, the RL stage's log and round summary, and for
every evaluation its ``metrics.json`` and ``levels.json`` (each level's successes, what
the intervals and paired differences need; written from ``trajectories.jsonl``, which at
128 x 8 episodes is about 10 MB). ``spa compare`` (and ``write_report``) read an archived
folder like the run itself, so a table made over several machines or sessions survives
the run folders.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from spa.eval.paired import LEVELS, read_evaluation
from spa.io import atomic_dir, write_json

#: The evaluation stages of the model RL starts from, in the order ``Run.start_model``
#: prefers them: after world-model SFT (spa), after RWML (rwml+ppo), or after the format
#: bootstrap (vanilla, state_estimation, vagen).
BEFORE_RL = ("eval_sft", "eval_rwml", "eval_bootstrap")

#: A run's result files, relative to its folder (those present are copied).
RESULT_FILES = ("config.yaml", "stages.json", "report.md", "rl/metrics.jsonl", "rl/rounds.json")


def eval_dir(folder: str | Path, stage: str, mode: str) -> Path:
    """Where evaluation stage ``stage`` (``eval_sft``, ...) of the run in ``folder`` writes
    its ``mode`` evaluation: ``eval/sft-MODE``. Readers derive it from the folder rather
    than from the path ``stages.json`` recorded, so that a run folder can be moved or
    archived."""
    return Path(folder) / "eval" / f"{stage.removeprefix('eval_')}-{mode}"


def write_levels(evaluation: str | Path) -> Path:
    """``levels.json`` beside an evaluation's ``trajectories.jsonl``: the environment played
    and each level's successes, one per sample, and its best-first counts where turns were
    scored (see :func:`spa.eval.paired.read_evaluation`)."""
    evaluation = Path(evaluation)
    played, levels, best = read_evaluation(evaluation)
    data = {**played, "levels": {str(seed): [int(s) for s in outcomes] for seed, outcomes in levels.items()}}
    if best:
        data["best_first"] = {str(seed): counts for seed, counts in best.items()}
    return write_json(evaluation / LEVELS, data)


def archive(run: str | Path, out: str | Path) -> Path:
    """Copy the results of the run folder ``run`` into ``out/NAME`` (NAME: the run's folder
    name) and return that folder.

    An archive already there is replaced whole, not file by file: a run still in progress
    may be archived (so that its finished evaluations outlive the machine) and later be
    restarted from scratch under the same name, and none of the earlier run's evaluations
    may then stand beside the new run's. The copy is written beside the old one and swapped
    in (:func:`spa.io.atomic_dir`), so an interrupt leaves the old copy or the new one."""
    run = Path(run)
    if not (run / "stages.json").is_file():
        raise FileNotFoundError(f"{run} is not a run folder (no stages.json)")
    if Path(out).resolve() == run.parent.resolve():
        raise ValueError(f"the archive folder {out} is the run's own parent folder: choose another")
    dest = Path(out) / run.name
    with atomic_dir(dest) as staging:
        _copy_results(run, staging)
    return dest


def _copy_results(run: Path, dest: Path) -> None:
    """The result files and every evaluation's metrics and ``levels.json`` of ``run``, into
    the existing folder ``dest``."""
    for name in RESULT_FILES:
        if (run / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(run / name, dest / name)
    for metrics in sorted(run.glob("**/eval/**/metrics.json")):
        folder = metrics.parent
        if (folder / "trajectories.jsonl").is_file():
            write_levels(folder)
        target = dest / folder.relative_to(run)
        target.mkdir(parents=True, exist_ok=True)
        for name in ("metrics.json", LEVELS):
            if (folder / name).is_file():
                shutil.copy2(folder / name, target / name)
