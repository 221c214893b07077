"""``spa iterate``: expert iteration, rounds of self-play filtered by a per-turn label and SFT on the rest."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import typer

from spa.agent.keep import LABELLED, keep_help
from spa.cli.common import (BASE_MODE_WHY, DeviceOption, EnvNameOption, EnvOption, ModelOption, PrecisionOption,
                            SetOption, app, console, decide, example, load, make_env, mode_option, parse_options,
                            prompt_config, settings)


@app.command(epilog=example("spa iterate -e frozenlake --model runs/fl/sft/epoch-3 --out runs/fl-iterate"))
def iterate(
    env: str = EnvNameOption,
    out: str = typer.Option(..., help="Run folder: rounds.json, and round-N/ with data.jsonl, sft/, eval/."),
    model: str = ModelOption,
    mode: str = mode_option("base", BASE_MODE_WHY),
    rounds: int = typer.Option(3, min=1, help="Rounds of play, filter and SFT."),
    episodes: int = typer.Option(1600, min=1, help="Episodes played per round (a multiple of --samples)."),
    samples: int = typer.Option(4, min=1, help="Episodes per level."),
    keep: str = typer.Option("value", help="Turns trained on, by a label per turn: " + keep_help(LABELLED)
                             + " value's settings, here at their defaults: --set value_rollouts=128 --set "
                               "value_horizon=5 --set value_tolerance=0. The iterate recipes use best "
                               "(vagen's: best_grounded)."),
    max_turns: int = typer.Option(5, min=1, help="Turns per episode."),
    max_actions: int = typer.Option(3, min=1, help="Actions per turn."),
    lr: float = typer.Option(1e-4, min=0.0, help="Peak SFT learning rate of each round."),
    eval_levels: int = typer.Option(128, min=0, help="Evaluation levels after each round (and at the start); "
                                                     "0: no evaluation."),
    eval_samples: int = typer.Option(8, min=1, help="Samples per evaluation level."),
    keep_optimizer: bool = typer.Option(False, "--keep-optimizer",
                                        help="Keep the rounds' optimizer states (trainer_state.pt, 1 GB a round "
                                             "for the default model) once every round is done; by default they "
                                             "are deleted then, as `spa run` does, since only an unfinished "
                                             "round resumes from one."),
    precision_name: str = PrecisionOption,
    device: str = DeviceOption,
    set_: list[str] = SetOption,
    option: list[str] = EnvOption,
) -> None:
    """Expert iteration: the policy plays, keeps the turns its label (--keep) passes, and
    fine-tunes on them, round after round.

    Each round plays fresh training levels; the kept turns, with the model's own responses,
    get one SFT epoch, which gives the next round's policy. The label: value (the default)
    keeps turns whose first move has the highest Monte-Carlo value under random continuation
    (the task's reward, no solver), winners the turns of episodes that succeeded, best the
    turns whose first move begins a solver's shortest solution (the recipes' choice). A
    killed run resumes where it stopped when given the same command.
    """
    from spa.agent.rollout import RolloutConfig
    from spa.config import to_dict
    from spa.eval.evaluate import EvalConfig, evaluate
    from spa.io import drop_trainer_states
    from spa.rl.expert_iteration import IterateConfig, describe_round, run

    make_env(env, option)
    prompt = prompt_config(mode, max_turns, max_actions, 0)
    sft = {**to_dict(IterateConfig().sft), "lr": lr, "precision": precision_name}  # one epoch, not SFTConfig's
    base = dict(rounds=rounds, episodes=episodes, samples=samples, keep=keep, sft=sft)
    config = settings(IterateConfig, base, set_)
    compute = decide(device, config.sft.precision)
    rollout = RolloutConfig(env, parse_options(option), prompt)
    load_fp32 = partial(load, chosen=compute, master=True)
    eval_config = EvalConfig(env, parse_options(option), prompt, max(eval_levels, 1), eval_samples,
                             max_new_tokens=config.max_new_tokens, engine_batch=config.engine_batch)

    def evaluate_fn(lm, tokenizer, folder: Path) -> dict:
        return evaluate(lm, tokenizer, eval_config, folder, model_name=model, label=f"{folder.parent.name} eval",
                        dtype=compute.decode_dtype)

    def report(record: dict) -> None:
        console.print(describe_round(record))

    try:
        run(model, load_fp32, config, rollout, out, evaluate=evaluate_fn if eval_levels else None, on_round=report,
            compute=compute)
    except (ValueError, RuntimeError) as error:
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from None
    if not keep_optimizer and (freed := drop_trainer_states(out)):
        console.print(f"dropped the rounds' optimizer states ({freed / 1e9:.2f} GB; --keep-optimizer keeps them)")
    console.print(f"rounds in {out}/rounds.json; last policy in {out}/round-{config.rounds}/sft")
