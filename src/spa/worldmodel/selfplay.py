"""Self-play world-model data: the model plays, then its imagined states are corrected.

The base model plays in ``world_model`` mode at temperature 1. For every assistant turn,
the text inside ``<observation>`` is replaced by the true state before the turn and the
text inside ``<prediction>`` by the true state after the turn's actions, in exactly the
format the prompt shows states (grid, then coordinates). Each corrected turn becomes one
SFT example: the prompt messages and the corrected response.

Ablation switches, each one of the paper's experiments:

* ``states="self_belief"``: keep the model's own imagined states (no replacement).
* ``exploration="random"``: random valid actions with a templated think text instead of
  the model's own play.
* ``exploration="oracle"``: as ``random``, but each action is drawn uniformly from the
  environment's ``best_actions`` (the moves that begin a shortest solution). Not one of
  the paper's methods: expert demonstrations, the behaviour-cloning reference that shows
  whether the model can learn to read the state at all when every label is right.
* ``coords="random"``: coordinates well-formed but random (the collapse experiment).

``mode`` other than ``world_model`` (``base``, ``state``) makes random-exploration data in
that prompt mode, with a short reasoning and the actions and no state text in the
response: the format bootstrap of the methods whose RL prompt has no world model, so
that every method starts RL from the same format competence.

``keep`` filters the turns that become examples by a per-turn label (the labels, and what
each needs, are the registry :mod:`spa.agent.keep`), which turns self-play into rejection
sampling (expert iteration): ``winners`` keeps the turns of episodes that succeeded (the
task's own sparse reward), ``best`` the turns whose first action begins a shortest
solution (a solver's label), ``best_prefix`` the same turns with the answer cut to its
leading actions that each began a shortest solution from the state it was taken in (so
no unlabelled move rides along). With a filter, self-play data may use any prompt mode:
the model's own response, answer rewritten to the actions played, is the target.
``best_grounded`` (``world_model`` mode) keeps the best turns as the model wrote them and
takes out of the SFT loss each of its own ``<observation>`` / ``<prediction>`` that did not
match the true state exactly (``spa.agent.grids.state_match`` below 1; the example's
``masked_states``): VAGEN's reward for grounded states as a loss mask beside the solver's
label for the move, with no ground-truth text ever shown to the policy. A filter on right
states instead would keep almost nothing: a format bootstrap's predictions are exact in
about 1% of turns (docs/baselines.md, "World-model baselines").
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from spa import distributed
from spa.agent.grids import grid_cells, state_match
from spa.agent.keep import FILTERS, KEEP, LABELLED, keep_filter, keep_help
from spa.agent.labels import label_turns
from spa.agent.parsing import ACTION_SEPARATOR
from spa.agent.prompts import PromptConfig, build_messages, check_mode
from spa.agent.rollout import RolloutConfig
from spa.agent.seeds import train_seeds
from spa.agent.sharding import Played, rollout_by_level
from spa.agent.trajectory import Trajectory, Turn
from spa.agent.turnlog import TurnLog
from spa.models.engine import DEFAULT_BATCH, check_batch
from spa.envs import env_class, make
from spa.envs.lookahead import VALUE_HORIZON, VALUE_ROLLOUTS
from spa.progress import Bar

STATES = ("ground_truth", "self_belief")
EXPLORATION = ("self_play", "random", "oracle")
COORDS = ("true", "random")

_COORD = re.compile(r"\((\d+),\s*(\d+)\)")


@dataclass
class SelfPlayConfig:
    """What data to collect and how to turn it into SFT examples."""

    env: str = "sokoban"
    env_config: dict[str, Any] = field(default_factory=dict)
    episodes: int = field(default=1280, metadata={"help": "Episodes (paper: 1,280 = 160 levels x 8 samples)."})
    samples: int = field(default=8, metadata={"help": "Episodes per training level."})
    seed_start: int = 0  # first training seed
    max_turns: int = field(default=5, metadata={"help": "Turns per episode."})
    max_actions_per_turn: int = field(default=3, metadata={"help": "Actions per turn."})
    max_new_tokens: int = field(default=400, metadata={"help": "New-token cap per turn."})
    temperature: float = 1.0
    states: str = field(default="ground_truth", metadata={"help": (
        "ground_truth, or self_belief (ablation: no replacement).")})
    exploration: str = field(default="self_play", metadata={"help": (
        "self_play, random (ablation: random actions) or oracle (best actions: a behaviour-cloning "
        "reference).")})
    # random and oracle exploration: each turn plays 1..exploration_actions actions, uniformly
    # (0: up to max_actions_per_turn); 1 makes every target a one-move answer
    exploration_actions: int = 0
    coords: str = field(default="true", metadata={"help": "true, or random (ablation: random coordinates)."})
    drop_no_valid_action: bool = field(default=False, metadata={"help": (
        "Also drop well-formed turns whose actions all failed.")})
    seed: int = field(default=0, metadata={"help": "Sampling and random-exploration seed."})
    mode: str = field(default="world_model", metadata={"help": (
        "Prompt mode: base, state or world_model. world_model writes world-model data (observation and "
        "prediction replaced by the true states); base or state write plain-prompt examples, and under "
        "self_play exploration need a keep label that filters.")})
    keep: str = field(default="all", metadata={"help": (
        "Turns kept, by a label per turn (any but all is rejection sampling on the model's own "
        "responses): " + keep_help(KEEP))})
    value_rollouts: int = VALUE_ROLLOUTS  # keep="value": random continuations per action and state
    value_horizon: int = VALUE_HORIZON  # keep="value": actions per continuation, the first one included
    value_tolerance: float = 0.0  # keep="value": actions this close to the highest value count as best
    engine_batch: int = DEFAULT_BATCH  # prompts decoded together while playing (spa.models.engine)

    def __post_init__(self) -> None:
        check_mode(self.mode)
        check_batch(self.engine_batch)
        for name, allowed in (("states", STATES), ("exploration", EXPLORATION), ("coords", COORDS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} is not allowed; valid: {', '.join(allowed)}")
        label = keep_filter(self.keep)
        if self.mode != "world_model" and self.exploration == "self_play" and not label.filters:
            labels = " or ".join(repr(name) for name in LABELLED if self.mode in FILTERS[name].modes)
            raise ValueError(f"mode={self.mode!r} with exploration='self_play' needs keep={labels} "
                             "(or exploration='random' or 'oracle'): unfiltered self-play data is world-model "
                             "data (observation and prediction to correct)")
        label.check_mode(self.mode)
        if label.own_states and self.coords != "true":
            raise ValueError(f"coords={self.coords!r} does not apply to keep={self.keep!r}, which trains the "
                             "model's own states and replaces none")
        if self.episodes < 1 or self.samples < 1 or self.episodes % self.samples:
            raise ValueError(f"episodes={self.episodes} must be a positive multiple of samples={self.samples}")
        if not 0 <= self.exploration_actions <= self.max_actions_per_turn:
            raise ValueError(f"exploration_actions={self.exploration_actions} must be 0 (up to max_actions_per_turn) "
                             f"or 1..{self.max_actions_per_turn}, the most actions a turn")
        label.check_env(self.env)
        if label.signal == "value":
            check_value_settings(self.value_rollouts, self.value_horizon, self.value_tolerance)

    @property
    def prompt(self) -> PromptConfig:
        return PromptConfig(self.mode, self.max_turns, self.max_actions_per_turn, history_turns=0)


def replace_span(text: str, tag: str, content: str) -> str:
    """``text`` with the content of its first ``<tag>...</tag>`` replaced by ``content``."""
    start = text.find(f"<{tag}>")
    end = text.find(f"</{tag}>", start)
    if start < 0 or end < 0:
        raise ValueError(f"no <{tag}> span in the response")
    return text[: start + len(tag) + 2] + content + text[end:]


def randomize_coordinates(state: str, rows: int, cols: int, rng: np.random.Generator, base: int = 0) -> str:
    """Every ``(r,c)`` in ``state`` replaced by a random in-grid coordinate (same format).

    ``base`` is the environment's ``coordinate_base`` (1 for Sudoku), so the random
    coordinates stay inside the grid as the description counts it."""
    return _COORD.sub(
        lambda _: f"({int(rng.integers(rows)) + base},{int(rng.integers(cols)) + base})", state)


def corrected_response(turn: Turn, config: SelfPlayConfig, rng: np.random.Generator) -> str:
    """The turn's response with the true states in place of the imagined ones.

    The answer is rewritten to the actions that were applied, so that the prediction
    (the state after them) matches it even when the model wrote more actions than
    the per-turn cap; under ``keep="best_prefix"``, to the leading ones that were best,
    and where the reasoning names the played moves as the answer lists them ("I will
    try Left || Up."), it is cut the same way.
    """
    response = turn.response
    think_end = response.find("</think>")
    label = FILTERS[config.keep]
    actions = turn.actions[: turn.best_run] if label.cut_answer else turn.actions
    kept = f" {ACTION_SEPARATOR} ".join(actions)
    head = response[: think_end + len("</think>")]
    if label.cut_answer:  # a reasoning that names the cut moves would contradict the answer
        head = head.replace(f" {ACTION_SEPARATOR} ".join(turn.actions), kept)
    response = head + f"<answer>{kept}</answer>"
    if config.states == "self_belief" or config.mode != "world_model" or label.own_states:
        return response  # best_grounded: the model's own states; the wrong ones leave the loss
    before, after = turn.state_before, turn.state_after
    if config.coords == "random":
        cells = grid_cells(turn.grid_before)
        rows, cols = len(cells), max(len(row) for row in cells)
        base = env_class(config.env).coordinate_base
        before = randomize_coordinates(before, rows, cols, rng, base)
        after = randomize_coordinates(after, rows, cols, rng, base)
    response = replace_span(response, "observation", before)
    return replace_span(response, "prediction", after)


def _exploration_action(env, config: SelfPlayConfig, rng: np.random.Generator) -> str:
    """A random valid action, or under ``exploration="oracle"`` a random one of the best."""
    best = env.best_actions() if config.exploration == "oracle" else None
    return str(rng.choice(sorted(best))) if best else env.random_action(rng)


def random_exploration(config: SelfPlayConfig, seeds: list[int]) -> list[Trajectory]:
    """Episodes of templated responses whose actions are random valid ones (the exploration
    ablation) or, under ``exploration="oracle"``, drawn from the best actions."""
    rng = np.random.default_rng(config.seed)
    trajectories = []
    for group, env_seed in enumerate(seeds):
        for sample in range(config.samples):
            env = make(config.env, **config.env_config)
            env.reset(seed=env_seed)
            trajectory = Trajectory(config.env, dict(config.env_config), env_seed, group, sample, config.mode)
            history: list[tuple[str, str, float]] = []  # so prompts match the rollout's (turn number, reward)
            for _ in range(config.max_turns):
                messages = build_messages(env, config.prompt, history)
                state_before, grid_before = env.state_text(), env.render()
                actions, rewards, done = [], 0.0, False
                for _ in range(int(rng.integers(1, (config.exploration_actions or config.max_actions_per_turn) + 1))):
                    action = _exploration_action(env, config, rng)
                    _, reward, terminated, truncated, _ = env.step(action)
                    actions.append(action)
                    rewards += reward
                    if terminated or truncated:
                        done = True
                        break
                joined = f" {ACTION_SEPARATOR} ".join(actions)
                think, observation, prediction = f"I will try {joined}.", "", ""
                if config.prompt.world_model:  # the plain modes' responses carry no state text
                    observation, prediction = state_before, env.state_text()
                    think = f"<observation>{observation}</observation> {think} <prediction>{prediction}</prediction>"
                response = f"<think>{think}</think><answer>{joined}</answer>"
                trajectory.turns.append(Turn(
                    prompt_messages=messages, prompt_ids=[], response=response, response_ids=[],
                    logprobs=[], finish_reason="stop", think="", observation=observation,
                    prediction=prediction, answer=joined, actions=actions,
                    actions_valid=[True] * len(actions), format_ok=True, state_before=state_before,
                    grid_before=grid_before, state_after=env.state_text(), grid_after=env.render(),
                    env_reward=rewards, reward=rewards,
                ))
                history.append((state_before, response, rewards))
                if done:
                    break
            trajectory.success, trajectory.terminated = env.is_success(), done
            trajectories.append(trajectory)
    return trajectories


def collect(engine, tokenizer, config: SelfPlayConfig, on_turn=None, log: TurnLog | None = None) -> list[Trajectory]:
    """Play the training seeds: the model in world-model mode, or templated turns of random
    (or, under ``exploration="oracle"``, best) actions. ``log`` keeps the model's finished
    turns on disk so an interrupted play resumes (:mod:`spa.agent.turnlog`). Every level on
    the calling process, under a launcher too (:func:`collect_by_level` splits them)."""
    with distributed.alone():
        return collect_by_level(engine, tokenizer, config, on_turn=on_turn, log=log).trajectories


def collect_by_level(engine, tokenizer, config: SelfPlayConfig, on_turn=None,
                     log: TurnLog | None = None) -> Played | None:
    """:func:`collect` with the model's play split over the processes of a launch by level
    (:mod:`spa.agent.sharding`): on the main process every trajectory, in single-process
    order, and each process's share; None on the others. Every process calls it.

    Random and oracle exploration run on the main process alone: one generator draws every
    level's actions in turn, so a share of the levels would draw other actions than one
    process does, and they play in seconds without a model. ``log``: this process's own
    (:func:`spa.agent.sharding.own_log`).
    """
    seeds = train_seeds(config.episodes // config.samples, config.seed_start)
    if config.exploration != "self_play":
        if not distributed.is_main():
            return None
        began = time.perf_counter()
        trajectories = random_exploration(config, seeds)
        return Played(trajectories, [{"levels": len(seeds), "episodes": len(trajectories),
                                      "seconds": round(time.perf_counter() - began, 1)}])
    from spa.models.engine import SamplingParams

    sampling = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                              seed=config.seed)
    rollout_config = RolloutConfig(config.env, config.env_config, config.prompt)
    return rollout_by_level(engine, tokenizer, seeds, config.samples, rollout_config, sampling, on_turn=on_turn,
                            log=log)


def check_value_settings(rollouts: int, horizon: int, tolerance: float) -> None:
    """The checks of the look-ahead settings of a ``value`` label, each error naming the bad
    value (the environment is the label's own check: ``KeepFilter.check_env``)."""
    for name, value in (("value_rollouts", rollouts), ("value_horizon", horizon)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or tolerance < 0:
        raise ValueError(f"value_tolerance={tolerance!r} must be a non-negative number")


def wrong_states(turn: Turn) -> list[str]:
    """The tags of the turn's own states that do not match the true ones exactly."""
    return [tag for tag, written, true in (("observation", turn.observation, turn.state_before),
                                           ("prediction", turn.prediction, turn.state_after))
            if state_match(written, true) < 1.0]


def _label_by_value(trajectories: list[Trajectory], config: SelfPlayConfig, progress: str | None) -> None:
    """``label_turns`` level by level, with a bar over the levels: the look-ahead of a
    1,600-episode round takes minutes. A level's labels depend only on its own episodes
    (the look-ahead of a state is seeded by the level and the state), so this labels every
    turn as one call over all the episodes would."""
    levels: dict[int, list[Trajectory]] = {}
    for trajectory in trajectories:
        levels.setdefault(trajectory.seed, []).append(trajectory)
    with Bar(disable=progress is None, transient=True) as bar:
        task = bar.add_task(f"{progress}: levels labelled (keep=value)", total=len(levels))
        for level in levels.values():
            label_turns(level, config.value_rollouts, config.value_horizon, config.value_tolerance, config.seed)
            bar.update(task, advance=1)


def _rate(hits: int, total: int) -> float | None:
    return hits / total if total else None


def build_examples(trajectories: list[Trajectory], config: SelfPlayConfig,
                   progress: str | None = None) -> tuple[list[dict], dict]:
    """SFT examples (one per kept turn) and counts of what was kept and dropped. ``progress``
    names a bar over the look-ahead of ``keep="value"``; None: no bar."""
    rng = np.random.default_rng(config.seed + 1)
    label = FILTERS[config.keep]
    if label.signal == "value":
        _label_by_value(trajectories, config, progress)
    counts: Counter[str] = Counter()
    examples = []
    for trajectory in trajectories:
        for index, turn in enumerate(trajectory.turns):
            counts["turns"] += 1
            if not turn.format_ok:
                counts["dropped_malformed"] += 1
                continue
            if config.drop_no_valid_action and not turn.any_valid:
                counts["dropped_no_valid_action"] += 1
                continue
            kept = label.kept(trajectory, turn)
            if turn.best_first is not None:  # how often each side of the filter began a shortest solution
                counts[f"best_first_{'kept' if kept else 'dropped'}"] += turn.best_first
                counts[f"solved_{'kept' if kept else 'dropped'}"] += 1
            if not kept:
                counts["dropped_by_filter"] += 1
                continue
            counts["kept"] += 1
            example = {
                "messages": turn.prompt_messages,
                "response": corrected_response(turn, config, rng),
                "env": trajectory.env, "seed": trajectory.seed, "sample": trajectory.sample,
                "turn": index, "actions": turn.actions,
                "state_before": turn.state_before, "state_after": turn.state_after,
            }
            if label.own_states:
                example["masked_states"] = wrong_states(turn)
                counts.update(f"{tag}_wrong" for tag in example["masked_states"])
            examples.append(example)
    stats = {
        "episodes": len(trajectories),
        "success_rate": sum(t.success for t in trajectories) / max(len(trajectories), 1),
        "turns": counts["turns"],
        "kept": counts["kept"],
        "dropped_malformed": counts["dropped_malformed"],
        "dropped_no_valid_action": counts["dropped_no_valid_action"],
        "dropped_by_filter": counts["dropped_by_filter"],
        # Share of kept and of filtered-out turns whose first action begins a shortest solution
        # (None without a solver, or with nothing on that side): how much the filter selects.
        "best_first_kept": _rate(counts["best_first_kept"], counts["solved_kept"]),
        "best_first_dropped": _rate(counts["best_first_dropped"], counts["solved_dropped"]),
        "config": asdict(config),
    }
    if label.own_states:  # the shares of kept turns whose own states the loss learns
        stats["states_right"] = {tag: _rate(counts["kept"] - counts[f"{tag}_wrong"], counts["kept"])
                                 for tag in ("observation", "prediction")}
    return examples, stats
