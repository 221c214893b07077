"""Metrics over rollouts: unbiased Pass@k (with a 95% interval over levels, and a bootstrap
interval over levels and seeds for replicate runs) and world-model accuracy of predicted
states."""

from __future__ import annotations

import math
from collections import defaultdict
from statistics import NormalDist, mean, stdev, variance

import numpy as np

from spa.agent.grids import cell_accuracy, exact_match, grid_exact


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k from ``n`` samples of which ``c`` succeeded (Chen et al., 2021).

    ``pass@k = 1 - C(n - c, k) / C(n, k)``: the probability that at least one of ``k``
    samples drawn without replacement from the ``n`` is a success. Computed as a product
    so large ``n`` does not overflow.
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def _level_outcomes(trajectories) -> dict[int, list[bool]]:
    """Each level's (group's) successes, one per sample."""
    groups: dict[int, list[bool]] = defaultdict(list)
    for trajectory in trajectories:
        groups[trajectory.group].append(trajectory.success)
    return groups


def summarize(trajectories, ks: tuple[int, ...] = (1, 2, 4, 8), intervals: bool = False) -> dict:
    """Success, Pass@k (per group of samples sharing a seed) and per-turn rates.

    ``best_first_rate`` is the share of turns whose first action begins a shortest
    solution from the state the turn saw (``Turn.best_first``), over the turns where the
    environment could say (uniformly random moves score about 0.4 on 4x4 lakes); it
    is left out when no turn could. A per-turn rate over hundreds of turns, it moves
    long before Pass@1 over a few hundred episodes does. ``best_follow_rate`` is, over
    the turns whose best first action was followed by a second, the share whose second
    action was best too (``Turn.best_run`` >= 2): how much of a multi-action answer
    that a best-first label keeps is itself right, rather than a random follow-up.
    ``first_valid_rate`` is the share of the scored turns whose first action the
    environment accepted, and ``best_first_of_valid_rate`` the best-first share among
    those: it splits a low best-first rate into moves the rules refuse (a clue cell, a
    wall) and legal moves chosen badly, the latter comparable with random valid actions,
    whose every move is legal.

    World-model accuracy is included when the trajectories were played in
    ``world_model`` mode: exact match and per-cell accuracy of ``<observation>`` against
    the state before each turn and of ``<prediction>`` against the state after it.

    ``ended`` splits the episodes by how they ended: ``success``; ``lost``, ended by the
    environment without success (a hole); ``out_of_turns``, still going when the turns or
    the action budget ran out. A policy of one-action answers can fail by the last of these
    where random play of three actions a turn would still be walking.

    With ``intervals``, ``pass_at_k_ci95`` holds ``[low, high]`` for every reported
    Pass@k (``pass_at_k_interval``); it is left out with fewer than 2 levels, whose
    spread cannot be measured.
    """
    groups = _level_outcomes(trajectories)
    turns = [turn for trajectory in trajectories for turn in trajectory.turns]
    actions = [valid for turn in turns for valid in turn.actions_valid]
    n = min(len(outcomes) for outcomes in groups.values())
    per_level = {f"pass@{k}": [pass_at_k(len(o), sum(o), k) for o in groups.values()] for k in ks if k <= n}
    result = {
        "episodes": len(trajectories),
        "groups": len(groups),
        "samples_per_group": n,
        "success_rate": mean(t.success for t in trajectories),
        "pass_at_k": {name: mean(values) for name, values in per_level.items()},
        "mean_reward": mean(t.total_reward for t in trajectories),
        "mean_turns": mean(len(t.turns) for t in trajectories),
        "mean_actions": mean(t.num_actions for t in trajectories),
        "format_valid_rate": mean(turn.format_ok for turn in turns) if turns else 0.0,
        "action_valid_rate": mean(actions) if actions else 0.0,
        "mean_response_tokens": mean(len(turn.response_ids) for turn in turns) if turns else 0.0,
        "ended": {"success": mean(t.success for t in trajectories),
                  "lost": mean(t.terminated and not t.success for t in trajectories),
                  "out_of_turns": mean(not (t.terminated or t.success) for t in trajectories)},
    }
    scored = [turn for turn in turns if turn.best_first is not None]
    if scored:
        result["best_first_rate"] = mean(turn.best_first for turn in scored)
        valid_first = [turn for turn in scored if turn.actions_valid[:1] == [True]]
        result["first_valid_rate"] = len(valid_first) / len(scored)
        if valid_first:
            result["best_first_of_valid_rate"] = mean(turn.best_first for turn in valid_first)
    followed = [turn.best_run >= 2 for turn in turns
                if turn.best_first and turn.best_run is not None and len(turn.actions_valid) >= 2]
    if followed:
        result["best_follow_rate"] = mean(followed)
    if intervals and len(groups) >= 2:
        result["pass_at_k_ci95"] = {name: list(normal_interval(values)) for name, values in per_level.items()}
    if trajectories and trajectories[0].mode == "world_model" and turns:
        result["world_model"] = world_model_accuracy(turns)
    return result


