"""Two processes train what one process trains: ``accelerate launch`` on 2 CPU processes (gloo).

tests/dist_script.py runs a minimal SFT, PPO (with either critic) and GRPO on the tiny
model. Launched on two processes, they must end with identical weights (the summed
gradients and the optimizer steps are the same everywhere), and those weights, the
gradient norms of every optimizer step and the logged metrics must match one process
running the same script: the check that sharding the micro-batches, the rollouts and the
minibatches, weighting by the global counts and padding the process with fewer
micro-batches reproduce the single-process update (up to fp32 summation order). Once
with DDP (SFT, PPO with either critic, GRPO) and once with FSDP (SFT, GRPO twice: FSDP
trains no critic), which shards the weights themselves over the processes. One RL run of
each has a KL term to a reference model, the second process starting from other weights:
the reference must hold the main process's. Before them, a self-play split by level over
the processes must collect the episodes of one process (the script's engine answers by
the episode alone); FSDP's RL evaluations are split by level too.
"""

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from spa import distributed
from spa.models import load_model
from spa.rl.config import PPOConfig
from spa.worldmodel.sft import SFTConfig

SCRIPT = Path(__file__).with_name("dist_script.py")


def launch(out: Path, processes: int = 2, parallel: str = "ddp") -> subprocess.CompletedProcess:
    """``accelerate launch`` without a config file: ``--multi_gpu`` picks torch's elastic
    launcher (``--cpu`` would start a single process), and without CUDA spa uses gloo."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "ACCELERATE_USE_CPU": "true"}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
               str(processes), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", "0", str(SCRIPT), str(out), parallel]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def test_two_processes_end_with_the_weights_of_one(tmp_path):
    from tests.dist_script import run

    done = launch(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    first, second = (torch.load(tmp_path / f"rank-{r}.pt", weights_only=False) for r in (0, 1))
    assert distributed.world() == (0, 1)  # the reference below runs alone, in this process
    single = run(tmp_path / "single")
    for stage in ("sft", "ppo", "ppo_head", "grpo"):
        trained_as_one(first, second, single, stage)
    kl_to_the_main_reference(first, "ppo")
    # the padding was put to work: steps where one process held more micro-batches than the
    # other, whether the other held some (PPO) or none at all (the end of SFT's epoch)
    padded(first, second, ("sft", "ppo", "grpo"))
    assert first["sft/held"] == second["sft/held"] == 1.0  # DDP: every process holds the whole model
    # wrapping copies the main process's weights to the other, and an engine built before it
    # decodes with them afterwards (the copy bumps the version counters its weights key on)
    assert torch.equal(first["engine/weights"], second["engine/weights"])
    assert second["engine/before"] != first["engine/before"]
    assert second["engine/after"] == first["engine/after"] == first["engine/before"]
    # on_main: the main process's value, computed as a run of its own, and its exception, on
    # both; the group waits the default 2 hours for a main process evaluating alone
    for rank in (first, second):
        assert rank["on_main/value"] == (0, 1)
        assert rank["on_main/error"] == "bad value on rank 0"
        assert rank["timeout"] == distributed.DEFAULT_TIMEOUT_SECONDS
    # from_each: every process's value on the main process; the second process's exception on both
    assert first["from_each/value"] == [(0, 2), (1, 2)] and second["from_each/value"] is None
    assert first["from_each/error"] == second["from_each/error"] == "bad value on rank 1"
    # self-play split by level: each process played its share (3 and 2 of the 5 levels, every
    # sample of a level on one process), and the main process collected the episodes of one process
    assert first["selfplay/shares"] == [(3, 6), (2, 4)] and second["selfplay/episodes"] is None
    assert first["selfplay/episodes"] == single["selfplay/episodes"]
    assert single["selfplay/shares"] == [(5, 10)]
    # the main process alone wrote the outputs (one metrics line per step, not two)
    assert (tmp_path / "runs" / "sft" / "epoch-1" / "trainer_state.pt").is_file()
    assert len((tmp_path / "runs" / "ppo" / "metrics.jsonl").read_text().splitlines()) == 2


def trained_as_one(first: dict, second: dict, single: dict, stage: str) -> None:
    """The two processes' results of ``stage`` (``first``, ``second``) agree exactly and
    match one process's (``single``)."""
    weights, norms, metrics = (f"{stage}/{part}" for part in ("weights", "norms", "metrics"))
    # the processes agree exactly: the same summed gradients, the same steps
    assert torch.equal(first[weights], second[weights]), stage
    assert first[norms] == second[norms], stage
    # and they trained what one process trains (fp32 summation order aside). Adam divides
    # each gradient by its own running scale, so a weight whose gradient is about 0 can
    # take a step of up to the learning rate (1e-3 here) from summation noise alone: seen
    # for 1 weight of 3.2 million (9e-5 off) on an Intel Xeon with AMX. So all but a few
    # millionths of the weights must match closely, and every weight within one step.
    assert first[weights].shape == single[weights].shape
    off = ~torch.isclose(first[weights], single[weights], atol=2e-5, rtol=1e-4)
    assert off.sum().item() <= 1e-5 * off.numel(), (stage, off.sum().item())
    torch.testing.assert_close(first[weights], single[weights], atol=1e-3, rtol=0, msg=stage)
    assert first[norms] == pytest.approx(single[norms], rel=1e-4), stage
    assert first[metrics] == pytest.approx(single[metrics], rel=1e-4, abs=1e-6, nan_ok=True), stage
    # the reference trained: the comparison is not between untouched models
    assert single[norms] and all(n > 0 for n in single[norms]), stage
    # each optimizer step, both processes ran as many passes as the one holding the most
    # micro-batches (the rest padding), and one process alone runs no padding pass
    passes = f"{stage}/passes"
    assert len(first[passes]) == len(second[passes]) == len(single[passes]), stage
    for (own, ran), (other, ran_there) in zip(first[passes], second[passes]):
        assert ran == ran_there == max(own, other), stage
    assert all(own == ran for own, ran in single[passes]), stage


