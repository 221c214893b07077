"""Replicate runs in ``spa compare``: runs grouped by recipe, means with bootstrap intervals
over levels and seeds, and Pass@k against k before and after RL.

Two runs are replicates when their saved recipes (``config.yaml``) agree on every key but
the seeds (``SEED_KEYS``) and the keys that change no result (``keep_optimizer``). A key a
saved recipe lacks (written before the key existed) reads as its default, as a resumed run
reads it, so a new setting left at its default does not split a group.
Per-level scores come from each evaluation's ``trajectories.jsonl`` (the unit of the
interval is the level, as in :func:`spa.eval.metrics.pass_at_k_interval`: the samples of
a level are not independent).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
import yaml  # noqa: E402

from spa.config import with_defaults  # noqa: E402
from spa.eval.metrics import (bootstrap_difference, bootstrap_interval, pass_at_k, pct_with_interval,  # noqa: E402
                              pooled_sd, runs_per_arm)
from spa.eval.paired import LEVELS, read_evaluation, signed_pct_with_interval  # noqa: E402
from spa.pipeline.layout import BEFORE_RL, eval_dir  # noqa: E402
from spa.pipeline.recipe import RESULT_NEUTRAL_KEYS, Recipe  # noqa: E402
from spa.rl.expert_iteration import LABEL  # noqa: E402

#: The recipe keys that tell replicates apart (dotted).
SEED_KEYS = ("seed", "selfplay.seed", "sft.seed", "ppo.seed", "rwml.seed", "iterate.seed")
#: The evaluated models of a comparison: column label and the stages that evaluate it.
MODELS = (("base", ("eval_base",)), ("before RL", BEFORE_RL), ("final", ("eval_final",)))


def _flatten(data: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def saved_recipe(config_text: str) -> dict:
    """A saved recipe (``config.yaml``'s text) as plain data, with the keys it lacks at their
    defaults (:func:`spa.config.with_defaults`)."""
    return with_defaults(Recipe, yaml.safe_load(config_text) or {})


def recipe_key(config_text: str) -> str:
    """The saved recipe without its seeds and result-neutral keys, as canonical JSON. An
    empty mapping reads as unset (``env.options: {}`` and ``null`` are one recipe)."""
    flat = _flatten(saved_recipe(config_text))
    return json.dumps({k: None if v == {} else v for k, v in flat.items() if k not in SEED_KEYS + RESULT_NEUTRAL_KEYS},
                      sort_keys=True, default=str)


def seeds_of(config_text: str) -> tuple:
    """The values of ``SEED_KEYS`` in a saved recipe (missing: None)."""
    flat = _flatten(yaml.safe_load(config_text) or {})
    return tuple(flat.get(k) for k in SEED_KEYS)


def group_runs(runs: list[dict]) -> list[list[dict]]:
    """Runs (``report.load_run`` dicts) grouped by :func:`recipe_key`, groups and runs in
    the order given. A run without a saved recipe is a group of its own."""
    groups: dict[str, list[dict]] = {}
    for run in runs:
        key = recipe_key(run["config"]) if run["config"] else f"no recipe: {run['dir']}"
        groups.setdefault(key, []).append(run)
    return list(groups.values())


def final_mode(run: dict) -> str | None:
    """The mode of the final evaluation; before it exists, the mode every evaluation stage
    runs first (the RL mode; the world-model mode, when also evaluated, comes after)."""
    finals = [mode for (stage, mode) in run["evals"] if stage == "eval_final"]
    return next(iter(finals or [mode for (_, mode) in run["evals"]]), None)


def model_eval(run: dict, stages: tuple[str, ...], mode: str | None) -> tuple[str, dict] | None:
    """``(stage, metrics)`` of the first of ``stages`` the run evaluated in ``mode``."""
    return next(((s, run["evals"][(s, mode)]) for s in stages if (s, mode) in run["evals"]), None)


def level_counts(trajectories: str | Path) -> tuple[tuple[int, int], ...] | None:
    """``(samples, successes)`` of each level in an evaluation's ``trajectories.jsonl``, or
    in the ``levels.json`` beside it (an archived run); None when neither is there."""
    table = level_table(trajectories)
    return None if table is None else tuple(table[1].values())


def level_table(trajectories: str | Path) -> tuple[dict, dict[int, tuple[int, int]]] | None:
    """``(played, {level seed: (samples, successes)})`` of an evaluation (``played``: the
    environment and its options), from :func:`level_outcomes`."""
    found = level_outcomes(trajectories)
    return found and (found[0], {seed: (len(outcomes), sum(outcomes)) for seed, outcomes in found[1].items()})


def level_outcomes(trajectories: str | Path) -> tuple[dict, dict[int, tuple[bool, ...]]] | None:
    """``(played, {level seed: one success per sample})`` of an evaluation, as
    :func:`level_counts` finds it. Read once per version of the file: the tables and the
    plot all need it, and a file of 128 x 8 episodes takes a while to parse."""
    found = _read_cached(trajectories)
    return found and found[:2]


def level_best_first(trajectories: str | Path) -> dict[int, tuple[int, int]] | None:
    """``{level seed: (best-first turns, scored turns)}`` of an evaluation, as
    :func:`level_outcomes` finds it; None where it scored no turn or is not there."""
    found = _read_cached(trajectories)
    return (found and found[2]) or None


def _read_cached(trajectories: str | Path) -> tuple | None:
    path = Path(trajectories)
    if not path.is_file():
        path = path.with_name(LEVELS)
        if not path.is_file():
            return None
    stat = path.stat()
    return _read_evaluation(str(path.parent), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=256)
def _read_evaluation(folder: str, _mtime_ns: int, _size: int) -> tuple[dict, dict, dict]:
    played, levels, best = read_evaluation(folder)
    return (played, {seed: tuple(outcomes) for seed, outcomes in levels.items()},
            {seed: tuple(counts) for seed, counts in best.items()})


def trajectories_path(run: dict, stage: str, mode: str) -> Path:
    """The ``trajectories.jsonl`` of one evaluation of a run (an archived run keeps its
    ``levels.json`` there instead)."""
    return eval_dir(run["dir"], stage, mode) / "trajectories.jsonl"


def eval_counts(run: dict, stage: str, mode: str) -> tuple[tuple[int, int], ...] | None:
    """:func:`level_counts` of one evaluation of a run."""
    return level_counts(trajectories_path(run, stage, mode))


def per_level(run: dict, stage: str, mode: str, k: int) -> list[float] | None:
    """Each level's Pass@k in one evaluation of a run; None without trajectories or with
    fewer than ``k`` samples per level."""
    counts = eval_counts(run, stage, mode)
    if not counts or min(n for n, _ in counts) < k:
        return None
    return [pass_at_k(n, c, k) for n, c in counts]


def reached(group: list[dict], stages: tuple[str, ...], k: int):
    """``(run, stage, metrics)`` of each run of a group whose first of ``stages`` evaluated
    in its final mode (:func:`model_eval`) recorded Pass@k."""
    for run in group:
        hit = model_eval(run, stages, final_mode(run))
        if hit and f"pass@{k}" in hit[1].get("pass_at_k", {}):
            yield run, *hit


def group_cell(group: list[dict], stages: tuple[str, ...], k: int, resamples: int) -> str:
    """Pass@k of one evaluated model over a group's runs: :func:`replicate_cell` of the
    first of ``stages`` each run evaluated."""
    found = [(metrics, per_level(run, stage, final_mode(run), k)) for run, stage, metrics in reached(group, stages, k)]
    return replicate_cell(found, len(group), k, resamples)


def replicate_cell(found: list[tuple[dict, list[float] | None]], runs: int, k: int, resamples: int) -> str:
    """:func:`replicate_estimate` as ``mean [low, high]`` in percent; ``(n=...)`` marks a
    cell that fewer than the group's ``runs`` reached (unfinished runs), ``-`` one none did."""
    if not found:
        return "-"
    suffix = f" (n={len(found)})" if len(found) < runs else ""
    return pct_with_interval(*replicate_estimate(found, k, resamples)) + suffix


def replicate_estimate(found: list[tuple[dict, list[float] | None]], k: int,
                       resamples: int) -> tuple[float, tuple[float, float] | None]:
    """Pass@k of one evaluated model of a group and its 95% interval, from the
    ``(metrics.json, per-level Pass@k or None)`` of each run that evaluated it.

    Several runs: :func:`spa.eval.metrics.bootstrap_interval` over seeds and levels. One
    run: its own number and per-level interval (normal approximation), as in the per-run
    table. Runs without per-level results give the mean alone, with no interval.
    """
    name = f"pass@{k}"
    if len(found) == 1:
        metrics = found[0][0]
        return metrics["pass_at_k"][name], metrics.get("pass_at_k_ci95", {}).get(name)
    levels = [scores for _, scores in found]
    if any(scores is None for scores in levels):
        return sum(m["pass_at_k"][name] for m, _ in found) / len(found), None
    centre, low, high = bootstrap_interval(levels, resamples=resamples)
    return centre, (low, high)


def group_levels(group: list[dict], stages: tuple[str, ...], k: int) -> tuple[str, list[list[float]]] | None:
    """What one evaluated model of a group played, and Pass@k per level for each run that
    evaluated it (levels in seed order): ``(played, scores)``, ``played`` the environment,
    its options and the level seeds as JSON. None when no run has per-level results, or
    when its runs played different levels or too few samples for ``k``."""
    played, scores = set(), []
    for run in group:
        hit = model_eval(run, stages, final_mode(run))
        table = level_table(trajectories_path(run, hit[0], final_mode(run))) if hit else None
        if table is None:
            continue
        env, levels = table
        if min(n for n, _ in levels.values()) < k:
            return None
        played.add(json.dumps({**env, "levels": sorted(levels)}, sort_keys=True))
        scores.append([pass_at_k(*levels[seed], k) for seed in sorted(levels)])
    return (played.pop(), scores) if len(played) == 1 else None


def difference_cell(group: list[dict], reference: list[dict], stages: tuple[str, ...], k: int,
                    resamples: int, seed_sd: float | None = None) -> str:
    """Pass@k of one evaluated model, ``group`` minus ``reference`` in points, with the 95%
    interval of :func:`spa.eval.metrics.bootstrap_difference`; ``-`` unless both groups
    evaluated it on the same levels. ``seed_sd`` (a fraction) stands in for the seed spread
    of a side with one run; the cell then names it, ``(1 vs 3, seed SD 5.4)``."""
    ours, theirs = group_levels(group, stages, k), group_levels(reference, stages, k)
    if ours is None or theirs is None or ours[0] != theirs[0]:
        return "-"
    single = min(len(ours[1]), len(theirs[1])) == 1
    used = seed_sd if single else None
    difference, low, high = bootstrap_difference(ours[1], theirs[1], resamples=resamples, seed_sd=used)
    shown = "" if used is None else f", seed SD {100 * used:.1f}"
    return signed_pct_with_interval(difference, (low, high)) + f" ({len(ours[1])} vs {len(theirs[1])}{shown})"


def replicate_scores(groups: list[list[dict]], stages: tuple[str, ...], k: int) -> dict[tuple, list[list[float]]]:
    """Pass@k of one evaluated model of each run, for the groups with two or more runs that
    reached it, collected per RL setting (:func:`_rl_setting`): what a seed spread is pooled over."""
    settings: dict[tuple, list[list[float]]] = {}
    for group in groups:
        scores = [metrics["pass_at_k"][f"pass@{k}"] for _, _, metrics in reached(group, stages, k)]
        if len(scores) > 1:
            settings.setdefault(_rl_setting(group[0]), []).append(scores)
    return settings


def difference_table(groups: list[list[dict]], resamples: int = 10_000) -> str | None:
    """Each group against plain RL: the vanilla group that plays RL and its evaluations in
    the same environment, with the same options, and has the same RL stage (``rl``); Pass@1
    before RL and Pass@1 / Pass@8 of the final model. None without such pairs."""
    rows = []
    recipes = [(summary(group[0]), _rl_setting(group[0])) for group in groups]  # each saved recipe parsed once
    columns = ((BEFORE_RL, 1), (("eval_final",), 1), (("eval_final",), 8))
    spreads = [{setting: pooled_sd(scores)[0] for setting, scores in replicate_scores(groups, stages, k).items()}
               for stages, k in columns]
    for i, (group, ((method, env), setting)) in enumerate(zip(groups, recipes), 1):
        reference = next((j for j, ((other, _), other_setting) in enumerate(recipes, 1)
                          if j != i and other == "vanilla" and other_setting == setting), None)
        if method == "vanilla" or reference is None:
            continue
        cells = [difference_cell(group, groups[reference - 1], stages, k, resamples, spread.get(setting))
                 for (stages, k), spread in zip(columns, spreads)]
        rows.append(f"| G{i} ({method}) | G{reference} | {env} | " + " | ".join(cells) + " |")
    if not rows:
        return None
    return "\n".join(["| group | minus | env | before RL Pass@1 | final Pass@1 | final Pass@8 |",
                      "|---|---|---|---:|---:|---:|", *rows])


#: The differences of final Pass@1, in points, that :func:`spread_table` sizes seeds for.
GAPS = (10, 20, 30)


def spread_table(groups: list[list[dict]]) -> str | None:
    """How much a final Pass@1 varies from seed to seed, per environment and RL stage
    (:func:`_rl_setting`): the standard deviation within groups, pooled over the groups that
    have two or more finished runs (:func:`spa.eval.metrics.pooled_sd`), and the runs per
    arm it takes to tell two recipes apart by each of ``GAPS``
    (:func:`spa.eval.metrics.runs_per_arm`, 5% two-sided, 80% power). None without such
    groups."""
    rows = []
    for (env, options, rl), finals in replicate_scores(groups, ("eval_final",), 1).items():
        finals = [[100 * score for score in scores] for scores in finals]
        sd, df = pooled_sd(finals)
        seeds = " / ".join(str(runs_per_arm(sd, gap)) for gap in GAPS)
        shown = "" if options == "{}" else f" {options}"
        rows.append(f"| {env}{shown} | {rl} | {len(finals)} | {sum(map(len, finals))} | {sd:.1f} | {df} | {seeds} |")
    if not rows:
        return None
    return "\n".join(["| env | RL | groups | runs | SD of final Pass@1 (points) | df "
                      f"| runs per arm for a gap of {' / '.join(map(str, GAPS))} points |",
                      "|---|---|---:|---:|---:|---:|---:|", *rows])


def _rl_setting(run: dict) -> tuple[str, str, str]:
    """The environment, its options and the RL stage of the run's RL and evaluations, as
    its saved recipe names them (``env.rl_options`` when set: a transfer recipe); expert
    iteration with the signal its rounds keep turns by (``spa.rl.expert_iteration.LABEL``),
    so that rounds on a solver's label and on the reward's values are not pooled or paired."""
    data = saved_recipe(run["config"] or "")
    env = data["env"]
    options = env["rl_options"] if env["rl_options"] is not None else env["options"] or {}
    rl = str(data["rl"])
    if rl == "iterate":
        keep = data["iterate"]["keep"]
        rl = f"iterate, {LABEL.get(keep, keep)} label"
    return str(env["name"]), json.dumps(options, sort_keys=True), rl


def rl_label(run: dict) -> str:
    """The RL stage of a run's saved recipe as :func:`_rl_setting` names it, e.g.
    ``iterate, value label``: what tells apart groups of one method and environment."""
    return _rl_setting(run)[2]


def summary(run: dict) -> tuple[str, str]:
    """``(method, env name)`` of a run's saved recipe."""
    data = yaml.safe_load(run["config"] or "") or {}
    return str(data.get("method", "?")), str((data.get("env") or {}).get("name", "?"))


def _shown(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def cut(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, an ellipsis marking the cut: a plot's label."""
    return text if len(text) <= width else text[:width - 1] + "…"


def variants(groups: list[list[dict]]) -> list[str]:
    """What sets each group apart from the largest group of its method and environment (the
    first of them on a tie): the recipe keys whose values differ from that group's, as
    ``key=value`` (the overrides that would turn one recipe into the other), seeds and
    result-neutral keys left out; ``-`` for that group itself. Method and environment
    alone do not tell an ablation from the recipe it ablates."""
    recipes = [json.loads(recipe_key(group[0]["config"])) if group[0]["config"] else {} for group in groups]
    kinds = [summary(group[0]) for group in groups]  # parsed once: the peers' test runs for every pair
    labels = []
    for kind, recipe in zip(kinds, recipes):
        peers = [i for i, other in enumerate(kinds) if other == kind]
        reference = recipes[max(peers, key=lambda i: len(groups[i]))]  # max keeps the first on a tie
        # An unset mapping flattens to one key (``env.rl_options: null``) that a filled one
        # lacks (``env.rl_options.size``): absent there, not a difference of its own.
        keys = sorted(key for key in recipe.keys() | reference.keys() if recipe.get(key) != reference.get(key))
        labels.append(", ".join(f"{key}={_shown(recipe.get(key))}" for key in keys) or "-")
    return labels


def group_table(groups: list[list[dict]], resamples: int = 10_000) -> str:
    """One row per group: method, env, variant (:func:`variants`), mode, RL stage, seeds,
    Pass@1 and Pass@8 of each model, runs."""
    rows = ["| group | method | env | variant | mode | RL | seeds | base Pass@1 | base Pass@8 | before RL Pass@1 "
            "| before RL Pass@8 | final Pass@1 | final Pass@8 | runs |",
            "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for i, (group, variant) in enumerate(zip(groups, variants(groups)), 1):
        method, env = summary(group[0])
        distinct = len({seeds_of(run["config"]) for run in group})
        seeds = f"{len(group)}" + (f" ({distinct} distinct)" if distinct < len(group) else "")
        cells = [group_cell(group, stages, k, resamples) for _, stages in MODELS for k in (1, 8)]
        rows.append(f"| G{i} | {method} | {env} | {variant} | {final_mode(group[0]) or '-'} | {rl_label(group[0])} "
                    f"| {seeds} | "
                    + " | ".join(cells)
                    + f" | {', '.join(run['name'] for run in group)} |")
    return "\n".join(rows)


def passk_curve(group: list[dict], stages: tuple[str, ...]) -> list[float]:
    """Mean Pass@k for k = 1..n (n: the fewest samples per level among the group's runs) of
    one evaluated model, each run weighing the same; empty when no run has its trajectories."""
    levels = []
    for run in group:
        hit = model_eval(run, stages, final_mode(run))
        counts = eval_counts(run, hit[0], final_mode(run)) if hit else None
        if counts:
            levels.append(counts)
    if not levels:
        return []
    top = min(n for counts in levels for n, _ in counts)
    return [sum(sum(pass_at_k(n, c, k) for n, c in counts) / len(counts) for counts in levels) / len(levels)
            for k in range(1, top + 1)]


def plot_passk(groups: list[list[dict]], path: Path) -> Path:
    """``passk.png``: one panel per group, Pass@k against k for the base model (dotted),
    the model before RL (dashed) and the final model (solid). Plain RL that sharpens the
    policy raises the solid line's left end and flattens it; the paper reports SPA raising
    it everywhere."""
    columns = min(len(groups), 4)
    rows = -(-len(groups) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.8 * rows), sharey=True, squeeze=False)
    for ax in axes.flat[len(groups):]:
        ax.axis("off")
    for i, (group, variant, ax) in enumerate(zip(groups, variants(groups), axes.flat), 1):
        for (label, stages), style, color in zip(MODELS, (":", "--", "-"), ("tab:gray", "tab:blue", "tab:red")):
            curve = passk_curve(group, stages)
            if curve:  # the same style and colour for a model in every panel
                ax.plot(range(1, len(curve) + 1), curve, style, color=color, marker="o", markersize=3, label=label)
        method, env = summary(group[0])
        title = f"G{i}: {method} {env} ({len(group)} seed{'s' * (len(group) > 1)})"
        if variant != "-":  # the overrides on a second line, cut to the panel's width
            title += "\n" + cut(variant, 44)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("k")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("Pass@k")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
