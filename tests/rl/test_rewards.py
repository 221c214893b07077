"""World-model rewards (RWML, exact, cell, change) and the VAGEN-style turn reward, on hand cases."""

from types import SimpleNamespace

import pytest
import torch

from spa.agent.grids import state_match
from spa.rl.rewards import (
    EMBEDDING_TAU,
    WORLD_MODEL_REWARDS,
    extract_prediction,
    get_reward,
    prediction_cell_reward,
    prediction_change_reward,
    prediction_embedding_reward,
    prediction_exact_reward,
    vagen_turn_reward,
)

GRID = "######\n#___P#\n##_XO#\n#____#\n#____#\n######"
STATE = GRID + "\nPlayer at (1,4); Box at (2,3); Target at (2,4)."
# The player one step to the left: two grid cells and one coordinate fact differ.
MOVED = STATE.replace("#___P#", "#__P_#").replace("(1,4)", "(1,3)")
SUDOKU = "3 4 1 2\n1 2 3 4\n4 3 2 1\n2 1 4 3\nEmpty at none."


def wm(pred: str) -> str:
    return (f"<think><observation>x</observation> go <prediction>{pred}</prediction></think>"
            "<answer>Up</answer>")


class TableEmbedder:
    """A fake embedder: each text maps to a fixed unit vector."""

    def __init__(self, table):
        self.table = table
        self.calls = 0

    def encode(self, texts):
        self.calls += 1
        return torch.nn.functional.normalize(torch.tensor([self.table[t] for t in texts]), dim=-1)


# -- parsing helpers ---------------------------------------------------------------

@pytest.mark.parametrize("completion, expected", [
    (wm(STATE), STATE),                                              # SPA format: inside think
    (f"<think>reason</think><prediction>{STATE}</prediction>", STATE),  # RWML format: after think
    (f"<prediction>\n{STATE}\n</prediction> trailing", STATE),       # no think at all
    ("<think>no prediction</think><answer>Up</answer>", None),
    ("<prediction>unclosed", None),
    ("<prediction>   </prediction>", None),                          # empty counts as missing
    ([{"role": "assistant", "content": wm("abc")}], "abc"),          # TRL conversational
    (None, None),
    # Nested or repeated tags give the last complete block, never a tag inside it.
    ("<prediction>a<prediction>b</prediction>c</prediction>", "b"),  # nested: innermost last
    ("<prediction>old</prediction> no, <prediction>new</prediction>", "new"),  # revised guess
    ("<think>I put the grid in <prediction> tags.</think><prediction>s</prediction>", "s"),
    ("<prediction>a</prediction>b</prediction>", "a"),               # stray closing tag
    ("<prediction>a</prediction><prediction>unclosed", "a"),         # unclosed last one ignored
    ("</prediction><prediction>", None),
])
def test_extract_prediction(completion, expected):
    assert extract_prediction(completion) == expected


# -- prediction rewards ------------------------------------------------------------------

def test_exact_reward():
    respaced = STATE.replace("\n", "  \r\n") + "\n\n"
    completions = [wm(STATE), wm(respaced), wm(MOVED), "garbage", wm("")]
    assert prediction_exact_reward(completions, targets=[STATE] * 5) == [1.0, 1.0, 0.0, 0.0, 0.0]
    # Characters inside a line count: "3 4" is not "34".
    joined = wm(SUDOKU.replace("3 4 1 2", "34 1 2"))
    assert prediction_exact_reward([joined], targets=[SUDOKU]) == [0.0]


def test_cell_reward():
    completions = [wm(STATE), wm(MOVED), wm(GRID), wm("nothing like a grid"), "unparsable",
                   wm(GRID.replace("#", "_"))]
    rewards = prediction_cell_reward(completions, targets=[STATE] * 6, prompts=["ignored"] * 6)
    assert rewards[:2] == [1.0, pytest.approx(34 / 36)]
    assert rewards[2] == 1.0  # the target's coordinate line is not part of its grid
    assert rewards[3] == 0.0 and rewards[4] == 0.0
    assert rewards[5] == pytest.approx(15 / 36)  # walls erased: only the 15 inner cells match


