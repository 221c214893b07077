"""Options built from the config dataclasses: an option that sets a config field takes the
field's default and its ``metadata["help"]``, so both are written once, in the field, and
the command line cannot drift from what ``--set``, recipes and the library use.

``option(SFTConfig, "epochs", min=1)`` is ``--epochs`` with SFTConfig's default and help;
a dotted path reaches a nested section (``option(IterateConfig, "sft.lr")``, the default
then read from the section's own default instance). An option whose default differs from
the field's says so in its help, with the reason (``default=..., why=...``).
"""

from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, fields, is_dataclass
from typing import Any

import typer

_SAME: Any = object()


@dataclass(frozen=True)
class Source:
    """The config field an option sets, and why its default differs from the field's (if it does)."""

    config: type
    path: str
    why: str = ""


def field_and_default(config: type, path: str) -> tuple[Field, Any]:
    """The field at the dotted ``path`` of ``config`` and its default: a top-level field's own
    (or its ``default_factory()``), a nested one's as the section's default instance holds it
    (IterateConfig's ``sft`` is a one-epoch SFTConfig, not SFTConfig's defaults)."""
    head, *rest = path.split(".")
    found = _field(config, head)
    value = found.default if found.default_factory is MISSING else found.default_factory()
    for name in rest:
        found = _field(type(value), name)
        value = getattr(value, name)
    return found, value


def _field(config: type, name: str) -> Field:
    if not is_dataclass(config):
        raise TypeError(f"{config!r} is not a config dataclass")
    named = {f.name: f for f in fields(config)}
    if name not in named:
        raise KeyError(f"{config.__name__} has no field {name!r}; fields: {', '.join(named)}")
    return named[name]


def field_help(config: type, path: str) -> str:
    """The field's ``metadata["help"]``; a field an option maps to must have one, so that the
    text is written in the field and nowhere else."""
    found, _ = field_and_default(config, path)
    if not found.metadata.get("help"):
        raise ValueError(f"{config.__name__}.{path} has no metadata['help'] for its option to show")
    return found.metadata["help"]


def option(config: type, path: str, *flags: str, default: Any = _SAME, why: str = "", note: str = "",
           **kwargs) -> Any:
    """A ``typer.Option`` for field ``path`` of ``config``: its default and help are the field's.

    ``default`` with ``why`` gives the option another default, named with the reason at the
    end of the help; ``note`` adds what only the command line needs to say (a flag's spelling
    of a value, another option it goes with). Other keywords (``min``, ``callback``) go to typer.
    """
    _, field_default = field_and_default(config, path)
    if default is _SAME:
        default = field_default
    if (default != field_default) != bool(why):
        raise ValueError(f"option for {config.__name__}.{path}: a default other than the field's "
                         f"({field_default!r}) needs a why, and only such a one")
    text = " ".join(filter(None, (field_help(config, path), note, differs(default, field_default, why))))
    info = typer.Option(default, *flags, help=text, **kwargs)
    info.source = Source(config, path, why)  # read by the tests that keep options and fields together
    return info


def differs(default: Any, field_default: Any, why: str) -> str:
    """The help's last sentence for an option whose default is not the field's; '' otherwise."""
    return f"Default here {default}, not {field_default}: {why}." if why else ""
