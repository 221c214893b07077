"""How much the task's reward alone can tell good moves from bad: filters scored by a solver.

docs/expert-iteration.md, "Expert iteration on the task's reward". Expert iteration keeps some turns of the
policy's own play and fine-tunes on them. With the solver's per-turn label (``--keep best``)
every kept turn begins a shortest solution and the curve rises; with the episode's
outcome (``--keep winners``) it stayed flat. This script asks whether any filter built
from the reward alone (outcome, steps to the goal under a discount, comparison with the
other samples of the same level) would select moves nearly as well, by scoring each
filter with the solver's label (``Turn.best_first``) on saved trajectories, such as an
evaluation's ``trajectories.jsonl``. No model is run.

On FrozenLake a second score separates state selection from action selection: the share
of the four moves that begin a shortest solution in each kept turn's state, i.e. the
best-first rate a uniformly random move would have on the same states. A filter whose
kept turns beat it only by choosing easy states (near the goal, several best moves) has
little to teach about which move to make.

    python experiments/reward_filters.py runs/eval/trajectories.jsonl [--group 4] [--value]

``--value`` adds the label of ``spa iterate --keep value``: the turns whose first move has
the highest Monte-Carlo value at its state (the reward under random continuation on copies
of the environment, ``spa.envs.lookahead``), found by replaying each episode; it takes about a
minute for a thousand episodes.

With ``--value`` a second table gives, for each first move, how often it was played and how
often it was best when played (by value, and by the solver). A policy that does not yet
tell the states apart gains, under the policy gradient of the expected label, on the
move whose rate is highest, whatever the state (docs/making-rl-learn.md).

``--group`` splits each level's samples into groups of that size, as ``spa iterate
--samples`` plays them (the group filters compare only within a group).
"""

from __future__ import annotations

import json
from collections import defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Callable

import typer

from spa.agent.trajectory import Trajectory
from spa.envs.frozen_lake import ACTIONS, FrozenLakeEnv
from spa.agent.labels import label_turns

Episode = dict  # one trajectories.jsonl record
#: A filter gives each well-formed turn of a group's episodes a weight (0: dropped).
Filter = Callable[[list[Episode]], list[tuple[dict, float]]]


def steps(episode: Episode) -> int:
    return sum(len(turn["actions_valid"]) for turn in episode["turns"])


def turns(episode: Episode) -> list[dict]:
    return [turn for turn in episode["turns"] if turn["format_ok"]]


def discounted(episode: Episode, gamma: float) -> float:
    """The episode's return with the reward of 1 discounted by the steps taken to reach it."""
    return gamma ** (steps(episode) - 1) if episode["success"] else 0.0


def outcome(weight: Callable[[Episode], float]) -> Filter:
    """Every turn of an episode gets the episode's weight."""
    return lambda group: [(turn, weight(episode)) for episode in group for turn in turns(episode)]


def to_go(gamma: float) -> Filter:
    """A winner's turn weighted by the discount over the steps from the turn to the goal."""
    def weigh(group: list[Episode]) -> list[tuple[dict, float]]:
        rows = []
        for episode in (e for e in group if e["success"]):
            left = steps(episode)
            for turn in episode["turns"]:
                if turn["format_ok"]:
                    rows.append((turn, gamma ** (left - 1)))
                left -= len(turn["actions_valid"])
        return rows
    return weigh


def above_group(gamma: float) -> Filter:
    """The episodes whose discounted return beats their group's mean (GRPO's positive advantages)."""
    def weigh(group: list[Episode]) -> list[tuple[dict, float]]:
        returns = [discounted(e, gamma) for e in group]
        mean = sum(returns) / len(returns)
        return [(turn, 1.0) for e, r in zip(group, returns) if r > mean for turn in turns(e)]
    return weigh


def fastest(group: list[Episode]) -> list[tuple[dict, float]]:
    """The winner or winners of the group that took the fewest steps."""
    won = [steps(e) for e in group if e["success"]]
    return [(turn, 1.0) for e in group if e["success"] and steps(e) == min(won) for turn in turns(e)]


def label_by_value(episodes: list[Episode], rollouts: int, horizon: int) -> None:
    """Set each turn's ``value_first``, the label of ``spa iterate --keep value``, replaying
    all episodes once (a state's label does not depend on which episode reached it)."""
    replayed = [Trajectory.from_json(e) for e in episodes]
    label_turns(replayed, rollouts, horizon, tolerance=0.0, seed=0)
    for episode, trajectory in zip(episodes, replayed):
        for turn, labelled in zip(episode["turns"], trajectory.turns):
            turn["value_first"] = labelled.value_first


