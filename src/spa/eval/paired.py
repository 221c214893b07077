"""Paired comparison of two evaluations that played the same levels (``spa paired``).

Two models evaluated on the same seeds can be compared level by level: the difference of
their per-level Pass@k, averaged over the levels. How hard a level is weighs on both
models alike and cancels in the difference, so its interval is much narrower than the
two unpaired intervals side by side, which can overlap while the gain is clear.
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
    moved = [0.0 if math.isclose(g, 0.0, abs_tol=1e-12) else g for g in gains]  # exact ties despite rounding
    return PairedDifference(
        k=k, levels=len(levels), before=mean(old), before_ci95=normal_interval(old, z), after=mean(new),
        after_ci95=normal_interval(new, z), difference=mean(gains),
        difference_ci95=normal_interval(gains, z, bounds=(-1.0, 1.0)),
        improved=sum(g > 0 for g in moved), worsened=sum(g < 0 for g in moved), tied=sum(g == 0 for g in moved))


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
#: kept (``spa archive``): ``{"env": ..., "env_config": ..., "levels": {"SEED": [1, 0, ...]}}``.
LEVELS = "levels.json"


def read_levels(path: str | Path) -> tuple[dict, dict[int, list[bool]]]:
    """``(played, successes)`` from an evaluation's ``trajectories.jsonl`` (the file or its
    folder), or from the ``levels.json`` beside it when the trajectories are not kept:
    ``played`` is the environment and its options, ``successes[seed]`` one success per
    sample of that level. The seed names a level across evaluations (the group is only
    its index in one)."""
    path = Path(path)
    if path.suffix != ".jsonl":
        path = path / "trajectories.jsonl"
    if not path.is_file():
        summary = path.with_name(LEVELS)
        if summary.is_file():
            data = json.loads(summary.read_text(encoding="utf-8"))
            played = {"env": data["env"], "env_config": data["env_config"]}
            return played, {int(seed): [bool(s) for s in outcomes] for seed, outcomes in data["levels"].items()}
        raise FileNotFoundError(f"{path} does not exist: not an evaluation (spa eval --out writes it)")
    played: dict = {}
    levels: dict[int, list[bool]] = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                record = json.loads(line)
                played = played or {"env": record["env"], "env_config": record["env_config"]}
                levels.setdefault(record["seed"], []).append(bool(record["success"]))
    return played, levels


def compare_evaluations(before: str | Path, after: str | Path) -> dict:
    """Paired Pass@1 and Pass@n (n: the fewest samples of a level on either side, when more
    than 1) of two evaluations' ``trajectories.jsonl``, as JSON-ready data.

    The same seed is the same level only in the same environment with the same options,
    so evaluations of different ones are refused (ValueError), as are different seeds.
    """
    (played_before, old), (played_after, new) = read_levels(before), read_levels(after)
    if played_before != played_after:
        raise ValueError(f"the two evaluations played different environments: {played_before} and {played_after}")
    paired = paired_difference(old, new)
    samples = {"before": min(map(len, old.values())), "after": min(map(len, new.values()))}
    ks = sorted({1, min(samples.values())})
    result = {"before": str(before), "after": str(after), **played_before, "levels": paired.levels,
              "samples": samples}
    result.update({f"pass@{k}": asdict(paired if k == 1 else paired_difference(old, new, k)) for k in ks})
    return result


def signed_pct_with_interval(value: float, interval: Sequence[float]) -> str:
    """A difference of rates in percentage points with its interval, ``+9.4 [+6.4, +12.3]``."""
    low, high = interval
    return f"{100 * value:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"


def table(result: dict) -> tuple[list[str], list[list[str]]]:
    """``(header, rows)`` of :func:`compare_evaluations` for a terminal: one column per
    Pass@k; rows before, after, the difference (each with its interval) and the levels
    whose Pass@k rose, fell and stayed."""
    ks = {key.replace("pass", "Pass"): value for key, value in result.items() if key.startswith("pass@")}
    rows = [["before", *(pct_with_interval(d["before"], d["before_ci95"]) for d in ks.values())],
            ["after", *(pct_with_interval(d["after"], d["after_ci95"]) for d in ks.values())],
            ["after - before", *(signed_pct_with_interval(d["difference"], d["difference_ci95"]) for d in ks.values())],
            ["levels up / down / same", *(f"{d['improved']} / {d['worsened']} / {d['tied']}" for d in ks.values())]]
    return ["", *ks], rows
