"""The RWML stage: GRPO bookkeeping, data, next-state accuracy, smoke/resume runs and the CLI."""

import copy
import json
from dataclasses import dataclass

import pytest
import torch
from typer.testing import CliRunner

from spa.models.engine import Generation
from spa.rl.batch import Sample, collate, policy_forward
from spa.rl.logger import read_metrics
from spa.rl.ppo import resume_point
from spa.rl.rwml import Triplet, collect_triplets, load_triplets, prompt_ids
from spa.rl.rwml_config import RWMLConfig
from spa.rl.rwml_train import batch_indices, grpo_samples, is_copy, prediction_accuracy, sampling_predictor, train
from tests.scripted import ScriptedEngine

BEFORE = "#####\n#P_O#\n#####\nPlayer at (1,1); Target at (1,3)."
AFTER = "#####\n#_PO#\n#####\nPlayer at (1,2); Target at (1,3)."


def gen(ids, logprob=-1.0):
    return Generation(list(ids), "", [logprob] * len(ids), "stop")


# -- config and batches --------------------------------------------------------------------

def test_config_rejects_bad_values_by_name():
    with pytest.raises(ValueError, match="valid names: embedding, exact, cell"):
        RWMLConfig(reward="bleu")
    with pytest.raises(ValueError, match="group_size=1 is out of range"):
        RWMLConfig(group_size=1)
    with pytest.raises(ValueError, match="episodes=10 .* multiple of samples=8"):
        RWMLConfig(episodes=10)
    with pytest.raises(ValueError, match="exploration='greedy' is not known; valid: self_play, random"):
        RWMLConfig(exploration="greedy")
    actor = RWMLConfig(lr=3e-5, entropy_coef=0.0).actor_config()
    assert (actor.algorithm, actor.actor_lr, actor.entropy_coef, actor.kl_coef) == ("grpo", 3e-5, 0.0, 0.0)


def test_batches_cover_each_epoch_once_and_depend_only_on_seed_and_step():
    epoch = [i for step in range(3) for i in batch_indices(6, 2, step, seed=0)]
    assert sorted(epoch) == list(range(6))
    assert batch_indices(6, 2, 4, seed=0) == batch_indices(6, 2, 4, seed=0)
    assert batch_indices(6, 2, 0, seed=0) != batch_indices(6, 2, 0, seed=1)
    wrapped = batch_indices(5, 4, 1, seed=0)  # positions 4..7: last of epoch 0, three of epoch 1
    assert len(wrapped) == 4 and len(set(wrapped[1:])) == 3
    with pytest.raises(ValueError, match="no triplets"):
        batch_indices(0, 2, 0, seed=0)


# -- GRPO samples --------------------------------------------------------------------------

def test_grpo_samples_put_group_normalised_advantages_on_completion_tokens_only():
    prompts = [[1, 2, 3], [4, 5]]
    generations = [gen([7, 8]), gen([9]), gen([10, 11, 12]), gen([13]),  # group 0
                   gen([14]), gen([]), gen([15]), gen([16])]  # group 1, one empty completion
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    samples = grpo_samples(prompts, generations, rewards, group_size=4)
    # Group 1's rewards are all equal: no advantage, left out of the update.
    assert [(s.episode, s.turn) for s in samples] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    # (r - mean) / sample std: mean 0.25, std 0.5.
    assert [len(s.advantages) for s in samples] == [2, 1, 3, 1]  # one per completion token
    flat = [a for s in samples for a in s.advantages.tolist()]
    assert flat == pytest.approx([1.5, 1.5, -0.5, -0.5, -0.5, -0.5, -0.5], abs=1e-5)
    assert samples[2].ids == [1, 2, 3, 10, 11, 12] and samples[2].start == 3
    assert samples[2].old_logprobs.tolist() == [-1.0] * 3
    _, _, targets = collate(samples, pad_id=0)
    assert targets[2].tolist() == [False] * 3 + [True] * 3
    # Dr. GRPO (no std); flat groups kept with exactly zero advantage, empty completions dropped.
    samples = grpo_samples(prompts, generations, rewards, 4, normalize_std=False, skip_flat=False)
    assert [s.advantages[0].item() for s in samples] == pytest.approx([0.75, -0.25, -0.25, -0.25, 0, 0, 0])
    with pytest.raises(ValueError, match="need 4 generations and rewards per prompt"):
        grpo_samples(prompts, generations[:7], rewards[:7], 4)


