"""A self-play split by level, then a minimal SFT and RL run on the tiny model, for
tests/test_distributed.py.

The test runs it under ``accelerate launch`` on 2 CPU processes (``python dist_script.py
OUT [ddp|fsdp]``: each process writes ``OUT/rank-N.pt``) and calls :func:`run` in its own
process for the single-process reference. Not collected by pytest (no ``test_`` prefix).

The RL engine answers each prompt from a hash of its tokens: a rollout's answers then
depend only on the episode, not on which process plays it next to which others (the
real engine's sampled tokens depend on the batch), so 1 and 2 processes play the same
episodes (the self-play too) and must reach the same weights.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import torch
from fakes import hashed_answers

from spa import distributed
from spa.agent.prompts import PromptConfig
from spa.agent.rollout import RolloutConfig
from spa.eval.evaluate import EvalConfig, evaluate
from spa.io import TRAINER_STATE
from spa.models import load_model
from spa.models.engine import Engine, SamplingParams
from spa.rl.config import PPOConfig
from spa.rl.ppo import train as train_rl
from spa.worldmodel.selfplay import SelfPlayConfig, build_examples, collect, collect_by_level
from spa.worldmodel.sft import SFTConfig
from spa.worldmodel.sft import train as train_sft

ANSWERS = ("<answer>Up</answer>", "nonsense", "<answer>Left || Down</answer>",
           "<think>hm</think><answer>Right</answer>")


class HashEngine:
    """Answers a prompt by the hash of its tokens plus how often it came before in the call
    (the samples of a group share their first prompt and must still differ)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompts, params, progress=False):
        # about the tiny random model's own log-probs (ln of its 49k vocabulary), so the PPO
        # ratios start near 1 rather than all clipped
        return hashed_answers(self.tokenizer, prompts, ANSWERS, lambda n: [-10.7 - 0.1 * (i % 3) for i in range(n)])


@contextmanager
def recorded_grad_norms():
    """The gradient norm of every optimizer step (clip_grad_norm_ returns it): the summed
    gradients themselves, which the weights after Adam's scale-free steps hide."""
    norms: list[float] = []
    real = torch.nn.utils.clip_grad_norm_

    def clip(params, max_norm, *args, **kwargs):
        params = list(params)
        norm = real(params, max_norm, *args, **kwargs)
        norms.append(float(norm))
        return norm

    torch.nn.utils.clip_grad_norm_ = clip
    try:
        yield norms
    finally:
        torch.nn.utils.clip_grad_norm_ = real


@contextmanager
def recorded_passes():
    """Per optimizer step (each call of spa.distributed.accumulation), how many micro-batches
    this process held and how many passes it ran: the padding that lets processes holding
    different numbers of micro-batches share DDP's all-reduce."""
    passes: list[tuple[int, int]] = []
    real = distributed.accumulation

    def accumulation(model, items):
        padded = real(model, items)
        passes.append((len(items), len(padded)))
        return padded

    distributed.accumulation = accumulation
    try:
        yield passes
    finally:
        distributed.accumulation = real


def flat(module) -> torch.Tensor:
    """The module's parameters, whole (gathered from the processes where FSDP shards them)."""
    with distributed.gathered(module):
        return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


#: The RL runs of each strategy: (name, algorithm, steps, keep_fraction, gradient checkpointing,
#: critic, KL to a reference: None or (kl_coef, kl_estimator)). PPO (2 steps, one of 4 groups kept
#: per process: the processes hold different numbers of turns; a KL term), the same PPO with a value
#: head on the policy's decoder as its critic (``ppo_head``, gradient checkpointing on) and GRPO
#: (1 step, gradient checkpointing on, a single group kept: one process trains on nothing and runs
#: only padding passes). FSDP trains no critic: GRPO as PPO's first run (``grpo_uneven``, with the
#: exact KL to a reference) and as DDP's. In the runs with a KL term the second process starts from
#: other weights (:func:`off_main`).
RL_RUNS = {"ddp": (("ppo", "ppo", 2, 0.5, False, "copy", (0.25, "k3")),
                   ("ppo_head", "ppo", 2, 0.5, True, "head", None), ("grpo", "grpo", 1, 0.25, True, "copy", None)),
           "fsdp": (("grpo_uneven", "grpo", 2, 0.5, False, "copy", (0.25, "full")),
                    ("grpo", "grpo", 1, 0.25, True, "copy", None))}