def kl_to_the_main_reference(first: dict, stage: str) -> None:
    """``stage`` trained with a KL term, which moved off 0 as the policy left the reference.
    The second process started from other weights (dist_script.off_main): that its metrics
    and weights matched one process's (:func:`trained_as_one`) says its reference held the
    main process's starting weights, as its policy did."""
    assert first[f"{stage}/metrics"]["actor/kl_ref"] > 0, stage
    assert first[f"{stage}/metrics"]["actor/kl_loss"] > 0, stage


def padded(first: dict, second: dict, stages: tuple[str, ...]) -> None:
    """Among the optimizer steps of ``stages``, one where one process held more micro-batches
    than the other while both held some, and one where the other held none."""
    held = [(own, other) for stage in stages
            for (own, _), (other, _) in zip(first[f"{stage}/passes"], second[f"{stage}/passes"])]
    assert any(min(pair) > 0 and pair[0] != pair[1] for pair in held), held
    assert any(min(pair) == 0 < max(pair) for pair in held), held


def test_fsdp_on_two_processes_trains_the_weights_of_one(tmp_path):
    from tests.dist_script import RL_RUNS, flat, run

    done = launch(tmp_path, parallel="fsdp")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    first, second = (torch.load(tmp_path / f"rank-{r}.pt", weights_only=False) for r in (0, 1))
    assert distributed.world() == (0, 1)
    single = run(tmp_path / "single", "fsdp")  # one process: parallel=fsdp wraps nothing
    stages = ("sft", *(name for name, *_ in RL_RUNS["fsdp"]))
    for stage in stages:
        trained_as_one(first, second, single, stage)
    kl_to_the_main_reference(first, "grpo_uneven")  # the exact KL, the reference unsharded beside the shards
    # uneven micro-batches (GRPO: 2 against 1; the end of SFT's epoch and GRPO with a single
    # group kept: 1 or 2 against none), every pass matched by padding
    padded(first, second, stages)
    # the weights were sharded: each process held half of them (the tiny model's tensors
    # split evenly in two), and one process holds all
    for rank in (first, second):
        assert rank["sft/held"] == pytest.approx(0.5, abs=0.01)
    assert single["sft/held"] == 1.0
    # the main process wrote whole weights, which load in one process: the final ones
    for stage, folder in (("sft", "sft/epoch-1"), ("grpo", "grpo/checkpoint/policy")):
        model, _ = load_model(str(tmp_path / "runs" / folder), dtype="fp32", device="cpu")
        assert torch.equal(flat(model), first[f"{stage}/weights"]), stage
    # and the whole optimizer state, which an optimizer of the model sharded again reads back
    assert first["resume/optimizer_same"] and first["resume/optimizer_entries"] > 0
    saved = torch.load(tmp_path / "runs" / "sft" / "epoch-1" / "trainer_state.pt", weights_only=False)["optimizer"]
    alone = torch.load(tmp_path / "single" / "sft" / "epoch-1" / "trainer_state.pt", weights_only=False)["optimizer"]
    for index, entries in alone["state"].items():
        for key, value in entries.items():
            torch.testing.assert_close(saved["state"][index][key], value, atol=1e-5, rtol=1e-3)
    # the engine decodes the main process's weights inside gathered(), and after the shards
    # change in place its kept fused weights give way to the new ones
    assert torch.equal(first["engine/weights"], second["engine/weights"])
    assert second["engine/before"] != first["engine/before"]
    assert second["engine/after"] == first["engine/after"] == first["engine/before"]
    assert first["engine/stepped"] == first["engine/fresh"] != first["engine/after"]
    assert second["engine/stepped"] == second["engine/fresh"] == first["engine/stepped"]
    # the main process alone logged: the evaluation before training and one line per step
    assert len((tmp_path / "runs" / "grpo_uneven" / "metrics.jsonl").read_text().splitlines()) == 3
    # both processes evaluated the whole policy before and after training, one of the 2 levels
    # each (the shards gathered first), and the main process wrote the evaluation
    assert "eval/success" in first["grpo/metrics"] and "eval/success" in second["grpo/metrics"]
    for step in (0, 1):
        evaluation = json.loads((tmp_path / "runs" / "grpo" / "eval" / f"step-{step}" / "metrics.json").read_text())
        assert [share["levels"] for share in evaluation["processes"]] == [1, 1]


