"""Learning curves of expert iteration (``rl: iterate``) in ``spa compare``: Pass@1 after
every round per group of replicate runs.

A run's round ``r`` is evaluated in ``rl/round-r/eval`` (round 0: the model RL starts from)
on the same levels as every other evaluation of the run, so the mean over seeds of each
round's Pass@1, with its interval over seeds and levels, is the curve the comparison is
about: whether, and how fast, each start learns from the same rounds, beside random valid
actions on the same levels (played here: a few seconds, no model). Run by run, each round
also shows what its play kept, its paired gain over the round before and its times.
"""

from __future__ import annotations

import json
from functools import lru_cache
from itertools import count
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from spa.agent.prompts import PromptConfig  # noqa: E402
from spa.eval.baselines import evaluate_policy  # noqa: E402
from spa.eval.evaluate import EvalConfig  # noqa: E402
from spa.eval.metrics import pass_at_k, pct_with_interval  # noqa: E402
from spa.eval.paired import paired_difference, paired_rate_difference, signed_pct_with_interval  # noqa: E402
from spa.pipeline.replicates import (level_best_first, level_counts, level_outcomes, replicate_cell,  # noqa: E402
                                     replicate_estimate, cut, rl_label, summary, variants)

Evaluation = tuple[dict, "list[float] | None"]  # metrics.json, per-level Pass@1


def round_eval(run: dict, round_: int) -> Evaluation | None:
    """``(metrics.json, per-level Pass@1)`` of a run's round ``round_``; None when the run has
    not evaluated it."""
    folder = Path(run["dir"]) / "rl" / f"round-{round_}" / "eval"
    if not (folder / "metrics.json").is_file():
        return None
    counts = level_counts(folder / "trajectories.jsonl")
    return json.loads((folder / "metrics.json").read_text()), counts and [pass_at_k(n, c, 1) for n, c in counts]


def group_rounds(group: list[dict]) -> list[list[Evaluation]]:
    """Per round, from 0 to the last any run reached, the evaluations of the runs that
    reached it; empty for a group without rounds (PPO, or no round evaluated yet)."""
    last = max((int(path.parent.parent.name.removeprefix("round-")) for run in group
                for path in Path(run["dir"]).glob("rl/round-*/eval/metrics.json")), default=-1)
    return [[hit for run in group if (hit := round_eval(run, r))] for r in range(last + 1)]


def group_curves(groups: list[list[dict]]) -> dict[int, list[list[Evaluation]]]:
    """:func:`group_rounds` of each group that has rounds, by its 1-based number (``G1``...)."""
    return {i: found for i, group in enumerate(groups, 1) if (found := group_rounds(group))}


def random_baseline(found: list[list[Evaluation]]) -> dict | None:
    """``spa eval --policy random``'s metrics on the levels, turn and action limits of a
    group's round-0 evaluation (``found``: :func:`group_rounds`; as its first run's
    ``metrics.json`` recorded them), sampling seed 0; None when that evaluation recorded no
    settings this version can read."""
    config = found[0][0][0].get("config") if found and found[0] else None
    return _random_baseline(json.dumps(config, sort_keys=True)) if config else None


@lru_cache(maxsize=32)
def _random_baseline(config_json: str) -> dict | None:
    config = json.loads(config_json)
    try:
        settings = EvalConfig(**{**config, "prompt": PromptConfig(**config["prompt"]), "seed": 0})
    except (KeyError, TypeError, ValueError):  # written by a version with other settings
        return None
    return evaluate_policy("random", settings)


def round_table(groups: list[list[dict]], resamples: int = 10_000) -> str | None:
    """One row per group with rounds: Pass@1 after each round as mean [95% interval over
    seeds and levels] (:func:`spa.pipeline.replicates.replicate_cell`), and the mean
    best-first-action rate of the start and of the last round; None when no group has rounds."""
    curves = group_curves(groups)
    if not curves:
        return None
    width = max(len(found) for found in curves.values())
    labels = variants(groups)
    rows = ["| group | method | env | variant | seeds | " + " | ".join(f"round {r}" for r in range(width))
            + " | best first action, start -> last | random valid actions |",
            "|---|---|---|---|---:|" + "---:|" * (width + 2)]
    for i, found in curves.items():
        group = groups[i - 1]
        cells = [replicate_cell(hits, len(group), 1, resamples) for hits in found] + ["-"] * (width - len(found))
        start, last = (sum(m.get("best_first_rate") or 0.0 for m, _ in hits) / len(hits) if hits else 0.0
                       for hits in (found[0], found[-1]))
        method, env = summary(group[0])
        random = random_baseline(found)
        reference = "-" if random is None else pct_with_interval(random["pass_at_k"]["pass@1"],
                                                                 random["pass_at_k_ci95"]["pass@1"])
        rows.append(f"| G{i} | {method} | {env} | {labels[i - 1]} | {len(group)} | " + " | ".join(cells)
                    + f" | {100 * start:.1f}% -> {100 * last:.1f}% | {reference} |")
    return "\n".join(rows)


def _rounds_record(run: dict) -> dict[int, dict]:
    """``rl/rounds.json`` of a run by round (play and SFT figures, stage times); empty
    without one."""
    path = Path(run["dir"]) / "rl" / "rounds.json"
    return {entry["round"]: entry for entry in json.loads(path.read_text())} if path.is_file() else {}


