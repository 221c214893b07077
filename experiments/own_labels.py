"""Correct moves from the model's own samples against an oracle's, as SFT data.

docs/making-rl-learn.md, "Correct moves from the model's own samples". The model plays random 3x3 lakes
that do not slip (the ``state`` prompt, 4 turns of 1 move, the behaviour-cloning lakes);
every turn whose first move begins a shortest path (``Turn.best_first``) becomes an SFT
example with the model's own response. ``--single`` keeps only one-move answers;
``--relabel`` replaces each kept answer by the templated answer of a move drawn uniformly
from the environment's best moves in that state (the oracle's labels on the model's
states). This isolates what on-policy RL trains on, its own winning samples, from what
behaviour cloning trains on.

    python experiments/own_labels.py MODEL OUT.jsonl [--samples 4] [--cap 809] [--single] [--relabel]
"""

from __future__ import annotations

import json
import random
from collections import Counter

import typer

from spa import envs, precision
from spa.agent.prompts import PromptConfig
from spa.agent.rollout import RolloutConfig, rollout
from spa.agent.trajectory import Trajectory
from spa.agent.seeds import train_seeds
from spa.cli.common import load
from spa.models.engine import Engine, SamplingParams

ENV_CONFIG = {"size": 3, "is_slippery": False}


def best_moves(trajectory: Trajectory, turn: int) -> list[str]:
    """The environment's best moves before ``turn``, found by replaying the episode's
    earlier actions from its seed (the lakes do not slip, so the replay is exact)."""
    env = envs.make("frozenlake", **ENV_CONFIG)
    env.reset(seed=trajectory.seed)
    for earlier in trajectory.turns[:turn]:
        for action in earlier.actions:
            env.step(action)
    return sorted(env.best_actions())


def main(model: str, out: str, samples: int = 4, lakes: int = 400, cap: int = 809, single: bool = False,
         relabel: bool = False, seed: int = 0) -> None:
    lm, tokenizer = load(model, "fp32", announce=False)
    engine = Engine(lm, tokenizer, dtype=precision.resolve("auto", next(lm.parameters()).device).decode_dtype)
    config = RolloutConfig("frozenlake", ENV_CONFIG, PromptConfig("state", 4, 1, 0))
    trajectories = rollout(engine, tokenizer, train_seeds(lakes, 0), samples, config,
                           SamplingParams(max_new_tokens=64, temperature=1.0, seed=seed))
    kept = [(t, k) for t in trajectories for k, turn in enumerate(t.turns) if turn.format_ok and turn.best_first]
    random.Random(seed).shuffle(kept)
    kept = [(t, k) for t, k in kept if not (single and "||" in t.turns[k].answer)][:cap]
    rng = random.Random(seed)
    moves: Counter[str] = Counter()
    with open(out, "w", encoding="utf-8") as lines:
        for t, k in kept:
            turn = t.turns[k]
            actions, response = turn.actions, turn.response
            if relabel:
                move = rng.choice(best_moves(t, k))
                actions, response = [move], f"<think>I will try {move}.</think><answer>{move}</answer>"
            lines.write(json.dumps({"messages": turn.prompt_messages, "response": response, "env": t.env,
                                    "seed": t.seed, "sample": t.sample, "turn": k, "actions": actions,
                                    "state_before": turn.state_before, "state_after": turn.state_after}) + "\n")
            moves[actions[0]] += 1
    print(f"{len(kept)} examples of {sum(len(t.turns) for t in trajectories)} turns; first moves {dict(moves)}")


if __name__ == "__main__":
    typer.run(main)