def test_a_flat_group_of_awkward_scores_gets_exactly_zero():
    """29/36 eight times: core.group_advantages leaves float noise there, we do not."""
    samples = grpo_samples([[1]], [gen([2])] * 8, [29 / 36] * 8, 8, skip_flat=False)
    assert all(s.advantages.item() == 0.0 for s in samples)


# -- data ----------------------------------------------------------------------------------

def test_random_exploration_gives_deduped_triplets_and_the_filter_drops_easy_ones(tiny):
    _, tokenizer = tiny
    config = RWMLConfig(exploration="random", episodes=4, samples=2, max_turns=2, filter=False)
    triplets, stats = collect_triplets("sokoban", {}, config)
    assert stats["triplets"] == len(triplets) > 0 and stats["episodes"] == 4
    assert stats["extracted"] == len(triplets) + stats["duplicates"]
    assert {t.seed for t in triplets} <= {0, 1} and all(t.actions for t in triplets)
    assert len({json.dumps(t.to_json(), sort_keys=True) for t in triplets}) == len(triplets)

    def perfect(batch, k):  # a filter model that always knows the next state
        return [[t.next_state] * k for t in batch]
    easy = RWMLConfig(exploration="random", episodes=4, samples=2, max_turns=2, filter_keep_prob=0.0)
    kept, stats = collect_triplets("sokoban", {}, easy, predict=perfect)
    assert kept == [] and stats["filter"]["easy"] == len(triplets) and stats["filter"]["tau"] == 0.05
    with pytest.raises(ValueError, match="needs a predictor"):
        collect_triplets("sokoban", {}, easy)
    with pytest.raises(ValueError, match="needs an engine"):
        collect_triplets("sokoban", {}, RWMLConfig(episodes=8))

    # The sampling predictor: k extracted predictions per triplet, None for a missing block.
    answers = [f"<prediction>{AFTER}</prediction>", "no block"] * 2
    predict = sampling_predictor(ScriptedEngine(tokenizer, [answers]), tokenizer, max_new_tokens=8)
    assert predict([triplet(), triplet()], 2) == [[AFTER, None], [AFTER, None]]


def triplet(seed=0, before=BEFORE, after=AFTER):
    return Triplet("sokoban", {}, seed=seed, turn=0, state_before=before, actions=["Right"], next_state=after)


# -- next-state accuracy -------------------------------------------------------------------

class OneHotEmbedder:
    """Equal texts -> equal unit vectors, different texts -> orthogonal ones."""

    def encode(self, texts):
        index = {t: i for i, t in enumerate(dict.fromkeys(texts))}
        return torch.nn.functional.one_hot(torch.tensor([index[t] for t in texts]), len(index)).float()


