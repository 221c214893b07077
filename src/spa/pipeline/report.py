"""Reports: ``report.md`` and plots for one run, and side-by-side comparisons of runs.

Everything here reads what the stages wrote (``stages.json``, ``config.yaml``, each
evaluation's ``metrics.json``, the RL ``metrics.jsonl``), so a report can be rebuilt at
any time without rerunning anything. Pass@1 is shown with its 95% interval over levels
(``21.3 [17.0, 25.6]``) where the metrics have one; runs written before intervals existed
show the number alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from spa.agent.keep import FILTERS  # noqa: E402
from spa.eval.metrics import pct_with_interval  # noqa: E402
from spa.eval.paired import compare_evaluations, signed_pct_with_interval  # noqa: E402
from spa.io import atomic_write_text  # noqa: E402
from spa.pipeline.layout import BEFORE_RL, eval_dir  # noqa: E402
from spa.pipeline.replicates import (SEED_KEYS, difference_table, final_mode, group_runs, group_table,  # noqa: E402
                                     model_eval, plot_passk, spread_table, trajectories_path)
from spa.pipeline.rounds import plot_rounds, round_table, run_round_table  # noqa: E402
from spa.rl.logger import read_metrics  # noqa: E402

EVAL_STAGES = {"eval_base": "base model", "eval_bootstrap": "after the format bootstrap",
               "eval_sft": "after world-model SFT", "eval_rwml": "after RWML", "eval_final": "final model"}
WM_KEYS = ("observation_exact", "prediction_exact", "observation_cell_acc", "prediction_cell_acc")
#: Whether predictions model transitions or copy the state (absent from older metrics).
COPY_KEYS = ("prediction_changed_exact", "prediction_copied")


def load_run(folder: str | Path) -> dict:
    """The parts of a run folder a report needs."""
    folder = Path(folder)
    stages_path = folder / "stages.json"
    if not stages_path.exists():
        raise FileNotFoundError(f"{folder} is not a run folder (no stages.json)")
    stages = json.loads(stages_path.read_text())
    evals = {}
    for stage, label in EVAL_STAGES.items():
        for mode in stages.get(stage, {}).get("outputs", {}):
            evals[(stage, mode)] = json.loads((eval_dir(folder, stage, mode) / "metrics.json").read_text())
    config = (folder / "config.yaml").read_text() if (folder / "config.yaml").exists() else ""
    # Expert iteration (rl: iterate) logs one line per round, in the names of PPO's log.
    unit = "round" if "rounds" in stages.get("rl", {}).get("outputs", {}) else "RL step"
    return {"dir": folder, "name": folder.name, "stages": stages, "evals": evals, "config": config,
            "rl": read_metrics(folder / "rl" / "metrics.jsonl"), "rl_unit": unit}


_pct = pct_with_interval  # a rate in percent, "-" when missing


def wall_seconds(run: dict) -> float:
    """The run's wall time so far, in seconds: its stages' (``stages.json``), with an
    expert-iteration stage counted as at least its rounds' play, SFT and evaluation
    (``rl/rounds.json``; round 0's evaluation is the before-RL stage's, not counted twice).

    That covers the rounds of a stage still running, most of a long run's time, and runs
    recorded before stage times were summed over resumes (:mod:`spa.pipeline.clock`),
    whose RL stage shows only its last process's time.
    """
    stages = run["stages"]
    seconds = sum(entry["seconds"] for name, entry in stages.items() if name != "rl")
    rounds_path = run["dir"] / "rl" / "rounds.json"
    records = json.loads(rounds_path.read_text()) if rounds_path.is_file() else []
    rounds = sum(record.get(key) or 0.0 for record in records if record["round"] > 0
                 for key in ("play_seconds", "sft_seconds", "eval_seconds"))
    return seconds + max(stages.get("rl", {}).get("seconds", 0.0), rounds)


def _pass_cell(metrics: dict, name: str = "pass@1") -> str:
    """``name`` from an evaluation's ``metrics.json``, with its 95% interval where it has one."""
    return pct_with_interval(metrics.get("pass_at_k", {}).get(name), metrics.get("pass_at_k_ci95", {}).get(name))


def _curve_cell(record: dict, name: str) -> str:
    """``eval/name`` of an RL log record, with ``eval/name_lo`` / ``_hi`` where logged."""
    low, high = record.get(f"eval/{name}_lo"), record.get(f"eval/{name}_hi")
    return pct_with_interval(record.get(f"eval/{name}"), None if low is None or high is None else (low, high))


