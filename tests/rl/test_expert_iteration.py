import inspect
import json

import pytest
import torch

from scripted import ScriptedEngine
from spa import heap
from spa.agent.prompts import PromptConfig
from spa.agent.rollout import RolloutConfig
from spa.cli.iterate import iterate as iterate_command
from spa.eval.evaluate import EvalConfig, evaluate
from spa.io import TRAINER_STATE
from spa.models import load_model
from spa.rl import expert_iteration
from spa.rl.expert_iteration import IterateConfig, run
from spa.worldmodel.sft import SFTConfig, load_examples, masked_lm_loss
from spa.worldmodel.tokenize import tokenize_example

MAP = {"desc": "SFG/FHF/FFF", "is_slippery": False}  # Right || Right wins in one turn
ROLLOUT = RolloutConfig("frozenlake", MAP, PromptConfig("base", 1, 2, 0))
WIN, LOSE = "<think>go</think><answer>Right || Right</answer>", "<think>go</think><answer>Down</answer>"


def load(name):
    return load_model(name, dtype="fp32")


@pytest.fixture
def scripted(monkeypatch):
    """Every round's sampler answers: sample 0 wins, sample 1 does not; records each round's
    engine batch (one entry per round played)."""
    played = []

    def engine(model, tokenizer, max_batch_size=None, dtype=None):
        played.append(max_batch_size)
        return ScriptedEngine(tokenizer, [[WIN, LOSE]], model=model)

    monkeypatch.setattr(expert_iteration, "Engine", engine)
    return played


def config(**overrides):
    sft = SFTConfig(epochs=1, val_fraction=0.0, lr=1e-3, batch_size=2, precision="fp32")
    return IterateConfig(**{"rounds": 2, "episodes": 2, "samples": 2, "sft": sft, "keep": "winners", **overrides})


def evaluate_fn(lm, tokenizer, folder):
    return evaluate(lm, tokenizer, EvalConfig("frozenlake", MAP, ROLLOUT.prompt, 2, 2, max_new_tokens=8), folder,
                    progress=False)


def loss_of(folder, example):
    lm, tokenizer = load(folder)
    tokens = tokenize_example(tokenizer, example["messages"], example["response"], False)
    ids = torch.tensor([tokens.input_ids])
    loss, count = masked_lm_loss(lm, ids, torch.ones_like(ids), torch.tensor([tokens.loss_mask]))
    return loss.item() / count


def test_rounds_train_on_the_winners_only_and_resume(tmp_path, scripted):
    records = run("tiny", load, config(), ROLLOUT, tmp_path, evaluate=evaluate_fn)
    assert [r["round"] for r in records] == [0, 1, 2]
    assert json.loads((tmp_path / "rounds.json").read_text()) == json.loads(json.dumps(records))
    for round_, record in enumerate(records[1:], start=1):
        examples = load_examples(tmp_path / f"round-{round_}" / "data.jsonl")
        assert [(e["sample"], e["response"]) for e in examples] == [(0, WIN)]
        assert examples[0]["seed"] != 0 or round_ == 1  # round 2 plays the next training level
        assert (record["kept"], record["turns"], record["play_success"]) == (1, 2, 0.5)
        assert (record["best_first_kept"], record["best_first_dropped"]) == (1.0, 0.0)  # Right, then Down
        assert record["model"] == str(tmp_path / f"round-{round_}" / "sft" / "epoch-1")
        assert set(record["gain_pass@1"]) == {"difference", "difference_ci95", "improved", "worsened"}
        assert record["eval_episodes"] == 4 and "pass@1" in record["eval_ci95"]
        # Tiny rounds take well under 0.1 s, which the record rounds to 0.0.
        assert all(isinstance(record[f"{phase}_seconds"], float) and record[f"{phase}_seconds"] >= 0
                   for phase in ("play", "sft", "eval"))
    seeds = [json.loads((tmp_path / f"round-{r}" / "data.jsonl").read_text())["seed"] for r in (1, 2)]
    assert seeds[0] != seeds[1]
    winner = json.loads((tmp_path / "round-1" / "data.jsonl").read_text())
    assert loss_of(records[1]["model"], winner) < loss_of("tiny", winner)  # the round learned its winner
    assert not list(tmp_path.rglob("*.partial.jsonl"))  # the rounds' turn logs are gone once written

    assert len(scripted) == 2
    more = run("tiny", load, config(rounds=3), ROLLOUT, tmp_path, evaluate=evaluate_fn)
    assert len(scripted) == 3 and [r["round"] for r in more] == [0, 1, 2, 3]  # rounds 1-2 were skipped
    assert more[:3] == records
    with pytest.raises(ValueError, match="started with other iterate settings"):
        run("tiny", load, config(keep="best"), ROLLOUT, tmp_path)


