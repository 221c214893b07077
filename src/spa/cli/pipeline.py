"""``spa run`` and ``spa compare``: the whole pipeline from one recipe, and runs side by side."""

from __future__ import annotations

from pathlib import Path

import typer

from spa.cli.common import app, console, example


@app.command(epilog=example("spa run configs/frozenlake-spa.yaml --preset quick"))
def run(
    config: str = typer.Argument(..., help="Recipe YAML, e.g. configs/sokoban-spa.yaml."),
    overrides: list[str] = typer.Argument(None, help="Recipe fields as key=value, e.g. ppo.steps=20."),
    preset: str = typer.Option("learn", help="Budget preset: learn (CPU, about 2.5 h: RL that can show a "
                                             "curve), quick (CPU, a short run of every stage on the default "
                                             "model), smoke (the tiny random model, seconds a stage: the "
                                             "plumbing, e.g. under a launcher), paper, or a YAML file."),
    name: str = typer.Option(None, help="Run name (default: recipe name and preset)."),
    runs_dir: str = typer.Option("runs", envvar="SPA_RUNS_DIR",
                                 help="Folder of the runs; keep it outside a checkout that may be laid anew."),
    until: str = typer.Option(None, help="Stop after this stage (e.g. eval_sft); run again without it to go on."),
) -> None:
    """Run every stage of a recipe into RUNS_DIR/NAME.

    Run it again to continue after an interruption.
    """
    from spa.config import ConfigError
    from spa.pipeline.recipe import load_recipe
    from spa.pipeline.run import Run

    if not Path(config).is_file():
        raise typer.BadParameter(f"recipe {config!r} does not exist")
    try:
        recipe = load_recipe(config, overrides or [], preset)
        folder = Path(runs_dir) / (name or f"{Path(config).stem}-{Path(preset).stem}")
        pipeline = Run(recipe, folder, log=lambda text: console.print(text, highlight=False))
        if until is not None and until not in pipeline.stage_list():
            raise ValueError(f"--until {until!r} is not a stage of this recipe; valid: "
                             f"{', '.join(pipeline.stage_list())}")
    except (ConfigError, ValueError) as error:
        raise typer.BadParameter(str(error)) from None
    try:
        pipeline.run(until)
    except RuntimeError as error:  # a stage that cannot go on (e.g. self-play kept no example)
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from None
    from spa import distributed

    if until is None and distributed.is_main():  # once under a launcher
        console.print(f"report: {folder / 'report.md'}")


@app.command(epilog=example("spa compare runs/frozenlake-spa-quick runs/frozenlake-vanilla-quick"))
def compare(
    runs: list[str] = typer.Argument(..., help="Run folders to compare."),
    out: str = typer.Option("comparison", help="Output folder: comparison.md, curves.png, passk.png, rounds.png."),
    resamples: int = typer.Option(10_000, min=1, help="Bootstrap replicates of the replicate groups' intervals."),
) -> None:
    """Compare runs: a side-by-side table, replicates grouped by recipe, and plots.

    The tables have Pass@1 and Pass@8 of the base model, before RL and after, and the
    paired Pass@1 gain of RL (as spa paired); runs of one recipe with other seeds form a
    group, shown as mean and 95% bootstrap interval over seeds and levels, each group against
    plain RL, and the seed spread with the runs per arm a gap needs. Plots: training curves
    and Pass@k for k = 1..8 per group.
    """
    from spa.pipeline.report import compare as write_comparison

    try:
        path = write_comparison(runs, out, resamples=resamples)
    except FileNotFoundError as error:
        raise typer.BadParameter(str(error)) from None
    console.print(path.read_text(), highlight=False, soft_wrap=True, markup=False)  # whole rows; [x] is text
    plots = [str(plot) for plot in (Path(out) / name for name in ("curves.png", "passk.png", "rounds.png"))
             if plot.is_file()]
    console.print(f"wrote {', '.join([str(path), *plots])}")


@app.command(epilog=example("spa archive runs/frozenlake-vanilla-iterate-s0 --out results/runs"))
def archive(
    runs: list[str] = typer.Argument(..., help="Run folders to archive."),
    out: str = typer.Option(..., help="Folder that receives a light copy of each run, under the run's name."),
) -> None:
    """Copy the results of runs (recipe, stages, report, RL log, every evaluation's metrics and
    per-level successes) without their checkpoints and data: a few hundred kB instead of GBs.

    spa compare reads the copy like the run, so a table made over several sessions or
    machines survives the run folders.
    """
    from spa.pipeline.layout import archive as archive_run

    for folder in runs:
        try:
            dest = archive_run(folder, out)
        except (FileNotFoundError, ValueError) as error:
            raise typer.BadParameter(str(error)) from None
        size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
        console.print(f"{folder} -> {dest} ({size / 1e3:.0f} kB)")
