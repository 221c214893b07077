"""The data side of RWML (Yu et al., 2026, "Reinforcement World Model Learning", seed 003).

RWML turns the policy's own rollouts into ``<s_<=t, a_t, s_t+1>`` triplets, subsamples the
"too easy" ones, and trains the policy with GRPO to predict ``s_t+1`` given the history
and the action (the reward lives in ``spa.rl.rewards``). Here:

* ``Triplet`` and ``triplets_from_trajectories``: one triplet per turn that applied at
  least one valid action and was well formatted;
* ``world_model_messages``: the chat prompt asking for the next state inside
  ``<prediction>..</prediction>``;
* ``filter_too_easy``: a triplet is easy when all K predictions of a filter model lie
  within distance tau of the truth; easy ones are kept with probability ``keep_prob``
  (paper: 0.1);
* ``collect_triplets`` (training data: play, extract, dedupe, filter),
  ``eval_triplets`` (held-out transitions), ``prompt_ids``, save/load and the data
  ``fingerprint`` that guards a resumed run.

Departure: our "action" is a turn's list of valid actions (a turn may hold several,
joined by ``||``), since the state after the turn is what the environment reports.
Invalid actions change nothing, so leaving them out keeps the transition exact.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

from spa.agent.grids import state_distance
from spa.agent.parsing import ACTION_SEPARATOR
from spa.agent.prompts import example_turn
from spa.agent.seeds import eval_seeds
from spa.envs import make
from spa.envs.base import TextEnv
from spa.io import write_jsonl
from spa.rl.rewards import embedding_distances
from spa.rl.rwml_config import RWMLConfig
from spa.worldmodel.selfplay import SelfPlayConfig, collect, random_exploration


#: Distance of the default filter (``1 - state_match``) below which a prediction counts
#: as right: 0.05 forgives a few wrong wall or floor cells (1/72 each in 6x6 Sokoban)
#: but no misplaced entity (the player one step off is at about 0.19).
DEFAULT_FILTER_TAU = 0.05

#: A batched distance: (predictions, truths) -> one distance per pair.
Distance = Callable[[list, list], Sequence[float]]


@dataclass
class Triplet:
    """One transition ``<history, actions, next state>`` of a rollout."""

    env: str
    env_config: dict
    seed: int
    turn: int  # index of the turn in its episode (0 = first)
    state_before: str  # grid + coordinates the actions were applied to
    actions: list[str]  # the turn's valid actions, in the order applied
    next_state: str  # grid + coordinates after them
    # earlier turns as (state, valid actions), oldest first
    history: list[tuple[str, list[str]]] = field(default_factory=list)
    group: int = 0
    sample: int = 0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, record: dict) -> "Triplet":
        record = dict(record)
        record["history"] = [(state, list(actions)) for state, actions in record.get("history", [])]
        return cls(**record)


def _valid_actions(turn) -> list[str]:
    return [a for a, ok in zip(turn.actions, turn.actions_valid) if ok]


def triplets_from_trajectories(trajectories, history_turns: int | None = 0,
                               require_format: bool = True) -> list[Triplet]:
    """One ``Triplet`` per usable turn of ``trajectories`` (``spa.agent.trajectory.Trajectory``).

    A turn is dropped when none of its actions was valid (the "transition" would be the
    identity, which teaches copying) or, with ``require_format``, when its response was
    malformed. ``history_turns`` earlier turns of the episode (dropped ones included:
    they happened) go into ``history``; 0, the default, keeps none because these
    environments are fully observable, so the current state is all a world model needs
    and prompts stay short; ``None`` keeps the whole episode.
    """
    if history_turns is not None and history_turns < 0:
        raise ValueError(f"history_turns={history_turns!r} must be >= 0 or None")
    triplets = []
    for trajectory in trajectories:
        for index, turn in enumerate(trajectory.turns):
            actions = _valid_actions(turn)
            if not actions or (require_format and not turn.format_ok):
                continue
            first = 0 if history_turns is None else max(0, index - history_turns)
            history = [(t.state_before, _valid_actions(t)) for t in trajectory.turns[first:index]]
            triplets.append(Triplet(
                env=trajectory.env, env_config=dict(trajectory.env_config), seed=trajectory.seed,
                turn=index, state_before=turn.state_before, actions=actions,
                next_state=turn.state_after, history=history,
                group=trajectory.group, sample=trajectory.sample,
            ))
    return triplets


@lru_cache(maxsize=64)
def _env(name: str, config_json: str) -> TextEnv:
    return make(name, **json.loads(config_json))


def _triplet_env(triplet: Triplet) -> TextEnv:
    """An environment of the triplet's kind and options, built once per kind (never stepped)."""
    return _env(triplet.env, json.dumps(triplet.env_config, sort_keys=True))


def env_rules(triplet: Triplet) -> str:
    """The rules text of the triplet's environment, as the agent's prompts show it."""
    return _triplet_env(triplet).rules()


