"""What every ``spa`` command shares: the typer app, the console, option types and helpers."""

from __future__ import annotations

from typing import Any

import typer
import yaml
from rich.console import Console

from spa import envs, interrupt


def example(command: str) -> str:
    """A help epilog showing one invocation, kept on its own line (click's ``\\b`` marker
    stops the paragraph from being re-wrapped)."""
    return f"\b\nExample:\n  {command}"


app = typer.Typer(
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
SetOption = typer.Option(None, "--set", help="Any field of the stage's config as key=value, e.g. --set lr=1e-5.")
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
ModeOption = typer.Option("world_model", help="Prompt mode: base, state or world_model.")
DtypeOption = typer.Option("auto", "--dtype", help="Compute precision: auto (bf16 where the hardware computes it "
                                                   "natively, else fp32), bf16, fp16 or fp32.")


def compute_precision(dtype: str):
    """The resolved precision for this machine's device, announced once; a bad name is a CLI error."""
    from spa import precision
    from spa.models.loading import resolve_device

    try:
        return precision.decide(dtype, resolve_device("auto"))
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


def load(model: str, dtype: str, announce: bool = True):
    """Load a model in ``dtype`` (``auto``: see :mod:`spa.precision`), turning a bad name into a
    clean CLI error. ``announce=False`` loads weights whose compute precision is chosen elsewhere
    (fp32 master weights of a trainer)."""
    from spa.models import load_model

    chosen = compute_precision(dtype).dtype if announce else dtype
    try:
        with console.status(f"loading {model}"):
            return load_model(model, dtype=chosen)
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


def load_for_training(model: str, out: str, resume: bool):
    """``(checkpoint or None, model, tokenizer)`` for an RL-style stage writing ``out/checkpoint``:
    the checkpoint's policy when resuming from one, else ``model``; fp32 master weights (the
    stage's precision does the compute: autocast and sampling)."""
    from spa.rl.ppo import resume_point

    checkpoint = resume_point(out) if resume else None
    if resume and checkpoint is None:
        console.print(f"no checkpoint in {out}: starting from {model}")
    lm, tokenizer = load(str(checkpoint / "policy") if checkpoint else model, "fp32", announce=False)
    return checkpoint, lm, tokenizer
