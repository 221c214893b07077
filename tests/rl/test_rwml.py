"""RWML data: triplet extraction, the world-model prompt and the too-easy filter."""

import random

import pytest
import torch

from spa.agent.prompts import example_turn
from spa.agent.trajectory import Trajectory, Turn
from spa.envs import make
from spa.rl.rewards import extract_prediction
from spa.rl.rwml import (
    Triplet,
    embedding_distances,
    filter_too_easy,
    triplets_from_trajectories,
    worked_example,
    world_model_messages,
)

S = [f"state {i}\nPlayer at ({i},0)." for i in range(6)]


def make_turn(state_before, state_after, actions, valid, *, format_ok=True) -> Turn:
    """A Turn whose bookkeeping fields are filler; states and actions are what matter."""
    return Turn(
        prompt_messages=[], prompt_ids=[], response="", response_ids=[], logprobs=[],
        finish_reason="stop", think="", observation="", prediction="",
        answer=" || ".join(actions), actions=list(actions), actions_valid=list(valid),
        format_ok=format_ok, state_before=state_before, grid_before=state_before.split("\n")[0],
        state_after=state_after, grid_after=state_after.split("\n")[0], env_reward=0.0, reward=0.0,
    )


def episode(seed=7, group=0, sample=0) -> Trajectory:
    turns = [
        make_turn(S[0], S[1], ["Up", "Jump", "Left"], [True, False, True]),  # mixed: kept
        make_turn(S[1], S[1], ["Jump"], [False]),                            # no valid action
        make_turn(S[1], S[2], ["Down"], [True], format_ok=False),            # malformed
        make_turn(S[2], S[3], ["Right"], [True]),                            # kept
    ]
    return Trajectory("sokoban", {}, seed, group, sample, "world_model", turns)


def test_triplets_drop_invalid_and_malformed_turns():
    triplets = triplets_from_trajectories([episode(seed=3, group=1, sample=2)])
    assert [t.turn for t in triplets] == [0, 3]
    first, last = triplets
    assert (first.state_before, first.next_state, first.actions) == (S[0], S[1], ["Up", "Left"])
    assert (last.state_before, last.next_state, last.actions) == (S[2], S[3], ["Right"])
    assert (first.env, first.seed, first.group, first.sample) == ("sokoban", 3, 1, 2)
    assert first.history == [] and last.history == []  # history_turns=0 by default
    # Without the format requirement the malformed turn's transition is usable.
    lenient = triplets_from_trajectories([episode()], require_format=False)
    assert [t.turn for t in lenient] == [0, 2, 3]


def test_triplet_history_keeps_earlier_turns_including_dropped_ones():
    (_, last) = triplets_from_trajectories([episode()], history_turns=2)
    assert last.history == [(S[1], []), (S[1], ["Down"])]
    (_, last) = triplets_from_trajectories([episode()], history_turns=None)
    assert [state for state, _ in last.history] == [S[0], S[1], S[1]]
    assert last.history[0][1] == ["Up", "Left"]
    with pytest.raises(ValueError, match="history_turns=-1"):
        triplets_from_trajectories([episode()], history_turns=-1)


def test_triplet_json_round_trip():
    (_, last) = triplets_from_trajectories([episode()], history_turns=None)
    assert Triplet.from_json(last.to_json()) == last


def test_world_model_messages():
    (first, last) = triplets_from_trajectories([episode()], history_turns=1)
    system, user = world_model_messages(last)
    assert system["role"] == "system" and "Sokoban" in system["content"]  # the env's own rules
    # The format is shown by a worked example on the example level, not by placeholders
    # (which the 135M model copies as its answer): a true transition of that level.
    before, played, after = example_turn(make("sokoban"))
    assert worked_example(last) in system["content"]
    assert f"Current state:\n{before}\nActions: {' || '.join(played)}" in system["content"]
    assert extract_prediction(worked_example(last)) == after != before
    assert "the state after" not in system["content"]
    text = user["content"]
    assert f"Turn 4. Current state:\n{S[2]}" in text and "Actions: Right" in text
    assert f"Turn 3 state:\n{S[1]}\nActions: Down" in text  # the one kept history turn
    assert text.index("Turn 3 state") < text.index("Turn 4. Current")
    _, user = world_model_messages(first, rules="RULES")
    assert "Earlier turns" not in user["content"] and "Actions: Up || Left" in user["content"]
    assert world_model_messages(first, rules="RULES")[0]["content"].startswith("RULES")
    # An answer in the requested format is read by the reward's parser.
    answer = f"<think>the player moves</think><prediction>{S[1]}</prediction>"
    assert extract_prediction(answer) == S[1]