def _actions_text(actions: list[str]) -> str:
    return f" {ACTION_SEPARATOR} ".join(actions) if actions else "(no valid action)"


def worked_example(triplet: Triplet) -> str:
    """One complete, correct question and answer on the example level of the triplet's
    environment (``spa.agent.prompts.example_turn``, a level no run trains or is evaluated
    on): its state, two actions, and the true next state inside ``<prediction>``, which
    ``extract_prediction`` reads. A concrete answer rather than a template: SmolLM2-135M
    copies placeholder text such as "the state after the actions" as its answer, which
    earns no reward and leaves GRPO without a signal."""
    before, played, after = example_turn(_triplet_env(triplet))  # cached by example_turn
    return (f"Current state:\n{before}\nActions: {_actions_text(played)}\n"
            f"Answer: <think>I apply {' then '.join(played)}.</think><prediction>{after}</prediction>")


def world_model_messages(triplet: Triplet, rules: str | None = None) -> list[dict]:
    """Chat messages asking the model to predict ``triplet.next_state``.

    System: the environment's rules (``rules``, or the env's own ``rules()``), the
    world-model role and the answer format, shown by ``worked_example``. User: the kept
    history, the current state and the actions. The state format is the env's
    ``state_text()`` (grid, then the coordinate line), which the prediction must reproduce.
    """
    rules = env_rules(triplet) if rules is None else rules
    system = (
        f"{rules}\n\nYou are the world model of this environment. Given the current state "
        "and the actions taken from it, predict the state that results. Actions are "
        "applied in the order given. Write the predicted state in exactly the format of "
        "the current state: the grid, one row per line, then the line of coordinates. "
        f"Answer in exactly this format, as in this example (with the states of the "
        f"question):\n{worked_example(triplet)}"
    )
    parts = []
    if triplet.history:
        parts.append("Earlier turns, oldest first:")
        for i, (state, actions) in enumerate(triplet.history):
            turn = triplet.turn - len(triplet.history) + i + 1
            parts.append(f"Turn {turn} state:\n{state}\nActions: {_actions_text(actions)}")
    parts.append(f"Turn {triplet.turn + 1}. Current state:\n{triplet.state_before}")
    parts.append(f"Actions: {_actions_text(triplet.actions)}\n"
                 "Predict the state after these actions.")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


def state_distances(predictions: list, truths: list) -> list[float]:
    """The default filter distance, ``state_distance`` per pair (deterministic, no model)."""
    return [state_distance(p, t) for p, t in zip(predictions, truths)]


def filter_too_easy(
    triplets: list[Triplet],
    predict: Callable[[list[Triplet], int], list[list[str | None]]],
    *,
    k: int = 8,
    tau: float = DEFAULT_FILTER_TAU,
    keep_prob: float = 0.1,
    distance: Distance = state_distances,
    rng: int | random.Random = 0,
) -> tuple[list[Triplet], dict]:
    """Subsample RWML's "too easy" triplets: those a filter model already predicts.

    ``predict(triplets, k)`` returns, per triplet, ``k`` predicted next-state texts
    (already extracted, e.g. with ``spa.rl.rewards.extract_prediction``; ``None`` is a
    miss). A triplet is easy when every prediction has ``distance < tau`` (the reward's
    strict inequality, so with the reward's own distance and tau "easy" means "every
    sample earns reward 1"). Easy triplets are kept with probability ``keep_prob``;
    the rest always are, in their order.

    ``k = 8`` matches the GRPO group size: a group in which all 8 samples earn reward 1
    has zero advantage and teaches nothing, which is why the paper drops them.
    Returns ``(kept, stats)`` with counts ``triplets, easy, hard, easy_kept, dropped,
    kept``.
    """
    if k < 1:
        raise ValueError(f"k={k!r} must be at least 1")
    if not 0.0 <= keep_prob <= 1.0:
        raise ValueError(f"keep_prob={keep_prob!r} is out of range; allowed: 0 to 1")
    rng = rng if isinstance(rng, random.Random) else random.Random(rng)
    predictions = predict(triplets, k) if triplets else []
    if len(predictions) != len(triplets) or any(len(p) != k for p in predictions):
        raise ValueError(
            f"predict must return {k} predictions for each of the {len(triplets)} triplets; "
            f"got {[len(p) for p in predictions]}"
        )
    flat_pred = [p for group in predictions for p in group]
    flat_true = [t.next_state for t in triplets for _ in range(k)]
    dists = list(distance(flat_pred, flat_true))
    kept, easy, easy_kept = [], 0, 0
    for i, triplet in enumerate(triplets):
        if all(d < tau for d in dists[i * k:(i + 1) * k]):
            easy += 1
            if rng.random() >= keep_prob:  # random() < 1 always, so keep_prob 1 keeps all
                continue
            easy_kept += 1
        kept.append(triplet)
    stats = {"triplets": len(triplets), "easy": easy, "hard": len(triplets) - easy,
             "easy_kept": easy_kept, "dropped": easy - easy_kept, "kept": len(kept)}
    return kept, stats


