"""What a run's start says about its end: the start's answer length against the final Pass@1.

Runs of one recipe that differ only in their seed end 20-30 points apart after three
rounds of expert iteration (docs/comparison.md, "The comparison"). This script reads the evaluations
that ``spa archive`` keeps (``rl/round-N/eval/metrics.json``) and sets, for every run, the
start's actions per well-formed turn, Pass@1 and best-first rate beside the Pass@1 of
every round, then correlates each start measure with the final Pass@1 across the runs
(Pearson's r with a 95% bootstrap interval over runs, and Spearman's rank correlation),
and estimates each recipe's difference from the first (runs grouped by name without
their ``-sN``) by least squares with and without the start's actions a turn as a
covariate, and with each seed as a block (runs of different recipes with the same seed
compared with each other), with t intervals:

    python experiments/seed_spread.py results/runs/frozenlake-*-iterate-*

``--length-round 1`` takes the actions a turn after round 1 as the covariate instead of
the start's: for a recipe whose first round changes the answers' length.

A folder that is an ``spa iterate`` output (``round-N/eval`` at its top) is read too. A
run given twice by name (live in ``runs/`` and archived in ``results/runs``) counts once.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

START_MEASURES = ("actions_per_turn", "pass@1", "best_first")

#: Student's t, 97.5% quantile, by degrees of freedom (a df between two rows takes the
#: lower row's, which is the wider interval).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000, 120: 1.980}


def rounds_of(run: Path) -> list[dict]:
    """The metrics of round 0 (the start), 1, 2... of a run, in order, as far as they go."""
    base = run / "rl" if (run / "rl").is_dir() else run
    found = []
    while (path := base / f"round-{len(found)}" / "eval" / "metrics.json").is_file():
        found.append(json.loads(path.read_text(encoding="utf-8")))
    return found


def distinct(runs: list[Path]) -> list[Path]:
    """The runs with each name once, in first-seen order: a run still going in ``runs/``
    and its archive in ``results/runs`` are one run, read from the copy with more rounds."""
    chosen: dict[str, Path] = {}
    for run in runs:
        if run.name not in chosen or len(rounds_of(run)) > len(rounds_of(chosen[run.name])):
            chosen[run.name] = run
    return list(chosen.values())


def measures(metrics: dict) -> dict:
    """The start measures of one evaluation (``mean_actions`` and ``mean_turns`` count
    well-formed turns only, so their ratio is the actions a turn the model wrote)."""
    turns = metrics["mean_turns"]
    return {"actions_per_turn": metrics["mean_actions"] / turns if turns else float("nan"),
            "pass@1": metrics["pass_at_k"]["pass@1"], "best_first": metrics.get("best_first_rate", float("nan"))}


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their mean rank."""
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(1, len(x) + 1)
    for value in np.unique(x):
        tied = x == value
        r[tied] = r[tied].mean()
    return r


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denominator) if denominator else float("nan")


def correlation(x, y, resamples: int = 10_000, seed: int = 0) -> dict:
    """Pearson's r with a 95% percentile bootstrap interval over the pairs, and Spearman's rho."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if np.ptp(x) == 0 or np.ptp(y) == 0:  # a constant measure correlates with nothing
        return {"pearson": None, "pearson_ci95": None, "spearman": None, "runs": len(x)}
    rng = np.random.default_rng(seed)
    draws = [pearson(x[i], y[i]) for i in rng.integers(0, len(x), (resamples, len(x)))]
    low, high = np.nanpercentile(draws, [2.5, 97.5])
    return {"pearson": round(pearson(x, y), 3), "pearson_ci95": [round(float(low), 3), round(float(high), 3)],
            "spearman": round(pearson(ranks(x), ranks(y)), 3), "runs": len(x)}


def t975(df: int) -> float:
    return T975[max(d for d in T975 if d <= df)]


SEED_SUFFIX = re.compile(r"-(s\d+)$")


def recipe_of(run: Path) -> str:
    """The run's name without its seed suffix (``frozenlake-spa-iterate-s2``: ``frozenlake-spa-iterate``)."""
    return SEED_SUFFIX.sub("", run.name)


def seed_of(run: Path) -> str:
    """The run's seed suffix (``frozenlake-spa-iterate-s2``: ``s2``; none: the whole name)."""
    found = SEED_SUFFIX.search(run.name)
    return found.group(1) if found else run.name