def test_the_parallel_setting_names_a_bad_value():
    for config in (SFTConfig, PPOConfig):
        with pytest.raises(ValueError, match=r"parallel 'zero' is not known; valid: ddp, fsdp"):
            config(parallel="zero")
    with pytest.raises(ValueError, match=r"parallel 'zero' is not known; valid: ddp, fsdp"):
        distributed.wrap(torch.nn.Linear(2, 2), "zero")
    # what FSDP does not train says so, and what to use instead
    with pytest.raises(ValueError, match=r"parallel=fsdp does not go with lora_rank > 0.*parallel=ddp"):
        SFTConfig(parallel="fsdp", lora_rank=8)
    with pytest.raises(ValueError, match=r"parallel=fsdp trains no critic.*advantage=gae.*parallel=ddp"):
        PPOConfig(parallel="fsdp")
    with pytest.raises(ValueError, match=r"parallel=fsdp trains no critic.*advantage=turn_gae"):
        PPOConfig(advantage="turn_gae", parallel="fsdp", kl_coef=0.1)
    assert PPOConfig(algorithm="grpo", parallel="fsdp").parallel == "fsdp"
    assert PPOConfig(advantage="mc", parallel="fsdp").parallel == "fsdp"
    # the reference model is not sharded: a KL term trains under FSDP
    assert PPOConfig(algorithm="grpo", parallel="fsdp", kl_coef=0.25, kl_estimator="full").kl_coef == 0.25


def test_one_process_wraps_nothing_whatever_the_strategy():
    module = torch.nn.Linear(2, 2)
    for strategy in distributed.STRATEGIES:
        assert distributed.wrap(module, strategy) is module
        with distributed.gathered(module):
            assert distributed.state_dict(module) is None
    optimizer = torch.optim.AdamW(module.parameters())
    module(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    state = distributed.optimizer_state(optimizer)
    distributed.load_optimizer_state(optimizer, state)
    assert optimizer.state_dict()["state"].keys() == state["state"].keys()


def test_the_timeout_of_the_process_group_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(distributed.TIMEOUT_ENV, raising=False)
    assert distributed.timeout() == timedelta(hours=2)
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "90")
    assert distributed.timeout() == timedelta(seconds=90)
    for bad in ("soon", "0", "-5", "nan", "inf"):
        monkeypatch.setenv(distributed.TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=f"SPA_DIST_TIMEOUT='{bad}' is not a timeout; valid: a finite number of seconds"):
            distributed.timeout()


def test_alone_makes_a_process_a_run_of_its_own():
    with distributed.alone():
        assert distributed.world() == (0, 1) and distributed.is_main()
        assert distributed.on_main(lambda: 7) == 7
    assert distributed.on_main(lambda: 8) == 8