# -- the too-easy filter --------------------------------------------------------------------

def triplet(i: int, easy: bool) -> Triplet:
    return Triplet("sokoban", {}, seed=i, turn=0, state_before=S[0], actions=["Up"],
                   next_state=S[1] if easy else S[2])


def perfect_for(state):
    """A scripted filter model that always predicts ``state``."""
    def predict(triplets, k):
        return [[state] * k for _ in triplets]
    return predict


def test_filter_keep_prob_zero_and_one():
    triplets = [triplet(i, easy=i % 2 == 0) for i in range(10)]  # 5 easy, 5 hard
    kept, stats = filter_too_easy(triplets, perfect_for(S[1]), k=4, keep_prob=0.0)
    assert [t.seed for t in kept] == [1, 3, 5, 7, 9]
    assert stats == {"triplets": 10, "easy": 5, "hard": 5, "easy_kept": 0, "dropped": 5, "kept": 5}
    kept, stats = filter_too_easy(triplets, perfect_for(S[1]), k=4, keep_prob=1.0)
    assert kept == triplets and stats["dropped"] == 0 and stats["easy_kept"] == 5


def test_filter_needs_all_k_right():
    def seven_of_eight(triplets, k):
        return [[S[1]] * (k - 1) + [None] for _ in triplets]
    kept, stats = filter_too_easy([triplet(0, easy=True)], seven_of_eight, k=8, keep_prob=0.0)
    assert len(kept) == 1 and stats["easy"] == 0
    # Near misses count when the distance says so: an injected distance and tau.
    def near(preds, truths):
        return [0.01] * len(preds)
    _, stats = filter_too_easy([triplet(0, easy=False)], perfect_for(S[0]), k=2, keep_prob=0.0,
                               distance=near, tau=0.02)
    assert stats["easy"] == 1
    _, stats = filter_too_easy([triplet(0, easy=False)], perfect_for(S[0]), k=2, keep_prob=0.0,
                               distance=near, tau=0.01)  # strict inequality, like the reward
    assert stats["easy"] == 0


def test_filter_seeded_fraction():
    triplets = [triplet(i, easy=True) for i in range(2000)]
    kept, stats = filter_too_easy(triplets, perfect_for(S[1]), k=1, keep_prob=0.1, rng=123)
    assert 0.08 < len(kept) / 2000 < 0.12 and stats["easy_kept"] == len(kept)
    again, _ = filter_too_easy(triplets, perfect_for(S[1]), k=1, keep_prob=0.1,
                               rng=random.Random(123))
    assert again == kept  # a seed and a Random with that seed agree


def test_filter_checks_its_arguments():
    triplets = [triplet(0, easy=True)]
    with pytest.raises(ValueError, match="2 predictions for each of the 1"):
        filter_too_easy(triplets, lambda t, k: [[S[1]]], k=2)  # one, not two
    with pytest.raises(ValueError, match="keep_prob=1.5"):
        filter_too_easy(triplets, perfect_for(S[1]), keep_prob=1.5)
    with pytest.raises(ValueError, match="k=0"):
        filter_too_easy(triplets, perfect_for(S[1]), k=0)
    assert filter_too_easy([], perfect_for(S[1]))[1]["triplets"] == 0


def test_filter_with_embedding_distance():
    class OneHot:
        def encode(self, texts):
            return torch.nn.functional.one_hot(torch.tensor([S.index(t) for t in texts]), 6).float()

    distances = embedding_distances(OneHot())
    assert distances([S[1], S[2], None], [S[1], S[1], S[1]]) == [0.0, 1.0, 2.0]
    triplets = [triplet(0, easy=True), triplet(1, easy=False)]
    kept, _ = filter_too_easy(triplets, perfect_for(S[1]), k=3, keep_prob=0.0,
                              distance=distances, tau=0.003)
    assert [t.seed for t in kept] == [1]
