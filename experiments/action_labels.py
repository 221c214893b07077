"""The value label of every action an evaluation's episodes played, first and later ones apart.

docs/making-rl-learn.md, "How far the value label can lead". The value label of the
policy-gradient learner judges a turn's first action (``ppo.value_actions=first``) or each
action (``each``). This script labels every played action of saved trajectories (an
evaluation's ``trajectories.jsonl``) at the state it was played in, with
:func:`spa.agent.labels.label_actions` (no solver, no model), and prints one JSON object:

* ``first`` and ``later``: how many actions sit first in their turn or after it, and the
  share of them that is best by value;
* ``later_moves``: per move, how often it was played after a turn's first action and how
  often it was best there;
* ``agreement`` (with ``--agreement``): at each level's starting state, whether two
  look-aheads with different seeds pick the same best moves, and the median gap between
  the best and second-best value: how noisy the label is.

    python experiments/action_labels.py runs/RUN/eval/step-4/trajectories.jsonl [--agreement]
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from spa.agent.labels import label_actions
from spa.agent.trajectory import Trajectory
from spa.envs import make
from spa.envs.lookahead import action_values, best_by_value


def position_rates(trajectories: list[Trajectory], labels: list) -> dict:
    """Plays and best-by-value share of first and later actions, and of each later move."""
    plays, best, moves, moves_best = Counter(), Counter(), Counter(), Counter()
    for trajectory, episode in zip(trajectories, labels):
        for turn, turn_labels in zip(trajectory.turns, episode):
            for k, (action, (is_best, _)) in enumerate(zip(turn.actions, turn_labels)):
                where = "first" if k == 0 else "later"
                plays[where] += 1
                best[where] += is_best
                if where == "later":
                    moves[action] += 1
                    moves_best[action] += is_best
    share = lambda hits, total: round(hits / total, 3) if total else None  # noqa: E731
    return {**{where: {"plays": plays[where], "best": share(best[where], plays[where])} for where in ("first", "later")},
            "later_moves": {move: {"plays": n, "best": share(moves_best[move], n)} for move, n in moves.most_common()}}


def agreement(trajectories: list[Trajectory], rollouts: int, horizon: int) -> dict:
    """At each distinct level's starting state, two look-aheads with different seeds: the
    share that pick the same best moves, and the median gap between the best two values."""
    same, gaps, levels = 0, [], {}
    for t in trajectories:
        levels.setdefault((t.env, json.dumps(t.env_config, sort_keys=True), t.seed), t)
    for n, t in enumerate(levels.values()):
        env = make(t.env, **t.env_config)
        env.reset(seed=t.seed)
        first, second = (action_values(env, rollouts, horizon, np.random.default_rng((draw, n))) for draw in (1, 2))
        same += best_by_value(first) == best_by_value(second)
        top = sorted(first.values(), reverse=True)
        gaps.append(top[0] - top[1] if len(top) > 1 else 0.0)
    return {"states": len(levels), "same_best": round(same / max(len(levels), 1), 3),
            "median_gap": round(float(np.median(gaps)), 3) if gaps else None}


def main(trajectories: Path,
         rollouts: Annotated[int, typer.Option(min=1, help="Continuations per action and state.")] = 128,
         horizon: Annotated[int, typer.Option(min=1, help="Actions per continuation.")] = 5,
         seed: Annotated[int, typer.Option(help="Seed of the look-ahead.")] = 0,
         with_agreement: Annotated[bool, typer.Option("--agreement", help="Also the label's agreement with "
                                                      "itself at the starting states.")] = False) -> None:
    episodes = [Trajectory.from_json(json.loads(line)) for line in trajectories.read_text().splitlines() if line]
    result = {"file": str(trajectories), "episodes": len(episodes),
              **position_rates(episodes, label_actions(episodes, rollouts, horizon, 0.0, seed))}
    if with_agreement:
        result["agreement"] = agreement(episodes, rollouts, horizon)
    print(json.dumps(result))


if __name__ == "__main__":
    typer.run(main)