def test_prediction_accuracy_on_hand_cases(tiny, tmp_path):
    model, tokenizer = tiny
    triplets = [triplet(0), triplet(1)]
    truth = [f"<think>the player moves right</think><prediction>{AFTER}</prediction>"] * 2
    right = prediction_accuracy(model, tokenizer, triplets, engine=ScriptedEngine(tokenizer, [truth]),
                                embedder=OneHotEmbedder(), records=tmp_path / "p.jsonl")
    assert (right["exact"], right["cell"], right["state_match"], right["embedding"]) == (1.0, 1.0, 1.0, 1.0)
    assert (right["found"], right["copied"], right["triplets"]) == (1.0, 0.0, 2)
    records = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [r["exact"] for r in records] == [1.0, 1.0] and records[0]["next_state"] == AFTER
    # Copying the state before the move: wrong, but 14 of 15 cells are right.
    copy_ = [f"<prediction>{BEFORE}</prediction>", "I do not know"]
    half = prediction_accuracy(model, tokenizer, triplets, engine=ScriptedEngine(tokenizer, [copy_]))
    assert (half["exact"], half["found"], half["copied"]) == (0.0, 0.5, 0.5)
    assert half["cell"] == pytest.approx(0.5 * 13 / 15) and "embedding" not in half
    # A move into a wall changes nothing: copying is exact there, so only changed_exact
    # (over the one transition that moves) tells a copier from a world model.
    wall = [triplet(0), triplet(1, after=BEFORE)]
    copier = prediction_accuracy(model, tokenizer, wall, engine=ScriptedEngine(tokenizer, [[copy_[0]] * 2]))
    assert (copier["exact"], copier["copied"], copier["changed"], copier["changed_exact"]) == (0.5, 1.0, 1, 0.0)
    assert (right["changed"], right["changed_exact"]) == (2, 1.0)
    # A copy with the actions tacked on is still a copy.
    tacked = [f"<prediction>{BEFORE}\nthen Right</prediction>"] * 2
    assert prediction_accuracy(model, tokenizer, triplets, engine=ScriptedEngine(tokenizer, [tacked]))["copied"] == 1.0
    # A copy left unclosed before a second, closed block: the prediction is that block, the
    # last complete one (extract_prediction), so it is neither a copy nor right.
    unclosed = [f"<prediction>{BEFORE}<prediction>Right</prediction>"] * 2
    scores = prediction_accuracy(model, tokenizer, triplets, engine=ScriptedEngine(tokenizer, [unclosed]))
    assert (scores["found"], scores["copied"], scores["exact"], scores["cell"]) == (1.0, 0.0, 0.0, 0.0)
    assert is_copy(BEFORE.replace("Player at (1,1)", "Player at (9,9)"), BEFORE)  # grids decide
    assert not is_copy(AFTER, BEFORE) and not is_copy("", BEFORE)
    with pytest.raises(ValueError, match="at least one triplet"):
        prediction_accuracy(model, tokenizer, [])


# -- training ------------------------------------------------------------------------------

@dataclass
class OracleEngine:
    """The first prediction of every group is the true next state, the others are wrong.

    Responses depend only on the prompt and its place in the group (not on the call
    count), so an interrupted run and a resumed one see the same ones; log-probs are
    the model's own, as a real engine's would be.
    """

    model: object
    tokenizer: object
    truths: dict
    group: int

    def generate(self, prompts, params, progress=False):
        texts = [f"<think>move</think><prediction>{self.truths[tuple(p)] if j % self.group == 0 else 'no idea'}"
                 "</prediction>" for j, p in enumerate(prompts)]
        ids = [self.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
        samples = [Sample(list(p) + i, len(p), torch.zeros(len(i)), 0, 0) for p, i in zip(prompts, ids)]
        with torch.no_grad():
            logprobs, _, mask = policy_forward(self.model, *collate(samples, 0), entropy=False)
        return [Generation(i, text, lp[m].tolist(), "stop") for i, text, lp, m in zip(ids, texts, logprobs, mask)]


@pytest.fixture(scope="module")
def data():
    config = RWMLConfig(exploration="random", episodes=3, samples=1, max_turns=2, filter=False)
    return collect_triplets("sokoban", {}, config)[0][:3]


def small(**overrides):
    config = dict(steps=2, batch_size=2, group_size=2, reward="exact", lr=1e-3, minibatch_size=4,
                  micro_batch_size=4, max_new_tokens=8, save_every=1, precision="fp32", tensorboard=False)
    config.update(overrides)
    return RWMLConfig(**config)


def oracle(model, tokenizer, triplets, group=2):
    return OracleEngine(model, tokenizer, {tuple(prompt_ids(tokenizer, t)): t.next_state for t in triplets}, group)


def test_training_updates_the_policy_logs_evaluates_and_checkpoints(tiny, tmp_path, data):
    model, tokenizer = tiny
    policy = copy.deepcopy(model)
    evaluated = []

    def evaluate_fn(m, step):
        evaluated.append(step)
        return {"exact": 0.5, "triplets": 3}
    history = train(policy, tokenizer, data, small(), tmp_path, progress=False, evaluate_fn=evaluate_fn,
                    engine=oracle(policy, tokenizer, data))
    assert [h["step"] for h in history] == [1, 2] and evaluated == [0, 2]
    first = history[0]
    assert first["rollout/reward_mean"] == 0.5 and first["rollout/flat_groups"] == 0.0
    assert first["rollout/exact"] == 0.5 and first["charts/train_samples"] == 4
    assert first["actor/approx_kl"] == pytest.approx(0.0, abs=1e-6)  # old log-probs are the model's own
    for key in ("actor/clipfrac", "actor/entropy", "actor/grad_norm", "charts/generation_tokens_per_second"):
        assert key in first
    assert history[1]["eval/exact"] == 0.5
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2]
    assert any(not torch.equal(a, b) for a, b in zip(policy.parameters(), model.parameters()))
    assert resume_point(tmp_path) is not None
    assert json.loads((tmp_path / "config.json").read_text())["rwml"]["group_size"] == 2


