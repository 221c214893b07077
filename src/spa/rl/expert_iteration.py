"""Expert iteration: rounds of self-play filtered by the task's reward, then SFT on what passed.

Each round the current policy plays fresh training levels at temperature 1. The turns that
pass the filter (a per-turn label of :mod:`spa.agent.keep`) become SFT examples with the
model's own response (its answer rewritten to the actions played), and one SFT run on them
gives the next round's policy:

* ``keep="winners"``: the turns of episodes that succeeded, i.e. the environment's sparse
  reward and nothing else (rejection-sampling fine-tuning: STaR, ReST, RAFT);
* ``keep="best"``: the turns whose first action begins a shortest solution, a solver's
  per-turn label (a dense reward the task does not give; where the episode's outcome was
  too noisy a filter, this one taught the policy to read the state);
* ``keep="best_prefix"``: those turns with the answer cut to its leading best actions, so
  that no unlabelled move rides along (on 3x3 lakes such moves cost most of what own
  correct moves taught; docs/making-rl-learn.md, "Correct moves from the model's own samples").
* ``keep="value"``: the turns whose first action has the highest Monte-Carlo value at its
  state, the task's reward under random continuation on copies of the environment
  (``spa.envs.lookahead``): a per-turn label from the reward alone, where a solver is not needed;
* ``keep="best_grounded"``: in the world-model prompt, the best turns as written, each
  own ``<observation>`` / ``<prediction>`` in the loss only where it was right: VAGEN's
  reward for grounded states beside the solver's label (the ``vagen`` method under
  ``rl: iterate``).

Why it is here beside PPO: on these CPU budgets PPO's few small updates per step did not
move the policy, while on the same samples about a hundred SFT steps at 1e-4 on the kept
turns did (docs/expert-iteration.md, "Expert iteration"). Filtering on success is the binary-reward limit
of a policy gradient with a baseline of zero: only winners are pushed up, nothing is
pushed down.

A run folder holds ``round-0/eval`` (the start), then per round ``round-N/data.jsonl``
(with ``.stats.json``), ``round-N/sft/epoch-E`` and ``round-N/eval``; ``rounds.json``
summarises them. Every piece is written atomically and skipped when present, so a run
killed at any point resumes where it stopped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from spa import heap
from spa.agent.keep import FILTERS, LABELLED, keep_filter, keep_help
from spa.agent.rollout import RolloutConfig
from spa.agent.turnlog import TurnLog
from spa.compute import Compute, for_model
from spa.config import to_dict, with_defaults
from spa.eval.metrics import pct_with_interval
from spa.eval.paired import compare_evaluations, signed_pct_with_interval
from spa.io import write_json, write_jsonl
from spa.models.engine import DEFAULT_BATCH, Engine, check_batch
from spa.progress import turn_progress
from spa.worldmodel.selfplay import SelfPlayConfig, build_examples, collect
from spa.worldmodel.sft import SFTConfig, last_checkpoint, load_examples, resume_model, train

#: The per-turn signal each ``keep`` filter trains on: the episode's outcome (the task's
#: sparse reward), a solver's shortest solutions, or Monte-Carlo values of the task's reward.
#: ``spa compare`` pairs and pools runs of expert iteration only with runs of the same signal.
LABEL = {name: FILTERS[name].signal for name in LABELLED}
TRAJECTORIES = "trajectories.jsonl"  # beside an evaluation's metrics.json
PLAY_PARTIAL = "play.partial.jsonl"  # a round's finished turns while it plays (spa.agent.turnlog)
Loader = Callable[[str], tuple[Any, Any]]  # model name or folder -> (fp32 model, tokenizer)


def _one_epoch_sft() -> SFTConfig:
    # No held-out split: the data is the policy's own, and each round is judged by its evaluation.
    return SFTConfig(epochs=1, val_fraction=0.0)


@dataclass
class IterateConfig:
    """What each round plays, what it keeps and how it trains on it."""

    rounds: int = field(default=3, metadata={"help": "Rounds of play, filter and SFT."})
    episodes: int = field(default=1600, metadata={"help": (
        "Episodes played per round (a multiple of samples).")})
    samples: int = field(default=4, metadata={"help": "Episodes per level."})
    keep: str = field(default="value", metadata={"help": (
        "Turns trained on, by a label per turn: " + keep_help(LABELLED))})
    value_rollouts: int = SelfPlayConfig.value_rollouts  # keep="value": spa.envs.lookahead
    value_horizon: int = SelfPlayConfig.value_horizon
    value_tolerance: float = SelfPlayConfig.value_tolerance
    new_levels: bool = True  # each round plays the next block of training levels, not the same ones
    max_new_tokens: int = 64  # per turn while playing
    temperature: float = 1.0
    seed: int = 0  # sampling seed of round 1; round r uses seed + r - 1
    sft: SFTConfig = field(default_factory=_one_epoch_sft)
    engine_batch: int = DEFAULT_BATCH  # prompts decoded together while playing (spa.models.engine)

    def __post_init__(self) -> None:
        check_batch(self.engine_batch)
        if self.rounds < 1:
            raise ValueError(f"rounds={self.rounds} must be at least 1")
        keep_filter(self.keep, LABELLED)  # a round that kept every turn would learn from no label
        if self.episodes < 1 or self.samples < 1 or self.episodes % self.samples:
            raise ValueError(f"episodes={self.episodes} must be a positive multiple of samples={self.samples}")

    @property
    def levels(self) -> int:
        return self.episodes // self.samples


def selfplay_config(config: IterateConfig, rollout: RolloutConfig, round_: int) -> SelfPlayConfig:
    """Round ``round_``'s data settings: fresh levels (unless ``new_levels`` is off) and seed."""
    return SelfPlayConfig(
        env=rollout.env, env_config=dict(rollout.env_config), episodes=config.episodes, samples=config.samples,
        seed_start=(round_ - 1) * config.levels if config.new_levels else 0, max_turns=rollout.prompt.max_turns,
        max_actions_per_turn=rollout.prompt.max_actions_per_turn, max_new_tokens=config.max_new_tokens,
        temperature=config.temperature, seed=config.seed + round_ - 1, mode=rollout.prompt.mode, keep=config.keep,
        value_rollouts=config.value_rollouts, value_horizon=config.value_horizon,
        value_tolerance=config.value_tolerance, engine_batch=config.engine_batch)


