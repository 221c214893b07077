"""Atomic file writes: an interrupted run never leaves a half-written file behind."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

#: A checkpoint's trainer state (optimizer, scheduler, RL critic, progress): what resuming a
#: training stage needs beyond the weights. A checkpoint folder without it is a model, not
#: a resume point.
TRAINER_STATE = "trainer_state.pt"


#: Below this much free space, a failed write is reported as a full disk (torch.save
#: says only "unexpected pos ..." when the disk fills under it).
LOW_DISK_BYTES = 64 * 2**20


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to a temporary file beside ``path``, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | Path, data: Any) -> Path:
    """Atomically write ``data`` as indented JSON."""
    return atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def write_jsonl(path: str | Path, records: Iterable[dict]) -> Path:
    """Atomically write one JSON object per line."""
    return atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; on success it replaces ``path`` whole.

    A checkpoint written through it is either the old one or the complete new one: an
    interruption leaves at most a hidden temporary folder, which is removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        try:
            yield tmp
        except (OSError, RuntimeError) as error:
            _raise_if_disk_full(path, error)
            raise
        old = path.with_name(f".{path.name}-old")
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
            path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _raise_if_disk_full(path: Path, error: BaseException) -> None:
    """Turn a write that failed on a full disk into an error that says so."""
    free = shutil.disk_usage(path.parent).free  # measured before the partial write is removed
    if getattr(error, "errno", None) == errno.ENOSPC or free < LOW_DISK_BYTES:
        raise RuntimeError(
            f"could not write {path}: the disk is full ({free / 2**20:.0f} MiB free); "
            f"free some space and run the same command again to resume"
        ) from error


def drop_trainer_states(folder: str | Path) -> int:
    """Delete every ``trainer_state.pt`` under ``folder``; returns the bytes freed.

    The weights, tokenizer and adapters beside them stay: a checkpoint without its trainer
    state is still a model (``load_model`` reads it), just no longer a resume point.
    """
    folder, freed = Path(folder), 0
    for path in sorted(folder.rglob(TRAINER_STATE)) if folder.is_dir() else []:
        freed += path.stat().st_size
        path.unlink()
    return freed
