from math import comb

import pytest

from spa.eval.metrics import cell_accuracy, exact_match, pass_at_k


@pytest.mark.parametrize("n,c,k", [(8, 0, 1), (8, 1, 1), (8, 3, 2), (8, 3, 4), (8, 5, 4), (8, 8, 8),
                                   (10, 2, 3), (200, 37, 8)])
def test_pass_at_k_matches_the_closed_form(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_pass_at_k_hand_cases():
    assert pass_at_k(8, 2, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)  # 1 - 1/6
    assert pass_at_k(8, 0, 8) == 0.0 and pass_at_k(8, 1, 8) == 1.0


@pytest.mark.parametrize("n,c,k", [(8, 9, 1), (8, 1, 9), (8, 1, 0), (0, 0, 1)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


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


def test_world_model_accuracy_scores_states_and_the_copy_floor():
    from types import SimpleNamespace

    from spa.eval.metrics import world_model_accuracy

    before, after = "_P\n__\nPlayer at (0,1).", "__\n_P\nPlayer at (1,1)."

    def turn(observation, prediction, state_after):
        grid_after = "\n".join(state_after.splitlines()[:2])
        return SimpleNamespace(observation=observation, prediction=prediction, state_before=before,
                               grid_before="_P\n__", state_after=state_after, grid_after=grid_after)

    right = turn(before, after, after)  # everything right
    copied = turn(before, before, after)  # the prediction copies the observation: wrong here
    blocked = turn(before, before, before)  # a move into the edge: copying is right
    scores = world_model_accuracy([right, copied, blocked])
    assert scores["observation_exact"] == 1.0
    assert scores["prediction_exact"] == 2 / 3
    assert scores["unchanged_rate"] == 1 / 3
    assert scores["prediction_cell_acc"] == (1 + 0.5 + 1) / 3
