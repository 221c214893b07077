"""``spa demo``: the method at a glance, in minutes on a CPU.

The model plays a few evaluation levels (never in any training data) in world-model
mode; a format bootstrap then fine-tunes it for one epoch on random-exploration turns
whose ``<observation>`` and ``<prediction>`` hold the true states (the first stage of
``spa run``, :mod:`spa.worldmodel.selfplay` with ``exploration="random"``); the trained
model plays the same levels with the same sampling seed. A table shows both side by
side: format-valid turns, a turn's imagined states against the true ones, the actions
and the successes.

The bootstrapped checkpoint is cached in ``$SPA_HOME/demo/``, keyed by everything that
changes its weights (model, environment and options, turns, bootstrap size, SFT
settings), and written atomically, so a second demo goes straight to playing.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from rich.table import Table
from rich.text import Text

from spa import heap
from spa.agent.prompts import PromptConfig
from spa.agent.rollout import RolloutConfig, rollout
from spa.agent.trajectory import Trajectory
from spa.agent.seeds import EVAL_SEED_OFFSET
from spa.envs import env_names
from spa.compute import Compute, decide
from spa.io import TRAINER_STATE, atomic_dir, write_json
from spa.progress import Bar
from spa.worldmodel.sft import SFTConfig

#: Bump when the cached checkpoint would come out differently for the same settings.
CACHE_VERSION = 1


@dataclass
class DemoConfig:
    """What the demo plays and how large its format bootstrap is."""

    env: str = field(default="frozenlake", metadata={"help": f"Environment: {', '.join(env_names())}."})
    options: dict[str, Any] = field(default_factory=dict)
    episodes: int = field(default=4, metadata={"help": (
        "Levels, played once by each model (the first evaluation levels by default).")})
    turns: int = field(default=3, metadata={"help": "Turns per episode."})
    max_actions: int = 3  # per turn
    max_new_tokens: int = field(default=200, metadata={"help": "New-token cap per turn."})
    seed: int = field(default=EVAL_SEED_OFFSET, metadata={"help": (
        "Seed of the first level; the default is the first evaluation level, which no training data "
        "holds.")})
    bootstrap_episodes: int = field(default=64, metadata={"help": (
        "Random-exploration episodes of the format bootstrap (one SFT epoch; cached).")})
    precision: str = "auto"

    @property
    def prompt(self) -> PromptConfig:
        return PromptConfig("world_model", self.turns, self.max_actions, history_turns=0)

    @property
    def sft(self) -> SFTConfig:
        # No held-out split: its next-state generation would cost more than the epoch
        # itself, and the demo's own play is the evaluation.
        return SFTConfig(epochs=1, val_fraction=0.0, precision=self.precision, seed=0)


def play(lm, tokenizer, config: DemoConfig, label: str) -> list[Trajectory]:
    """The demo's levels played once each at temperature 1, with a bar of turns."""
    from spa.models.engine import Engine, SamplingParams

    rollout_config = RolloutConfig(config.env, dict(config.options), config.prompt)
    sampling = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=1.0, seed=config.seed)
    seeds = list(range(config.seed, config.seed + config.episodes))
    with Bar() as bar:
        task = bar.add_task(f"{label}: {config.episodes} level(s), turn", total=config.turns)
        trajectories = rollout(Engine(lm, tokenizer), tokenizer, seeds, 1, rollout_config, sampling,
                               on_turn=lambda turn, active: bar.update(task, completed=turn,
                                                                       info=f"{active} playing"))
        bar.update(task, completed=config.turns, info="")
    return trajectories


# -- the format bootstrap, cached --------------------------------------------------------


def cache_key(model: str, config: DemoConfig) -> dict:
    """Everything the bootstrapped weights depend on."""
    path = Path(model).expanduser()
    return {"version": CACHE_VERSION, "model": str(path.resolve()) if path.is_dir() else model,
            "env": config.env, "options": config.options, "turns": config.turns,
            "max_actions": config.max_actions, "bootstrap_episodes": config.bootstrap_episodes,
            "sft": asdict(config.sft)}


def spa_home() -> Path:
    # Imported here: spa.models.loading loads transformers, and the CLI imports DemoConfig
    # (its options are built from it) on every start.
    from spa.models.loading import spa_home as home

    return home()


def cache_dir(model: str, config: DemoConfig) -> Path:
    key = cache_key(model, config)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(model).name)
    return spa_home() / "demo" / f"{name}-{config.env}-{digest}"


