"""``spa rwml``: the RWML baseline, the policy trained as a world model with GRPO (seed 003)."""

from __future__ import annotations

import typer

from spa.cli.common import (DeviceOption, EnvNameOption, EnvOption, ModelOption, SetOption, app, console, decide,
                            example, load_for_training, make_env, parse_options, precision_option, settings)
from spa.cli.options import option
from spa.rl.rwml_config import RWMLConfig


@app.command(epilog=example("spa rwml -e frozenlake --out runs/fl-rwml --reward change --steps 20"))
def rwml(
    env: str = EnvNameOption,
    out: str = typer.Option(..., help="Run folder: triplets.jsonl, checkpoint/, metrics.jsonl, eval/."),
    model: str = ModelOption,
    exploration: str = option(RWMLConfig, "exploration"),
    episodes: int = option(RWMLConfig, "episodes", min=1),
    samples: int = option(RWMLConfig, "samples", min=1),
    max_turns: int = option(RWMLConfig, "max_turns", min=1),
    max_actions: int = option(RWMLConfig, "max_actions_per_turn", min=1),
    steps: int = option(RWMLConfig, "steps", min=1),
    group_size: int = option(RWMLConfig, "group_size", min=2),
    batch_size: int = option(RWMLConfig, "batch_size", min=1),
    reward: str = option(RWMLConfig, "reward"),
    tau: float = option(RWMLConfig, "tau", min=0.0),
    lr: float = option(RWMLConfig, "lr", min=0.0),
    filter_easy: bool = option(RWMLConfig, "filter", "--filter/--no-filter"),
    filter_model: str = option(RWMLConfig, "filter_model"),
    eval_levels: int = option(RWMLConfig, "eval_seeds", "--eval-levels", min=0),
    eval_every: int = option(RWMLConfig, "eval_every", min=0),
    resume: bool = typer.Option(False, help="Reuse OUT/triplets.jsonl and continue from OUT/checkpoint."),
    precision_name: str = precision_option(RWMLConfig),
    device: str = DeviceOption,
    set_: list[str] = SetOption,
    option: list[str] = EnvOption,
) -> None:
    """RWML: the policy learns to predict next states, with GRPO.

    Reports the next-state accuracy before and after.
    """
    from spa.rl.rwml_train import run

    make_env(env, option)
    base = dict(exploration=exploration, episodes=episodes, samples=samples, max_turns=max_turns,
                max_actions_per_turn=max_actions, steps=steps, group_size=group_size, batch_size=batch_size,
                reward=reward, tau=tau, lr=lr, filter=filter_easy, filter_model=filter_model,
                eval_seeds=eval_levels, eval_every=eval_every, precision=precision_name)
    config = settings(RWMLConfig, base, set_)
    compute = decide(device, config.precision)
    _, lm, tokenizer = load_for_training(model, out, resume, compute)
    try:
        summary = run(lm, tokenizer, env, parse_options(option), config, out, resume=resume, log=console.print,
                      compute=compute)
    except (ValueError, ModuleNotFoundError, FileNotFoundError) as error:  # no data, no embedder...
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from None
    before, after = summary["before"], summary["after"]
    if before and after:
        for key in ("exact", "changed_exact", "cell", "embedding", "copied"):
            if key in before and key in after:
                console.print(f"next-state {key:13s} {100 * before[key]:5.1f}% -> {100 * after[key]:5.1f}%")
    console.print(f"world model in {out}/checkpoint/policy; accuracy in {out}/eval/summary.json")
