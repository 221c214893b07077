"""``spa envs``, ``spa play`` and ``spa demo``: look at the environments and the model."""

from __future__ import annotations

import typer
from rich.table import Table

from spa import envs
from spa.cli.common import (DeviceOption, EnvNameOption, EnvOption, ModelOption, PlayPrecisionOption, SetOption, app,
                            console, decide, example, load, make_env, parse_options, settings)
from spa.cli.options import option
from spa.demo import DemoConfig


@app.command("envs", epilog=example("spa envs"))
def list_envs() -> None:
    """List the environments and their options with defaults."""
    table = Table(title="Environments (spa.envs.make(name, **options))")
    for column in ("name", "option", "default", "meaning"):
        table.add_column(column, overflow="fold")
    for name in envs.env_names():
        for i, (key, default, help_text) in enumerate(envs.config_defaults(name)):
            table.add_row(name if i == 0 else "", key, repr(default), help_text)
        table.add_section()
    console.print(table)


@app.command(epilog=example("spa play -e frozenlake --seed 3 -o size=6"))
def play(
    env: str = EnvNameOption,
    seed: int = typer.Option(0, help="Seed of the episode (the same seed, the same level)."),
    option: list[str] = EnvOption,
) -> None:
    """Play an environment yourself in the terminal. Ctrl-D or Ctrl-C quits."""
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


@app.command(epilog=example("spa demo --model tiny --episodes 1 --bootstrap-episodes 4"))
def demo(
    env: str = option(DemoConfig, "env", "--env", "-e"),
    model: str = ModelOption,
    episodes: int = option(DemoConfig, "episodes", min=1),
    turns: int = option(DemoConfig, "turns", min=1),
    max_new_tokens: int = option(DemoConfig, "max_new_tokens", min=1),
    seed: int = option(DemoConfig, "seed"),
    train: bool = typer.Option(True, "--train/--no-train", help="Train a format bootstrap and play again; "
                                                               "--no-train only plays, showing every turn."),
    bootstrap_episodes: int = option(DemoConfig, "bootstrap_episodes", min=1),
    precision_name: str = PlayPrecisionOption,
    device: str = DeviceOption,
    option: list[str] = EnvOption,
    set_: list[str] = SetOption,
) -> None:
    """Watch the model play in world-model mode at temperature 1, then train it briefly and
    watch again.

    The model plays a few levels; a format bootstrap (one SFT epoch on random-exploration
    turns with the true states, cached in $SPA_HOME/demo) trains it; it plays the same
    levels again, and a table shows both side by side.
    """
    from spa import demo as demo_

    make_env(env, option)  # validates the options before the model loads
    base = dict(env=env, options=parse_options(option), episodes=episodes, turns=turns, max_new_tokens=max_new_tokens,
                seed=seed, bootstrap_episodes=bootstrap_episodes, precision=precision_name)
    config = settings(DemoConfig, base, set_)
    compute = decide(device, config.precision)
    before = demo_.play(*load(model, compute), config, "before" if train else model)
    if not train:
        _show_turns(before)
    else:
        checkpoint = demo_.bootstrapped(model, config, lambda text: console.print(text, highlight=False), compute)
        after = demo_.play(*load(str(checkpoint), compute), config, "after")
        title = f"{env}: {model} before and after a {config.bootstrap_episodes}-episode format bootstrap"
        console.print(demo_.comparison({"before": before, "after": after}, title))
    console.print(f"Next, the whole method (self-play, world-model SFT, RL): "
                  f"{demo_.next_command(env, config.options)}", highlight=False, soft_wrap=True)


def _show_turns(trajectories) -> None:
    """Every turn of every episode: the state, the model's text, what it did."""
    for trajectory in trajectories:
        console.rule(f"{trajectory.env}, seed {trajectory.seed}")
        for i, turn in enumerate(trajectory.turns, 1):
            console.print(f"[bold]turn {i}[/bold] state:\n{turn.state_before}", highlight=False)
            console.print(f"[yellow]model:[/yellow] {turn.response}", highlight=False)
            console.print(f"format ok: {turn.format_ok}; actions: {turn.actions} "
                          f"(valid: {turn.actions_valid}); reward: {turn.reward:+.2f}")
        console.print("solved" if trajectory.success else "not solved")
    solved = sum(t.success for t in trajectories)
    console.print(f"\n{solved}/{len(trajectories)} episodes solved")
