"""The progress bar prints plain lines when its output is a log file, not a terminal."""

import io
from functools import partial
from types import SimpleNamespace

from rich.console import Console

from spa import progress
from spa.progress import Bar


def log_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=200), out


def test_a_log_gets_a_plain_line_per_interval():
    console, out = log_console()
    with Bar(console=console, interval=0) as bar:
        task = bar.add_task("ppo sokoban", total=8)
        bar.update(task, completed=1, info="reward -0.50")
        bar.update(task, completed=2)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("ppo sokoban:")]
    assert lines[0].startswith("ppo sokoban: 1/8  reward -0.50 (0:0")
    assert lines[1].startswith("ppo sokoban: 2/8  reward -0.50 (0:0")  # the info field persists


def test_lines_are_spaced_by_the_interval_and_off_when_disabled():
    console, out = log_console()
    with Bar(console=console, interval=3600) as bar:
        task = bar.add_task("eval frozenlake", total=5)
        for turn in range(5):
            bar.update(task, completed=turn)
    assert sum(line.startswith("eval frozenlake:") for line in out.getvalue().splitlines()) == 1
    console, out = log_console()
    with Bar(console=console, interval=0, disable=True) as bar:
        bar.update(bar.add_task("quiet", total=1), completed=1)
    assert out.getvalue() == ""


def test_a_terminal_gets_the_bar_only():
    out = io.StringIO()
    with Bar(console=Console(file=out, force_terminal=True, width=120), interval=0) as bar:
        bar.update(bar.add_task("sft", total=2), completed=1, info="loss 0.1")
    assert "sft: 1/2" not in out.getvalue() and "sft" in out.getvalue()


def test_turn_progress_counts_the_episodes_answered_within_a_turn(monkeypatch):
    console, out = log_console()
    monkeypatch.setattr(progress, "Bar", partial(Bar, console=console, interval=0))
    engine = SimpleNamespace(on_chunk=None)  # the hook of spa.models.engine.Engine
    with progress.turn_progress("round-1 play", 5, engine=engine) as on_turn:
        on_turn(0, 1600)
        engine.on_chunk(64, 1600)
        engine.on_chunk(128, 1600)
        on_turn(1, 1500)
    assert engine.on_chunk is None  # the bar's only while it lasts
    lines = [line.split(" (")[0] for line in out.getvalue().splitlines()]
    assert lines[:4] == ["round-1 play: turn 1, 1600 episodes playing: 0/5",
                         "round-1 play: turn 1, 1600 episodes playing: 0/5  64/1600 answered",
                         "round-1 play: turn 1, 1600 episodes playing: 0/5  128/1600 answered",
                         "round-1 play: turn 2, 1500 episodes playing: 1/5"]