def world_model_accuracy(turns) -> dict:
    """Observation / prediction exact match and per-cell accuracy over ``turns``.

    ``unchanged_rate`` is the share of turns whose state did not change (moves into
    walls or edges): the prediction exact match a model would get by copying the
    observation, the floor a learned transition model has to beat.
    ``prediction_copied`` is the share of predictions whose grid repeats the grid before
    the actions, and ``prediction_changed_exact`` the exact match over the turns whose
    state changed (None without such turns): there a copy scores 0, so it is the rate of
    transitions actually predicted. A prediction exact match no higher than
    ``unchanged_rate`` with ``prediction_changed_exact`` near 0 is a model that copies.
    """
    unchanged = [exact_match(t.state_before, t.state_after) for t in turns]
    predicted = [exact_match(t.prediction, t.state_after) for t in turns]
    changed = [right for right, same in zip(predicted, unchanged) if not same]
    return {
        "observation_exact": mean(exact_match(t.observation, t.state_before) for t in turns),
        "prediction_exact": mean(predicted),
        "observation_cell_acc": mean(cell_accuracy(t.observation, t.grid_before) for t in turns),
        "prediction_cell_acc": mean(cell_accuracy(t.prediction, t.grid_after) for t in turns),
        "observation_grid_exact": mean(grid_exact(t.observation, t.grid_before) for t in turns),
        "prediction_grid_exact": mean(grid_exact(t.prediction, t.grid_after) for t in turns),
        "unchanged_rate": mean(unchanged),
        "prediction_copied": mean(grid_exact(t.prediction, t.grid_before) for t in turns),
        "prediction_changed_exact": mean(changed) if changed else None,
    }


def pass_at_k_interval(trajectories, k: int, z: float = 1.96) -> tuple[float, float]:
    """A normal-approximation interval (95% for ``z = 1.96``) for the mean Pass@k.

    The unit is the level, not the episode: the samples of one seed share a level and
    are not independent, so the interval is ``mean ± z * sd / sqrt(levels)`` over the
    per-level Pass@k values, clipped to [0, 1]. It is degenerate (zero width) when every
    level scores the same, e.g. a solver that solves them all.
    """
    values = [pass_at_k(len(o), sum(o), k) for o in _level_outcomes(trajectories).values()]
    if len(values) < 2:
        raise ValueError(f"pass_at_k_interval needs at least 2 levels; got {len(values)}")
    return normal_interval(values, z)


def normal_interval(values: list[float], z: float = 1.96,
                    bounds: tuple[float, float] = (0.0, 1.0)) -> tuple[float, float]:
    """``mean ± z * sd / sqrt(n)`` of ``values`` (at least 2), clipped to ``bounds``: [0, 1]
    for a rate, [-1, 1] for a difference of two rates (``spa.eval.paired``)."""
    centre = mean(values)
    half = z * stdev(values) / math.sqrt(len(values))
    return max(bounds[0], centre - half), min(bounds[1], centre + half)