def by_value(group: list[Episode]) -> list[tuple[dict, float]]:
    """The turns whose first move is best by Monte-Carlo value (after :func:`label_by_value`)."""
    return [(turn, 1.0) for episode in group for turn in turns(episode) if turn["value_first"]]


FILTERS: dict[str, Filter] = {
    "all turns": outcome(lambda e: 1.0),
    "winners (spa iterate --keep winners)": outcome(lambda e: float(e["success"])),
    "losers": outcome(lambda e: float(not e["success"])),
    **{f"winners weighted by {g}^steps": outcome(lambda e, g=g: discounted(e, g)) for g in (0.9, 0.7)},
    **{f"winners weighted by {g}^steps-to-goal": to_go(g) for g in (0.9, 0.7)},
    **{f"return above the group's mean, gamma {g}": above_group(g) for g in (0.9, 0.7)},
    "fastest winners of each group": fastest,
}


def chance_of_best(turn: dict) -> float:
    """Share of the moves that begin a shortest solution in a FrozenLake turn's state
    (read from its grid: ``P`` player, ``_`` ice, ``O`` hole, ``G`` goal)."""
    return _chance_on_grid(turn["grid_before"])


@lru_cache(maxsize=None)  # every filter scores the same turns again
def _chance_on_grid(grid: str) -> float:
    env = FrozenLakeEnv.from_desc(grid.translate(str.maketrans({"P": "S", "_": "F", "O": "H"})).split("\n"))
    env.reset(seed=0)
    return len(env.best_actions() or ()) / len(ACTIONS)


def groups_of(episodes: list[Episode], size: int) -> list[list[Episode]]:
    by_level: dict[int, list[Episode]] = defaultdict(list)
    for episode in episodes:
        by_level[episode["seed"]].append(episode)
    out = []
    for level in by_level.values():
        level.sort(key=lambda e: e["sample"])
        out += [level[i:i + size] for i in range(0, len(level), size)]
    return out


def move_rates(episodes: list[Episode]) -> dict[str, tuple[int, float, float]]:
    """For each first move of the well-formed turns: (times played, share of them best by
    value, share best by the solver), most played first; needs :func:`label_by_value`."""
    plays: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    for episode in episodes:
        for turn in turns(episode):
            if turn["actions"]:
                plays[turn["actions"][0]].append((bool(turn["value_first"]), bool(turn["best_first"])))
    rates = {move: (len(rows), sum(v for v, _ in rows) / len(rows), sum(b for _, b in rows) / len(rows))
             for move, rows in plays.items()}
    return dict(sorted(rates.items(), key=lambda kv: -kv[1][0]))


def main(trajectories: Path, group: int = typer.Option(4, min=1, help="Samples per group."),
         value: Annotated[bool, typer.Option(help="Add the Monte-Carlo value label (spa iterate --keep value).")]
         = False,
         rollouts: Annotated[int, typer.Option(min=1, help="--value: continuations per action and state.")] = 128,
         horizon: Annotated[int, typer.Option(min=1, help="--value: actions per continuation.")] = 5) -> None:
    filters = {**FILTERS, f"first move best by value, {rollouts} x {horizon} (spa iterate --keep value)":
               by_value} if value else FILTERS
    episodes = [json.loads(line) for line in trajectories.read_text(encoding="utf-8").splitlines() if line]
    if value:
        label_by_value(episodes, rollouts, horizon)
    grouped = groups_of(episodes, group)
    print(f"{len(episodes)} episodes, success {100 * sum(e['success'] for e in episodes) / len(episodes):.1f}%")
    lake = episodes[0]["env"] == "frozenlake"
    print("| filter | turns kept | total weight | best first move (weighted) |"
          + (" a random move's rate on the same states |" if lake else "") + "\n|---|---|---|---|" + "---|" * lake)
    for name, weigh in filters.items():
        rows = [row for g in grouped for row in weigh(g) if row[1] > 0]
        total = sum(w for _, w in rows)
        best = sum(w for turn, w in rows if turn["best_first"]) / total if total else float("nan")
        chance = sum(w * chance_of_best(turn) for turn, w in rows) / total if lake and total else None
        print(f"| {name} | {len(rows)} | {total:.0f} | {100 * best:.1f}% |"
              + (f" {100 * chance:.1f}% |" if chance is not None else ""))
    if value:
        print("\n| first move | turns | best by value when played | best by the solver when played |\n|---|---|---|---|")
        for move, (count, by_value_rate, by_solver_rate) in move_rates(episodes).items():
            print(f"| {move} | {count} | {100 * by_value_rate:.1f}% | {100 * by_solver_rate:.1f}% |")


if __name__ == "__main__":
    typer.run(main)