def test_change_reward_does_not_pay_the_copy():
    # MOVED -> STATE: the player steps right, two cells of row 1 change.
    wrong_way = MOVED.replace("#__P_#", "#_P__#")  # the player stepped left instead
    completions = [wm(STATE), wm(MOVED), wm(STATE.replace("#___P#", "#____#")), wm(wrong_way), "unparsable"]
    rewards = prediction_change_reward(completions, targets=[STATE] * 5, befores=[MOVED] * 5)
    assert rewards[0] == 1.0
    assert rewards[1] == 0.5  # the copy: every kept cell right, both changed cells wrong
    assert rewards[2] == pytest.approx((1 / 2 + 1) / 2)  # left the old cell, never arrived
    assert rewards[3] == pytest.approx((1 / 2 + 33 / 34) / 2)
    assert rewards[4] == 0.0
    # The cell reward pays the copy 34/36; with nothing changed, copying is the right answer.
    assert prediction_cell_reward([wm(MOVED)], targets=[STATE]) == [pytest.approx(34 / 36)]
    assert prediction_change_reward([wm(STATE)], targets=[STATE], befores=[STATE]) == [1.0]
    with pytest.raises(ValueError, match="1 completions but 2 befores"):
        prediction_change_reward([wm(STATE)], targets=[STATE], befores=[STATE, STATE])


def test_embedding_reward_threshold_and_unparsable():
    embedder = TableEmbedder({STATE: [1.0, 0.0], "near": [1.0, 0.05], "far": [0.0, 1.0]})
    completions = [wm(STATE), wm("near"), wm("far"), "unparsable"]
    targets = [STATE] * 4
    rewards = prediction_embedding_reward(completions, targets=targets, embedder=embedder, tau=0.01)
    assert rewards == [1.0, 1.0, 0.0, 0.0]  # near: 1 - cos = 0.00125 < 0.01
    strict = prediction_embedding_reward(completions, targets=targets, embedder=embedder, tau=0.001)
    assert strict == [1.0, 0.0, 0.0, 0.0]
    dense = prediction_embedding_reward(completions, targets=targets, embedder=embedder,
                                        binary=False)
    assert dense[0] == pytest.approx(1.0) and dense[1] == pytest.approx(0.99875, abs=1e-5)
    assert dense[2] == pytest.approx(0.0, abs=1e-6) and dense[3] == 0.0
    assert embedder.calls == 3  # one batched encode per call
    assert prediction_embedding_reward(["x"], targets=[STATE], embedder=None) == [0.0]  # no encode
    assert 0 < EMBEDDING_TAU < 0.01


def test_rewards_check_lengths_and_tau():
    with pytest.raises(ValueError, match="2 completions but 1 targets"):
        prediction_exact_reward(["a", "b"], targets=["a"])
    with pytest.raises(ValueError, match="tau=0"):
        prediction_embedding_reward(["a"], targets=["a"], embedder=None, tau=0)


def test_registry():
    assert set(WORLD_MODEL_REWARDS) == {"embedding", "exact", "cell", "change"}
    assert get_reward("exact") is prediction_exact_reward
    with pytest.raises(ValueError, match="reward 'rouge'; valid names: embedding, exact, cell, change"):
        get_reward("rouge")


# -- VAGEN turn reward -------------------------------------------------------------------

def make_turn(state_before, state_after, *, observation="", prediction="", format_ok=True):
    """The fields of ``spa.agent.trajectory.Turn`` that the turn reward reads."""
    return SimpleNamespace(state_before=state_before, state_after=state_after,
                           observation=observation, prediction=prediction, format_ok=format_ok)


def test_vagen_turn_reward():
    perfect = make_turn(STATE, MOVED, observation=STATE, prediction=MOVED)
    assert vagen_turn_reward(perfect) == pytest.approx(1.5)
    weighted = vagen_turn_reward(perfect, beta_s=1.0, beta_w=2.0, format_reward=0.0)
    assert weighted == pytest.approx(3.0)
    copied = make_turn(STATE, MOVED, observation=STATE, prediction=STATE)
    assert vagen_turn_reward(copied) == pytest.approx(0.5 + 0.5 + 0.5 * state_match(STATE, MOVED))
    empty = make_turn(STATE, MOVED)
    assert vagen_turn_reward(empty) == pytest.approx(0.5)  # format only
    broken = make_turn(STATE, MOVED, observation=STATE, prediction=MOVED, format_ok=False)
    assert vagen_turn_reward(broken) == 0.0  # no format, no state reward