def test_resume_gives_the_uninterrupted_result(tiny, tmp_path, data):
    from transformers import AutoModelForCausalLM

    model, tokenizer = tiny
    straight = copy.deepcopy(model)
    train(straight, tokenizer, data, small(), tmp_path / "a", progress=False,
          engine=oracle(straight, tokenizer, data))
    first = copy.deepcopy(model)
    train(first, tokenizer, data, small(steps=1), tmp_path / "b", progress=False,
          engine=oracle(first, tokenizer, data))
    checkpoint = resume_point(tmp_path / "b")
    resumed = AutoModelForCausalLM.from_pretrained(checkpoint / "policy", dtype=torch.float32)
    train(resumed, tokenizer, data, small(), tmp_path / "b", resume_from=checkpoint, progress=False,
          engine=oracle(resumed, tokenizer, data))
    assert all(torch.equal(a, b) for a, b in zip(straight.parameters(), resumed.parameters()))
    assert [r["step"] for r in read_metrics(tmp_path / "b" / "metrics.jsonl")] == [1, 2]
    with pytest.raises(ValueError, match="trained on other triplets"):
        train(copy.deepcopy(model), tokenizer, data[:2], small(steps=3), tmp_path / "b", resume_from=checkpoint,
              progress=False)


# -- the command ---------------------------------------------------------------------------

def test_cli_runs_the_stage_and_resumes_without_recollecting(tmp_path):
    import spa.cli.rwml  # noqa: F401  registers the command
    from spa.cli.common import app

    out = tmp_path / "run"
    args = ["rwml", "-e", "sokoban", "--out", str(out), "-m", "tiny", "--exploration", "random",
            "--episodes", "2", "--samples", "1", "--max-turns", "2", "--steps", "1", "--group-size", "2",
            "--batch-size", "2", "--reward", "exact", "--lr", "1e-4", "--eval-levels", "2",
            "--set", "max_new_tokens=4", "--set", "filter_k=2", "--set", "precision=fp32", "--set", "tensorboard=false"]
    runner = CliRunner()
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    triplets = load_triplets(out / "triplets.jsonl")
    stats = json.loads((out / "triplets.stats.json").read_text())
    assert len(triplets) == stats["triplets"] and stats["filter"]["triplets"] >= len(triplets)
    summary = json.loads((out / "eval" / "summary.json").read_text())
    assert summary["before"]["step"] == 0 and summary["after"]["step"] == 1
    assert {"exact", "changed_exact", "cell", "copied"} <= set(summary["delta"]) and "next-state exact" in result.output
    assert resume_point(out) is not None and (out / "eval" / "step-1.predictions.jsonl").is_file()
    # Resuming a finished run reuses its triplets and trains nothing more.
    result = runner.invoke(app, args + ["--resume"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "reusing" in result.output and load_triplets(out / "triplets.jsonl") == triplets
    result = runner.invoke(app, args[:-8] + ["--set", "temperature=0"], terminal_width=200)
    assert result.exit_code != 0 and "temperature=0" in result.output
