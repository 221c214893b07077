"""``spa selfplay``, ``spa sft`` and ``spa rl``: the training stages one by one."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from spa.agent.prompts import PromptConfig
from spa.cli.common import (BASE_MODE_WHY, DeviceOption, EnvNameOption, EnvOption, ModelOption, PlayPrecisionOption,
                            SetOption, app, console, decide, example, load, load_for_training, make_env,
                            parse_options, precision_option, prompt_config, settings)
from spa.cli.options import option
from spa.compute import Compute
from spa.eval.evaluate import EvalConfig
from spa.rl.config import PPOConfig
from spa.worldmodel.selfplay import SelfPlayConfig
from spa.worldmodel.sft import SFTConfig

#: Why spa rl's periodic evaluation is smaller than spa eval's.
RL_EVAL_WHY = "it runs inside the training: at its start and end, and every --eval-every steps"


@app.command(epilog=example("spa selfplay -e frozenlake --out data/fl.jsonl --episodes 8 \\\n"
                            "    --bootstrap-episodes 64"))
def selfplay(
    env: str = EnvNameOption,
    out: str = typer.Option(..., help="Output JSONL of SFT examples (a .stats.json is written beside it)."),
    model: str = ModelOption,
    episodes: int = option(SelfPlayConfig, "episodes", min=1),
    samples: int = option(SelfPlayConfig, "samples", min=1),
    max_turns: int = option(SelfPlayConfig, "max_turns", min=1),
    max_actions: int = option(SelfPlayConfig, "max_actions_per_turn", min=1),
    max_new_tokens: int = option(SelfPlayConfig, "max_new_tokens", min=1),
    states: str = option(SelfPlayConfig, "states"),
    exploration: str = option(SelfPlayConfig, "exploration"),
    coords: str = option(SelfPlayConfig, "coords"),
    drop_no_valid_action: bool = option(SelfPlayConfig, "drop_no_valid_action"),
    mode: str = option(SelfPlayConfig, "mode"),
    keep: str = option(SelfPlayConfig, "keep"),
    bootstrap_episodes: int = typer.Option(0, min=0, help="Format bootstrap before the play: one SFT epoch on "
                                           "this many random-exploration episodes with the true states, as spa "
                                           "run and spa demo do (cached in $SPA_HOME/demo). The default model "
                                           "cannot write the world-model format without it (spa run's quick preset "
                                           "and spa demo use 64). 0: none."),
    precision_name: str = PlayPrecisionOption,
    device: str = DeviceOption,
    seed: int = option(SelfPlayConfig, "seed"),
    option: list[str] = EnvOption,
    set_: list[str] = SetOption,
) -> None:
    """Self-play world-model data with true states, as SFT examples.

    The model plays; the states it imagined are replaced by the true ones and each
    well-formed turn becomes one SFT example. A play that keeps no example is an error.
    """
    from spa.agent.turnlog import TurnLog
    from spa.io import write_json, write_jsonl
    from spa.models.engine import Engine
    from spa.progress import turn_progress
    from spa.worldmodel.selfplay import build_examples, collect

    make_env(env, option)
    base = dict(env=env, env_config=parse_options(option), episodes=episodes, samples=samples, max_turns=max_turns,
                max_actions_per_turn=max_actions, max_new_tokens=max_new_tokens, states=states,
                exploration=exploration, coords=coords, drop_no_valid_action=drop_no_valid_action, seed=seed,
                mode=mode, keep=keep)
    config = settings(SelfPlayConfig, base, set_)
    if bootstrap_episodes and (config.exploration != "self_play" or config.mode != "world_model"):
        raise typer.BadParameter("--bootstrap-episodes teaches the world-model format to the model that plays: "
                                 "it needs --exploration self_play and --mode world_model")
    engine = tokenizer = None
    if config.exploration == "self_play":
        compute = decide(device, precision_name)
        if bootstrap_episodes:
            model = _bootstrapped(model, config, bootstrap_episodes, precision_name, compute)
        lm, tokenizer = load(model, compute)
        engine = Engine(lm, tokenizer, max_batch_size=config.engine_batch)
    start = time.perf_counter()
    log = TurnLog(Path(out).with_suffix(".partial.jsonl"))  # rerun the command to resume an interrupted play
    with turn_progress("self-play", config.max_turns, engine=engine) as on_turn, log:
        trajectories = collect(engine, tokenizer, config, on_turn=on_turn, log=log)
    examples, stats = build_examples(trajectories, config, progress="look-ahead")
    if not examples:
        log.finish()
        console.print(f"[red]error:[/red] {_no_example(stats, bootstrap_episodes)}", highlight=False)
        raise typer.Exit(1)
    stats["wall_seconds"] = round(time.perf_counter() - start, 1)
    write_jsonl(out, examples)
    write_json(Path(out).with_suffix(".stats.json"), stats)
    log.finish()
    console.print(f"{stats['kept']} examples from {stats['turns']} turns "
                  f"({stats['dropped_malformed']} malformed, {stats['dropped_no_valid_action']} without a "
                  f"valid action, {stats['dropped_by_filter']} by --keep dropped); "
                  f"episode success {100 * stats['success_rate']:.1f}%; "
                  f"{stats['wall_seconds']} s -> {out}")


def _bootstrapped(model: str, config, episodes: int, precision_name: str, compute: Compute) -> str:
    """``model`` after spa demo's format bootstrap in the play's environment and turn limits."""
    from spa.demo import DemoConfig, bootstrapped

    demo = DemoConfig(env=config.env, options=dict(config.env_config), turns=config.max_turns,
                      max_actions=config.max_actions_per_turn, bootstrap_episodes=episodes, precision=precision_name)
    return str(bootstrapped(model, demo, lambda text: console.print(text, highlight=False), compute))


def _no_example(stats: dict, bootstrap_episodes: int) -> str:
    """Why the play kept no example, with the counts, and what to do about it."""
    counts = (f"{stats['turns']} turns played, {stats['dropped_malformed']} malformed, "
              f"{stats['dropped_no_valid_action']} without a valid action, {stats['dropped_by_filter']} "
              "dropped by --keep")
    if 2 * stats["dropped_malformed"] < stats["turns"]:  # mostly well-formed: the filters dropped them
        return f"no example kept ({counts}): play more --episodes, or keep more (--keep, --drop-no-valid-action)"
    if bootstrap_episodes:
        return (f"no example kept ({counts}): the model still cannot write the world-model format after a "
                f"{bootstrap_episodes}-episode format bootstrap; give --bootstrap-episodes more episodes")
    recipe = f"configs/{stats['config']['env']}-spa.yaml"
    return (f"no example kept ({counts}): the model cannot write the world-model format yet. Add "
            "--bootstrap-episodes 64 (one SFT epoch on random-exploration turns first), or run the whole method "
            f"with spa run {recipe} --preset quick, which bootstraps the format itself")


@app.command(epilog=example("spa sft --data data/fl.jsonl --out ckpt/fl-sft --epochs 1"))
def sft(
    data: str = typer.Option(..., help="SFT examples (JSONL from spa selfplay)."),
    out: str = typer.Option(..., help="Checkpoint folder (epoch-N subfolders, metrics.json)."),
    model: str = ModelOption,
    epochs: int = option(SFTConfig, "epochs", min=1),
    lr: float = option(SFTConfig, "lr", min=0.0),
    batch_size: int = option(SFTConfig, "batch_size", min=1),
    grad_accum: int = option(SFTConfig, "grad_accum", min=1),
    mask_states: bool = option(SFTConfig, "mask_states"),
    val_fraction: float = option(SFTConfig, "val_fraction", min=0.0, max=0.9),
    max_length: int = option(SFTConfig, "max_length", min=16),
    resume: bool = typer.Option(False, help="Continue after the last complete epoch in OUT."),
    lora_rank: int = option(SFTConfig, "lora_rank", min=0),
    precision_name: str = precision_option(SFTConfig),
    device: str = DeviceOption,
    seed: int = option(SFTConfig, "seed"),
    set_: list[str] = SetOption,
) -> None:
    """World-model SFT on think + answer tokens, states included.

    A masked cross-entropy: prompts and environment text are never trained on.
    """
    from spa.worldmodel.sft import last_checkpoint, load_examples, resume_model, train

    if not Path(data).is_file():
        raise typer.BadParameter(f"data file {data!r} does not exist")
    base = dict(lr=lr, epochs=epochs, batch_size=batch_size, grad_accum=grad_accum, max_length=max_length,
                mask_states=mask_states, val_fraction=val_fraction, seed=seed, lora_rank=lora_rank,
                precision=precision_name)
    config = settings(SFTConfig, base, set_)
    compute = decide(device, config.precision)
    checkpoint = last_checkpoint(Path(out)) if resume else None
    if checkpoint is not None:
        console.print(f"resuming from {checkpoint}")
    # Weights stay fp32 (autocast in the compute precision does the compute); a resumed run
    # continues the checkpoint.
    lm, tokenizer = resume_model(lambda name: load(name, compute, master=True), model, checkpoint)
    history = train(lm, tokenizer, load_examples(data), config, out, resume_from=checkpoint, compute=compute)
    for record in history:
        console.print(f"epoch {record['epoch']}: train loss {record['train_loss']:.3f}, val loss "
                      f"{record['val_loss']:.3f}, next-state exact {100 * record['val_prediction_exact']:.1f}%, "
                      f"{record['tokens_per_second']:.0f} tok/s")
    console.print(f"checkpoints in {out}/epoch-N (Hugging Face format)")


RL_EXAMPLE = "spa rl -e frozenlake --out runs/fl-grpo --algorithm grpo --steps 20"


@app.command("rl", epilog=example(RL_EXAMPLE))
def rl(
    env: str = EnvNameOption,
    out: str = typer.Option(..., help="Run folder: checkpoint/, metrics.jsonl, tensorboard/, eval/."),
    model: str = ModelOption,
    mode: str = option(PromptConfig, "mode", default="base", why=BASE_MODE_WHY),
    algorithm: str = option(PPOConfig, "algorithm"),
    steps: int = option(PPOConfig, "steps", min=1),
    groups: int = option(PPOConfig, "groups", min=1),
    samples: int = option(PPOConfig, "samples", min=1),
    max_turns: int = option(PromptConfig, "max_turns", min=1),
    max_actions: int = option(PromptConfig, "max_actions_per_turn", min=1),
    eval_every: int = option(PPOConfig, "eval_every", min=0),
    eval_levels: int = option(EvalConfig, "num_envs", min=1, default=32, why=RL_EVAL_WHY),
    eval_samples: int = option(EvalConfig, "samples", min=1, default=4, why=RL_EVAL_WHY),
    resume: bool = typer.Option(False, help="Continue from OUT/checkpoint."),
    precision_name: str = precision_option(PPOConfig),
    device: str = DeviceOption,
    set_: list[str] = SetOption,
    option: list[str] = EnvOption,
) -> None:
    """RL stage: PPO with a critic, or GRPO, on multi-turn episodes."""
    from spa.agent.rollout import RolloutConfig
    from spa.eval.evaluate import evaluate
    from spa.rl.ppo import train

    make_env(env, option)
    prompt = prompt_config(mode, max_turns, max_actions, 0)
    base = dict(algorithm=algorithm, steps=steps, groups=groups, samples=samples, eval_every=eval_every,
                precision=precision_name)
    config = settings(PPOConfig, base, set_)
    try:  # before the model loads: PPOConfig's own checks predate the field
        eval_config = EvalConfig(env, parse_options(option), prompt, eval_levels, eval_samples,
                                 max_new_tokens=config.max_new_tokens, engine_batch=config.engine_batch)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    compute = decide(device, config.precision)
    rollout_config = RolloutConfig(env, parse_options(option), prompt)
    checkpoint, lm, tokenizer = load_for_training(model, out, resume, compute)

    def evaluate_fn(policy, step: int) -> dict:
        return evaluate(policy, tokenizer, eval_config, Path(out) / "eval" / f"step-{step}", model_name=model,
                        progress=False, dtype=compute.decode_dtype)

    history = train(lm, tokenizer, rollout_config, config, out, evaluate_fn=evaluate_fn, resume_from=checkpoint,
                    compute=compute)
    if history:
        last = history[-1]
        console.print(f"step {last['step']}: reward {last['rollout/reward_mean']:+.3f}, "
                      f"success {100 * last['rollout/success']:.1f}%")
    console.print(f"policy in {out}/checkpoint/policy; metrics in {out}/metrics.jsonl")



# The command's name before spa rl: hidden, and still running (with a note) for a release.
app.command("ppo", hidden=True, epilog=example(RL_EXAMPLE))(rl)