def run(out: Path, parallel: str = "ddp") -> dict:
    """SFT (1 epoch; the last step has one micro-batch, so one of 2 processes runs only a
    padding pass) then the RL runs of ``parallel`` (:data:`RL_RUNS`), each trained with that
    strategy; the final weights, gradient norms, logged metrics and each optimizer step's
    micro-batches and passes."""
    result = {}
    model, tokenizer = load_model("tiny", dtype="fp32")
    result.update(selfplay_by_level(tokenizer))
    selfplay = SelfPlayConfig(env="frozenlake", episodes=10, samples=2, max_turns=1, exploration="random")
    examples, _ = build_examples(collect(None, tokenizer, selfplay), selfplay)
    sft = SFTConfig(lr=3e-3, epochs=1, batch_size=3, grad_accum=2, val_fraction=0.2, val_examples_generate=2,
                    val_max_new_tokens=4, precision="fp32", parallel=parallel)
    with recorded_grad_norms() as norms, recorded_passes() as passes:
        history = train_sft(model, tokenizer, examples, sft, out / "sft", progress=False)
    result["sft/weights"], result["sft/norms"], result["sft/passes"] = flat(model), norms, passes
    result["sft/held"] = held_share(model)
    result["sft/metrics"] = {k: history[-1][k] for k in ("train_loss", "val_loss", "val_prediction_exact")}
    if parallel == "fsdp":
        result.update(optimizer_round_trip(model, out / "sft" / "epoch-1"))

    rollout = RolloutConfig("sokoban", {}, PromptConfig("state", max_turns=2))
    # Some runs recompute their activations in the backward (gradient checkpointing under
    # the wrapper); ppo_head's critic trains its head alone, DDP-wrapped, on the policy's decoder
    for name, algorithm, steps, keep, recompute, critic, kl in RL_RUNS[parallel]:
        policy, _ = load_model("tiny", dtype="fp32")
        kl_coef, kl_estimator = kl or (0.0, "k3")
        if kl_coef:  # the reference must hold the main process's weights, as the trained policy does
            off_main(policy)
        config = PPOConfig(algorithm=algorithm, steps=steps, groups=4, samples=2, keep_fraction=keep,
                           max_new_tokens=8, minibatch_size=4, micro_batch_size=2, ppo_epochs=2, actor_lr=1e-3,
                           critic_lr=1e-3, tensorboard=False, precision="fp32", gradient_checkpointing=recompute,
                           critic=critic, parallel=parallel, eval_every=1, kl_coef=kl_coef,
                           kl_estimator=kl_estimator)
        # FSDP: every process evaluates its share of the levels with the whole policy (the shards gathered first)
        evaluate_fn = evaluation(tokenizer, out / name) if parallel == "fsdp" else None
        with recorded_grad_norms() as norms, recorded_passes() as passes:
            history = train_rl(policy, tokenizer, rollout, config, out / name, progress=False,
                               engine=HashEngine(tokenizer), evaluate_fn=evaluate_fn)
        result[f"{name}/weights"], result[f"{name}/norms"] = flat(policy), norms
        result[f"{name}/passes"] = passes
        last = history[-1].items()
        result[f"{name}/metrics"] = {k: v for k, v in last if not k.startswith(("charts/", "time/"))}
    return result


def selfplay_by_level(tokenizer) -> dict:
    """Self-play of 5 levels x 2 samples split over the processes (``collect_by_level``): the
    episodes the main process collects (seed, group, sample, responses; None on the others)
    and each process's share. The hash engine's answers depend on the episode alone, so one
    process and two must collect the same episodes."""
    config = SelfPlayConfig(env="frozenlake", episodes=10, samples=2, max_turns=2)
    played = collect_by_level(HashEngine(tokenizer), tokenizer, config)
    if played is None:
        return {"selfplay/episodes": None, "selfplay/shares": None}
    return {"selfplay/episodes": [(t.seed, t.group, t.sample, [turn.response for turn in t.turns])
                                  for t in played.trajectories],
            "selfplay/shares": [(share["levels"], share["episodes"]) for share in played.shares]}


def off_main(model) -> None:
    """Other weights than the main process's on every other process (scaled by 1.5), as a
    checkpoint read from another disk would give: what the trainer copies from the main
    process must not depend on them."""
    if distributed.world()[0] != 0:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.5)