# ---------------------------------------------------------------------------- data sets


def prompt_ids(tokenizer, triplet: Triplet) -> list[int]:
    """The chat-templated world-model prompt of ``triplet`` (``world_model_messages``)."""
    ids = tokenizer.apply_chat_template(world_model_messages(triplet), add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _key(triplet: Triplet) -> str:
    """What makes two triplets the same example: their prompt and their target."""
    return json.dumps([triplet.env, triplet.env_config, triplet.history, triplet.turn, triplet.state_before,
                       triplet.actions, triplet.next_state], sort_keys=True)


def dedupe(triplets: list[Triplet]) -> list[Triplet]:
    """The first of every set of identical triplets (same prompt, same next state), in order."""
    seen: set[str] = set()
    out = []
    for t in triplets:
        if _key(t) not in seen:
            seen.add(_key(t))
            out.append(t)
    return out


def collect_triplets(env: str, env_config: dict, config: RWMLConfig, engine=None, tokenizer=None,
                     predict=None, embedder=None, on_turn=None) -> tuple[list[Triplet], dict]:
    """Play the training seeds, extract triplets, dedupe and filter them; returns (triplets, stats).

    ``engine``/``tokenizer`` play for ``self_play``; ``predict`` (``sampling_predictor``)
    is the filter model, needed when ``config.filter``; ``embedder`` when the filter
    distance is ``embedding``.
    """
    selfplay = SelfPlayConfig(env=env, env_config=dict(env_config), episodes=config.episodes,
                              samples=config.samples, seed_start=config.seed_start, max_turns=config.max_turns,
                              max_actions_per_turn=config.max_actions_per_turn,
                              max_new_tokens=config.rollout_max_new_tokens, exploration=config.exploration,
                              seed=config.seed)
    if config.exploration == "self_play" and engine is None:
        raise ValueError("exploration 'self_play' needs an engine and a tokenizer; or use exploration 'random'")
    trajectories = collect(engine, tokenizer, selfplay, on_turn=on_turn)
    turns = sum(len(t.turns) for t in trajectories)
    triplets = triplets_from_trajectories(trajectories, config.history_turns, config.require_format)
    extracted = len(triplets)
    if config.dedupe:
        triplets = dedupe(triplets)
    stats = {"episodes": len(trajectories), "turns": turns, "extracted": extracted,
             "duplicates": extracted - len(triplets), "exploration": config.exploration,
             "success_rate": sum(t.success for t in trajectories) / max(len(trajectories), 1)}
    if config.filter and triplets:
        if predict is None:
            raise ValueError("the too-easy filter needs a predictor (sampling_predictor); or set filter=false")
        if config.filter_distance == "embedding":
            if embedder is None:
                raise ValueError("filter_distance 'embedding' needs an embedder")
            distance, tau = embedding_distances(embedder), config.filter_tau or config.tau
        else:
            distance, tau = state_distances, config.filter_tau or DEFAULT_FILTER_TAU
        triplets, filtered = filter_too_easy(triplets, predict, k=config.filter_k, tau=tau,
                                             keep_prob=config.filter_keep_prob, distance=distance, rng=config.seed)
        stats["filter"] = {**filtered, "tau": tau, "distance": config.filter_distance}
    stats["triplets"] = len(triplets)
    return triplets, stats


def eval_triplets(env: str, env_config: dict, config: RWMLConfig) -> list[Triplet]:
    """Held-out triplets: one random-exploration episode per evaluation seed.

    Random actions make the set independent of the model, so the accuracy before and
    after training is measured on the same transitions; the seeds never overlap training.
    """
    if config.eval_seeds == 0:
        return []
    explore = SelfPlayConfig(env=env, env_config=dict(env_config), episodes=config.eval_seeds, samples=1,
                             max_turns=config.max_turns, max_actions_per_turn=config.max_actions_per_turn,
                             exploration="random", seed=config.seed)
    trajectories = random_exploration(explore, eval_seeds(config.eval_seeds))
    return triplets_from_trajectories(trajectories, config.history_turns, require_format=False)


def save_triplets(path: str | Path, triplets: list[Triplet]) -> Path:
    return write_jsonl(path, [t.to_json() for t in triplets])


def load_triplets(path: str | Path) -> list[Triplet]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [Triplet.from_json(json.loads(line)) for line in lines if line.strip()]


def fingerprint(triplets: list[Triplet]) -> str:
    """A short hash of the training data: a resumed run must train on the same triplets."""
    return hashlib.sha256("\n".join(_key(t) for t in triplets).encode()).hexdigest()[:16]