def _minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.0f}"


def _valid_first(metrics: dict) -> str:
    """``35.8% (22.3%)``: the first actions the rules accepted, and the best among them;
    ``-`` for metrics written before they were measured."""
    valid, best = metrics.get("first_valid_rate"), metrics.get("best_first_of_valid_rate")
    if valid is None:
        return "-"
    return f"{100 * valid:.1f}%" + ("" if best is None else f" ({100 * best:.1f}%)")


def run_round_rows(run: dict) -> list[str]:
    """The rows of :func:`run_round_table` for one run, one per round it evaluated."""
    record = _rounds_record(run)
    rows, before, before_best = [], None, None
    for r in count():
        found = round_eval(run, r)
        if found is None:
            break
        metrics, folder = found[0], Path(run["dir"]) / "rl" / f"round-{r}" / "eval"
        entry = record.get(r, {})
        gain = moved = "-"
        best_gain = ""
        outcomes = level_outcomes(folder / "trajectories.jsonl")
        best = level_best_first(folder / "trajectories.jsonl")
        if before and outcomes and before[0] == outcomes[0]:  # the same environment and options
            try:
                paired = paired_difference(before[1], outcomes[1])
                gain = signed_pct_with_interval(paired.difference, paired.difference_ci95)
                moved = f"{paired.improved} / {paired.worsened}"
                if before_best and best:
                    shares = paired_rate_difference(before_best, best)
                    best_gain = f" ({signed_pct_with_interval(shares.difference, shares.difference_ci95)})"
            except ValueError:  # other levels played
                pass
        kept = f"{entry['kept']:,} / {entry['turns']:,}" if "kept" in entry else "-"
        success = f"{100 * entry['play_success']:.1f}%" if "play_success" in entry else "-"
        first = metrics.get("best_first_rate")
        first = "-" if first is None else f"{100 * first:.1f}%{best_gain}"
        valid = _valid_first(metrics)
        actions = (f"{metrics['mean_actions'] / metrics['mean_turns']:.2f}"
                   if metrics.get("mean_turns") and "mean_actions" in metrics else "-")
        times = " / ".join(_minutes(entry.get(f"{stage}_seconds")) for stage in ("play", "sft", "eval"))
        pass1 = pct_with_interval(metrics["pass_at_k"]["pass@1"], (metrics.get("pass_at_k_ci95") or {}).get("pass@1"))
        rows.append(f"| {run['name']} | {r} | {kept} | {success} | {pass1} | {gain} | {moved} | "
                    f"{first} | {valid} | {actions} | {times} |")
        before, before_best = outcomes, best
    return rows


def run_round_table(runs: list[dict]) -> str | None:
    """One row per round of each run of expert iteration: the turns its play kept of those
    played and the play's success rate, Pass@1 with its interval over levels, the paired
    Pass@1 gain over the round before on the same levels (:func:`spa.eval.paired.paired_difference`)
    with the levels that rose and fell, the best-first-action rate (with its paired gain
    over the round before, :func:`spa.eval.paired.paired_rate_difference`, where both
    evaluations kept their turns' scores), the valid first actions with the best-first share
    of them (:func:`spa.eval.metrics.summarize`), actions a turn, and the round's play, SFT
    and evaluation minutes; None when no run has rounds."""
    rows = [row for run in runs for row in run_round_rows(run)]
    if not rows:
        return None
    return "\n".join(["| run | round | turns kept / played | play success | Pass@1 | gain over the round before "
                      "(paired) | levels up / down | best first action | valid first action (best of them) "
                      "| actions a turn | play / SFT / eval (min) |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|", *rows])


def plot_rounds(groups: list[list[dict]], path: Path, resamples: int = 2_000) -> Path | None:
    """``rounds.png``: mean Pass@1 against round for each group with rounds, its 95% interval
    over seeds and levels as a band; None when no group has rounds."""
    curves = group_curves(groups)
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.8))
    labels = variants(groups)
    for i, found in curves.items():
        rounds = [r for r, hits in enumerate(found) if hits]
        points = [replicate_estimate(found[r], 1, resamples) for r in rounds]
        method, env = summary(groups[i - 1][0])
        seeds, variant = len(groups[i - 1]), labels[i - 1]
        variant = "" if variant == "-" else f", {cut(variant, 32)}"
        line, = ax.plot(rounds, [mean for mean, _ in points], marker="o",
                        label=f"G{i}: {method} {env}, {rl_label(groups[i - 1][0])}{variant} "
                              f"({seeds} seed{'s' * (seeds > 1)})")
        low = [interval[0] if interval else mean for mean, interval in points]
        high = [interval[1] if interval else mean for mean, interval in points]
        ax.fill_between(rounds, low, high, alpha=0.15, color=line.get_color())
    drawn = set()
    for found in curves.values():  # one dashed line per environment and score (random play reads no prompt)
        random = random_baseline(found)
        if random is None:
            continue
        env, options = random["config"]["env"], random["config"]["env_config"]
        label, score = f"random valid actions ({env}{f' {options}' if options else ''})", random["pass_at_k"]["pass@1"]
        if (label, score) not in drawn:
            drawn.add((label, score))
            ax.axhline(score, linestyle="--", color="gray", linewidth=1, label=label)
    ax.set_xlabel("round (0: before RL)")
    ax.set_ylabel("Pass@1")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
