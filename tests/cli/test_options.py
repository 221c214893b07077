"""The options that set a config field show that field's default and help (spa.cli.options),
so that the command line, ``--set`` and the recipes cannot drift apart; and the docs name
every per-turn label of the registry (spa.agent.keep)."""

import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import typer.main

from spa.agent.keep import FILTERS, KEEP, LABELLED
from spa.cli import app
from spa.cli.options import differs, field_and_default, field_help, option
from spa.rl.expert_iteration import IterateConfig
from spa.worldmodel.sft import SFTConfig

COMMANDS_DOC = Path(__file__).resolve().parents[2] / "docs" / "commands.md"
#: The commands that build a stage config from their options.
CONFIGURED = ("eval", "selfplay", "sft", "rl", "iterate", "rwml", "demo")
#: Options no config field holds, in every command above: what the command acts on and where.
EVERYWHERE = {"env", "model", "option", "set_", "device", "out", "resume"}
#: Options of one command that no field of its config holds, with the reason.
OWN = {
    ("eval", "policy"): "who plays: the model or a baseline, which loads none",
    ("eval", "precision_name"): "the precision the weights are loaded in; EvalConfig has none",
    ("selfplay", "precision_name"): "the precision the weights are loaded in; SelfPlayConfig has none",
    ("demo", "precision_name"): "the play's --precision, the weights loaded in it, as in every command that plays",
    ("selfplay", "bootstrap_episodes"): "spa demo's format bootstrap, trained before the play begins",
    ("sft", "data"): "the examples' file",
    ("iterate", "keep_optimizer"): "what the command deletes once done",
    ("demo", "train"): "whether the demo trains at all",
}


def _click(command: str):
    return typer.main.get_command(app).commands[command]


def _param(command: str, name: str):
    return next(p for p in _click(command).params if p.name == name)


def _sources(command: str) -> dict:
    """The parameters of ``command`` built by spa.cli.options.option, with the field each sets."""
    info = next(c for c in app.registered_commands if (c.name or c.callback.__name__) == command)
    return {name: param.default.source for name, param in inspect.signature(info.callback).parameters.items()
            if hasattr(param.default, "source")}


def _words(text: str | None) -> str:
    return " ".join((text or "").split())


@pytest.mark.parametrize("command", CONFIGURED)
def test_every_option_of_a_configured_command_comes_from_its_field_or_says_why_not(command):
    sources = _sources(command)
    for param in _click(command).params:
        if param.name in sources or param.name in EVERYWHERE:
            continue
        assert (command, param.name) in OWN, (
            f"spa {command} --{param.name} is declared by hand: build it with spa.cli.options.option from the "
            "config field it sets, or list it in OWN with the reason it has none")


@pytest.mark.parametrize("command", CONFIGURED)
def test_an_option_built_from_a_field_shows_its_default_and_help(command):
    sources = _sources(command)
    assert sources, command
    for param in _click(command).params:
        if param.name not in sources:
            continue
        source = sources[param.name]
        _, default = field_and_default(source.config, source.path)
        where = f"spa {command} --{param.name} ({source.config.__name__}.{source.path})"
        assert _words(param.help).startswith(_words(field_help(source.config, source.path))), where
        if source.why:  # another default on purpose: the help says which and why
            assert param.default != default, f"{where}: a why for a default that does not differ"
            assert _words(param.help).endswith(_words(differs(param.default, default, source.why))), where
        else:
            assert param.default == default, f"{where}: {param.default!r} != the field's {default!r}"


def test_options_take_the_settings_that_the_commands_pass_on():
    """The option's default is what the command hands its config, so a command run without
    it builds the config's defaults (spa sft) or the nested section's (spa iterate's SFT)."""
    assert _param("sft", "epochs").default == SFTConfig().epochs
    assert _param("iterate", "lr").default == IterateConfig().sft.lr
    assert _param("eval", "max_actions").default == 3 and _param("rwml", "eval_levels").opts == ["--eval-levels"]


@dataclass
class _Toy:
    size: int = field(default=3, metadata={"help": "How big."})
    bare: int = 1
    section: SFTConfig = field(default_factory=lambda: SFTConfig(epochs=1))


def test_option_reads_the_field_and_refuses_a_silent_difference():
    assert (option(_Toy, "size").default, option(_Toy, "size").help) == (3, "How big.")
    assert option(_Toy, "section.epochs").default == 1  # the section's default instance, not SFTConfig()
    assert option(_Toy, "size", default=4, why="a reason").help == "How big. Default here 4, not 3: a reason."
    assert option(_Toy, "size", note="-1: all.").help == "How big. -1: all."
    with pytest.raises(ValueError, match="needs a why"):
        option(_Toy, "size", default=4)
    with pytest.raises(ValueError, match="needs a why"):
        option(_Toy, "size", why="the same default")
    with pytest.raises(ValueError, match="has no metadata"):
        option(_Toy, "bare")
    with pytest.raises(KeyError, match="no field 'sise'"):
        option(_Toy, "sise")


# -- the per-turn labels in the docs and the help ---------------------------------------------
def _keep_choices(text: str) -> list[set[str]]:
    r"""Every ``--keep a\|b\|c`` list of choices in a Markdown table."""
    return [set(choices.split("\\|")) for choices in re.findall(r"--keep ((?:\w+\\\|)+\w+)", text)]


def test_docs_commands_list_the_labels_of_the_registry():
    text = COMMANDS_DOC.read_text()
    choices = _keep_choices(text)
    assert set(KEEP) in choices, "spa selfplay's --keep choices in docs/commands.md are not spa.agent.keep's"
    assert set(LABELLED) in choices, "spa iterate's --keep choices in docs/commands.md are not spa.agent.keep's"
    assert all(found <= set(KEEP) for found in choices), choices
    for name in KEEP:
        assert f"`--keep {name}`" in text, f"docs/commands.md does not say what --keep {name} keeps"
    for name in LABELLED:
        assert f"**{FILTERS[name].learner}**" in _words(text), f"docs/commands.md does not name {FILTERS[name].learner}"


def test_iterate_help_names_every_label_with_the_rounds_it_gives():
    text = _words(_click("iterate").help)
    for name in LABELLED:
        assert name in text and FILTERS[name].learner in text, name
    assert f"({IterateConfig().keep} by default" in text
