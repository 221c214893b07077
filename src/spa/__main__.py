"""``python -m spa`` runs the command line."""

from spa.cli import app

app()
