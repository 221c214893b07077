"""The progress bar of every long loop (evaluation, self-play, SFT, PPO, RWML).

rich draws its bar only on a terminal; written to a log file (``nohup spa run ... >
log``) it shows nothing until the loop ends, and an hour-long stage looks hung. So when
the console is not a terminal, ``Bar`` also prints the task as a plain line, at most
every ``interval`` seconds. transformers' own bars (loading and saving weights, a
second each) are the opposite case: noise in a log, so ``quiet_hf_bars`` turns them off
there.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

#: Seconds between two plain progress lines in a log.
LOG_INTERVAL = 60.0


class Bar(Progress):
    """rich's ``Progress`` with the project's columns: description, bar, done/total, an
    ``info`` field (loss, reward...) and the elapsed time; plain lines when not on a terminal."""

    def __init__(self, *, disable: bool = False, transient: bool = False, interval: float = LOG_INTERVAL,
                 console: Console | None = None):
        super().__init__(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                         TextColumn("{task.fields[info]}"), TimeElapsedColumn(), disable=disable,
                         transient=transient, console=console)
        self._plain = not disable and not self.console.is_terminal
        self._interval = interval
        self._printed: dict[TaskID, float] = {}

    def add_task(self, description: str, **kwargs) -> TaskID:
        kwargs.setdefault("info", "")
        return super().add_task(description, **kwargs)

    def update(self, task_id: TaskID, **kwargs) -> None:
        super().update(task_id, **kwargs)
        now = time.monotonic()
        if self._plain and now - self._printed.get(task_id, -float("inf")) >= self._interval:
            self._printed[task_id] = now
            task = next(t for t in self.tasks if t.id == task_id)
            minutes, seconds = divmod(int(task.elapsed or 0), 60)
            info = f"  {task.fields['info']}" if task.fields.get("info") else ""
            self.console.print(f"{task.description}: {task.completed:g}/{task.total:g}{info} "
                               f"({minutes}:{seconds:02d} elapsed)", highlight=False, soft_wrap=True)


@contextlib.contextmanager
def turn_progress(label: str, turns: int, disable: bool = False,
                  engine=None) -> Iterator[Callable[[int, int], None]]:
    """A bar over the turns of a batched rollout (evaluation, self-play, an expert-iteration
    round), which advance together: yields the rollout's ``on_turn(turn, active)`` callback,
    and marks every turn done when the rollout returns.

    With the rollout's ``engine`` (:class:`spa.models.engine.Engine`), the bar also counts
    the episodes answered within the turn: a turn of 1,600 episodes takes minutes on a
    CPU, and in a log the bar prints (at most a line a minute) only when it is updated.
    """
    with Bar(disable=disable, transient=True) as bar:
        task = bar.add_task(label, total=turns)

        def on_turn(turn: int, active: int) -> None:
            bar.update(task, completed=turn, description=f"{label}: turn {turn + 1}, {active} episodes playing",
                       info="")

        def on_chunk(answered: int, total: int) -> None:
            bar.update(task, info=f"{answered}/{total} answered")

        previous = getattr(engine, "on_chunk", None)
        if engine is not None:
            engine.on_chunk = on_chunk
        try:
            yield on_turn
            bar.update(task, completed=turns, info="")
        finally:
            if engine is not None:
                engine.on_chunk = previous


@contextlib.contextmanager
def quiet_hf_bars():
    """transformers' progress bars ("Loading weights", "Writing model shards") off while
    stderr is not a terminal (a run's log); on a terminal they stay. Restored on exit."""
    from transformers.utils import logging as hf_logging  # heavy import, only when used

    if sys.stderr.isatty() or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()
