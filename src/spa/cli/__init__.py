"""The ``spa`` command line: one typer app, one command per stage (``spa --help``)."""

# Importing a module registers its commands; this order is the order of ``spa --help``.
from spa.cli import play  # noqa: F401  isort: skip
from spa.cli import evaluation  # noqa: F401  isort: skip
from spa.cli import training  # noqa: F401  isort: skip
from spa.cli import rwml  # noqa: F401  isort: skip
from spa.cli import iterate  # noqa: F401  isort: skip
from spa.cli import pipeline  # noqa: F401  isort: skip
from spa.cli.common import app

__all__ = ["app"]
