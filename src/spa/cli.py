"""The ``spa`` command line: one typer app, one command per stage."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from spa import envs

app = typer.Typer(
    help="Train LLM agents with an internal world model (SPA), with RWML and RL baselines.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()

EnvOption = typer.Option(
    None, "--option", "-o", help="Environment option as key=value (repeatable), e.g. -o dim=8."
)


def parse_options(pairs: list[str] | None) -> dict[str, Any]:
    """``["dim=8", "is_slippery=false"]`` -> ``{"dim": 8, "is_slippery": False}`` (YAML values)."""
    options: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"{pair!r} is not of the form key=value")
        options[key.strip()] = yaml.safe_load(value) if value.strip() else None
    return options


def make_env(name: str, options: list[str] | None) -> envs.TextEnv:
    """Build an environment, turning configuration errors into clean CLI errors."""
    try:
        return envs.make(name, **parse_options(options))
    except (ValueError, TypeError) as error:
        raise typer.BadParameter(str(error)) from None


@app.command("envs")
def list_envs() -> None:
    """List the environments and their options with defaults."""
    table = Table(title="Environments (spa.envs.make(name, **options))")
    for column in ("name", "option", "default", "meaning"):
        table.add_column(column, overflow="fold")
    for name in envs.env_names():
        for i, (option, default, help_text) in enumerate(envs.config_defaults(name)):
            table.add_row(name if i == 0 else "", option, repr(default), help_text)
        table.add_section()
    console.print(table)


@app.command()
def play(
    env: str = typer.Argument(..., help=f"Environment: {', '.join(envs.env_names())}."),
    seed: int = typer.Option(0, help="Seed of the episode (the same seed, the same level)."),
    option: list[str] = EnvOption,
) -> None:
    """Play an environment yourself in the terminal (Ctrl-D or Ctrl-C quits)."""
    game = make_env(env, option)
    game.reset(seed=seed)
    console.print(game.rules(), style="dim")
    console.print("Type an action and press Enter; 'quit' leaves.\n")
    total, done = 0.0, False
    try:
        while not done:
            console.print(game.render(), highlight=False)
            console.print(game.describe(), style="cyan", highlight=False)
            action = console.input("[bold]action> [/bold]").strip()
            if action.lower() in {"quit", "exit", "q"}:
                break
            _, reward, terminated, truncated, info = game.step(action)
            if not info["action_valid"]:
                console.print(f"[red]invalid action[/red]: {info.get('reason', '')}")
                continue
            total += reward
            done = terminated or truncated
            console.print(f"reward {reward:+.2f}  (total {total:+.2f}, steps {game.steps})")
    except (EOFError, KeyboardInterrupt):
        console.print()
    if done:
        console.print(game.render(), highlight=False)
        verdict = "[green]solved[/green]" if game.is_success() else "[red]not solved[/red]"
        console.print(f"episode over: {verdict}, total reward {total:+.2f}")


ModelOption = typer.Option("smollm2-135m-instruct", "--model", "-m",
                           help="Built-in name (smollm2-135m-instruct, tiny), local folder or hub id.")
ModeOption = typer.Option("world_model", help="Prompt mode: base, state or world_model.")
DtypeOption = typer.Option("bf16", help="Compute dtype: bf16 (fast on CPU), fp32 or fp16.")


def load(model: str, dtype: str):
    """Load a model, turning a bad name into a clean CLI error."""
    from spa.models import load_model

    try:
        with console.status(f"loading {model}"):
            return load_model(model, dtype=dtype, device="auto")
    except (ValueError, FileNotFoundError) as error:
        raise typer.BadParameter(str(error)) from None


def prompt_config(mode: str, max_turns: int, max_actions: int, history_turns: int | None):
    from spa.agent.prompts import PromptConfig

    try:
        return PromptConfig(mode, max_turns, max_actions, history_turns)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


@app.command()
def demo(
    env: str = typer.Option("sokoban", help=f"Environment: {', '.join(envs.env_names())}."),
    model: str = ModelOption,
    episodes: int = typer.Option(2, min=1, help="Episodes to play."),
    turns: int = typer.Option(3, min=1, help="Turns per episode."),
    max_new_tokens: int = typer.Option(200, min=1, help="New-token cap per turn."),
    seed: int = typer.Option(0, help="Seed of the first episode."),
    option: list[str] = EnvOption,
) -> None:
    """A short self-play demo: the model plays in world-model mode at temperature 1."""
    from spa.agent.rollout import RolloutConfig, rollout
    from spa.models.engine import Engine, SamplingParams

    make_env(env, option)  # validates the options before the model loads
    lm, tokenizer = load(model, "bf16")
    config = RolloutConfig(env, parse_options(option), prompt_config("world_model", turns, 3, 0))
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=seed)
    trajectories = rollout(Engine(lm, tokenizer), tokenizer, list(range(seed, seed + episodes)), 1,
                           config, sampling)
    for trajectory in trajectories:
        console.rule(f"{env}, seed {trajectory.seed}")
        for i, turn in enumerate(trajectory.turns, 1):
            console.print(f"[bold]turn {i}[/bold] state:\n{turn.state_before}", highlight=False)
            console.print(f"[yellow]model:[/yellow] {turn.response}", highlight=False)
            console.print(f"format ok: {turn.format_ok}; actions: {turn.actions} "
                          f"(valid: {turn.actions_valid}); reward: {turn.reward:+.2f}")
        console.print("solved" if trajectory.success else "not solved")
    solved = sum(t.success for t in trajectories)
    console.print(f"\n{solved}/{episodes} episodes solved")


@app.command("eval")
def evaluate_command(
    env: str = typer.Option(..., "--env", "-e", help=f"Environment: {', '.join(envs.env_names())}."),
    model: str = ModelOption,
    mode: str = ModeOption,
    num_envs: int = typer.Option(128, min=1, help="Evaluation seeds (fixed, disjoint from training)."),
    samples: int = typer.Option(8, min=1, help="Samples per seed (Pass@k uses k <= samples)."),
    temperature: float = typer.Option(1.0, min=0.0, help="Sampling temperature; 0 is greedy."),
    top_p: float = typer.Option(1.0, min=0.0, max=1.0, help="Nucleus sampling mass."),
    max_turns: int = typer.Option(5, min=1, help="Turns per episode."),
    max_actions: int = typer.Option(3, min=1, help="Actions per turn."),
    history_turns: int = typer.Option(0, min=-1, help="Earlier turns kept in the prompt; -1 keeps all."),
    max_new_tokens: int = typer.Option(400, min=1, help="New-token cap per turn."),
    dtype: str = DtypeOption,
    seed: int = typer.Option(0, help="Sampling seed."),
    out: str = typer.Option(None, help="Output folder (default: evals/ENV-MODE)."),
    option: list[str] = EnvOption,
) -> None:
    """Evaluate a model: Pass@k, valid rates and (world_model mode) world-model accuracy."""
    from spa.eval.evaluate import EvalConfig, evaluate, metric_rows

    make_env(env, option)
    prompt = prompt_config(mode, max_turns, max_actions, None if history_turns < 0 else history_turns)
    config = EvalConfig(env, parse_options(option), prompt, num_envs, samples, temperature, top_p,
                        max_new_tokens, seed=seed)
    lm, tokenizer = load(model, dtype)
    out_dir = out or f"evals/{env}-{mode}"
    metrics = evaluate(lm, tokenizer, config, out_dir, model_name=model)
    table = Table(title=f"{model} on {env} ({mode}), {num_envs} seeds x {samples} samples")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in metric_rows(metrics):
        table.add_row(name, value)
    console.print(table)
    console.print(f"{metrics['wall_seconds']} s; wrote {out_dir}/metrics.json, report.md, trajectories.jsonl")


@app.command()
def ppl(
    env: list[str] = typer.Option(None, "--env", "-e", help="Environment(s); default: all."),
    model: str = ModelOption,
    num_states: int = typer.Option(128, min=1, help="States per environment."),
    dtype: str = typer.Option("fp32", help="Compute dtype (fp32 default: perplexity is a precise number)."),
    out: str = typer.Option(None, help="Also write the results as JSON here."),
) -> None:
    """State perplexity of raw grids vs grids with coordinates (the paper's Table 1)."""
    from spa.eval.perplexity import sample_states, state_perplexity
    from spa.io import write_json

    names = env or envs.env_names()
    for name in names:
        make_env(name, None)  # a bad name fails before the model loads
    lm, tokenizer = load(model, dtype)
    table = Table(title=f"State perplexity of {model} ({num_states} states each)")
    for column in ("env", "raw grid", "grid + coordinates", "state tokens (raw / structured)"):
        table.add_column(column)
    results = {}
    for name in names:
        states = sample_states(name, num_states)
        raw = state_perplexity(lm, tokenizer, states, structured=False)
        structured = state_perplexity(lm, tokenizer, states, structured=True)
        results[name] = {"raw": raw, "structured": structured}
        table.add_row(name, f"{raw['ppl']:.1f}", f"{structured['ppl']:.1f}",
                      f"{raw['state_tokens']} / {structured['state_tokens']}")
    console.print(table)
    if out:
        write_json(out, {"model": model, "num_states": num_states, "results": results})


@app.command()
def selfplay(
    env: str = typer.Option(..., "--env", "-e", help=f"Environment: {', '.join(envs.env_names())}."),
    out: str = typer.Option(..., help="Output JSONL of SFT examples (a .stats.json is written beside it)."),
    model: str = ModelOption,
    episodes: int = typer.Option(1280, min=1, help="Episodes (paper: 1,280 = 160 seeds x 8 samples)."),
    samples: int = typer.Option(8, min=1, help="Episodes per training seed."),
    max_turns: int = typer.Option(5, min=1, help="Turns per episode."),
    max_actions: int = typer.Option(3, min=1, help="Actions per turn."),
    max_new_tokens: int = typer.Option(400, min=1, help="New-token cap per turn."),
    states: str = typer.Option("ground_truth", help="ground_truth, or self_belief (ablation: no replacement)."),
    exploration: str = typer.Option("self_play", help="self_play, or random (ablation: random actions)."),
    coords: str = typer.Option("true", help="true, or random (ablation: random coordinates)."),
    drop_no_valid_action: bool = typer.Option(False, help="Also drop turns whose actions all failed."),
    dtype: str = DtypeOption,
    seed: int = typer.Option(0, help="Sampling seed."),
    option: list[str] = EnvOption,
) -> None:
    """Self-play world-model data: play, replace imagined states by true ones, write SFT examples."""
    from spa.io import write_json, write_jsonl
    from spa.models.engine import Engine
    from spa.worldmodel.selfplay import SelfPlayConfig, build_examples, collect

    make_env(env, option)
    try:
        config = SelfPlayConfig(
            env=env, env_config=parse_options(option), episodes=episodes, samples=samples,
            max_turns=max_turns, max_actions_per_turn=max_actions, max_new_tokens=max_new_tokens,
            states=states, exploration=exploration, coords=coords,
            drop_no_valid_action=drop_no_valid_action, seed=seed)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    engine = tokenizer = None
    if exploration == "self_play":
        lm, tokenizer = load(model, dtype)
        engine = Engine(lm, tokenizer)
    start = time.perf_counter()
    with console.status("self-play") as status:
        trajectories = collect(engine, tokenizer, config, on_turn=lambda t, n: status.update(
            f"self-play: turn {t + 1}/{max_turns}, {n} episodes playing"))
    examples, stats = build_examples(trajectories, config)
    stats["wall_seconds"] = round(time.perf_counter() - start, 1)
    write_jsonl(out, examples)
    write_json(Path(out).with_suffix(".stats.json"), stats)
    console.print(f"{stats['kept']} examples from {stats['turns']} turns "
                  f"({stats['dropped_malformed']} malformed, {stats['dropped_no_valid_action']} without a "
                  f"valid action dropped); episode success {100 * stats['success_rate']:.1f}%; "
                  f"{stats['wall_seconds']} s -> {out}")


@app.command()
def sft(
    data: str = typer.Option(..., help="SFT examples (JSONL from spa selfplay)."),
    out: str = typer.Option(..., help="Checkpoint folder (epoch-N subfolders, metrics.json)."),
    model: str = ModelOption,
    epochs: int = typer.Option(5, min=1, help="Epochs (paper: 5)."),
    lr: float = typer.Option(1e-4, min=0.0, help="Peak learning rate (paper: 1e-4)."),
    batch_size: int = typer.Option(8, min=1, help="Sequences per micro-batch."),
    grad_accum: int = typer.Option(1, min=1, help="Micro-batches per optimizer step."),
    mask_states: bool = typer.Option(False, help="Exclude observation/prediction contents from the loss (ablation)."),
    val_fraction: float = typer.Option(0.1, min=0.0, max=0.9, help="Held-out share of episodes."),
    max_length: int = typer.Option(2048, min=16, help="Drop longer examples."),
    resume: bool = typer.Option(False, help="Continue after the last complete epoch in OUT."),
    seed: int = typer.Option(0, help="Data order and split seed."),
) -> None:
    """World-model SFT: masked cross-entropy on think + answer tokens, states included."""
    from spa.worldmodel.sft import SFTConfig, last_checkpoint, load_examples, train

    if not Path(data).is_file():
        raise typer.BadParameter(f"data file {data!r} does not exist")
    config = SFTConfig(lr=lr, epochs=epochs, batch_size=batch_size, grad_accum=grad_accum,
                       max_length=max_length, mask_states=mask_states, val_fraction=val_fraction, seed=seed)
    checkpoint = last_checkpoint(Path(out)) if resume else None
    if checkpoint is not None:
        console.print(f"resuming from {checkpoint}")
    # Weights stay fp32 (bf16 autocast does the compute); a resumed run continues the checkpoint.
    lm, tokenizer = load(str(checkpoint) if checkpoint is not None else model, "fp32")
    history = train(lm, tokenizer, load_examples(data), config, out, resume_from=checkpoint)
    for record in history:
        console.print(f"epoch {record['epoch']}: train loss {record['train_loss']:.3f}, val loss "
                      f"{record['val_loss']:.3f}, next-state exact {100 * record['val_prediction_exact']:.1f}%, "
                      f"{record['tokens_per_second']:.0f} tok/s")
    console.print(f"checkpoints in {out}/epoch-N (Hugging Face format)")


@app.command()
def ppo(
    env: str = typer.Option(..., "--env", "-e", help=f"Environment: {', '.join(envs.env_names())}."),
    out: str = typer.Option(..., help="Run folder: checkpoint/, metrics.jsonl, tensorboard/, eval/."),
    model: str = ModelOption,
    mode: str = typer.Option("state", help="Prompt mode: base, state or world_model."),
    algorithm: str = typer.Option("ppo", help="ppo (with a critic) or grpo."),
    steps: int = typer.Option(1000, min=1, help="Training steps (paper: 1,000)."),
    groups: int = typer.Option(32, min=1, help="Training seeds per step (paper: 32)."),
    samples: int = typer.Option(8, min=1, help="Episodes per seed (paper: 8)."),
    max_turns: int = typer.Option(5, min=1, help="Turns per episode."),
    max_actions: int = typer.Option(3, min=1, help="Actions per turn."),
    eval_every: int = typer.Option(0, min=0, help="Evaluate every N steps (and at start and end); 0: never."),
    eval_envs: int = typer.Option(32, min=1, help="Evaluation seeds of the periodic evaluation."),
    eval_samples: int = typer.Option(4, min=1, help="Samples per evaluation seed."),
    resume: bool = typer.Option(False, help="Continue from OUT/checkpoint."),
    set_: list[str] = typer.Option(None, "--set", help="Any PPOConfig field as key=value, e.g. --set actor_lr=1e-5."),
    option: list[str] = EnvOption,
) -> None:
    """RL stage: PPO with a critic, or GRPO, on multi-turn episodes."""
    import torch

    from spa.agent.rollout import RolloutConfig
    from spa.config import ConfigError, load as load_config
    from spa.eval.evaluate import EvalConfig, evaluate
    from spa.rl.ppo import PPOConfig, resume_point, train

    make_env(env, option)
    prompt = prompt_config(mode, max_turns, max_actions, 0)
    base = dict(algorithm=algorithm, steps=steps, groups=groups, samples=samples, eval_every=eval_every)
    try:
        config = load_config(PPOConfig, base, set_ or [])
    except ConfigError as error:
        raise typer.BadParameter(str(error)) from None
    rollout_config = RolloutConfig(env, parse_options(option), prompt)
    checkpoint = resume_point(out) if resume else None
    if resume and checkpoint is None:
        console.print(f"no checkpoint in {out}: starting from {model}")
    lm, tokenizer = load(str(checkpoint / "policy") if checkpoint else model, "fp32")
    eval_config = EvalConfig(env, parse_options(option), prompt, eval_envs, eval_samples,
                             max_new_tokens=config.max_new_tokens)

    def evaluate_fn(policy, step: int) -> dict:
        return evaluate(policy, tokenizer, eval_config, Path(out) / "eval" / f"step-{step}", model_name=model,
                        progress=False, dtype=torch.bfloat16 if config.bf16 else None)

    history = train(lm, tokenizer, rollout_config, config, out, evaluate_fn=evaluate_fn, resume_from=checkpoint)
    if history:
        last = history[-1]
        console.print(f"step {last['step']}: reward {last['rollout/reward_mean']:+.3f}, "
                      f"success {100 * last['rollout/success']:.1f}%")
    console.print(f"policy in {out}/checkpoint/policy; metrics in {out}/metrics.jsonl")


if __name__ == "__main__":
    app()
