"""A rollout's turns written to disk as they finish, so an interrupted rollout resumes.

A :class:`TurnLog` is a JSON-lines file: a header with the rollout's settings, then for
every finished turn one line per episode that played it and a line that marks the turn
complete (with the play time so far). :func:`spa.agent.rollout.rollout` given a log
replays its complete turns in fresh environments and goes on from the next turn. That
gives what the uninterrupted rollout would have: an environment is deterministic given
its seed and the actions played (slips draw from the episode's own seeded generator),
and the engine seeds its sampler anew for every call, so a turn's generation depends
only on its prompts. An evaluation of 1,024 episodes takes 10-40 minutes on 2 CPU
cores, so without the log an interrupt there lost all of it.

Lines after the last complete turn (an interrupt while writing) are dropped; a file
written under other settings (other weights, another precision) is started afresh, with
a warning.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import asdict
from pathlib import Path

import torch

from spa.agent.trajectory import Turn
from spa.io import atomic_write_text


class TurnLog:
    """The turns of one rollout in ``path``; see the module docstring.

    Use it as a context manager (the file is closed, and kept, however the block ends)
    and call :meth:`finish` once the rollout's outputs are written.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._seconds = 0.0  # play time until the file was last opened (or closed)
        self._file = None
        self._opened = 0.0
        self._turns = 0

    def open(self, settings: dict) -> list[list[tuple[int, dict]]]:
        """Start (or resume) the log of a rollout with ``settings`` (JSON-serialisable);
        returns the complete turns on disk, each a list of (episode index, turn record)."""
        settings = json.loads(json.dumps(settings))  # as it reads back: tuples become lists
        turns = self._read(settings)
        lines = [json.dumps({"settings": settings})]
        for number, records in enumerate(turns, start=1):
            lines += [json.dumps({"episode": i, "turn": record}) for i, record in records]
            lines.append(json.dumps({"done": number, "seconds": self._seconds}))
        atomic_write_text(self.path, "\n".join(lines) + "\n")  # drops any torn tail before appending
        self._file = self.path.open("a", encoding="utf-8")
        self._opened, self._turns = time.perf_counter(), len(turns)
        return turns

    def append(self, played: list[tuple[int, Turn]]) -> None:
        """Add one finished turn: each (episode index, turn) that played it."""
        self._turns += 1
        for i, turn in played:
            self._file.write(json.dumps({"episode": i, "turn": asdict(turn)}) + "\n")
        self._file.write(json.dumps({"done": self._turns, "seconds": round(self.seconds(), 1)}) + "\n")
        self._file.flush()

    def seconds(self) -> float:
        """Play time of the whole rollout so far, the time before a resume included."""
        return self._seconds + (time.perf_counter() - self._opened if self._file else 0.0)

    def close(self) -> None:
        """Close the file, keeping it to resume from."""
        if self._file is not None:
            self._seconds = self.seconds()
            self._file.close()
            self._file = None

    def finish(self) -> None:
        """Close and delete the file: the rollout is done and what it was for is written."""
        self.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> TurnLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _read(self, settings: dict) -> list[list[tuple[int, dict]]]:
        if not self.path.is_file():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        try:
            header = json.loads(lines[0]) if lines else {}
        except json.JSONDecodeError:
            header = {}
        if header.get("settings") != settings:
            warnings.warn(f"{self.path} holds turns of a rollout with other settings; starting afresh", stacklevel=3)
            return []
        turns, current = [], []
        for line in lines[1:]:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                break  # a line cut by the interrupt: the turn it belongs to is incomplete
            if "done" in record:
                turns.append(current)
                current = []
                self._seconds = float(record["seconds"])
            else:
                current.append((int(record["episode"]), record["turn"]))
        return turns


def fingerprint(model: torch.nn.Module) -> str:
    """A short digest of a model's weights (names, shapes and about a thousand evenly
    spaced values of each tensor), so that a log resumes only for the model that began it."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            flat = tensor.detach().reshape(-1)
            digest.update(f"{name}{tuple(tensor.shape)}".encode())
            # a copy: numpy() of the weights' own storage would pin it, which FSDP frees and
            # refills (spa.distributed.gathered)
            digest.update(flat[:: max(1, flat.numel() // 1024)].to("cpu", torch.float32, copy=True).numpy().tobytes())
    return digest.hexdigest()[:16]
