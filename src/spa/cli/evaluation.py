"""``spa eval``, ``spa paired`` and ``spa ppl``: measure a model, compare two evaluations."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from spa import envs
from spa.cli.common import (BASE_MODE_WHY, DeviceOption, EnvNameOption, EnvOption, ModelOption, PlayPrecisionOption,
                            SetOption, app, console, decide, example, load, make_env, parse_options, settings)
from spa.cli.options import option
from spa.eval.evaluate import EvalConfig


@app.command("eval", epilog=example("spa eval -e sokoban --policy oracle --levels 16"))
def evaluate_command(
    env: str = EnvNameOption,
    model: str = ModelOption,
    mode: str = option(EvalConfig, "prompt.mode", default="base",
                       why=BASE_MODE_WHY + "; world_model for a world-model SFT checkpoint"),
    levels: int = option(EvalConfig, "num_envs", min=1),
    samples: int = option(EvalConfig, "samples", min=1),
    temperature: float = option(EvalConfig, "temperature", min=0.0),
    top_p: float = option(EvalConfig, "top_p", min=0.0, max=1.0),
    max_turns: int = option(EvalConfig, "prompt.max_turns", min=1),
    max_actions: int = option(EvalConfig, "prompt.max_actions_per_turn", min=1),
    history_turns: int = option(EvalConfig, "prompt.history_turns", min=-1, note="Here -1 stands for None."),
    max_new_tokens: int = option(EvalConfig, "max_new_tokens", min=1),
    precision_name: str = PlayPrecisionOption,
    device: str = DeviceOption,
    seed: int = option(EvalConfig, "seed"),
    out: str = typer.Option(None, help="Output folder (default: evals/ENV-MODE, or evals/ENV-POLICY "
                            "for a baseline)."),
    option: list[str] = EnvOption,
    policy: str = typer.Option("model", help="Who plays: model, random (uniform valid actions), "
                               "oracle (a solver's shortest solution) or value (greedy on Monte-Carlo "
                               "values of random continuation: what the value label teaches, no "
                               "solver); the baselines load no model."),
    set_: list[str] = SetOption,
) -> None:
    """Evaluate a model or a baseline on the fixed evaluation levels.

    Pass@k, valid-action rates and world-model accuracy; --policy random, oracle or value
    plays a baseline instead of the model.
    """
    from spa.eval.baselines import POLICIES, evaluate_policy
    from spa.eval.evaluate import evaluate, metric_rows

    if policy not in POLICIES:
        raise typer.BadParameter(f"unknown policy {policy!r}; valid policies: {', '.join(POLICIES)}")
    make_env(env, option)
    prompt = dict(mode=mode, max_turns=max_turns, max_actions_per_turn=max_actions,
                  history_turns=None if history_turns < 0 else history_turns)
    base = dict(env=env, env_config=parse_options(option), prompt=prompt, num_envs=levels, samples=samples,
                temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed)
    config = settings(EvalConfig, base, set_)
    mode = config.prompt.mode
    if policy == "model":
        lm, tokenizer = load(model, decide(device, precision_name))
        out_dir = out or f"evals/{env}-{mode}"
        metrics = evaluate(lm, tokenizer, config, out_dir, model_name=model)
    else:
        out_dir = out or f"evals/{env}-{policy}"
        metrics = evaluate_policy(policy, config, out_dir)
    player = model if policy == "model" else f"{policy} policy"
    table = Table(title=f"{player} on {env} ({mode}), {config.num_envs} levels x {config.samples} samples")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in metric_rows(metrics):  # Pass@k 95% intervals included, where there are 2+ seeds
        table.add_row(name, value)
    console.print(table)
    console.print(f"{metrics['wall_seconds']} s; wrote {out_dir}/metrics.json, report.md, trajectories.jsonl")


@app.command(epilog=example("spa paired runs/exp-bc/eval-ep1 runs/exp-bc-grpo-step20-eval-128x8"))
def paired(
    before: str = typer.Argument(..., help="Evaluation folder (spa eval --out) of the first model."),
    after: str = typer.Argument(..., help="Evaluation folder of the second model, on the same levels."),
    as_json: bool = typer.Option(False, "--json", help="Print the numbers as JSON instead of a table."),
) -> None:
    """Compare two evaluations that played the same levels, level by level.

    Each level's Pass@1 (and Pass@k with k the samples per level) after minus before,
    averaged over the levels, with a 95% interval over levels: far narrower than the two
    evaluations' own intervals, as each level's difficulty cancels out. Where the
    environment has a solver, also the share of turns whose first action began a shortest
    solution, paired the same way.
    """
    from spa.eval.paired import best_first_table, compare_evaluations, table

    try:
        result = compare_evaluations(before, after)
    except (FileNotFoundError, ValueError) as error:
        raise typer.BadParameter(str(error)) from None
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    samples = result["samples"]
    each = samples["before"] if samples["before"] == samples["after"] else f"{samples['before']} / {samples['after']}"
    title = f"{before} -> {after}\n{result['env']}, {result['levels']} levels x {each} samples"
    for header, rows in filter(None, (table(result), best_first_table(result))):
        view = Table(title=title)
        for column in header:
            view.add_column(column, justify="right" if column else "left")
        for row in rows:
            view.add_row(*row)
        console.print(view)
        title = None
    console.print("In %, differences in points; 95% intervals over levels.", highlight=False)


@app.command(epilog=example("spa ppl -e sokoban -e sudoku --levels 32"))
def ppl(
    env: list[str] = typer.Option(None, "--env", "-e", help="Environment (repeatable); default: all."),
    model: str = ModelOption,
    levels: int = typer.Option(128, min=1, help="Evaluation levels per environment, one state of each "
                                                "(after 0-4 random actions)."),
    precision_name: str = PlayPrecisionOption,
    device: str = DeviceOption,
    out: str = typer.Option(None, help="Also write the results as JSON here."),
) -> None:
    """State perplexity of raw grids vs grids with coordinates.

    The paper's Table 1 measurement: one state of each of the first evaluation levels.
    """
    from spa.eval.perplexity import sample_states, state_perplexity
    from spa.io import write_json

    names = env or envs.env_names()
    for name in names:
        make_env(name, None)  # a bad name fails before the model loads
    lm, tokenizer = load(model, decide(device, precision_name))
    table = Table(title=f"State perplexity of {model} ({levels} states each)")
    for column in ("env", "raw grid", "grid + coordinates", "state tokens (raw / structured)"):
        table.add_column(column)
    results = {}
    for name in names:
        states = sample_states(name, levels)
        raw = state_perplexity(lm, tokenizer, states, structured=False)
        structured = state_perplexity(lm, tokenizer, states, structured=True)
        results[name] = {"raw": raw, "structured": structured}
        table.add_row(name, f"{raw['ppl']:.1f}", f"{structured['ppl']:.1f}",
                      f"{raw['state_tokens']} / {structured['state_tokens']}")
    console.print(table)
    if out:
        write_json(out, {"model": model, "levels": levels, "results": results})
