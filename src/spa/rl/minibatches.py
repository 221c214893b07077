"""Which of a step's turns train, and in which minibatches.

The group filter keeps the groups whose samples disagree most (a group whose samples all
scored the same teaches nothing). The sample table lists every process's training turns
in the order a single process would hold them, so the shuffled minibatches drawn from it
are the single-process ones whatever the number of processes, and each process knows
every minibatch's global weight (see :mod:`spa.rl.ppo` on ``accelerate launch``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from spa import distributed
from spa.agent.rollout import Trajectory
from spa.rl.batch import Sample

if TYPE_CHECKING:
    from spa.rl.config import PPOConfig


def group_spread(trajectories: list[Trajectory]) -> dict[int, float]:
    """The reward std of each group: how much its samples disagree."""
    groups: dict[int, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.group, []).append(t)
    return {g: float(np.std([t.total_reward for t in ts])) for g, ts in groups.items()}


#: A group whose reward std is at most this is flat: its samples all scored the same.
FLAT_SPREAD = 1e-8


def top_groups(spread: dict[int, float], fraction: float, drop_flat: bool = True) -> set[int]:
    """The ``ceil(fraction x groups)`` groups with the highest spread (ties: lower id first).

    With ``drop_flat`` the flat groups (spread <= FLAT_SPREAD) are then left out, so fewer
    may be kept, or none (an empty set). The count is of all groups: with 32 groups and
    fraction 0.25, four informative groups are all kept (a fraction of the informative
    ones would keep one and waste the others' signal).
    """
    n = max(1, math.ceil(fraction * len(spread)))
    top = sorted(spread, key=lambda g: (-spread[g], g))[:n]
    return {g for g in top if spread[g] > FLAT_SPREAD or not drop_flat}


@dataclass(frozen=True)
class Entry:
    """One training turn of the step, as every process knows it (see :func:`sample_table`)."""

    key: tuple[int, int, int]  # (group, sample, turn): the single-process order
    units: int  # what the aggregation averages over (see loss_units)
    tokens: int  # prompt + response tokens
    rank: int  # the process that holds the Sample
    index: int  # its index in that process's samples


def sample_table(samples: list[Sample], kept: list[Trajectory], aggregation: str) -> list[Entry]:
    """Every process's training turns, in the order one process would have them.

    A single process orders the turns by (group, sample, turn); the table restores that
    order over all processes, so the minibatches drawn from it are the single-process
    minibatches, and each process knows every minibatch's global weight.
    """
    rank = distributed.world()[0]
    mine = [Entry((kept[s.episode].group, kept[s.episode].sample, s.turn), loss_units([s], aggregation), len(s.ids),
                  rank, i) for i, s in enumerate(samples)]
    return sorted(distributed.gather(mine), key=lambda e: e.key)


def local_table(samples: list[Sample], aggregation: str) -> list[Entry]:
    """The table of a single process holding every sample, in the samples' order
    (for callers whose samples are not turns of trajectories, e.g. RWML's predictions)."""
    return [Entry((s.episode, s.turn, 0), loss_units([s], aggregation), len(s.ids), 0, i)
            for i, s in enumerate(samples)]


def minibatches(samples: list[Sample], table: list[Entry], config: PPOConfig, rng: np.random.Generator):
    """Shuffled minibatches for ``ppo_epochs`` passes: this process's micro-batches of each,
    and the minibatch's global units (every process, so the weighting is global).

    Every process draws the same permutation of the global table and yields the same
    number of minibatches, possibly with no micro-batch of its own.
    """
    rank = distributed.world()[0]
    for _ in range(config.ppo_epochs):
        order = rng.permutation(len(table))
        for lo in range(0, len(order), config.minibatch_size):
            entries = [table[i] for i in order[lo: lo + config.minibatch_size]]
            mb = [samples[e.index] for e in entries if e.rank == rank]
            total = sum(e.units for e in entries)
            yield [mb[j: j + config.micro_batch_size] for j in range(0, len(mb), config.micro_batch_size)], total


def loss_units(samples: list[Sample], aggregation: str) -> int:
    """What the aggregation averages over: policy-loss tokens for token-mean, sequences
    otherwise. Weighting each micro-batch by its share makes accumulation equal one big batch."""
    return sum(s.loss_tokens for s in samples) if aggregation == "token-mean" else len(samples)
