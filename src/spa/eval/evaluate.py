"""``spa eval``: play the fixed evaluation seeds and write metrics, a report and trajectories.

Outputs in ``out_dir``: ``metrics.json`` (every number), ``report.md`` (a table a person
reads first) and ``trajectories.jsonl`` (every turn of every episode); while it plays,
``rollout.partial.jsonl`` holds the finished turns, so an interrupted evaluation into the
same folder resumes from its last finished turn. The evaluation
seeds start at ``EVAL_SEED_OFFSET``, far above any training seed. Every Pass@k comes
with a 95% interval over levels, ``pass_at_k_ci95`` (``spa.eval.metrics.summarize``),
when there are at least 2 levels.

Under a launcher every process calls :func:`evaluate`: each plays its share of the levels
(:mod:`spa.agent.sharding`: all samples of a level on one process, another sampling draw
than one process's), the main process alone summarises them and writes the outputs
(``metrics.json`` then records each process's share under ``processes``), and every
process returns the metrics.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from spa import distributed
from spa.agent.prompts import PromptConfig
from spa.agent.rollout import RolloutConfig
from spa.agent.seeds import eval_seeds
from spa.agent.sharding import Played, finish_log, own_log, rollout_by_level
from spa.agent.turnlog import TurnLog
from spa.eval.metrics import summarize
from spa.io import atomic_write_text, write_json, write_jsonl
from spa.models.engine import DEFAULT_BATCH, Engine, SamplingParams, check_batch
from spa.progress import turn_progress

#: The finished turns of an evaluation in progress, in its output folder (spa.agent.turnlog).
PARTIAL = "rollout.partial.jsonl"


@dataclass
class EvalConfig:
    """What to evaluate and how."""

    env: str = "sokoban"
    env_config: dict[str, Any] = field(default_factory=dict)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    num_envs: int = field(default=128, metadata={"help": (
        "Evaluation levels (fixed, disjoint from training; paper: 128).")})
    samples: int = field(default=8, metadata={"help": "Samples per level (Pass@k uses k <= samples; paper: 8)."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature; 0 is greedy."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass."})
    max_new_tokens: int = field(default=400, metadata={"help": "New-token cap per turn (paper: 400)."})
    format_penalty: float = -0.1
    seed: int = field(default=0, metadata={"help": "Sampling seed."})
    # prompts the generation engine decodes together (spa.models.engine.DEFAULT_BATCH: a GPU
    # wants more); seeded samples differ between batch sizes
    engine_batch: int = DEFAULT_BATCH

    def __post_init__(self) -> None:
        check_batch(self.engine_batch)


def evaluate(model, tokenizer, config: EvalConfig, out_dir: str | Path | None = None,
             model_name: str = "", progress: bool = True, dtype: torch.dtype | None = None,
             label: str = "") -> dict:
    """Roll out the evaluation seeds, summarise, and write the outputs to ``out_dir``.

    ``dtype`` decodes in another precision than the model's (a trainer's fp32 weights in bf16);
    ``label`` names the evaluation in its progress line (default ``eval ENV``). Under a
    launcher every process calls it, each with the whole model (module docstring).
    """
    engine = Engine(model, tokenizer, max_batch_size=config.engine_batch, dtype=dtype)
    sampling = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                              top_p=config.top_p, seed=config.seed)
    rollout_config = RolloutConfig(config.env, config.env_config, config.prompt,
                                   format_penalty=config.format_penalty)
    start = time.perf_counter()
    # With an output folder the finished turns go to disk, so an interrupted evaluation resumes.
    log = TurnLog(own_log(Path(out_dir) / PARTIAL)) if out_dir is not None else None
    with turn_progress(label or f"eval {config.env}", config.prompt.max_turns,
                       disable=not progress or not distributed.is_main(), engine=engine) as on_turn, \
            log or contextlib.nullcontext():
        played = rollout_by_level(engine, tokenizer, eval_seeds(config.num_envs), config.samples,
                                  rollout_config, sampling, on_turn=on_turn, log=log)
    # the main process's time, which under a launcher includes waiting for the slowest process
    seconds = log.seconds() if log is not None else time.perf_counter() - start
    metrics = distributed.on_main(lambda: summarized(played, config, model_name, seconds, out_dir))
    if log is not None:
        finish_log(log)
    return metrics


def summarized(played: Played, config: EvalConfig, model_name: str, seconds: float,
               out_dir: str | Path | None) -> dict:
    """The metrics of a played evaluation, its outputs written to ``out_dir``."""
    trajectories = played.trajectories
    metrics = summarize(trajectories, intervals=True)
    generated = sum(len(turn.response_ids) for t in trajectories for turn in t.turns)
    metrics.update(model=model_name, config=asdict(config), wall_seconds=round(seconds, 1),
                   generated_tokens=generated, tokens_per_second=round(generated / max(seconds, 1e-9), 1),
                   **played.by_process())
    write_outputs(out_dir, trajectories, metrics)
    return metrics


def write_outputs(out_dir: str | Path | None, trajectories, metrics: dict) -> None:
    """``trajectories.jsonl``, ``metrics.json`` and ``report.md`` in ``out_dir`` (None: nothing)."""
    if out_dir is None:
        return
    out = Path(out_dir)
    write_jsonl(out / "trajectories.jsonl", (t.to_json() for t in trajectories))
    write_json(out / "metrics.json", metrics)
    atomic_write_text(out / "report.md", markdown_report(metrics))


#: Per-turn rates of ``summarize`` and their names in the tables, in the tables' order.
_TURN_RATES = (("best_first_rate", "best first action"), ("first_valid_rate", "valid first action"),
               ("best_first_of_valid_rate", "best first action, of the valid ones"),
               ("best_follow_rate", "best second action, after a best first"))


def metric_rows(metrics: dict) -> list[tuple[str, str]]:
    """``(name, formatted value)`` rows shared by the terminal table and the report."""
    rows = [("success rate (Pass@1)", f"{100 * metrics['success_rate']:.1f}%")]
    rows += [(name, f"{100 * value:.1f}%") for name, value in metrics["pass_at_k"].items()]
    rows += interval_rows(metrics)
    rows += [
        ("mean reward", f"{metrics['mean_reward']:.2f}"),
        ("mean turns", f"{metrics['mean_turns']:.2f}"),
        ("mean actions", f"{metrics['mean_actions']:.2f}"),
        ("format-valid turns", f"{100 * metrics['format_valid_rate']:.1f}%"),
        ("valid actions", f"{100 * metrics['action_valid_rate']:.1f}%"),
    ]
    if "ended" in metrics:  # absent from metrics written before it
        ended = metrics["ended"]
        rows.append(("episodes ended", f"{100 * ended['success']:.1f}% success, {100 * ended['lost']:.1f}% lost, "
                                       f"{100 * ended['out_of_turns']:.1f}% out of turns"))
    # Absent where no turn was scored (no solver) and from metrics written before they existed.
    rows += [(name, f"{100 * metrics[key]:.1f}%") for key, name in _TURN_RATES if key in metrics]
    rows.append(("mean response tokens", f"{metrics['mean_response_tokens']:.0f}"))
    for name, value in metrics.get("world_model", {}).items():
        rows.append((name.replace("_", " "), "-" if value is None else f"{100 * value:.1f}%"))
    return rows


def interval_rows(metrics: dict) -> list[tuple[str, str]]:
    """``(name, formatted interval)`` rows for ``pass_at_k_ci95``, where the metrics have it."""
    return [(f"{name} 95% interval", f"[{100 * low:.1f}%, {100 * high:.1f}%]")
            for name, (low, high) in metrics.get("pass_at_k_ci95", {}).items()]


def markdown_report(metrics: dict) -> str:
    """The evaluation as a short markdown page."""
    cfg = metrics["config"]
    lines = [
        f"# Evaluation: {metrics['model'] or 'model'} on {cfg['env']} ({cfg['prompt']['mode']} mode)",
        "",
        f"{metrics['groups']} evaluation seeds x {metrics['samples_per_group']} samples, "
        f"temperature {cfg['temperature']}, at most {cfg['prompt']['max_turns']} turns of "
        f"{cfg['max_new_tokens']} new tokens; {metrics['wall_seconds']} s, "
        f"{metrics['tokens_per_second']} generated tokens/s.",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    lines += [f"| {name} | {value} |" for name, value in metric_rows(metrics)]
    return "\n".join(lines) + "\n"
