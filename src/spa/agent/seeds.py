"""Seed ranges: evaluation seeds are fixed and never overlap a training seed."""

from __future__ import annotations

#: Evaluation seeds start here; training seeds are drawn below it, so they never overlap.
EVAL_SEED_OFFSET = 10_000_000


def eval_seeds(count: int) -> list[int]:
    """The fixed evaluation seeds, disjoint from every training seed."""
    return list(range(EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + count))


def train_seeds(count: int, start: int = 0) -> list[int]:
    """Training seeds ``start .. start+count-1``; they must stay below the evaluation range."""
    if start < 0 or start + count > EVAL_SEED_OFFSET:
        raise ValueError(f"training seeds must lie in [0, {EVAL_SEED_OFFSET}); got start={start}")
    return list(range(start, start + count))
