"""An interrupted rollout resumes from its turn log and ends as the uninterrupted one."""

import copy
import json
from dataclasses import dataclass

import pytest
import torch

from spa.agent.prompts import PromptConfig
from spa.agent.rollout import RolloutConfig, rollout
from spa.agent.turnlog import TurnLog, fingerprint
from spa.eval.evaluate import PARTIAL, EvalConfig, evaluate
from spa.models.engine import SamplingParams
from scripted import ScriptedEngine, wm

# Slippery ice, so replaying a turn must also replay the slips the episode drew.
SLIPPERY = {"desc": "SFFF/FHFH/FFFH/HFFG", "is_slippery": True, "success_rate": 0.5}
CONFIG = RolloutConfig("frozenlake", SLIPPERY, PromptConfig(max_turns=3, max_actions_per_turn=3))
# The i-th prompt of every call gets ANSWERS[i % 3]: one babbles.
ANSWERS = [wm("Down || Down || Right"), wm("Right || Down"), "no format"]


@dataclass
class Answering(ScriptedEngine):
    """A scripted engine that answers any number of prompts from ANSWERS."""

    def generate(self, prompts, params, progress=False):
        self.script = [[ANSWERS[i % len(ANSWERS)] for i in range(len(prompts))]] * (self.calls + 1)
        return super().generate(prompts, params, progress)


class Interrupt(Exception):
    pass


def interrupt_at(turn: int):
    def on_turn(index, active):
        if index == turn:
            raise Interrupt
    return on_turn


def play(tokenizer, model, log=None, on_turn=None):
    """Four episodes: two seeds, two samples."""
    engine = Answering(tokenizer, [], model=model)
    return engine, rollout(engine, tokenizer, [3, 4], 2, CONFIG, SamplingParams(seed=1), on_turn=on_turn, log=log)


def records(trajectories):
    return [json.loads(json.dumps(t.to_json())) for t in trajectories]


def test_a_rollout_interrupted_after_a_turn_resumes_to_the_same_episodes(tiny, tmp_path):
    model, tokenizer = tiny
    _, whole = play(tokenizer, model)
    assert any(len(t.turns) < 3 for t in whole) and any(len(t.turns) == 3 for t in whole)  # some ended early
    path = tmp_path / "play.partial.jsonl"
    with TurnLog(path) as log, pytest.raises(Interrupt):
        play(tokenizer, model, log=log, on_turn=interrupt_at(2))
    with path.open("a") as handle:
        handle.write('{"episode": 0, "tu')  # a line the interrupt cut
    with TurnLog(path) as log:
        engine, resumed = play(tokenizer, model, log=log)
    assert engine.calls == 1  # only the third turn was generated
    assert records(resumed) == records(whole)
    assert log.seconds() >= 0 and path.is_file()
    log.finish()
    assert not path.exists()


def test_a_log_of_other_settings_or_weights_is_started_afresh(tiny, tmp_path):
    model, tokenizer = tiny
    path = tmp_path / "play.partial.jsonl"
    with TurnLog(path) as log, pytest.raises(Interrupt):
        play(tokenizer, model, log=log, on_turn=interrupt_at(2))
    other = copy.deepcopy(model)  # other weights: a fresh init could repeat the seeded RNG's draw
    with torch.no_grad():
        next(other.parameters()).add_(1.0)
    assert fingerprint(other) != fingerprint(model)
    with TurnLog(path) as log, pytest.warns(UserWarning, match="other settings"):
        engine, _ = play(tokenizer, other, log=log)
    assert engine.calls == 3


def test_a_log_whose_replay_misses_its_saved_state_is_refused(tiny, tmp_path):
    model, tokenizer = tiny
    path = tmp_path / "play.partial.jsonl"
    with TurnLog(path) as log, pytest.raises(Interrupt):
        play(tokenizer, model, log=log, on_turn=interrupt_at(1))
    lines = path.read_text().splitlines()
    turn = json.loads(lines[1])
    turn["turn"]["actions"] = ["Up"]  # not what was played
    path.write_text("\n".join([lines[0], json.dumps(turn), *lines[2:]]) + "\n")
    with TurnLog(path) as log, pytest.raises(RuntimeError, match="did not reach its saved state"):
        play(tokenizer, model, log=log)


def test_an_interrupted_evaluation_resumes_into_the_same_metrics(tiny, tmp_path, monkeypatch):
    model, tokenizer = tiny
    config = EvalConfig("frozenlake", SLIPPERY, PromptConfig("base", max_turns=3), num_envs=2, samples=2,
                        max_new_tokens=8)
    whole = evaluate(model, tokenizer, config, tmp_path / "whole", progress=False)
    append = TurnLog.append

    def append_then_stop(self, played):
        append(self, played)
        raise Interrupt
    monkeypatch.setattr(TurnLog, "append", append_then_stop)
    with pytest.raises(Interrupt):
        evaluate(model, tokenizer, config, tmp_path / "resumed", progress=False)
    assert (tmp_path / "resumed" / PARTIAL).is_file() and not (tmp_path / "resumed" / "metrics.json").exists()
    monkeypatch.setattr(TurnLog, "append", append)
    resumed = evaluate(model, tokenizer, config, tmp_path / "resumed", progress=False)
    assert not (tmp_path / "resumed" / PARTIAL).exists()
    log_resumed, log_whole = (tmp_path / name / "trajectories.jsonl" for name in ("resumed", "whole"))
    assert log_resumed.read_text() == log_whole.read_text()
    assert resumed["pass_at_k"] == whole["pass_at_k"]
