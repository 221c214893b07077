"""A minimal SFT and RL run on the tiny model, for tests/test_distributed.py.

The test runs it under ``accelerate launch`` on 2 CPU processes (``python dist_script.py
OUT``: each process writes ``OUT/rank-N.pt``) and calls :func:`run` in its own process
for the single-process reference. Not collected by pytest (no ``test_`` prefix).

The RL engine answers each prompt from a hash of its tokens: a rollout's answers then
depend only on the episode, not on which process plays it next to which others (the
real engine's sampled tokens depend on the batch), so 1 and 2 processes train on the
same episodes and must reach the same weights.
"""

from __future__ import annotations

import sys
import zlib
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import torch

from spa.agent.prompts import PromptConfig
from spa.agent.rollout import RolloutConfig
from spa.models import load_model
from spa.models.engine import Generation
from spa.rl.config import PPOConfig
from spa.rl.ppo import train as train_rl
from spa.worldmodel.selfplay import SelfPlayConfig, build_examples, collect
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
        seen: Counter = Counter()
        out = []
        for prompt in prompts:
            key = tuple(prompt)
            text = ANSWERS[(zlib.crc32(str(key).encode()) + seen[key]) % len(ANSWERS)]
            seen[key] += 1
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            # about the tiny random model's own log-probs (ln of its 49k vocabulary), so
            # the PPO ratios start near 1 rather than all clipped
            out.append(Generation(ids, text, [-10.7 - 0.1 * (i % 3) for i in range(len(ids))], "stop"))
        return out


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


def flat(module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def run(out: Path) -> dict:
    """SFT (1 epoch; the last step has one micro-batch, so one of 2 processes idles) then
    PPO (2 steps, one of 4 groups kept per process) and GRPO (1 step, a single group
    kept: one process trains on nothing and joins the all-reduce with no gradients);
    the final weights, gradient norms and logged metrics."""
    result = {}
    model, tokenizer = load_model("tiny", dtype="fp32")
    selfplay = SelfPlayConfig(env="frozenlake", episodes=10, samples=2, max_turns=1, exploration="random")
    examples, _ = build_examples(collect(None, tokenizer, selfplay), selfplay)
    sft = SFTConfig(lr=3e-3, epochs=1, batch_size=3, grad_accum=2, val_fraction=0.2, val_examples_generate=2,
                    val_max_new_tokens=4, precision="fp32")
    with recorded_grad_norms() as norms:
        history = train_sft(model, tokenizer, examples, sft, out / "sft", progress=False)
    result["sft/weights"], result["sft/norms"] = flat(model), norms
    result["sft/metrics"] = {k: history[-1][k] for k in ("train_loss", "val_loss", "val_prediction_exact")}

    rollout = RolloutConfig("sokoban", {}, PromptConfig("state", max_turns=2))
    for algorithm, steps, keep in (("ppo", 2, 0.5), ("grpo", 1, 0.25)):
        policy, _ = load_model("tiny", dtype="fp32")
        config = PPOConfig(algorithm=algorithm, steps=steps, groups=4, samples=2, keep_fraction=keep,
                           max_new_tokens=8, minibatch_size=4, micro_batch_size=2, ppo_epochs=2, actor_lr=1e-3,
                           critic_lr=1e-3, tensorboard=False, precision="fp32")
        with recorded_grad_norms() as norms:
            history = train_rl(policy, tokenizer, rollout, config, out / algorithm, progress=False,
                               engine=HashEngine(tokenizer))
        result[f"{algorithm}/weights"], result[f"{algorithm}/norms"] = flat(policy), norms
        last = history[-1].items()
        result[f"{algorithm}/metrics"] = {k: v for k, v in last if not k.startswith(("charts/", "time/"))}
    return result


def agreement() -> dict:
    """What :func:`spa.distributed.on_main` hands every process (the main process's value,
    computed there as a run of its own; the main process's exception) and the process
    group's timeout."""
    from spa import distributed

    def fail():
        raise ValueError(f"bad value on rank {distributed.world()[0]}")

    result = {"on_main/value": distributed.on_main(distributed.world)}
    try:
        distributed.on_main(fail)
    except ValueError as error:
        result["on_main/error"] = str(error)
    group = torch.distributed.group.WORLD
    result["timeout"] = group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    return result


if __name__ == "__main__":
    from spa import distributed

    folder = Path(sys.argv[1])
    outcome = {**run(folder / "runs"), **agreement()}
    torch.save(outcome, folder / f"rank-{distributed.world()[0]}.pt")
