"""Paired comparison of two evaluations that played the same levels (``spa paired``).

Two models evaluated on the same seeds can be compared level by level: the difference of
their per-level Pass@k, averaged over the levels. How hard a level is weighs on both
models alike and cancels in the difference, so its interval is much narrower than the
two unpaired intervals side by side, which can overlap while the gain is clear.

Where the environment has a solver, each turn also records whether its first action began
a shortest solution (``Turn.best_first``); the share of such turns is paired the same way
(:func:`paired_rate_difference`), a finer signal than Pass@k while no level is solved.
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import mean

from spa.eval.metrics import normal_interval, pass_at_k, pct_with_interval


@dataclass(frozen=True)
class PairedDifference:
    """Pass@k of two evaluations on the same levels and their paired difference, as rates."""

    k: int
    levels: int
    before: float
    before_ci95: tuple[float, float]
    after: float
    after_ci95: tuple[float, float]
    difference: float  # mean over levels of (after - before)
    difference_ci95: tuple[float, float]
    improved: int  # levels whose Pass@k rose
    worsened: int
    tied: int


def paired_difference(before: Mapping[Hashable, Sequence[bool]], after: Mapping[Hashable, Sequence[bool]],
                      k: int = 1, z: float = 1.96) -> PairedDifference:
    """The mean over levels of each level's Pass@k after minus before, with a 95% interval.

    ``before[level]`` and ``after[level]`` are the successes of that level's samples; the
    two may hold different numbers of samples of a level. Each level's Pass@k is the
    unbiased ``pass_at_k`` of its samples (Pass@1: its success share). The intervals are
    the ones ``pass_at_k_interval`` gives every evaluation, the normal approximation over
    levels, ``mean ± z * sd / sqrt(levels)`` (``normal_interval``): of each side's
    per-level Pass@k, clipped to [0, 1], and of the per-level differences, clipped to
    [-1, 1]. The level is the unit because its samples are not independent.

    Raises ValueError when the two do not hold the same levels (naming a few that one of
    them lacks), when a level has no samples, with fewer than 2 levels (no spread to
    measure), or when ``k`` exceeds a level's samples.
    """
    _check_levels(before, after)
    fewest = min(len(outcomes) for side in (before, after) for outcomes in side.values())
    if not 1 <= k <= fewest:
        raise ValueError(f"Pass@{k} needs 1 <= k <= the samples of every level; the fewest is {fewest}")
    levels = list(before)
    old = [pass_at_k(len(before[level]), sum(before[level]), k) for level in levels]
    new = [pass_at_k(len(after[level]), sum(after[level]), k) for level in levels]
    gains = [b - a for a, b in zip(old, new)]
    improved, worsened, tied = _moves(gains)
    return PairedDifference(
        k=k, levels=len(levels), before=mean(old), before_ci95=normal_interval(old, z), after=mean(new),
        after_ci95=normal_interval(new, z), difference=mean(gains),
        difference_ci95=normal_interval(gains, z, bounds=(-1.0, 1.0)),
        improved=improved, worsened=worsened, tied=tied)


def _moves(gains: Sequence[float]) -> tuple[int, int, int]:
    """How many of the per-level ``gains`` rose, fell and stayed; within rounding of 0 is a tie."""
    moved = [0.0 if math.isclose(g, 0.0, abs_tol=1e-12) else g for g in gains]
    return sum(g > 0 for g in moved), sum(g < 0 for g in moved), sum(g == 0 for g in moved)


@dataclass(frozen=True)
class PairedRate:
    """A share of turns (the best first action's) in two evaluations on the same levels and
    its difference, as rates; the counts of levels cover those with scored turns on both sides."""

    levels: int
    turns_before: int  # scored turns
    turns_after: int
    before: float  # hits over scored turns, pooled over the levels
    before_ci95: tuple[float, float]
    after: float
    after_ci95: tuple[float, float]
    difference: float
    difference_ci95: tuple[float, float]
    improved: int  # levels whose own share rose
    worsened: int
    tied: int


def paired_rate_difference(before: Mapping[Hashable, Sequence[int]], after: Mapping[Hashable, Sequence[int]],
                           z: float = 1.96) -> PairedRate:
    """The difference of a share of turns between two evaluations, with a 95% interval over levels.

    ``before[level]`` and ``after[level]`` are ``(hits, scored)``: how many of that level's
    scored turns hit, over all its samples. Each side's share pools its turns, hits over
    scored turns, so it is the number ``summarize`` reports (``best_first_rate``). A pooled
    share is a ratio of two sums over levels, and its interval takes the level as the unit
    through the ratio's linearisation: level ``i`` contributes the pseudo-value
    ``share + (hits_i - share * scored_i) / mean(scored)``, whose mean is the share, and
    the interval is :func:`normal_interval` of the pseudo-values (of their differences for
    the difference, which pairs the levels). Levels with no scored turn add nothing but
    count in the spread, as a cluster of size zero does.

    Raises ValueError as :func:`paired_difference` does for levels that differ, and when a
    side has no scored turn at all.
    """
    _check_levels(before, after)
    levels = list(before)
    old, old_pseudo, old_turns = _pooled("before", [before[level] for level in levels])
    new, new_pseudo, new_turns = _pooled("after", [after[level] for level in levels])
    improved, worsened, tied = _moves([after[level][0] / after[level][1] - before[level][0] / before[level][1]
                                       for level in levels if before[level][1] and after[level][1]])
    return PairedRate(
        levels=len(levels), turns_before=old_turns, turns_after=new_turns, before=old,
        before_ci95=normal_interval(old_pseudo, z), after=new, after_ci95=normal_interval(new_pseudo, z),
        difference=new - old,
        difference_ci95=normal_interval([b - a for a, b in zip(old_pseudo, new_pseudo)], z, bounds=(-1.0, 1.0)),
        improved=improved, worsened=worsened, tied=tied)


def _pooled(name: str, counts: list[Sequence[int]]) -> tuple[float, list[float], int]:
    """``(share, pseudo-values, scored turns)`` of one side's per-level ``(hits, scored)``
    (:func:`paired_rate_difference`)."""
    hits, scored = [h for h, _ in counts], [n for _, n in counts]
    if not sum(scored):
        raise ValueError(f"no turn of {name} was scored: the environment has no solver, or no turn gave an action")
    share, size = sum(hits) / sum(scored), mean(scored)
    return share, [share + (h - share * n) / size for h, n in zip(hits, scored)], sum(scored)


def _check_levels(before: Mapping, after: Mapping) -> None:
    only = {name: [level for level in side if level not in other]
            for name, side, other in (("before", before, after), ("after", after, before))}
    if any(only.values()):
        raise ValueError("the two evaluations did not play the same levels: " + "; ".join(
            f"{len(levels)} only in {name} ({_few(levels)})" for name, levels in only.items() if levels))
    for name, side in (("before", before), ("after", after)):
        empty = [level for level, outcomes in side.items() if not outcomes]
        if empty:
            raise ValueError(f"{len(empty)} level(s) without samples in {name} ({_few(empty)})")
    if len(before) < 2:
        raise ValueError(f"a paired interval needs at least 2 levels; got {len(before)}")


def _few(levels: list, shown: int = 5) -> str:
    """The first ``shown`` levels, ``...`` for the rest."""
    return ", ".join(map(str, levels[:shown])) + (", ..." if len(levels) > shown else "")


#: Each level's successes beside an evaluation, for when its ``trajectories.jsonl`` is not
#: kept (``spa archive``): ``{"env": ..., "env_config": ..., "levels": {"SEED": [1, 0, ...]}}``,
#: and where turns were scored, ``"best_first": {"SEED": [hits, scored turns]}``.
LEVELS = "levels.json"


def read_levels(path: str | Path) -> tuple[dict, dict[int, list[bool]]]:
    """``(played, successes)`` from an evaluation's ``trajectories.jsonl`` (the file or its
    folder), or from the ``levels.json`` beside it when the trajectories are not kept:
    ``played`` is the environment and its options, ``successes[seed]`` one success per
    sample of that level. The seed names a level across evaluations (the group is only
    its index in one)."""
    played, levels, _ = read_evaluation(path)
    return played, levels


def read_evaluation(path: str | Path) -> tuple[dict, dict[int, list[bool]], dict[int, list[int]]]:
    """:func:`read_levels` and, third, each level's best-first counts ``[hits, scored
    turns]`` over its samples (empty where no turn was scored, or where an archived
    ``levels.json`` predates them)."""
    path = Path(path)
    if path.suffix != ".jsonl":
        path = path / "trajectories.jsonl"
    if not path.is_file():
        summary = path.with_name(LEVELS)
        if summary.is_file():
            data = json.loads(summary.read_text(encoding="utf-8"))
            played = {"env": data["env"], "env_config": data["env_config"]}
            return (played, {int(seed): [bool(s) for s in outcomes] for seed, outcomes in data["levels"].items()},
                    {int(seed): list(counts) for seed, counts in data.get("best_first", {}).items()})
        raise FileNotFoundError(f"{path} does not exist: not an evaluation (spa eval --out writes it)")
    played: dict = {}
    levels: dict[int, list[bool]] = {}
    best: dict[int, list[int]] = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                record = json.loads(line)
                played = played or {"env": record["env"], "env_config": record["env_config"]}
                levels.setdefault(record["seed"], []).append(bool(record["success"]))
                scored = [bool(turn["best_first"]) for turn in record["turns"] if turn.get("best_first") is not None]
                counts = best.setdefault(record["seed"], [0, 0])
                counts[0] += sum(scored)
                counts[1] += len(scored)
    return played, levels, best if any(n for _, n in best.values()) else {}


def compare_evaluations(before: str | Path, after: str | Path) -> dict:
    """Paired Pass@1 and Pass@n (n: the fewest samples of a level on either side, when more
    than 1) of two evaluations' ``trajectories.jsonl``, as JSON-ready data; with
    ``best_first`` (:func:`paired_rate_difference`) where both sides scored turns.

    The same seed is the same level only in the same environment with the same options,
    so evaluations of different ones are refused (ValueError), as are different seeds.
    """
    (played_before, old, old_best), (played_after, new, new_best) = read_evaluation(before), read_evaluation(after)
    if played_before != played_after:
        raise ValueError(f"the two evaluations played different environments: {played_before} and {played_after}")
    paired = paired_difference(old, new)
    samples = {"before": min(map(len, old.values())), "after": min(map(len, new.values()))}
    ks = sorted({1, min(samples.values())})
    result = {"before": str(before), "after": str(after), **played_before, "levels": paired.levels,
              "samples": samples}
    result.update({f"pass@{k}": asdict(paired if k == 1 else paired_difference(old, new, k)) for k in ks})
    if old_best and new_best:  # every level has its counts, [0, 0] where none of its turns was scored
        result["best_first"] = asdict(paired_rate_difference(old_best, new_best))
    return result


def signed_pct_with_interval(value: float, interval: Sequence[float]) -> str:
    """A difference of rates in percentage points with its interval, ``+9.4 [+6.4, +12.3]``."""
    low, high = interval
    return f"{100 * value:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"


def table(result: dict) -> tuple[list[str], list[list[str]]]:
    """``(header, rows)`` of :func:`compare_evaluations` for a terminal: one column per
    Pass@k; rows before, after, the difference (each with its interval) and the levels
    whose Pass@k rose, fell and stayed. The best first action, where present, is
    :func:`best_first_table`'s."""
    ks = {key.replace("pass", "Pass"): value for key, value in result.items() if key.startswith("pass@")}
    return ["", *ks], _rows(ks.values())


def best_first_table(result: dict) -> tuple[list[str], list[list[str]]] | None:
    """``(header, rows)`` of the best first action's share of turns, as :func:`table`;
    None where the evaluations scored no turns."""
    if "best_first" not in result:
        return None
    return ["", "best first action"], _rows([result["best_first"]])


def _rows(columns) -> list[list[str]]:
    columns = list(columns)
    return [["before", *(pct_with_interval(d["before"], d["before_ci95"]) for d in columns)],
            ["after", *(pct_with_interval(d["after"], d["after_ci95"]) for d in columns)],
            ["after - before", *(signed_pct_with_interval(d["difference"], d["difference_ci95"]) for d in columns)],
            ["levels up / down / same", *(f"{d['improved']} / {d['worsened']} / {d['tied']}" for d in columns)]]