def bootstrapped(model: str, config: DemoConfig, log: Callable[[str], None] = print,
                 compute: Compute | None = None) -> Path:
    """The format-bootstrapped checkpoint of ``model``: from the cache, else trained now on
    ``compute``'s device and in its precision (None: decided here from ``config.precision``)."""
    from spa.models import load_model
    from spa.worldmodel.selfplay import SelfPlayConfig, build_examples, collect
    from spa.worldmodel.sft import last_checkpoint, train

    folder = cache_dir(model, config)
    if (folder / "bootstrap.json").is_file():
        log(f"format bootstrap: cached in {folder}, no training")
        return folder / "model"
    start = time.perf_counter()
    compute = compute or decide("auto", config.precision)
    data = SelfPlayConfig(env=config.env, env_config=dict(config.options), episodes=config.bootstrap_episodes,
                          samples=1, max_turns=config.turns, max_actions_per_turn=config.max_actions,
                          exploration="random", mode="world_model")
    examples, stats = build_examples(collect(None, None, data), data)
    log(f"format bootstrap: {len(examples)} world-model turns with the true states from "
        f"{config.bootstrap_episodes} random-exploration episodes; one epoch of SFT")
    lm, tokenizer = load_model(model, dtype="fp32", device=compute.device)  # fp32 master weights; autocast computes
    with atomic_dir(folder) as tmp:
        history = train(lm, tokenizer, examples, config.sft, tmp / "sft", compute=compute)
        checkpoint = last_checkpoint(tmp / "sft")
        (checkpoint / TRAINER_STATE).unlink()  # optimizer state: twice the weights, never resumed
        checkpoint.rename(tmp / "model")
        shutil.rmtree(tmp / "sft")
        write_json(tmp / "bootstrap.json", {"key": cache_key(model, config), "examples": len(examples),
                                            "data": {k: v for k, v in stats.items() if k != "config"},
                                            "history": history,
                                            "seconds": round(time.perf_counter() - start, 1)})
    del lm
    heap.release()
    log(f"format bootstrap: trained in {time.perf_counter() - start:.0f} s, cached in {folder}")
    return folder / "model"


# -- the side-by-side table ---------------------------------------------------------------


def marked(written: str, truth: str) -> Text:
    """``written`` with the characters that differ from ``truth`` (same line, same column)
    in red; a missing state reads "(none)"."""
    if not written.strip():
        return Text("(none)", style="dim")
    truth_lines = truth.strip().splitlines()
    text = Text()
    for i, line in enumerate(written.strip().splitlines()):
        true_line = truth_lines[i] if i < len(truth_lines) else ""
        if i:
            text.append("\n")
        for j, char in enumerate(line):
            text.append(char, style=None if j < len(true_line) and true_line[j] == char else "bold red")
    return text


def _rate(count: int, total: int) -> str:
    return f"{count}/{total} ({100 * count / total:.0f}%)" if total else "0/0"


def _actions(trajectory: Trajectory) -> Text:
    """The actions turn by turn (invalid ones red, a turn without any "-"), then the outcome."""
    text = Text()
    for i, turn in enumerate(trajectory.turns):
        if i:
            text.append(" | ", style="dim")
        if not turn.actions:
            text.append("-", style="dim")
        for k, (action, valid) in enumerate(zip(turn.actions, turn.actions_valid)):
            text.append((", " if k else "") + action, style=None if valid else "red")
    text.append("\nsolved" if trajectory.success else "\nnot solved", style="green" if trajectory.success else "dim")
    return text


def comparison(runs: dict[str, list[Trajectory]], title: str) -> Table:
    """One column per model: format-valid turns, valid actions, levels solved, each level's
    actions, and the first turn's observation and prediction against the true states."""
    table = Table(title=title, caption="red: differs from the true state", show_lines=False)
    table.add_column("")
    for name in runs:
        table.add_column(name, overflow="fold")
    turns = {name: [t for traj in trajs for t in traj.turns] for name, trajs in runs.items()}

    def row(label, cell) -> None:
        table.add_row(label, *(cell(name) for name in runs))

    row("format-valid turns", lambda n: _rate(sum(t.format_ok for t in turns[n]), len(turns[n])))
    row("valid actions", lambda n: _rate(sum(sum(t.actions_valid) for t in turns[n]),
                                         sum(len(t.actions) for t in turns[n])))
    row("levels solved", lambda n: _rate(sum(t.success for t in runs[n]), len(runs[n])))
    table.add_section()
    for i, seed in enumerate(t.seed for t in next(iter(runs.values()))):
        row(f"level {seed}: actions", lambda n: _actions(runs[n][i]))
    table.add_section()
    first = {name: trajs[0].turns[0] for name, trajs in runs.items()}
    seed = next(iter(runs.values()))[0].seed
    row(f"level {seed}, turn 1:\ntrue state", lambda n: Text(first[n].state_before))
    row("observation", lambda n: marked(first[n].observation, first[n].state_before))
    row("true next state", lambda n: Text(first[n].state_after))
    row("prediction", lambda n: marked(first[n].prediction, first[n].state_after))
    return table


def next_command(env: str, options: dict[str, Any]) -> str:
    """The whole method on the same environment: ``spa run`` of its SPA recipe."""
    overrides = "".join(f" env.options.{k}={v if isinstance(v, str) else json.dumps(v)}"
                        for k, v in options.items())
    return f"spa run configs/{env}-spa.yaml --preset quick{overrides}"