def test_more_rounds_after_a_finished_run_train_only_the_new_ones(tmp_path, scripted, monkeypatch):
    """``spa run`` drops the trainer states of a finished stage; a round whose model is there is
    still done, so rounds added later train alone (rounds 1-3 were trained again before)."""
    run("tiny", load, config(rounds=1), ROLLOUT, tmp_path)
    for state in tmp_path.rglob(TRAINER_STATE):
        state.unlink()
    trained, original = [], expert_iteration.train
    monkeypatch.setattr(expert_iteration, "train", lambda *args, **kwargs: (trained.append(args[4]),
                                                                           original(*args, **kwargs))[1])
    run("tiny", load, config(rounds=2), ROLLOUT, tmp_path)
    assert trained == [tmp_path / "round-2" / "sft"] and len(scripted) == 2


def test_rounds_play_with_the_engine_batch_and_runs_from_before_it_resume(tmp_path, scripted):
    run("tiny", load, config(rounds=1, engine_batch=3), ROLLOUT, tmp_path / "three")
    assert scripted == [3]
    run("tiny", load, config(rounds=1), ROLLOUT, tmp_path / "old")
    settings = tmp_path / "old" / "settings.json"  # as a run started before the key existed wrote it
    saved = json.loads(settings.read_text())
    del saved["iterate"]["engine_batch"]
    settings.write_text(json.dumps(saved))
    run("tiny", load, config(rounds=2), ROLLOUT, tmp_path / "old")  # the missing key reads as its default
    assert scripted == [3, 64, 64]
    with pytest.raises(ValueError, match="started with other iterate settings"):  # it changes the samples
        run("tiny", load, config(rounds=3, engine_batch=5), ROLLOUT, tmp_path / "old")


def test_a_round_without_a_winner_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(expert_iteration, "Engine", lambda model, tokenizer, max_batch_size=None, dtype=None:
                        ScriptedEngine(tokenizer, [[LOSE, LOSE]], model=model))
    with pytest.raises(RuntimeError, match="round-1 kept no turn: none of 2 episodes passed keep='winners'"):
        run("tiny", load, config(), ROLLOUT, tmp_path)


def test_config_errors_name_the_value():
    # one default: the reward's own per-turn label, in the config and on spa iterate's --keep
    assert IterateConfig().keep == "value" == inspect.signature(iterate_command).parameters["keep"].default.default
    with pytest.raises(ValueError, match="keep='all' is not allowed; valid: winners, best"):
        IterateConfig(keep="all")
    with pytest.raises(ValueError, match="episodes=10 must be a positive multiple of samples=4"):
        IterateConfig(episodes=10)
    with pytest.raises(ValueError, match="rounds=0"):
        IterateConfig(rounds=0)
    with pytest.raises(ValueError, match="engine_batch=0"):
        IterateConfig(engine_batch=0)


def test_every_stage_returns_its_memory_to_the_system(tmp_path, scripted, monkeypatch):
    """The start's evaluation, then each round's play, SFT and evaluation: a release after each."""
    released = []
    monkeypatch.setattr(heap, "release", lambda: released.append(len(list(tmp_path.rglob("metrics.json")))))
    run("tiny", load, config(rounds=1), ROLLOUT, tmp_path, evaluate=evaluate_fn)
    assert released == [1, 1, 2, 3]  # metrics.json: round-0 eval; + round-1 SFT; + round-1 eval
