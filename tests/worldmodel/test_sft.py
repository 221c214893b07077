import copy
import dataclasses
import json
import os
import shutil
import signal

import numpy as np
import pytest
import torch

from spa.worldmodel.selfplay import SelfPlayConfig, build_examples, collect
from spa.worldmodel.sft import (SFTConfig, collate, last_checkpoint, length_buckets, masked_lm_loss,
                                split, train)
from spa.worldmodel.tokenize import tokenize_example


def random_play_examples(tokenizer, episodes=8, max_turns=2):
    config = SelfPlayConfig(env="frozenlake", episodes=episodes, samples=2, max_turns=max_turns,
                            exploration="random")
    examples, _ = build_examples(collect(None, tokenizer, config), config)
    return examples


def test_accumulating_4_batches_of_1_equals_one_batch_of_4(tiny):
    model, tokenizer = tiny
    examples = random_play_examples(tokenizer)[:4]
    tokenized = [tokenize_example(tokenizer, e["messages"], e["response"]) for e in examples]

    def grads(groups):
        m = copy.deepcopy(model)
        batches = [collate(g, tokenizer.pad_token_id) for g in groups]
        targets = sum(int(mask[:, 1:].sum()) for _, _, mask in batches)
        for ids, attention, mask in batches:
            loss, _ = masked_lm_loss(m, ids, attention, mask)
            (loss / targets).backward()
        return torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])

    whole = grads([tokenized])
    accumulated = grads([[e] for e in tokenized])
    torch.testing.assert_close(accumulated, whole, atol=1e-6, rtol=1e-4)


def test_masked_loss_ignores_untrained_tokens(tiny):
    model, tokenizer = tiny
    example = tokenize_example(tokenizer, *_one(tokenizer))
    ids, attention, mask = collate([example], tokenizer.pad_token_id)
    loss, count = masked_lm_loss(model, ids, attention, mask)
    logits = model(input_ids=ids).logits[0, :-1].float()
    targets = mask[0, 1:]
    expected = torch.nn.functional.cross_entropy(logits[targets], ids[0, 1:][targets], reduction="sum")
    assert count == int(targets.sum()) > 0
    torch.testing.assert_close(loss, expected, atol=1e-3, rtol=1e-4)


def _one(tokenizer):
    example = random_play_examples(tokenizer, episodes=2)[0]
    return example["messages"], example["response"]


def test_length_buckets_cover_every_index_once():
    lengths = list(np.random.default_rng(0).integers(10, 500, size=203))
    batches = length_buckets(lengths, 8, np.random.default_rng(1))
    assert sorted(i for b in batches for i in b) == list(range(203))
    assert all(len(b) <= 8 for b in batches)


def test_split_keeps_episodes_whole():
    examples = [{"seed": s, "sample": k, "turn": t} for s in range(10) for k in range(2) for t in range(3)]
    train_part, held = split(examples, 0.2, seed=0)
    assert len(held) == 12 and len(train_part) == 48
    assert not {(e["seed"], e["sample"]) for e in held} & {(e["seed"], e["sample"]) for e in train_part}


