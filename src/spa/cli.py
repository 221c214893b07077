"""The ``spa`` command line: one typer app, one command per stage."""

from __future__ import annotations

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


@app.command()
def demo(
    env: str = typer.Option("sokoban", help=f"Environment: {', '.join(envs.env_names())}."),
    model: str = typer.Option("smollm2-135m-instruct", help="Built-in name, local folder or hub id."),
    episodes: int = typer.Option(2, min=1, help="Episodes to play."),
    turns: int = typer.Option(3, min=1, help="Turns per episode."),
    max_new_tokens: int = typer.Option(200, min=1, help="New-token cap per turn."),
    seed: int = typer.Option(0, help="Seed of the first episode."),
    option: list[str] = EnvOption,
) -> None:
    """A short self-play demo: the model plays in world-model mode at temperature 1."""
    from spa.agent.demo import play_episode
    from spa.models import load_model

    game = make_env(env, option)
    with console.status(f"loading {model}"):
        lm, tokenizer = load_model(model)
    solved = 0
    for episode in range(episodes):
        console.rule(f"{env}, episode {episode + 1} (seed {seed + episode})")
        turns_played, success = play_episode(
            lm, tokenizer, game, seed + episode, max_turns=turns, max_new_tokens=max_new_tokens
        )
        for i, turn in enumerate(turns_played, 1):
            console.print(f"[bold]turn {i}[/bold] state:\n{turn.state}", highlight=False)
            console.print(f"[yellow]model:[/yellow] {turn.response}", highlight=False)
            console.print(
                f"format ok: {turn.format_ok}; actions: {turn.actions}; rewards: {turn.rewards}"
            )
        solved += success
        console.print("solved" if success else "not solved")
    console.print(f"\n{solved}/{episodes} episodes solved")


if __name__ == "__main__":
    app()