def rl_gain_cell(run: dict, mode: str | None) -> str:
    """The paired Pass@1 gain of RL: the final evaluation minus the one before RL (after SFT,
    RWML or the format bootstrap), level by level (:func:`spa.eval.paired.paired_difference`), ``+9.4 [+6.4, +12.3]``;
    ``-`` without both evaluations' trajectories or when they did not play the same levels."""
    before = model_eval(run, BEFORE_RL, mode)
    if before is None or ("eval_final", mode) not in run["evals"]:
        return "-"
    try:
        gain = compare_evaluations(trajectories_path(run, before[0], mode),
                                   trajectories_path(run, "eval_final", mode))["pass@1"]
    except (FileNotFoundError, ValueError):
        return "-"
    return signed_pct_with_interval(gain["difference"], gain["difference_ci95"])


def eval_table(run: dict) -> str:
    rows = ["| model | mode | Pass@1 [95% interval] | Pass@8 | best first action | format valid | obs exact "
            "| pred exact | obs cells | pred cells | pred exact, changed | pred copies |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (stage, mode), m in run["evals"].items():
        wm = m.get("world_model", {})
        rows.append(f"| {EVAL_STAGES[stage]} | {mode} | {_pass_cell(m)} | "
                    f"{_pct(m['pass_at_k'].get('pass@8'))} | {_pct(m.get('best_first_rate'))} | "
                    f"{_pct(m['format_valid_rate'])} | "
                    + " | ".join(_pct(wm.get(k)) for k in WM_KEYS + COPY_KEYS) + " |")
    return "\n".join(rows)


def eval_curve_table(run: dict) -> str:
    """The RL stage's periodic evaluations, one row per step; empty when it logged none."""
    evals = [r for r in run["rl"] if "eval/pass@1" in r]
    if not evals:
        return ""
    rows = [f"| {run['rl_unit']} | Pass@1 [95% interval] | Pass@8 | best first action |",
            "|---:|---:|---:|---:|"]
    rows += [f"| {r['step']} | {_curve_cell(r, 'pass@1')} | {_curve_cell(r, 'pass@8')} | "
             f"{_pct(r.get('eval/best_first'))} |" for r in evals]
    return "\n".join(rows)


def _save(fig, ax, title: str, path: Path, xlabel: str | None = "RL step", unit_range: bool = False) -> Path:
    """Label, lay out, write and close one figure."""
    if xlabel:
        ax.set_xlabel(xlabel)
    if xlabel == "round":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if unit_range:
        ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_rl(run: dict, out: Path) -> list[Path]:
    """Training curves: rollout reward/success and the periodic evaluation's Pass@k, Pass@1
    with its 95% interval as a band where the log has it."""
    records = [r for r in run["rl"] if "rollout/success" in r]
    if not records:
        return []
    unit = run["rl_unit"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key, label in (("rollout/reward_mean", "reward"), ("rollout/success", "success")):
        if key in records[0]:  # expert iteration logs no reward
            ax.plot([r["step"] for r in records], [r.get(key) for r in records], marker="o" if
                    unit == "round" else None, label=label)
    paths = [_save(fig, ax, f"{run['name']}: training rollouts", out / "rl_rollouts.png", xlabel=unit)]
    evals = [r for r in run["rl"] if "eval/pass@1" in r]
    if evals:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        keys = {k for r in evals for k in r if k.startswith("eval/pass@") and not k.endswith(("_lo", "_hi"))}
        for key in sorted(keys):
            (line,) = ax.plot([r["step"] for r in evals], [r.get(key) for r in evals], marker="o", label=key[5:])
            band = [r for r in evals if f"{key}_lo" in r and f"{key}_hi" in r]
            if key == "eval/pass@1" and band:
                ax.fill_between([r["step"] for r in band], [r[f"{key}_lo"] for r in band],
                                [r[f"{key}_hi"] for r in band], color=line.get_color(), alpha=0.2,
                                label="pass@1 95% interval")
        paths.append(_save(fig, ax, f"{run['name']}: evaluation Pass@k", out / "rl_eval.png", xlabel=unit,
                           unit_range=True))
    return paths


def plot_world_model(run: dict, out: Path) -> list[Path]:
    """World-model accuracy of each evaluated model (bars)."""
    entries = [(EVAL_STAGES[s], m["world_model"]) for (s, mode), m in run["evals"].items()
               if mode == "world_model" and "world_model" in m]
    if not entries:
        return []
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / len(entries)
    for i, (label, wm) in enumerate(entries):
        ax.bar([j + i * width for j in range(len(WM_KEYS))], [wm.get(k, 0) for k in WM_KEYS], width, label=label)
    ax.set_xticks([j + width * (len(entries) - 1) / 2 for j in range(len(WM_KEYS))],
                  [k.replace("_", "\n") for k in WM_KEYS], fontsize=8)
    return [_save(fig, ax, f"{run['name']}: world-model accuracy", out / "world_model.png", xlabel=None,
                  unit_range=True)]


def write_report(folder: str | Path) -> Path:
    """Write ``report.md`` (and its PNG plots) into the run folder."""
    run = load_run(folder)
    folder = Path(folder)
    plots = plot_rl(run, folder) + plot_world_model(run, folder)
    stages = run["stages"]
    lines = [f"# Run {run['name']}", "", "## Evaluation", "", eval_table(run), "",
             "Pass@k: unbiased estimator over the samples of each evaluation seed; world-model columns: exact "
             "match and per-cell accuracy of `<observation>` / `<prediction>` against the true states (world_model "
             "mode); pred exact, changed: exact on the turns whose state changed, where a copy scores 0; pred "
             "copies: predictions whose grid repeats the grid before the actions.", ""]
    for name in ("bootstrap", "selfplay", "bridge"):
        if name in stages:
            o = stages[name]["outputs"]
            lines.append(f"- {name} data: {o['kept']} SFT examples from {o['turns']} turns "
                         f"({o['malformed']} malformed dropped), episode success {_pct(o['success_rate'])}%.")
    if "rwml" in stages:
        summary = stages["rwml"]["outputs"]["summary"]
        before, after = summary.get("before") or {}, summary.get("after") or {}
        keys = [k for k in ("exact", "changed_exact", "cell", "embedding", "copied") if k in before]
        glosses = {"changed_exact": "exact on the transitions that change the state",
                   "copied": "predictions whose grid repeats the grid before the actions"}
        gloss = "; ".join(f"{k}: {glosses[k]}" for k in keys if k in glosses)
        lines.append("- RWML next-state prediction on held-out transitions (before -> after): "
                     + ", ".join(f"{k} {_pct(before.get(k))}% -> {_pct(after.get(k))}%" for k in keys)
                     + (f" ({gloss})" if gloss else ""))
    if "sft" in stages:
        for e in stages["sft"]["outputs"]["history"]:
            lines.append(f"- SFT epoch {e['epoch']}: train loss {e['train_loss']:.3f}, val loss {e['val_loss']:.3f}, "
                         f"held-out next-state exact {_pct(e['val_prediction_exact'])}%")
    if run["rl"] and run["rl_unit"] == "round":
        last = run["rl"][-1]
        lines.append(f"- RL by expert iteration: {last['step']} rounds, the last one kept {last.get('iterate/kept')} "
                     f"of {last.get('iterate/turns')} turns, play success {_pct(last.get('rollout/success'))}%")
    elif run["rl"]:
        last = run["rl"][-1]
        lines.append(f"- RL: {last['step']} steps, last rollout reward {last.get('rollout/reward_mean', 0):+.3f}, "
                     f"success {_pct(last.get('rollout/success'))}%")
    curve = eval_curve_table(run)
    if curve:
        lines += ["", "## Evaluation during RL" + (" (round 0: the start)" if run["rl_unit"] == "round" else ""),
                  "", curve, "",
                  "Pass@k in %, with the 95% interval over the evaluation levels (normal approximation) in "
                  "brackets where logged."]
    lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    lines += ["", "## Stages", "", "| stage | wall time (s) |", "|---|---:|"]
    lines += [f"| {name} | {entry['seconds']} |" for name, entry in stages.items()]
    lines += ["", "## Recipe", "", "```yaml", run["config"].rstrip(), "```", ""]
    return atomic_write_text(folder / "report.md", "\n".join(lines))


def compare(folders: list[str | Path], out: str | Path, resamples: int = 10_000) -> Path:
    """A side-by-side table of runs, a table of replicate groups, and plots.

    Per run: Pass@1 / Pass@8 of the base model, of the model before RL (after SFT or
    RWML, when the method has that stage) and of the final model, all in the mode the
    final model is evaluated in, and the run's total wall time; each Pass@1 with its 95%
    interval where the evaluation has one, the paired Pass@1 gain of RL (:func:`rl_gain_cell`)
    and the final model's best-first-action rate.
    A run that has not finished shows ``-`` for what it has not evaluated yet. Per group
    of replicates (same recipe, other seeds; :mod:`spa.pipeline.replicates`): the number
    of seeds and each Pass@1 / Pass@8 as mean [95% bootstrap interval over seeds and
    levels, ``resamples`` replicates]. Plots:
    ``curves.png`` (RL curves, overlaid), ``passk.png`` (Pass@k against k per group) and,
    when a group has expert-iteration rounds, ``rounds.png`` (Pass@1 against round).
    """
    runs = [load_run(f) for f in folders]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = ["| run | method | learner | env | mode | base Pass@1 | base Pass@8 | before RL Pass@1 | before RL Pass@8 "
            "| final Pass@1 | final Pass@8 | RL gain Pass@1 (paired) | final best first action | wall time (min) |",
            "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    hours, unfinished = 0.0, 0  # the wall-time column's sum, read once per run
    for run in runs:
        recipe = _recipe_summary(run["config"])
        mode = final_mode(run)
        cells = []
        for stages in (("eval_base",), BEFORE_RL, ("eval_final",)):
            found = next((run["evals"][(s, mode)] for s in stages if (s, mode) in run["evals"]), {})
            cells += [_pass_cell(found), _pct(found.get("pass_at_k", {}).get("pass@8"))]
        cells.append(rl_gain_cell(run, mode))
        cells.append(_pct(found.get("best_first_rate")))  # the final evaluation's
        seconds = wall_seconds(run)
        done = "report" in run["stages"]
        hours += seconds / 3600
        unfinished += not done
        rows.append(f"| {run['name']} | {recipe.get('method', '?')} | {recipe['learner']} | {recipe.get('env', '?')} | "
                    f"{mode or '-'} | "
                    + " | ".join(cells) + f" | {seconds / 60:.0f}{'' if done else ' (unfinished)'} |")
    # What a table of runs costs is a question users ask before reproducing it; the sum is
    # of each run's own clock, on whatever machine and beside whatever else it ran.
    total = (f"In all: {hours:.1f} hours of wall time over {len(runs)} "
             f"run{'s' * (len(runs) != 1)}, the sum of the column above"
             f"{f' ({unfinished} unfinished, so far)' if unfinished else ''}.")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for run in runs:
        records = [r for r in run["rl"] if "rollout/reward_mean" in r]
        axes[0].plot([r["step"] for r in records], [r["rollout/reward_mean"] for r in records], label=run["name"])
        evals = [r for r in run["rl"] if "eval/pass@1" in r]
        axes[1].plot([r["step"] for r in evals], [r["eval/pass@1"] for r in evals], marker="o", label=run["name"])
    axes[0].set_title("rollout reward")
    axes[1].set_title("evaluation Pass@1")
    for ax in axes:
        ax.set_xlabel("RL step (round for rl: iterate)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    plt.close(fig)
    note = ("Pass@k in %; each Pass@1 with its 95% interval over the evaluation levels (normal approximation) "
            "in brackets where the evaluation recorded one. RL gain: the final model's Pass@1 minus the model's "
            "before RL, level by level on the same levels, in points, with its 95% interval over levels (normal "
            "approximation; `spa paired`).")
    groups = group_runs(runs)
    plot_passk(groups, out / "passk.png")
    group_note = (f"Runs of the same recipe but for the seeds ({', '.join(SEED_KEYS)}) form a group. Pass@k in %, "
                  "mean over seeds of the mean over levels, with a 95% percentile bootstrap interval "
                  f"({resamples} replicates, fixed RNG seed) that resamples the seeds, then the levels of each "
                  "seed drawn; a group of one run shows that run's interval over levels (normal approximation), "
                  "as above. `(n=...)`: fewer runs than the group's reached that evaluation. `passk.png`: Pass@k "
                  "against k per group, for the base model (dotted), the model before RL (dashed) and the final "
                  "model (solid).")
    against = difference_table(groups, resamples)
    against_note = ("Each group minus the vanilla group of the same environment and RL stage (the RL column: for "
                    "expert iteration with the label its rounds keep turns by), in points of Pass@k, "
                    "on the same levels: a 95% percentile bootstrap interval that draws the levels once for both "
                    "groups and each group's seeds independently (`spa.eval.metrics.bootstrap_difference`); "
                    "`(a vs b)`: the runs of each group that reached that evaluation. Few seeds make the "
                    "interval too narrow, not too wide. A group of one run (`1 vs`, `vs 1`) has no seeds to "
                    "resample: where recipes of the same environment and RL stage have two or more runs at "
                    "that evaluation, their pooled seed SD (`seed SD`, points) adds a normal draw to that "
                    "group's mean in each replicate, standing in for its seed's luck; without one its "
                    "interval holds only its levels' noise.")
    sections = _section("Against plain RL", against, against_note) if against else []
    spread = spread_table(groups)
    if spread:
        sections += _section("Seed spread", spread,
                     "The standard deviation of the final Pass@1 between runs of one recipe, pooled over the "
                     "recipes with two or more finished runs (df: runs minus recipes), and the runs each of two "
                     "recipes needs to show a true difference of that many points with a 5% two-sided test at "
                     "80% power: 2 (1.96 + 0.84)^2 SD^2 / gap^2, rounded up (normal approximation). The SD "
                     "includes the noise of the evaluation's samples.")
    curves = round_table(groups, resamples)
    if curves and plot_rounds(groups, out / "rounds.png"):
        sections += _section("Learning curves (expert iteration)", curves,
                     "Pass@1 in % after each round (round 0: the model RL starts from), mean over the runs that "
                     "reached it with its 95% interval, as in the replicates table; best first action: the share "
                     "of turns whose first action begins a shortest solution, mean over the runs.",
                     "![rounds](rounds.png)", "")
    else:  # a folder reused for runs without rounds: no stale plot beside the new table
        (out / "rounds.png").unlink(missing_ok=True)
    by_round = run_round_table(runs)
    if by_round:
        sections += _section("Rounds, run by run", by_round,
                     "Per round of each run: the turns its play kept (by the run's label) of those played, and "
                     "the play's episode success; Pass@1 in % with its 95% interval over levels; the paired "
                     "Pass@1 gain over the round before on the same levels, in points, with the levels whose "
                     "Pass@1 rose and fell (`spa paired`); valid first action: the turns whose first action "
                     "the rules accepted, with the best-first share of those in brackets; actions a turn: mean "
                     "actions over mean turns of the evaluation. Round 0 is the model RL starts from; its "
                     "evaluation minutes are that evaluation's.")
    text = "\n".join(["# Comparison", "", *rows, "", note, "", total, "", "## Replicates", "",
                      group_table(groups, resamples), "", group_note, "", *sections, "![curves](curves.png)", "",
                      "![Pass@k](passk.png)", ""])
    return atomic_write_text(out / "comparison.md", text)


def _section(title: str, table: str, note: str, *more: str) -> list[str]:
    """The lines of one section of ``comparison.md``: its title, table and note, then ``more``."""
    return [f"## {title}", "", table, "", note, "", *more]


def _recipe_summary(config_text: str) -> dict:
    import yaml

    data = yaml.safe_load(config_text) or {}
    return {"method": data.get("method"), "env": (data.get("env") or {}).get("name"), "learner": learner_name(data)}


#: What each expert-iteration filter makes of the rounds: imitation of a solver, the
#: reward's own Monte-Carlo values, or the episode's outcome (``KeepFilter.learner``).
ROUND_LEARNERS = {name: label.learner for name, label in FILTERS.items() if label.learner}


def learner_name(recipe: dict) -> str:
    """The learner a resolved recipe trains with, as the tables name it: the rounds of
    ``rl: iterate`` by their label, else the RL stage's algorithm (and its per-turn
    Monte-Carlo advantages), or RWML for the method that ends with it."""
    if recipe.get("method") == "rwml":
        return "RWML (no RL stage)"
    if recipe.get("rl") == "iterate":
        keep = (recipe.get("iterate") or {}).get("keep")
        return ROUND_LEARNERS.get(keep, f"rounds (keep: {keep})")
    ppo = recipe.get("ppo") or {}
    name = {"ppo": "PPO", "grpo": "GRPO"}.get(ppo.get("algorithm"), str(ppo.get("algorithm")))
    return name + (", Monte-Carlo advantages" if ppo.get("advantage") == "mc" else "")