def bootstrap_interval(per_seed: list[list[float]], resamples: int = 10_000, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, low, high)``: a mean over replicate runs and its percentile bootstrap interval.

    ``per_seed[s][l]`` is the score (e.g. Pass@k) of level ``l`` in the run of seed ``s``;
    runs may have different numbers of levels. The estimate is the mean over seeds of each
    seed's mean over levels, every seed weighing the same. Each of ``resamples`` bootstrap
    replicates resamples the seeds with replacement, then, independently for every seed it
    drew, that seed's levels with replacement (a two-stage, hierarchical bootstrap: both
    the training seed and the finite set of levels vary between replicates), and recomputes
    the estimate; the interval is the ``(1 - level) / 2`` and ``(1 + level) / 2``
    percentiles of the replicates (``numpy.percentile``, linear interpolation). A fixed
    ``seed`` makes the interval reproducible. With one seed it is a bootstrap over levels;
    when every level of every seed scores the same it has zero width.
    """
    if not per_seed or any(len(levels) == 0 for levels in per_seed):
        raise ValueError("bootstrap_interval needs at least one seed, each with at least one level")
    if resamples < 1 or not 0 < level < 1:
        raise ValueError(f"bootstrap_interval needs resamples >= 1 and 0 < level < 1; got {resamples}, {level}")
    rng = np.random.default_rng(seed)
    values = [np.asarray(levels, dtype=float) for levels in per_seed]
    seeds = len(values)
    drawn = rng.integers(seeds, size=(resamples, seeds))  # which seed fills each slot of a replicate
    slot_means = np.empty((resamples, seeds))
    for s, v in enumerate(values):  # every slot seed s fills gets its own resampling of its levels
        filled = drawn == s
        slot_means[filled] = v[rng.integers(len(v), size=(int(filled.sum()), len(v)))].mean(axis=1)
    replicates = slot_means.mean(axis=1)
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(replicates, [tail, 100 - tail])
    return float(np.mean([v.mean() for v in values])), float(low), float(high)


def bootstrap_difference(first: list[list[float]], second: list[list[float]], resamples: int = 10_000,
                         seed: int = 0, level: float = 0.95,
                         seed_sd: float | None = None) -> tuple[float, float, float]:
    """``(difference, low, high)``: the mean over ``first``'s seeds minus the mean over
    ``second``'s (each a mean over levels, as in :func:`bootstrap_interval`), with a
    percentile bootstrap interval.

    ``first[s][l]`` and ``second[t][l]`` score the same level ``l``: two groups of runs
    evaluated on one set of levels. Each replicate draws the levels once, with replacement,
    for every run of both groups (the levels are shared, so a level both groups find hard
    cancels out), and each group's seeds with replacement, independently (the training seeds
    of two recipes are unrelated); the interval is the ``(1 - level) / 2`` and
    ``(1 + level) / 2`` percentiles of the replicates' differences. With few seeds per
    group the interval is too narrow rather than too wide: three seeds cannot show how far a
    fourth might fall.

    A group of one run has no seeds to resample, so its seed's own luck would be missing
    from the interval. Given ``seed_sd`` (the standard deviation of a run's mean between
    seeds of one recipe, e.g. :func:`pooled_sd` over other recipes, in the scores' units),
    each replicate adds a deviation drawn from ``N(0, seed_sd^2)`` to such a group's mean: a
    parametric stand-in for the seeds it lacks. Groups of two or more runs are unchanged.
    """
    if not first or not second:
        raise ValueError("bootstrap_difference needs at least one seed in each group")
    counts = {len(levels) for levels in first + second}
    if len(counts) != 1 or 0 in counts:
        raise ValueError(f"bootstrap_difference needs the same levels in every run; got level counts {sorted(counts)}")
    if resamples < 1 or not 0 < level < 1 or (seed_sd is not None and seed_sd < 0):
        raise ValueError(f"bootstrap_difference needs resamples >= 1, 0 < level < 1 and seed_sd >= 0; "
                         f"got {resamples}, {level}, {seed_sd}")
    rng = np.random.default_rng(seed)
    a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)  # (seeds, levels)
    levels = rng.integers(a.shape[1], size=(resamples, a.shape[1]))
    a_means, b_means = a[:, levels].mean(axis=2), b[:, levels].mean(axis=2)  # (seeds, resamples)
    pick_a = rng.integers(len(a), size=(resamples, len(a)))
    pick_b = rng.integers(len(b), size=(resamples, len(b)))
    rows = np.arange(resamples)[:, None]
    draws = [a_means.T[rows, pick_a].mean(axis=1), b_means.T[rows, pick_b].mean(axis=1)]
    for group, draw in zip((a, b), draws):
        if len(group) == 1 and seed_sd:  # drawn after the rest, so seed_sd=None keeps the old replicates
            draw += rng.normal(0.0, seed_sd, size=resamples)
    replicates = draws[0] - draws[1]
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(replicates, [tail, 100 - tail])
    return float(a.mean() - b.mean()), float(low), float(high)


def pooled_sd(groups: list[list[float]]) -> tuple[float, int]:
    """``(sd, df)``: the standard deviation within groups, pooled over the groups.

    ``groups[g]`` holds one score per replicate run of group ``g`` (e.g. each seed's final
    Pass@1). Each group's squared deviations from its own mean are summed over all groups and
    divided by ``df = sum(len(g) - 1)``, so a difference between the groups' means does not
    count as spread. Groups of one run add nothing; at least one group needs two runs.
    """
    spread = [g for g in groups if len(g) > 1]
    df = sum(len(g) - 1 for g in spread)
    if df < 1:
        raise ValueError(f"pooled_sd needs a group with at least 2 runs; got group sizes {[len(g) for g in groups]}")
    return math.sqrt(sum((len(g) - 1) * variance(g) for g in spread) / df), df


def runs_per_arm(sd: float, gap: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Replicate runs per arm that a two-sided test at level ``alpha`` needs to detect a
    difference of ``gap`` between two arms with probability ``power``, when each run's score
    spreads with standard deviation ``sd``: ``ceil(2 (z_{1-alpha/2} + z_power)^2 sd^2 / gap^2)``
    (normal approximation, equal arms; with few runs the t distribution asks a little more),
    and at least 2, the fewest that show a spread.
    """
    if sd < 0 or gap <= 0 or not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError(f"runs_per_arm needs sd >= 0, gap > 0, 0 < alpha < 1, 0 < power < 1; "
                         f"got sd={sd}, gap={gap}, alpha={alpha}, power={power}")
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    return max(2, math.ceil(round(2 * (z * sd / gap) ** 2, 9)))  # round: 4.000...01 is 4


def pct_with_interval(value: float | None, interval=None) -> str:
    """A rate in percent with its interval in brackets, ``21.3 [17.0, 25.6]``; the number
    alone without an interval (metrics written before intervals existed), ``-`` without a value."""
    if value is None:
        return "-"
    text = f"{100 * value:.1f}"
    if interval is not None:
        low, high = interval
        text += f" [{100 * low:.1f}, {100 * high:.1f}]"
    return text
