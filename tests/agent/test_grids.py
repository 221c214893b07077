"""State texts compared: spacing, cells in place, coordinate facts and the state matcher, on hand cases."""

import pytest

from spa.agent.grids import cell_accuracy, coordinate_facts, exact_match, split_state, state_distance, state_match

GRID = "######\n#___P#\n##_XO#\n#____#\n#____#\n######"
STATE = GRID + "\nPlayer at (1,4); Box at (2,3); Target at (2,4)."
# The player one step to the left: two grid cells and one coordinate fact differ.
MOVED = STATE.replace("#___P#", "#__P_#").replace("(1,4)", "(1,3)")
SUDOKU = "3 4 1 2\n1 2 3 4\n4 3 2 1\n2 1 4 3\nEmpty at none."


def test_exact_match_ignores_spacing_only():
    truth = "#P_#\n#__#\nPlayer at (0,1)."
    assert exact_match("  #P_# \n\n#__#\nPlayer  at (0,1).", truth)
    assert not exact_match("#P_#\n#__#\nPlayer at (0,2).", truth)


def test_cell_accuracy_counts_cells_in_place():
    assert cell_accuracy("#P_#\n#__#\nPlayer at (0,1).", "#P_#\n#__#") == 1.0
    assert cell_accuracy("#_P#\n#__#", "#P_#\n#__#") == 0.75
    assert cell_accuracy("#P_#", "#P_#\n#__#") == 0.5  # a missing row counts as wrong
    assert cell_accuracy("", "#P_#\n#__#") == 0.0
    assert cell_accuracy("1 _ 3 4\n3 4 1 2", "1 2 3 4\n3 4 1 2") == 7 / 8  # Sudoku tokens


def test_split_state_and_coordinate_facts():
    assert split_state(STATE) == (GRID, "Player at (1,4); Box at (2,3); Target at (2,4).")
    assert split_state(SUDOKU)[1] == "Empty at none."
    assert split_state(GRID) == (GRID, "")
    assert coordinate_facts(STATE) == {("player", 1, 4), ("box", 2, 3), ("target", 2, 4)}
    assert coordinate_facts("Hole at (1,0), (1, 1);\nGoal at (3,3).") == {
        ("hole", 1, 0), ("hole", 1, 1), ("goal", 3, 3)}
    assert coordinate_facts("Empty at none.") == set()


# -- state_match (the VAGEN matcher) ---------------------------------------------------

def test_state_match_identical_near_far_and_missing():
    assert state_match(STATE, STATE) == 1.0
    assert state_match(STATE.replace("\n", "\r\n  "), STATE) == 1.0  # spacing is not content
    # One step off: grid 34/36 cells, coordinates F1 2/3.
    assert state_match(MOVED, STATE) == pytest.approx(0.5 * 34 / 36 + 0.5 * 2 / 3)
    # Statement order does not matter, only the facts.
    reordered = GRID + "\nTarget at (2,4); Box at (2,3); Player at (1,4)."
    assert state_match(reordered, STATE) == 1.0
    assert state_match("I have no idea.", STATE) == 0.0
    assert state_match(None, STATE) == 0.0 and state_match("", STATE) == 0.0
    assert state_distance(STATE, STATE) == 0.0 and state_distance(None, STATE) == 1.0


def test_state_match_other_grids():
    far = "P_G_\nOO__\n_OO_\nO___\nPlayer at (0,0); Goal at (0,2)."
    assert state_match(far, STATE) < 0.2
    assert state_match(GRID, GRID) == 1.0  # a raw grid truth is scored by its grid alone
    assert state_match(GRID.replace("P", "_"), GRID) == pytest.approx(35 / 36)
    assert state_match(SUDOKU, SUDOKU) == 1.0
    # A full Sudoku: nothing to state, and nothing stated.
    assert state_match(SUDOKU.split("\nEmpty")[0], SUDOKU) == 1.0
