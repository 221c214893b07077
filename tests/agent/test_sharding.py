"""``spa.agent.sharding``: a rollout's levels split over processes, put back together in
one process's order. The launched version (2 processes) is tested in tests/test_distributed.py
and tests/pipeline/test_launch.py; here each process's share is played in turn in one process."""

import torch
from fakes import hashed_answers

from spa import distributed
from spa.agent.prompts import PromptConfig
from spa.agent.rollout import RolloutConfig, rollout
from spa.agent.sharding import (
    Played,
    finish_log,
    levels_of,
    merged,
    own_log,
    process_seed,
    renumbered,
    rollout_by_level,
)
from spa.agent.turnlog import TurnLog
from spa.models.engine import SamplingParams

ANSWERS = ("<answer>Up</answer>", "nonsense", "<answer>Left || Down</answer>", "<answer>Right</answer>")
CONFIG = RolloutConfig("frozenlake", {}, PromptConfig("state", max_turns=2))
SAMPLING = SamplingParams(max_new_tokens=8, seed=3)
SEEDS = [100, 101, 102, 103, 104]


class PromptEngine:
    """Answers each prompt by its tokens and how often it came before in the call (a level's
    samples share their first prompt): the answers depend on the episode alone, not on which
    episodes share the batch, as a seeded sampler's would."""

    model = torch.nn.Linear(1, 1)

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def decode_dtype(self):
        return torch.float32

    def generate(self, prompts, params, progress=False):
        return hashed_answers(self.tokenizer, prompts, ANSWERS, lambda n: [-1.0] * n)


def test_every_level_goes_to_one_process_and_the_shares_are_even():
    for world in (1, 2, 3):
        shares = [levels_of(SEEDS, rank, world) for rank in range(world)]
        assert sorted(seed for share in shares for seed in share) == SEEDS
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
    assert levels_of(SEEDS[:1], 1, 2) == []  # more processes than levels: one plays none


def test_one_process_samples_with_the_seed_itself_and_each_of_several_with_its_own():
    assert process_seed(7, 0, 1) == 7
    assert [process_seed(7, rank, 2) for rank in (0, 1)] == [14, 15]
    assert process_seed(None, 1, 2) is None


def test_the_shares_put_together_are_the_rollout_of_one_process(tiny):
    _, tokenizer = tiny
    engine = PromptEngine(tokenizer)
    whole = rollout(engine, tokenizer, SEEDS, 2, CONFIG, SAMPLING)
    parts = [renumbered(rollout(engine, tokenizer, levels_of(SEEDS, rank, 2), 2, CONFIG, SAMPLING), rank, 2)
             for rank in (1, 0)]  # in any order
    together = merged(parts)
    assert [(t.seed, t.group, t.sample) for t in together] == [(t.seed, t.group, t.sample) for t in whole]
    assert [t.to_json() for t in together] == [t.to_json() for t in whole]
    assert len({t.group for t in whole}) == len(SEEDS) and any(len(t.turns) == 2 for t in whole)


def test_alone_the_split_rollout_is_the_rollout(tiny):
    _, tokenizer = tiny
    engine = PromptEngine(tokenizer)
    played = rollout_by_level(engine, tokenizer, SEEDS, 2, CONFIG, SAMPLING)
    assert [t.to_json() for t in played.trajectories] == [t.to_json() for t in
                                                          rollout(engine, tokenizer, SEEDS, 2, CONFIG, SAMPLING)]
    assert [(s["levels"], s["episodes"]) for s in played.shares] == [(5, 10)]
    assert played.by_process() == {}  # a single-process output keeps exactly its fields
    assert distributed.from_each(lambda: 4) == [4]


def test_several_processes_are_recorded_by_process():
    shares = [{"levels": 3, "episodes": 6, "seconds": 1.0}, {"levels": 2, "episodes": 4, "seconds": 0.8}]
    assert Played([], shares).by_process() == {"processes": shares}


def test_each_process_logs_its_turns_apart_and_the_main_process_clears_them_all(tmp_path, monkeypatch):
    path = tmp_path / "rollout.partial.jsonl"
    assert own_log(path) == path
    monkeypatch.setattr(distributed, "world", lambda: (1, 2))
    assert own_log(path) == tmp_path / "rollout.rank1.partial.jsonl"
    monkeypatch.undo()
    # the main process's log, the second process's, one of an earlier launch of 4, and another file
    for name in ("rollout.partial.jsonl", "rollout.rank1.partial.jsonl", "rollout.rank3.partial.jsonl",
                 "selfplay.partial.jsonl"):
        (tmp_path / name).write_text("{}\n")
    finish_log(TurnLog(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["selfplay.partial.jsonl"]
