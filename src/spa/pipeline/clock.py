"""The wall time of a run's stages, across the processes that ran them.

A stage of a long run is often interrupted and resumed by a later ``spa run``; the time
of the last process alone then understates it (a Sokoban RL stage of 6 hours was
recorded as 64 minutes). :class:`StageClock` keeps each unfinished stage's time so far
in ``runs/NAME/clock.json``, rewritten every ``every`` seconds from a background thread,
so a process killed without warning loses at most that much of the count. The time
counted is the stage's whole cost: work an interrupt threw away and redid included.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from spa.io import write_json


class StageClock:
    """Time spent on ``stage`` by every process so far; a context manager around the stage.

    On a clean exit the stage's entry is removed (the caller records the total in
    ``stages.json``); on an exception it is written, so the next process counts on from it.
    """

    def __init__(self, path: str | Path, stage: str, every: float = 60.0):
        self.path, self.stage, self.every = Path(path), stage, every
        self.before = float(self._read().get(stage, 0.0))
        self._start = self._end = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"clock-{stage}", daemon=True)

    def seconds(self) -> float:
        """The earlier processes' time plus this one's (up to the block's end, once it ended)."""
        if self._start is None:
            return self.before
        return self.before + (self._end or time.perf_counter()) - self._start

    def save(self) -> None:
        """Write this stage's time so far (the other stages' entries are kept)."""
        write_json(self.path, {**self._read(), self.stage: round(self.seconds(), 1)})

    def __enter__(self) -> StageClock:
        self._start = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, error_type, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._end = time.perf_counter()
        if error_type is not None:
            self.save()
            return
        rest = {k: v for k, v in self._read().items() if k != self.stage}
        if rest:
            write_json(self.path, rest)
        else:
            self.path.unlink(missing_ok=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            self.save()

    def _read(self) -> dict:
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
