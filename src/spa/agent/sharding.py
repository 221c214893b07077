"""A rollout's levels split over the processes of a launch: evaluation and self-play.

Under a launcher (several processes, outside :func:`spa.distributed.alone`) each process
plays every ``N``-th level from its rank, all samples of a level on the same process (Pass@k
and its interval are per level, as are the groups of PPO and of the keep filters). The
trajectories go to the main process, in the
order one process would hold them: group ids are renumbered to the level's index in the
whole rollout, as one process numbers them. Alone, :func:`rollout_by_level` is
:func:`spa.agent.rollout.rollout`.

Each process seeds its sampler with ``seed * N + rank``, as PPO's rollouts do: the seed
itself alone, a stream of its own for every process otherwise (with one seed for all, the
same row of every process's batch would draw the same random numbers). A sharded rollout is therefore another draw than one
process's: the same levels and samples per level, other sampled responses (and a batch's
draws depend on its composition anyway: :data:`spa.models.engine.DEFAULT_BATCH`). The same
launch size gives the same trajectories again.

Each process keeps its own turn log (:mod:`spa.agent.turnlog`) beside the main process's
one, so an interrupted sharded rollout resumes from its last finished turn under the same
launch; a log whose settings differ (another launch size plays other levels per process)
starts afresh.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from spa import distributed
from spa.agent.rollout import RolloutConfig, rollout
from spa.agent.trajectory import Trajectory
from spa.agent.turnlog import TurnLog
from spa.models.engine import Engine, SamplingParams


@dataclass
class Played:
    """A rollout's trajectories in single-process order, and what each process played."""

    trajectories: list[Trajectory]
    # per process, in rank order: {"levels", "episodes", "seconds"} (its own play time)
    shares: list[dict]

    def by_process(self) -> dict:
        """``{"processes": shares}`` for an output's record where several processes played;
        nothing alone, so that a single-process output keeps exactly its fields."""
        return {"processes": self.shares} if len(self.shares) > 1 else {}


def levels_of(seeds: list[int], rank: int, world: int) -> list[int]:
    """The levels process ``rank`` of ``world`` plays: every ``world``-th from its rank."""
    return seeds[rank::world]


def process_seed(seed: int | None, rank: int, world: int) -> int | None:
    """Process ``rank``'s sampling seed: ``seed`` alone, ``seed * world + rank`` otherwise."""
    return None if seed is None else seed * world + rank


def renumbered(trajectories: list[Trajectory], rank: int, world: int) -> list[Trajectory]:
    """``trajectories`` of process ``rank``, their group ids (indices in its own share of
    the levels) changed in place to the levels' indices in the whole rollout."""
    for trajectory in trajectories:
        trajectory.group = rank + world * trajectory.group
    return trajectories


def merged(parts: list[list[Trajectory]]) -> list[Trajectory]:
    """The processes' trajectories in one list, ordered as one process orders them."""
    return sorted((t for part in parts for t in part), key=lambda t: (t.group, t.sample))


def own_log(path: Path) -> Path:
    """This process's turn log for a rollout logged at ``path``: ``path`` on the main process
    (and alone), ``NAME.rankR.REST`` on process R (``rollout.rank1.partial.jsonl``)."""
    rank = distributed.world()[0]
    if rank == 0:
        return path
    head, dot, tail = path.name.partition(".")
    return path.with_name(f"{head}.rank{rank}{dot}{tail}")


def finish_log(log: TurnLog) -> None:
    """:meth:`TurnLog.finish` this process's log once the rollout's outputs are written; the
    main process also deletes the other processes' logs beside it, those of an earlier launch
    of another size included (no process plays any more: the trajectories were collected)."""
    log.finish()
    if distributed.is_main():
        head, dot, tail = log.path.name.partition(".")
        for stale in log.path.parent.glob(f"{head}.rank*{dot}{tail}"):
            stale.unlink(missing_ok=True)


def rollout_by_level(engine: Engine, tokenizer, seeds: list[int], samples: int, config: RolloutConfig,
                     sampling: SamplingParams, on_turn: Callable[[int, int], None] | None = None,
                     log: TurnLog | None = None) -> Played | None:
    """:func:`spa.agent.rollout.rollout` of ``seeds`` with the levels split over the
    processes (module docstring): on the main process every trajectory, in single-process
    order; None on the others. Every process calls it (a collective). ``log``: this
    process's own (:func:`own_log`); ``on_turn`` sees this process's episodes only."""
    rank, world = distributed.world()
    mine = levels_of(seeds, rank, world)
    own = replace(sampling, seed=process_seed(sampling.seed, rank, world))

    def play() -> tuple[list[Trajectory], dict]:
        began = time.perf_counter()
        trajectories = rollout(engine, tokenizer, mine, samples, config, own, on_turn=on_turn, log=log)
        share = {"levels": len(mine), "episodes": len(trajectories),
                 "seconds": round(time.perf_counter() - began, 1)}
        return renumbered(trajectories, rank, world), share

    parts = distributed.from_each(play)
    if parts is None:
        return None
    return Played(merged([trajectories for trajectories, _ in parts]), [share for _, share in parts])