def test_training_lowers_the_loss_and_resume_matches_an_uninterrupted_run(tiny, tmp_path, monkeypatch):
    from spa.models import load_model

    _, tokenizer = tiny
    examples = random_play_examples(tokenizer, episodes=8, max_turns=1)
    config = SFTConfig(lr=3e-3, epochs=2, batch_size=4, val_fraction=0.25, val_examples_generate=2,
                       val_max_new_tokens=8, precision="fp32")

    model_a, _ = load_model("tiny", dtype="fp32")
    history = train(model_a, tokenizer, examples, config, tmp_path / "a", progress=False)
    assert [h["epoch"] for h in history] == [1, 2]
    assert history[1]["train_loss"] < history[0]["train_loss"]
    assert 0.0 <= history[1]["val_prediction_exact"] <= 1.0 and history[1]["val_loss"] > 0

    # Interrupted right after the epoch-1 checkpoint; a second run resumes from it.
    import spa.worldmodel.sft as sft

    real_save = sft.save_checkpoint

    def save_then_interrupt(*args, **kwargs):
        real_save(*args, **kwargs)
        raise KeyboardInterrupt

    model_b, _ = load_model("tiny", dtype="fp32")
    monkeypatch.setattr(sft, "save_checkpoint", save_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        train(model_b, tokenizer, examples, config, tmp_path / "b", progress=False)
    monkeypatch.setattr(sft, "save_checkpoint", real_save)
    checkpoint = last_checkpoint(tmp_path / "b")
    assert checkpoint.name == "epoch-1"
    model_c, _ = load_model(str(checkpoint), dtype="fp32")
    train(model_c, tokenizer, examples, config, tmp_path / "b", resume_from=checkpoint, progress=False)
    assert last_checkpoint(tmp_path / "b").name == "epoch-2"
    # Every epoch keeps its weights; only the newest, the resume point, its optimizer state.
    for run in "ab":
        assert (tmp_path / run / "epoch-1" / "model.safetensors").is_file()
        assert not (tmp_path / run / "epoch-1" / "trainer_state.pt").exists()
        assert (tmp_path / run / "epoch-2" / "trainer_state.pt").is_file()
    for (name, a), (_, c) in zip(model_a.named_parameters(), model_c.named_parameters()):
        torch.testing.assert_close(a, c, msg=name, atol=1e-5, rtol=1e-4)


def test_an_epoch_interrupted_midway_resumes_from_its_resume_point(tiny, tmp_path, monkeypatch):
    import spa.worldmodel.sft as sft
    from spa.models import load_model

    _, tokenizer = tiny
    examples = random_play_examples(tokenizer, episodes=8, max_turns=1)  # 6 to train on: 3 batches an epoch
    config = SFTConfig(lr=3e-3, epochs=2, batch_size=2, val_fraction=0.25, val_examples_generate=2,
                       val_max_new_tokens=8, precision="fp32")
    model_a, _ = load_model("tiny", dtype="fp32")
    history_a = train(model_a, tokenizer, examples, config, tmp_path / "a", progress=False)

    monkeypatch.setattr(sft, "RESUME_EVERY_SECONDS", 0.0)  # a resume point after every step
    real_save = sft.save_checkpoint

    def save_then_interrupt_in_epoch_2(*args, position=None, **kwargs):
        real_save(*args, position=position, **kwargs)
        if position is not None and args[1] == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(sft, "save_checkpoint", save_then_interrupt_in_epoch_2)
    model_b, _ = load_model("tiny", dtype="fp32")
    with pytest.raises(KeyboardInterrupt):
        train(model_b, tokenizer, examples, config, tmp_path / "b", progress=False)
    monkeypatch.setattr(sft, "save_checkpoint", real_save)  # the resumed run writes its resume points too
    checkpoint = last_checkpoint(tmp_path / "b")
    assert checkpoint.name == "resume"
    assert json.loads((checkpoint / "position.json").read_text()) == {"epoch": 1, "batches": 1}
    model_c, _ = sft.resume_model(lambda name: load_model(name, dtype="fp32"), "tiny", checkpoint)
    history_c = train(model_c, tokenizer, examples, config, tmp_path / "b", resume_from=checkpoint, progress=False)
    assert last_checkpoint(tmp_path / "b").name == "epoch-2" and not (tmp_path / "b" / "resume").exists()
    for (name, a), (_, c) in zip(model_a.named_parameters(), model_c.named_parameters()):
        torch.testing.assert_close(a, c, msg=name, atol=1e-5, rtol=1e-4)
    assert history_c[1]["train_loss"] == pytest.approx(history_a[1]["train_loss"])  # the epoch's sums carried over
    # A resume point left from before the newest epoch (an interrupt between the two writes) is stale.
    shutil.copytree(tmp_path / "b" / "epoch-2", tmp_path / "b" / "resume")
    (tmp_path / "b" / "resume" / "position.json").write_text('{"epoch": 1, "batches": 1}')
    assert last_checkpoint(tmp_path / "b").name == "epoch-2"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_writes_a_resume_point_at_the_end_of_the_step(tiny, tmp_path, monkeypatch, signum):
    """SIGTERM (or Ctrl-C) stops after the step with a resume point at that step, from which
    the run ends where the uninterrupted one does; SIGUSR1 writes the same point and goes on."""
    import spa.worldmodel.sft as sft
    from spa.interrupt import Interrupted
    from spa.models import load_model

    _, tokenizer = tiny
    examples = random_play_examples(tokenizer, episodes=8, max_turns=1)  # 6 to train on: 3 batches an epoch
    config = SFTConfig(lr=3e-3, epochs=2, batch_size=2, val_fraction=0.25, val_examples_generate=2,
                       val_max_new_tokens=8, precision="fp32")
    model_a, _ = load_model("tiny", dtype="fp32")
    train(model_a, tokenizer, examples, config, tmp_path / "a", progress=False)

    real_accumulate, real_save, steps, points = sft._accumulate, sft.save_checkpoint, [], []

    def accumulate_and_signal_in_step_2(*args, **kwargs):
        steps.append(len(steps) + 1)
        if len(steps) == 2:
            os.kill(os.getpid(), signum)  # arrives mid-step
        return real_accumulate(*args, **kwargs)

    def save(*args, position=None, **kwargs):
        if position is not None:
            points.append((args[1], position["batches"]))
        return real_save(*args, position=position, **kwargs)

    monkeypatch.setattr(sft, "_accumulate", accumulate_and_signal_in_step_2)
    monkeypatch.setattr(sft, "save_checkpoint", save)
    model_b, _ = load_model("tiny", dtype="fp32")
    if signum == signal.SIGUSR1:
        train(model_b, tokenizer, examples, config, tmp_path / "b", progress=False)
        assert points == [(0, 2)] and len(steps) == 6
    else:
        with pytest.raises(Interrupted, match="epoch 1 of 2 at batch 2 of 3"):
            train(model_b, tokenizer, examples, config, tmp_path / "b", progress=False)
        assert points == [(0, 2)] and len(steps) == 2
        checkpoint = last_checkpoint(tmp_path / "b")
        assert json.loads((checkpoint / "position.json").read_text()) == {"epoch": 0, "batches": 2}
        model_b, _ = sft.resume_model(lambda name: load_model(name, dtype="fp32"), "tiny", checkpoint)
        train(model_b, tokenizer, examples, config, tmp_path / "b", resume_from=checkpoint, progress=False)
        assert len(steps) == 6  # the step the signal came in was not repeated
    for (name, a), (_, b) in zip(model_a.named_parameters(), model_b.named_parameters()):
        torch.testing.assert_close(a, b, msg=name, atol=1e-5, rtol=1e-4)


def test_lora_trains_adapters_saves_a_plain_model_and_resumes_exactly(tiny, tmp_path, monkeypatch):
    import spa.worldmodel.sft as sft
    from spa.models import load_model
    from spa.worldmodel.sft import resume_model

    _, tokenizer = tiny
    examples = random_play_examples(tokenizer, episodes=8, max_turns=1)
    config = SFTConfig(lr=3e-3, epochs=2, batch_size=4, val_fraction=0.25, val_examples_generate=2,
                       val_max_new_tokens=8, precision="fp32", lora_rank=4)

    def loader(name):
        return load_model(name, dtype="fp32")

    base, _ = loader("tiny")
    original = {k: v.clone() for k, v in base.state_dict().items()}
    train(base, tokenizer, examples, config, tmp_path / "a", progress=False)
    final = tmp_path / "a" / "epoch-2"
    assert (final / "adapter" / "adapter_config.json").is_file()
    merged, _ = loader(str(final))  # a plain Hugging Face model
    assert not hasattr(merged, "peft_config")
    weights = merged.state_dict()
    assert not torch.equal(weights["model.layers.0.self_attn.q_proj.weight"],
                           original["model.layers.0.self_attn.q_proj.weight"])
    # LoRA never touches the embeddings or the norms
    assert torch.equal(weights["model.embed_tokens.weight"], original["model.embed_tokens.weight"])
    assert torch.equal(weights["model.norm.weight"], original["model.norm.weight"])
    # the merged weights compute what base + adapters compute
    adapted, _ = resume_model(loader, "tiny", final)
    ids = torch.tensor([tokenizer("Turn 1. Current state:\n#P_#")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, adapted(ids).logits, atol=1e-4, rtol=1e-4)

    real_save = sft.save_checkpoint

    def save_then_interrupt(*args, **kwargs):
        real_save(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(sft, "save_checkpoint", save_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        train(loader("tiny")[0], tokenizer, examples, config, tmp_path / "b", progress=False)
    monkeypatch.setattr(sft, "save_checkpoint", real_save)
    checkpoint = last_checkpoint(tmp_path / "b")
    resumed, _ = resume_model(loader, "tiny", checkpoint)
    train(resumed, tokenizer, examples, config, tmp_path / "b", resume_from=checkpoint, progress=False)
    again, _ = loader(str(tmp_path / "b" / "epoch-2"))
    for (name, a), (_, b) in zip(merged.named_parameters(), again.named_parameters()):
        torch.testing.assert_close(a, b, msg=name, atol=1e-5, rtol=1e-4)


def test_an_examples_masked_states_leave_its_loss_as_mask_states_does(tiny, tmp_path):
    """``masked_states`` on every example trains exactly as ``mask_states=True`` does, and
    differs from training on the states (a negligible lr: the first epoch's loss over the targets)."""
    from spa.models import load_model

    _, tokenizer = tiny
    examples = random_play_examples(tokenizer, episodes=4, max_turns=1)
    config = SFTConfig(lr=1e-12, epochs=1, batch_size=4, val_fraction=0.0, precision="fp32")

    def first_loss(examples, name, **changes):
        model, _ = load_model("tiny", dtype="fp32")
        history = train(model, tokenizer, examples, dataclasses.replace(config, **changes), tmp_path / name,
                        progress=False)
        return history[0]["train_loss"]

    masked = [{**e, "masked_states": ["observation", "prediction"]} for e in examples]
    assert first_loss(masked, "masked") == pytest.approx(first_loss(examples, "flag", mask_states=True))
    assert first_loss(masked, "masked") != pytest.approx(first_loss(examples, "plain"), rel=1e-3)


def test_the_heap_is_trimmed_every_trim_every_steps_optimizer_steps(tiny, tmp_path, monkeypatch):
    import spa.worldmodel.sft as sft
    from spa.models import load_model

    _, tokenizer = tiny
    examples = random_play_examples(tokenizer, episodes=8, max_turns=1)  # 8 turns: 4 batches of 2, 2 steps of 2
    config = SFTConfig(epochs=2, batch_size=2, grad_accum=2, val_fraction=0.0, precision="fp32")
    trims = []
    monkeypatch.setattr(sft.heap, "trim", lambda: trims.append(len(trims)))
    for every, expected in ((0, 0), (1, 4), (2, 2), (3, 0)):  # per epoch: its 2 steps
        trims.clear()
        monkeypatch.setattr(sft, "TRIM_EVERY_STEPS", every)
        model, _ = load_model("tiny", dtype="fp32")
        train(model, tokenizer, examples, config, tmp_path / str(every), progress=False)
        assert len(trims) == expected, every


def test_the_compute_handed_down_is_what_trains_not_the_configs_string(tiny, tmp_path, monkeypatch):
    """A caller that decided bf16 (spa.compute.decide) gets bf16 autocast in every forward
    and held-out generation, although the config still says fp32; none is decided again."""
    import spa.models.engine as engine_module
    import spa.worldmodel.sft as sft
    from spa.compute import Compute
    from spa.models import load_model
    from spa.precision import Precision

    _, tokenizer = tiny
    examples = random_play_examples(tokenizer, episodes=4, max_turns=1)
    config = SFTConfig(epochs=1, batch_size=2, val_fraction=0.5, val_examples_generate=1, val_max_new_tokens=2,
                       precision="fp32")
    autocasts, engines = [], []
    real_loss, real_engine = sft.masked_lm_loss, engine_module.Engine

    def loss(model, *batch):
        autocasts.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return real_loss(model, *batch)

    def engine(model, tokenizer, dtype=None):
        engines.append(dtype)
        return real_engine(model, tokenizer, dtype=dtype)

    monkeypatch.setattr(sft, "masked_lm_loss", loss)
    monkeypatch.setattr(engine_module, "Engine", engine)
    monkeypatch.setattr(sft, "for_model", lambda *args: pytest.fail("a compute was decided inside train"))
    model, _ = load_model("tiny", dtype="fp32")
    train(model, tokenizer, examples, config, tmp_path, progress=False,
          compute=Compute(torch.device("cpu"), Precision("bf16", "decided by the caller")))
    assert autocasts and set(autocasts) == {torch.bfloat16}  # training and held-out loss
    assert engines == [torch.bfloat16]  # the held-out next states
