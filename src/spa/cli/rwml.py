"""``spa rwml``: the RWML baseline, the policy trained as a world model with GRPO (seed 003)."""

from __future__ import annotations

import typer

from spa.cli.common import (DeviceOption, EnvNameOption, EnvOption, ModelOption, PrecisionOption, SetOption, app,
                            console, decide, example, load_for_training, make_env, parse_options, settings)
from spa.rl.rewards import EMBEDDING_TAU  # a light import (no torch)


@app.command(epilog=example("spa rwml -e frozenlake --out runs/fl-rwml --reward change --steps 20"))
def rwml(
    env: str = EnvNameOption,
    out: str = typer.Option(..., help="Run folder: triplets.jsonl, checkpoint/, metrics.jsonl, eval/."),
    model: str = ModelOption,
    exploration: str = typer.Option("self_play", help="Data: self_play (the policy plays, paper) or random "
                                                      "(random valid actions; for models that rarely act)."),
    episodes: int = typer.Option(1280, min=1, help="Data episodes (a multiple of --samples)."),
    samples: int = typer.Option(8, min=1, help="Episodes per training level."),
    max_turns: int = typer.Option(5, min=1, help="Turns per episode (one triplet per turn)."),
    max_actions: int = typer.Option(3, min=1, help="Actions per turn."),
    steps: int = typer.Option(100, min=1, help="GRPO steps."),
    group_size: int = typer.Option(8, min=2, help="Predictions per triplet: the group whose rewards GRPO "
                                                  "compares (paper: 8)."),
    batch_size: int = typer.Option(32, min=1, help="Triplets per step, each a group of --group-size predictions."),
    reward: str = typer.Option("embedding", help="embedding (paper: 1[1 - cos < tau]), exact, cell, or change "
                               "(cell accuracy balanced over changed and kept cells: a copy scores 0.5)."),
    tau: float = typer.Option(EMBEDDING_TAU, min=0.0, help="Cosine-distance threshold of the embedding reward."),
    lr: float = typer.Option(1e-6, min=0.0, help="Learning rate (paper: 1e-6; CPU quick runs need ~1e-5)."),
    filter_easy: bool = typer.Option(True, "--filter/--no-filter",
                                     help="Subsample too-easy triplets (paper); costs K predictions per triplet."),
    filter_model: str = typer.Option("", help="Model of the too-easy filter; empty: the policy at the start."),
    eval_levels: int = typer.Option(32, min=0, help="Evaluation levels explored at random for next-state "
                                                    "accuracy; 0: no evaluation."),
    eval_every: int = typer.Option(0, min=0, help="Also evaluate every N steps (start and end always)."),
    resume: bool = typer.Option(False, help="Reuse OUT/triplets.jsonl and continue from OUT/checkpoint."),
    precision_name: str = PrecisionOption,
    device: str = DeviceOption,
    set_: list[str] = SetOption,
    option: list[str] = EnvOption,
) -> None:
    """RWML: the policy learns to predict next states, with GRPO.

    Reports the next-state accuracy before and after.
    """
    from spa.rl.rwml_config import RWMLConfig
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
