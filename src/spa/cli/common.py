"""What every ``spa`` command shares: the typer app, the console, option types and helpers."""

from __future__ import annotations

from typing import Any

import click
import typer
import yaml
from rich.console import Console
from typer.core import TyperCommand

from spa import compute, envs, interrupt, precision
from spa.cli.options import option


def example(command: str) -> str:
    """A help epilog showing one invocation, kept on its own line (click's ``\\b`` marker
    stops the paragraph from being re-wrapped)."""
    return f"\b\nExample:\n  {command}"


#: Option names from before the CLI spoke one vocabulary -> their names now. In a command
#: that has the new name the old one is an error that names the new form (``--num-envs is
#: now --levels: use spa eval --levels 128``), so that a script written before stops with
#: the fix instead of running on.
RENAMED_OPTIONS = {"--dtype": "--precision", "--num-envs": "--levels", "--num-states": "--levels",
                   "--eval-envs": "--eval-levels", "--eval-seeds": "--eval-levels", "--batch": "--batch-size"}
#: Command names from before -> now; the old name is a hidden alias that still runs.
RENAMED_COMMANDS = {"ppo": "rl"}
#: Commands that took the environment as their first argument (``spa play frozenlake``).
POSITIONAL_ENV = {"play"}


def note(text: str) -> None:
    typer.echo(f"note: {text}", err=True)


class Command(TyperCommand):
    """A typer command that knows the old names: the old commands (:data:`RENAMED_COMMANDS`)
    and the positional environment (:data:`POSITIONAL_ENV`) still run, each with a note
    naming the new form; an old option (:data:`RENAMED_OPTIONS`) is an error naming it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if self.name in RENAMED_COMMANDS:
            note(f"spa {self.name} is now spa {RENAMED_COMMANDS[self.name]}; the old name goes in a later release")
        if self.name in POSITIONAL_ENV and args and not args[0].startswith("-"):
            note(f"the environment is given as -e: spa {self.name} -e {args[0]}")
            args = ["--env", *args]
        names = {name for param in self.params for name in param.opts}
        for i, arg in enumerate(args):
            if arg == "--":
                break
            name, sep, value = arg.partition("=")
            new = RENAMED_OPTIONS.get(name)
            if new in names and name not in names:
                if not sep and i + 1 < len(args) and not args[i + 1].startswith("-"):
                    value = args[i + 1]
                command = RENAMED_COMMANDS.get(self.name, self.name)
                ctx.fail(f"{name} is now {new}: use spa {command} {new} {value}".rstrip())
        return super().parse_args(ctx, args)


class _Typer(typer.Typer):
    def command(self, *args, cls: type[TyperCommand] | None = None, **kwargs):
        return super().command(*args, cls=cls or Command, **kwargs)


app = _Typer(
    help="Train LLM agents with an internal world model (SPA), with RWML and RL baselines.",
    epilog=example("spa run configs/frozenlake-spa.yaml --preset quick"),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Click's plain help instead of rich's boxes: where the terminal width is
    # unknown (logs, CI) rich laid options out in four columns and squeezed their help into
    # about 15 characters; click's two-column list wraps to min(terminal, 80) columns.
    rich_markup_mode=None,
)
console = Console()


@app.callback()
def _every_command() -> None:
    # A `kill -USR1` asks a training loop for a resume point; anywhere else it would end
    # the process.
    interrupt.ignore_save_requests()

EnvNameOption = typer.Option(..., "--env", "-e", help=f"Environment: {', '.join(envs.env_names())}.")
SetOption = typer.Option(None, "--set", help="Any field of the stage's config as key=value (repeatable), e.g. "
                                             "--set seed=1; applied after the other options.")
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


ModelOption = typer.Option("smollm2-135m-instruct", "--model", "-m",
                           help="Built-in name (smollm2-135m-instruct, tiny), local folder or hub id.")


#: Why ``--mode`` is base where a command plays in the prompt RL trains in (PromptConfig's
#: default is world_model, the world-model data's prompt).
BASE_MODE_WHY = "the plain think/answer prompt (raw grid) in which the recipes' RL trains"


def _checked(check):
    """A typer callback: ``check(value)``'s canonical name, its ValueError a usage error
    (exit status 2) naming the value and what is allowed, before the command runs."""
    def callback(value: str) -> str:
        try:
            return check(value)
        except ValueError as error:
            raise typer.BadParameter(str(error)) from None
    return callback


def precision_option(config: type, path: str = "precision"):
    """``--precision`` of a stage that trains: the config field's default and help (fp32 master
    weights, autocast)."""
    return option(config, path, "--precision", callback=_checked(precision.check))


#: The commands that only play or measure, which load the weights in the precision itself.
PlayPrecisionOption = typer.Option("auto", "--precision", callback=_checked(precision.check),
                                   help=precision.FIELD_HELP.partition(" Weights stay")[0]
                                   + " The weights are loaded in it.")
#: Every command that loads a model.
DeviceOption = typer.Option("auto", "--device", callback=_checked(compute.check_device), help=compute.FIELD_HELP)


def decide(device: str, precision_name: str) -> compute.Compute:
    """The command's device and precision, decided once before any model loads
    (:func:`spa.compute.decide`); one this machine lacks (``cuda`` without a GPU) is a
    usage error."""
    try:
        return compute.decide(device, precision_name)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


def load(model: str, chosen: compute.Compute, master: bool = False):
    """Load a model on the decided device, in its precision (a player's weights) or in fp32
    (``master``: a trainer's master weights, which autocast computes on), turning a bad
    name into a clean CLI error."""
    from spa.models import load_model

    try:
        with console.status(f"loading {model}"):
            return load_model(model, dtype="fp32" if master else chosen.dtype, device=chosen.device)
    except (ValueError, FileNotFoundError) as error:
        raise typer.BadParameter(str(error)) from None


def prompt_config(mode: str, max_turns: int, max_actions: int, history_turns: int | None):
    from spa.agent.prompts import PromptConfig

    try:
        return PromptConfig(mode, max_turns, max_actions, history_turns)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


def settings(cls, base: dict, overrides: list[str] | None):
    """The stage config ``cls`` from the command's options plus ``--set key=value`` overrides;
    a bad key or value is a clean CLI error naming it."""
    from spa.config import ConfigError
    from spa.config import load as load_config

    try:
        return load_config(cls, base, overrides or [])
    except ConfigError as error:
        raise typer.BadParameter(str(error)) from None


def load_for_training(model: str, out: str, resume: bool, chosen: compute.Compute):
    """``(checkpoint or None, model, tokenizer)`` for an RL-style stage writing ``out/checkpoint``:
    the checkpoint's policy when resuming from one, else ``model``; fp32 master weights on
    the decided device (its precision does the compute: autocast and sampling)."""
    from spa.rl.ppo import resume_point

    checkpoint = resume_point(out) if resume else None
    if resume and checkpoint is None:
        console.print(f"no checkpoint in {out}: starting from {model}")
    lm, tokenizer = load(str(checkpoint / "policy") if checkpoint else model, chosen, master=True)
    return checkpoint, lm, tokenizer
