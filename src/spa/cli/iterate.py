"""``spa iterate``: expert iteration, rounds of self-play filtered by a per-turn label and SFT on the rest."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import typer

from spa.agent.keep import FILTERS, LABELLED
from spa.agent.prompts import PromptConfig
from spa.cli.common import (BASE_MODE_WHY, DeviceOption, EnvNameOption, EnvOption, ModelOption, SetOption, app,
                            console, decide, example, load, make_env, parse_options, precision_option, prompt_config,
                            settings)
from spa.cli.options import option
from spa.eval.evaluate import EvalConfig
from spa.rl.expert_iteration import IterateConfig

DEFAULTS = IterateConfig()


def rounds_by_label() -> str:
    """The rounds each label gives, as the tables name them, read from the registry
    (:data:`spa.agent.keep.FILTERS`): ``winners: winner rounds; best, ...: solver-label rounds``."""
    names: dict[str, list[str]] = {}
    for name in LABELLED:
        names.setdefault(FILTERS[name].learner, []).append(name)
    return "; ".join(f"{', '.join(group)}: {learner}" for learner, group in names.items())


ITERATE_HELP = f"""Expert iteration: the policy plays, keeps the turns its label (--keep) passes, and
fine-tunes on them, round after round.

Each round plays fresh training levels; the kept turns, with the model's own responses,
get one SFT epoch, which gives the next round's policy. The labels, by the rounds they
give ({DEFAULTS.keep} by default; --keep says what each keeps): {rounds_by_label()}. A
killed run resumes where it stopped when given the same command.
"""


@app.command(help=ITERATE_HELP,
             epilog=example("spa iterate -e frozenlake --model runs/fl/sft/epoch-3 --out runs/fl-iterate"))
def iterate(
    env: str = EnvNameOption,
    out: str = typer.Option(..., help="Run folder: rounds.json, and round-N/ with data.jsonl, sft/, eval/."),
    model: str = ModelOption,
    mode: str = option(PromptConfig, "mode", default="base", why=BASE_MODE_WHY),
    rounds: int = option(IterateConfig, "rounds", min=1),
    episodes: int = option(IterateConfig, "episodes", min=1),
    samples: int = option(IterateConfig, "samples", min=1),
    keep: str = option(IterateConfig, "keep", note=f"value's settings, here at their defaults: --set "
                       f"value_rollouts={DEFAULTS.value_rollouts} --set value_horizon={DEFAULTS.value_horizon} "
                       f"--set value_tolerance={DEFAULTS.value_tolerance:g}. The iterate recipes use best "
                       "(vagen's: best_grounded)."),
    max_turns: int = option(PromptConfig, "max_turns", min=1),
    max_actions: int = option(PromptConfig, "max_actions_per_turn", min=1),
    lr: float = option(IterateConfig, "sft.lr", min=0.0, note="Of each round's SFT."),
    eval_levels: int = option(EvalConfig, "num_envs", min=0, note="Played at the start and after each round; "
                                                                  "0: no evaluation."),
    eval_samples: int = option(EvalConfig, "samples", min=1),
    keep_optimizer: bool = typer.Option(False, "--keep-optimizer",
                                        help="Keep the rounds' optimizer states (trainer_state.pt, 1 GB a round "
                                             "for the default model) once every round is done; by default they "
                                             "are deleted then, as `spa run` does, since only an unfinished "
                                             "round resumes from one."),
    precision_name: str = precision_option(IterateConfig, "sft.precision"),
    device: str = DeviceOption,
    set_: list[str] = SetOption,
    option: list[str] = EnvOption,
) -> None:
    # The help is ITERATE_HELP, built from the labels' registry.
    from spa.agent.rollout import RolloutConfig
    from spa.config import to_dict
    from spa.eval.evaluate import evaluate
    from spa.io import drop_trainer_states
    from spa.rl.expert_iteration import describe_round, run

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
