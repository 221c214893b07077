"""How a state text written by the agent compares with the true one: grids cell by cell, and the
``Entity at (r,c)`` facts of the coordinate description.

The evaluation (:mod:`spa.eval.metrics`), the self-play data's check of the model's own states
(:mod:`spa.worldmodel.selfplay`) and the world-model rewards (:mod:`spa.rl.rewards`) all
judge states with these functions, so they live below all three.
"""

from __future__ import annotations

import re

_COORD_LINE = re.compile(r"^\s*[A-Za-z][A-Za-z ]*?\s+at\s+(\(|none\b)", re.IGNORECASE)
_FACT = re.compile(r"([A-Za-z][A-Za-z ]*?)\s+at\s+([^;\n]*)", re.IGNORECASE)
_PAIR = re.compile(r"\(\s*(\d+)\s*,\s*(\d+)\s*\)")


def _lines(text: str) -> list[str]:
    """Non-empty lines with runs of whitespace collapsed (formatting is not content)."""
    return [" ".join(line.split()) for line in text.strip().splitlines() if line.strip()]


def exact_match(predicted: str, truth: str) -> bool:
    """Whether two state texts agree line by line, ignoring blank lines and spacing."""
    return _lines(predicted) == _lines(truth)


def _cells(row: str, spaced: bool) -> list[str]:
    return row.split() if spaced else list(row.replace(" ", ""))


def grid_cells(grid: str) -> list[list[str]]:
    """The grid's rows as lists of cells: characters, or whitespace-separated tokens when
    the grid is written that way (Sudoku)."""
    rows = _lines(grid)
    spaced = bool(rows) and " " in rows[0]
    return [_cells(row, spaced) for row in rows]


def aligned_cells(predicted: str, true_grid: str) -> list[list[str]]:
    """The predicted grid, read as the true grid is written: the prediction's first rows
    (at most as many as the true grid has), split into characters, or into
    whitespace-separated tokens when the true grid is written that way (Sudoku)."""
    truth_rows = _lines(true_grid)
    spaced = bool(truth_rows) and " " in truth_rows[0]
    return [_cells(row, spaced) for row in _lines(predicted)[: len(truth_rows)]]


def cell_accuracy(predicted: str, true_grid: str) -> float:
    """Fraction of the true grid's cells that the predicted text reproduces in place.

    The predicted grid is ``aligned_cells``; a missing row or cell counts as wrong, extra
    ones are ignored.
    """
    truth = grid_cells(true_grid)
    if not truth:
        return 0.0
    pred = aligned_cells(predicted, true_grid)
    total = correct = 0
    for i, truth_cells in enumerate(truth):
        pred_cells = pred[i] if i < len(pred) else []
        total += len(truth_cells)
        correct += sum(p == t for p, t in zip(pred_cells, truth_cells))
    return correct / total


def grid_exact(predicted: str, true_grid: str) -> bool:
    """Whether the first rows of the predicted text are exactly the true grid."""
    rows = len(_lines(true_grid))
    return _lines(predicted)[:rows] == _lines(true_grid)


def split_state(text: str) -> tuple[str, str]:
    """Split a state text into (grid, coordinate description).

    The description starts at the first line that reads ``Name at (r,c)`` or
    ``Name at none`` (``TextEnv.describe``); grid rows never do. Blank lines are dropped.
    """
    lines = [line for line in text.strip().splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if _COORD_LINE.match(line):
            return "\n".join(lines[:i]), "\n".join(lines[i:])
    return "\n".join(lines), ""


def coordinate_facts(text: str) -> set[tuple[str, int, int]]:
    """``(entity, row, col)`` facts of every ``Entity at (r,c), (r,c)...`` statement in ``text``.

    Entity names are lower-cased; statements are separated by ``;`` or line ends.
    """
    facts = set()
    for name, positions in _FACT.findall(text):
        entity = name.strip().lower()
        facts.update((entity, int(r), int(c)) for r, c in _PAIR.findall(positions))
    return facts


def _f1(predicted: set, truth: set) -> float:
    if not predicted and not truth:
        return 1.0  # nothing to state (a full Sudoku) and nothing stated
    hits = len(predicted & truth)
    return 2 * hits / (len(predicted) + len(truth))


def state_match(pred_text: str | None, true_text: str) -> float:
    """Deterministic similarity of a predicted state to the true one, in [0, 1].

    The mean of two scores, when the true state has a coordinate description:
    * grid: ``cell_accuracy`` of the prediction's first rows against the true grid;
    * coordinates: F1 of the ``(entity, row, col)`` facts the prediction states against
      the true ones (VAGEN's symbolic states are also scored by an F1 over matched
      objects).
    A raw grid without a description is scored by the grid alone. Identical states
    score 1, no prediction 0. The layout of a level is mostly static (walls), so the
    grid score is generous and the coordinate score does the discriminating: copying
    the state before a move scores about 0.8 in 6x6 Sokoban (grid ~0.94, coordinates
    2/3) and 0.92 in 4x4 Sudoku (one cell of 16), a different level of the same game
    0.3-0.4 (median over 40 seeds), text without grid or coordinates 0.
    """
    if not pred_text:
        return 0.0
    true_grid, true_coords = split_state(true_text)
    grid_score = cell_accuracy(pred_text, true_grid) if grid_cells(true_grid) else 0.0
    if not true_coords:
        return grid_score
    coord_score = _f1(coordinate_facts(pred_text), coordinate_facts(true_coords))
    return 0.5 * grid_score + 0.5 * coord_score


def state_distance(pred_text: str | None, true_text: str) -> float:
    """``1 - state_match``: 0 for identical states, 1 for a missing prediction."""
    return 1.0 - state_match(pred_text, true_text)