def evaluation(tokenizer, out: Path):
    """The RL trainer's ``evaluate_fn``: a small greedy evaluation with the real engine, which
    every process runs, each playing one of the 2 levels (spa.agent.sharding)."""
    config = EvalConfig("frozenlake", {}, PromptConfig("state", max_turns=1), num_envs=2, samples=1,
                        temperature=0.0, max_new_tokens=4)
    return lambda policy, step: evaluate(policy, tokenizer, config, out / "eval" / f"step-{step}", progress=False)


def held_share(module) -> float:
    """The share of the module's parameters that this process holds: 1, or about 1/N where
    FSDP shards them over N processes."""
    params = list(module.parameters())
    held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in params)
    return held / sum(p.numel() for p in params)


def optimizer_round_trip(model, checkpoint: Path) -> dict:
    """Whether the optimizer state of an SFT checkpoint written under FSDP (whole tensors)
    comes back whole after loading into an optimizer of the model sharded again (as a
    resumed run does): saved and reloaded, every tensor equal."""
    saved = torch.load(checkpoint / TRAINER_STATE, weights_only=False, map_location="cpu")["optimizer"]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1.0)
    distributed.load_optimizer_state(optimizer, saved)
    with distributed.gathered(model, optimizer):
        again = distributed.optimizer_state(optimizer)
    if not distributed.is_main():
        return {}
    same = saved["state"].keys() == again["state"].keys() and all(
        torch.equal(torch.as_tensor(value), torch.as_tensor(again["state"][i][key]))
        for i, entries in saved["state"].items() for key, value in entries.items())
    return {"resume/optimizer_same": same, "resume/optimizer_entries": len(saved["state"])}


def wrapped_weights_reach_the_engine(parallel: str = "ddp") -> dict:
    """Greedy tokens of an engine built before :func:`spa.distributed.wrap`, before and after
    it: wrapping copies the main process's weights to the others (here the second process
    starts from other weights), and the engine must decode with them afterwards (under FSDP
    inside :func:`spa.distributed.gathered`). Under FSDP also the tokens after the shards
    change in place (as an optimizer step changes them), of the same engine and of a new one:
    the kept fused weights must not outlive the weights they were built from."""
    model, tokenizer = load_model("tiny", dtype="fp32")
    off_main(model)
    engine = Engine(model, tokenizer)
    prompts = [tokenizer("The lake is frozen", add_special_tokens=False)["input_ids"]]
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    before = engine.generate(prompts, params)[0].token_ids
    distributed.wrap(model, parallel)
    with distributed.gathered(model):
        result = {"engine/before": before, "engine/after": engine.generate(prompts, params)[0].token_ids,
                  "engine/weights": flat(model)}
    if parallel == "fsdp":
        with torch.no_grad():
            for p in model.parameters():  # shards, outside gathered()
                p.mul_(-1.0)
        fresh = Engine(model, tokenizer)  # built on the sharded model, as the RL trainer builds its engine
        with distributed.gathered(model):
            result["engine/stepped"] = engine.generate(prompts, params)[0].token_ids
            result["engine/fresh"] = fresh.generate(prompts, params)[0].token_ids
    return result


def agreement() -> dict:
    """What :func:`spa.distributed.on_main` hands every process (the main process's value,
    computed there as a run of its own; the main process's exception), what
    :func:`spa.distributed.from_each` collects (every process's value on the main one; the
    exception of the one process that failed, on all) and the process group's timeout."""
    def fail():
        raise ValueError(f"bad value on rank {distributed.world()[0]}")

    def fail_off_main():
        if not distributed.is_main():
            fail()
        return 1

    result = {"on_main/value": distributed.on_main(distributed.world),
              "from_each/value": distributed.from_each(distributed.world)}
    try:
        distributed.on_main(fail)
    except ValueError as error:
        result["on_main/error"] = str(error)
    try:
        distributed.from_each(fail_off_main)
    except ValueError as error:
        result["from_each/error"] = str(error)
    group = torch.distributed.group.WORLD
    result["timeout"] = group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    return result


if __name__ == "__main__":
    folder, strategy = Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "ddp"
    outcome = {**run(folder / "runs", strategy), **wrapped_weights_reach_the_engine(strategy), **agreement()}
    torch.save(outcome, folder / f"rank-{distributed.world()[0]}.pt")