def indicators(labels: list[str]) -> list[np.ndarray]:
    """One 0/1 column per label but the first."""
    names = list(dict.fromkeys(labels))
    return [np.array([label == n for label in labels], float) for n in names[1:]]


def differences(recipes: list[str], end, covariate=None, blocks: list[str] | None = None) -> dict:
    """Least-squares difference of each recipe's mean end from the first recipe's, with a
    95% t interval, in points (``end`` is a rate); with ``covariate``, at equal covariate
    (one common slope, points per unit of the covariate); with ``blocks`` (each run's
    seed), within blocks: each seed gets its own level, so that a seed which sets every
    method's start alike (Sokoban's bootstrap exploration) drops out of the comparison."""
    names = list(dict.fromkeys(recipes))
    columns = [np.ones(len(end))] + indicators(recipes)
    if blocks is not None:
        columns += indicators(blocks)
    if covariate is not None:
        columns.append(np.asarray(covariate, float))
    x, y = np.column_stack(columns), 100 * np.asarray(end, float)
    df = len(y) - int(np.linalg.matrix_rank(x))  # a seed run by one recipe only adds no information
    if df < 1:
        return {}
    beta = np.linalg.lstsq(x, y, rcond=None)[0]
    residual = y - x @ beta
    scale = float(residual @ residual) / df
    se = np.sqrt(np.diag(scale * np.linalg.pinv(x.T @ x)))
    q = t975(df)

    def estimate(i: int) -> dict:
        return {"points": round(float(beta[i]), 1),
                "ci95": [round(float(beta[i] - q * se[i]), 1), round(float(beta[i] + q * se[i]), 1)]}

    out = {f"{n} - {names[0]}": estimate(i) for i, n in enumerate(names[1:], start=1)}
    if covariate is not None:
        out["slope"] = estimate(len(beta) - 1)
    return {**out, "residual_sd": round(float(np.sqrt(scale)), 1), "df": df}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="Archived runs or spa iterate folders.")
    parser.add_argument("--round", type=int, default=3, help="The round whose Pass@1 is the end.")
    parser.add_argument("--length-round", type=int, default=0,
                        help="The round whose actions a turn is the covariate of the equal-length "
                             "estimate (0: the start). A later round holds equal what a run's "
                             "answers became, where a recipe may change their length.")
    args = parser.parse_args(argv)
    if not 0 <= args.length_round <= args.round:
        raise SystemExit(f"--length-round {args.length_round}: must lie in 0..{args.round} (--round)")
    table, start, end, lengths, recipes, seeds = [], {m: [] for m in START_MEASURES}, [], [], [], []
    for run in distinct(args.runs):
        rounds = rounds_of(run)
        if len(rounds) <= args.round:
            print(f"{run}: {len(rounds) - 1} rounds, fewer than {args.round}: left out")
            continue
        first = measures(rounds[0])
        for name in START_MEASURES:
            start[name].append(first[name])
        end.append(rounds[args.round]["pass_at_k"]["pass@1"])
        lengths.append(measures(rounds[args.length_round])["actions_per_turn"])
        recipes.append(recipe_of(run))
        seeds.append(seed_of(run))
        curve = "  ".join(f"{100 * m['pass_at_k']['pass@1']:.1f}/{measures(m)['actions_per_turn']:.2f}"
                          for m in rounds[: args.round + 1])
        table.append(f"| {run.name} | {first['actions_per_turn']:.2f} | {100 * first['pass@1']:.1f} | "
                     f"{100 * first['best_first']:.1f}% | {curve} |")
    if len(end) < 3:
        raise SystemExit(f"{len(end)} runs with {args.round} rounds: a correlation needs at least 3")
    print(f"| run | start: actions a turn | start Pass@1 | start best first | Pass@1 / actions a turn, "
          f"rounds 0..{args.round} |\n|---|---:|---:|---:|---|")
    print("\n".join(table))
    result = {"end": f"round-{args.round} pass@1",
              "correlation_with_start": {name: correlation(values, end) for name, values in start.items()},
              "difference": differences(recipes, end),
              "length_round": args.length_round,
              "difference_at_equal_actions_per_turn": differences(recipes, end, lengths),
              "difference_within_seeds": differences(recipes, end, blocks=seeds)}
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