def run(model: str, load: Loader, config: IterateConfig, rollout: RolloutConfig, out: str | Path,
        evaluate: Callable[[Any, Any, Path], dict] | None = None,
        on_round: Callable[[dict], None] | None = None, compute: Compute | None = None) -> list[dict]:
    """Run (or resume) the rounds from ``model``; returns one summary record per round.

    ``load`` gives fp32 weights (sampling decodes in ``config.sft.precision``), ``rollout``
    the environment and prompt, and ``evaluate(model, tokenizer, folder)`` (optional) an
    evaluation whose metrics it writes under ``folder``. ``compute``: the device and
    precision the caller decided from ``config.sft.precision`` (:func:`spa.compute.decide`;
    ``load`` puts the weights on its device); None decides it on each loaded model's device.
    """
    out = Path(out)
    selfplay_config(config, rollout, 1)  # its checks (keep against the prompt mode) before any model loads
    _check_settings(out / "settings.json", {"model": model, "rollout": to_dict(rollout), "iterate": to_dict(config)})
    records: list[dict] = []
    if evaluate is not None:
        records.append({"round": 0, "model": model, **_evaluation(model, load, evaluate, out / "round-0" / "eval")})
        _report(out, records, on_round)
    for round_ in range(1, config.rounds + 1):
        folder = out / f"round-{round_}"
        stats = _play(model, load, config, selfplay_config(config, rollout, round_), folder / "data.jsonl", compute)
        model = _train(model, load, config.sft, folder, compute)
        record = {"round": round_, "model": model, "kept": stats["kept"], "turns": stats["turns"],
                  "play_success": stats["success_rate"], "best_first_kept": stats.get("best_first_kept"),
                  "best_first_dropped": stats.get("best_first_dropped"), "play_seconds": stats.get("wall_seconds"),
                  "sft_seconds": _sft_seconds(folder / "sft")}
        if "states_right" in stats:
            record["states_right"] = stats["states_right"]
        if evaluate is not None:
            previous = out / f"round-{round_ - 1}" / "eval"
            record.update(_evaluation(model, load, evaluate, folder / "eval", before=previous))
        records.append(record)
        _report(out, records, on_round)
    return records


def _check_settings(path: Path, settings: dict) -> None:
    """Record a run's settings; a resumed run must have the same ones (rounds may grow)."""
    if path.is_file():
        saved = json.loads(path.read_text(encoding="utf-8"))
        # a key added since the run started reads as its default, which kept the old behaviour
        saved["iterate"] = with_defaults(IterateConfig, saved["iterate"])
        saved["iterate"]["rounds"] = settings["iterate"]["rounds"]
        changed = [key for key in settings if saved.get(key) != settings[key]]
        if changed:
            raise ValueError(f"{path.parent} was started with other {' and '.join(changed)} settings "
                             f"(see {path}); resume with the same ones or use a new folder")
    write_json(path, settings)


@heap.releasing  # each stage frees a model (SFT also its optimizer): back to the system (spa.heap)
def _play(model: str, load: Loader, config: IterateConfig, play: SelfPlayConfig, data: Path,
          compute: Compute | None) -> dict:
    """The round's filtered examples in ``data`` (played unless already there); their stats."""
    stats_path = data.with_suffix(".stats.json")
    if stats_path.is_file():  # written after the data, so both are complete
        return json.loads(stats_path.read_text(encoding="utf-8"))
    lm, tokenizer = load(model)
    engine = Engine(lm, tokenizer, max_batch_size=config.engine_batch,
                    dtype=(compute or for_model(lm, config.sft.precision)).decode_dtype)
    log = TurnLog(data.with_name(PLAY_PARTIAL))  # an interrupted play resumes from its last finished turn
    with turn_progress(f"{data.parent.name} play", play.max_turns, engine=engine) as on_turn, log:
        trajectories = collect(engine, tokenizer, play, on_turn=on_turn, log=log)
    examples, stats = build_examples(trajectories, play, progress=f"{data.parent.name} look-ahead")
    if not examples:
        raise RuntimeError(f"{data.parent.name} kept no turn: none of {stats['episodes']} episodes passed "
                           f"keep={play.keep!r} (success {100 * stats['success_rate']:.1f}%); play more "
                           "episodes, or start from a model that sometimes succeeds")
    stats["wall_seconds"] = round(log.seconds(), 1)  # the play's, summed over the processes that resumed it
    write_jsonl(data, examples)
    write_json(stats_path, stats)
    log.finish()
    return stats


@heap.releasing
def _train(model: str, load: Loader, config: SFTConfig, folder: Path, compute: Compute | None) -> str:
    """SFT of ``model`` on the round's data (resumed or skipped if done); the new model's folder."""
    sft_dir = folder / "sft"
    final = sft_dir / f"epoch-{config.epochs}"
    if final.is_dir():  # written atomically, so whole; done even where its trainer state was dropped
        return str(final)
    checkpoint = last_checkpoint(sft_dir)
    lm, tokenizer = resume_model(load, model, checkpoint)
    train(lm, tokenizer, load_examples(folder / "data.jsonl"), config, sft_dir, resume_from=checkpoint,
          compute=compute)
    return str(final)


def _sft_seconds(sft_dir: Path) -> float:
    epochs = json.loads((sft_dir / "metrics.json").read_text(encoding="utf-8"))["epochs"]
    return round(sum(epoch["seconds"] for epoch in epochs), 1)


@heap.releasing
def _evaluation(model: str, load: Loader, evaluate: Callable, folder: Path, before: Path | None = None) -> dict:
    """Pass@1 and Pass@k of ``model`` with 95% intervals (evaluated unless ``folder`` holds its
    metrics), and the paired Pass@1 difference from the evaluation in ``before``."""
    metrics_path = folder / "metrics.json"
    if not metrics_path.is_file():
        lm, tokenizer = load(model)
        evaluate(lm, tokenizer, folder)
    metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
    record = {"eval_episodes": metrics["episodes"], "eval_seconds": metrics["wall_seconds"],
              "eval": metrics["pass_at_k"], "eval_ci95": metrics.get("pass_at_k_ci95", {}),
              "eval_best_first": metrics.get("best_first_rate")}
    if before is not None:
        gain = compare_evaluations(before / TRAJECTORIES, folder / TRAJECTORIES)["pass@1"]
        record["gain_pass@1"] = {key: gain[key] for key in ("difference", "difference_ci95", "improved", "worsened")}
    return record


def describe_round(record: dict) -> str:
    """One line for a round's record: what it kept, and its evaluation with the paired gain."""
    line = f"round {record['round']}"
    if "kept" in record:
        line += f": kept {record['kept']} of {record['turns']} turns (play success {100 * record['play_success']:.1f}%"
        if record.get("best_first_kept") is not None and record.get("best_first_dropped") is not None:
            line += f"; best first move in {100 * record['best_first_kept']:.0f}% of the kept turns, " \
                    f"{100 * record['best_first_dropped']:.0f}% of the others"
        if record.get("states_right"):
            line += "; own states right, so learnt: " + ", ".join(
                f"{tag} {100 * share:.0f}%" for tag, share in record["states_right"].items() if share is not None)
        line += ")"
    if "eval" in record:
        line += f"; eval Pass@1 {pct_with_interval(record['eval']['pass@1'], record['eval_ci95'].get('pass@1'))}"
    if "gain_pass@1" in record:
        gain = record["gain_pass@1"]
        line += f", paired gain {signed_pct_with_interval(gain['difference'], gain['difference_ci95'])}"
    return line


def _report(out: Path, records: list[dict], on_round: Callable[[dict], None] | None) -> None:
    write_json(out / "rounds.json", records)
    if on_round is not None:
        on_round(records[-1])
