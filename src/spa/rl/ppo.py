"""PPO with a critic, and GRPO, for multi-turn text agents.

One loop, top to bottom, per step: roll out ``groups`` training seeds x ``samples``
episodes; keep the groups whose rewards vary most (the others teach little: every
sample of a group scored the same); compute advantages (critic + GAE for PPO, group
normalised scores for GRPO); update the actor (and the critic) on minibatches of turns
with gradient accumulation; log; evaluate every ``eval_every`` steps; checkpoint.

Defaults are the paper's PPO settings (DESIGN.md): actor lr 1e-6, critic lr 1e-5,
gamma = lambda = 1, clip 0.2 / 0.28, dual clip 3, value clip 0.5, entropy 1e-3, KL 0,
1 PPO epoch, 32 groups x 8 samples, keep 25% of the groups, episode reward on the last
token. Old log-probs are the rollout's sampling log-probs (the engine decodes in bf16
from the fp32 master weights, so the first ratio is close to, not exactly, 1).

A run is resumable: ``out/checkpoint`` holds the policy, the critic and both optimizers
after the last saved step; the seeds, sampling and minibatch order of a step depend only
on (seed, step), so a resumed run repeats what the uninterrupted run would have done.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from spa.agent.rollout import RolloutConfig, Trajectory, rollout
from spa.agent.seeds import train_seeds
from spa.eval.metrics import summarize
from spa.io import atomic_dir, write_json
from spa.models.engine import Engine, SamplingParams
from spa.rl import core
from spa.rl.batch import (Sample, collate, critic_advantages, group_advantages, pad_responses,
                          policy_forward, turn_samples)
from spa.rl.critic import Critic
from spa.rl.logger import MetricsLogger

ALGORITHMS = ("ppo", "grpo")
ESTIMATORS = {"ppo": ("gae", "turn_gae"), "grpo": ("grpo", "grpo_no_std")}


@dataclass
class PPOConfig:
    """Hyper-parameters of the RL stage (the paper's PPO settings by default)."""

    algorithm: str = "ppo"  # ppo (with a critic) | grpo (no critic)
    advantage: str = ""  # ppo: gae | turn_gae; grpo: grpo | grpo_no_std; "" = the first
    steps: int = 1000  # paper: 1,000
    groups: int = 32  # training seeds per step (paper: 32)
    samples: int = 8  # episodes per seed (paper: 8)
    keep_fraction: float = 0.25  # share of groups kept, highest reward std first (paper: 0.25)
    reward: str = "episode"  # episode: total reward on the last token; turn: per-turn rewards
    actor_lr: float = 1e-6
    critic_lr: float = 1e-5
    gamma: float = 1.0
    lam: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float = 3.0
    value_clip: float = 0.5
    entropy_coef: float = 1e-3
    kl_coef: float = 0.0  # > 0 loads a frozen reference model
    kl_estimator: str = "k3"
    aggregation: str = "token-mean"
    ppo_epochs: int = 1
    minibatch_size: int = 32  # turns per optimizer step
    micro_batch_size: int = 4  # turns per forward/backward
    max_grad_norm: float = 1.0
    temperature: float = 1.0
    max_new_tokens: int = 400  # per turn (paper: 400)
    seed_start: int = 0  # first training seed (steps use consecutive blocks of seeds)
    eval_every: int = 0  # evaluate every N steps (and at the start and end); 0: never
    save_every: int = 10  # checkpoint every N steps (and at the end)
    bf16: bool = True  # bf16 autocast and bf16 sampling on CPU
    tensorboard: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm {self.algorithm!r} is not known; valid: {', '.join(ALGORITHMS)}")
        self.advantage = self.advantage or ESTIMATORS[self.algorithm][0]
        if self.advantage not in ESTIMATORS[self.algorithm]:
            raise ValueError(f"advantage {self.advantage!r} does not go with {self.algorithm}; valid: "
                             f"{', '.join(ESTIMATORS[self.algorithm])}")
        core.get(core.KL_ESTIMATORS, self.kl_estimator, "KL estimator")
        core.get(core.AGGREGATIONS, self.aggregation, "aggregation")
        checks = {"steps": self.steps >= 1, "groups": self.groups >= 1, "samples": self.samples >= 1,
                  "keep_fraction": 0 < self.keep_fraction <= 1, "ppo_epochs": self.ppo_epochs >= 1,
                  "minibatch_size": self.minibatch_size >= 1, "micro_batch_size": self.micro_batch_size >= 1,
                  "save_every": self.save_every >= 1, "eval_every": self.eval_every >= 0,
                  "reward": self.reward in ("episode", "turn")}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} is out of range")


def keep_groups(trajectories: list[Trajectory], fraction: float) -> list[Trajectory]:
    """The trajectories of the ``ceil(fraction x groups)`` groups with the highest reward std."""
    groups: dict[int, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.group, []).append(t)
    spread = {g: float(np.std([t.total_reward for t in ts])) for g, ts in groups.items()}
    n = max(1, math.ceil(fraction * len(groups)))
    kept = set(sorted(groups, key=lambda g: (-spread[g], g))[:n])
    return [t for t in trajectories if t.group in kept]


def _minibatches(samples: list[Sample], config: PPOConfig, rng: np.random.Generator):
    """Shuffled minibatches, each a list of micro-batches, for ``ppo_epochs`` passes."""
    for _ in range(config.ppo_epochs):
        order = rng.permutation(len(samples))
        for lo in range(0, len(order), config.minibatch_size):
            mb = [samples[i] for i in order[lo: lo + config.minibatch_size]]
            yield [mb[j: j + config.micro_batch_size] for j in range(0, len(mb), config.micro_batch_size)]


def _units(samples: list[Sample], aggregation: str) -> int:
    """What the aggregation averages over: tokens for token-mean, sequences otherwise.
    Weighting each micro-batch by its share makes accumulation equal one big batch."""
    return sum(s.response_length for s in samples) if aggregation == "token-mean" else len(samples)


def _optimizer_step(params, optimizer, max_norm: float) -> float:
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)


def update_actor(policy, reference, optimizer, samples: list[Sample], config: PPOConfig, pad_id: int,
                 autocast, rng: np.random.Generator) -> dict:
    """PPO clipped policy loss - entropy bonus (+ KL to the reference), over minibatches."""
    params = [p for p in policy.parameters() if p.requires_grad]
    policy.train()
    totals: dict[str, float] = {}
    count, norms = 0, []
    for micro_batches in _minibatches(samples, config, rng):
        total = _units([s for mb in micro_batches for s in mb], config.aggregation)
        for mb in micro_batches:
            batch = collate(mb, pad_id)
            with autocast:
                logprobs, entropy, mask = policy_forward(policy, *batch)
            old, _ = pad_responses([s.old_logprobs for s in mb])
            adv, _ = pad_responses([s.advantages for s in mb])
            loss, stats = core.policy_loss(logprobs, old, adv, mask, config.clip_low, config.clip_high,
                                           config.dual_clip, config.aggregation)
            ent = core.aggregate(entropy, mask, config.aggregation)
            loss = loss - config.entropy_coef * ent
            if reference is not None:
                with torch.no_grad(), autocast:
                    ref, _, _ = policy_forward(reference, *batch, entropy=False)
                kl = core.aggregate(core.kl_penalty(logprobs, ref, config.kl_estimator), mask, config.aggregation)
                loss = loss + config.kl_coef * kl
                stats["kl_ref"] = kl.item()
            (loss * _units(mb, config.aggregation) / total).backward()
            stats.update(policy_loss=loss.item(), entropy=ent.item())
            n = int(mask.sum())
            for k, v in stats.items():
                totals[k] = totals.get(k, 0.0) + v * n
            count += n
        norms.append(_optimizer_step(params, optimizer, config.max_grad_norm))
    stats = {f"actor/{k}": v / max(count, 1) for k, v in totals.items()}
    return {**stats, "actor/grad_norm": float(np.mean(norms)) if norms else 0.0}


def update_critic(critic: Critic, optimizer, samples: list[Sample], config: PPOConfig, pad_id: int,
                  autocast, rng: np.random.Generator) -> dict:
    """Clipped value loss towards the GAE returns, over minibatches."""
    params = [p for p in critic.parameters() if p.requires_grad]
    critic.train()
    totals, count = {"value_loss": 0.0, "vf_clipfrac": 0.0}, 0
    for micro_batches in _minibatches(samples, config, rng):
        total = _units([s for mb in micro_batches for s in mb], config.aggregation)
        for mb in micro_batches:
            with autocast:
                values, mask = critic(*collate(mb, pad_id))
            old, _ = pad_responses([s.old_values for s in mb])
            returns, _ = pad_responses([s.returns for s in mb])
            loss, stats = core.value_loss(values, old, returns, mask, config.value_clip, config.aggregation)
            (loss * _units(mb, config.aggregation) / total).backward()
            n = int(mask.sum())
            totals["value_loss"] += loss.item() * n
            totals["vf_clipfrac"] += stats["vf_clipfrac"] * n
            count += n
        _optimizer_step(params, optimizer, config.max_grad_norm)
    return {f"critic/{k}": v / max(count, 1) for k, v in totals.items()}


def rollout_metrics(trajectories: list[Trajectory]) -> dict:
    """Reward, success, Pass@k of the step's groups, lengths and valid rates."""
    summary = summarize(trajectories, ks=(1, 2, 4, 8))
    rewards = [t.total_reward for t in trajectories]
    turns = [turn for t in trajectories for turn in t.turns]
    metrics = {"rollout/reward_mean": float(np.mean(rewards)), "rollout/reward_std": float(np.std(rewards)),
               "rollout/success": summary["success_rate"],
               "rollout/response_length": float(np.mean([len(t.response_ids) for t in turns])) if turns else 0.0,
               "rollout/turns": summary["mean_turns"], "rollout/format_valid": summary["format_valid_rate"],
               "rollout/action_valid": summary["action_valid_rate"]}
    metrics.update({f"rollout/{k}": v for k, v in summary["pass_at_k"].items()})
    return metrics


def save_checkpoint(out: Path, step: int, policy, tokenizer, critic, actor_opt, critic_opt) -> Path:
    """``out/checkpoint``, replaced atomically: policy (HF folder), critic and optimizers."""
    with atomic_dir(out / "checkpoint") as tmp:
        policy.save_pretrained(tmp / "policy")
        tokenizer.save_pretrained(tmp / "policy")
        torch.save({"step": step, "actor_opt": actor_opt.state_dict(),
                    "critic": critic.state_dict() if critic is not None else None,
                    "critic_opt": critic_opt.state_dict() if critic_opt is not None else None},
                   tmp / "trainer_state.pt")
    return out / "checkpoint"


def resume_point(out: str | Path) -> Path | None:
    """The checkpoint folder to resume from, if a complete one exists."""
    path = Path(out) / "checkpoint"
    return path if (path / "trainer_state.pt").is_file() else None


def train(policy, tokenizer, rollout_config: RolloutConfig, config: PPOConfig, out: str | Path,
          evaluate_fn=None, resume_from: Path | None = None, progress: bool = True,
          engine=None) -> list[dict]:
    """Run PPO or GRPO; returns the per-step metrics (also in ``out/metrics.jsonl``).

    ``evaluate_fn(policy, step) -> dict`` runs the periodic evaluation (its flat numeric
    entries are logged under ``eval/``). ``resume_from`` is a checkpoint whose policy
    weights ``policy`` already holds; the critic and optimizers are restored from it.
    ``engine`` replaces the generation engine (tests script the responses with it).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    on_cpu = next(policy.parameters()).device.type == "cpu"
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16 and on_cpu)
    reference = None
    if config.kl_coef > 0:
        import copy

        reference = copy.deepcopy(policy).eval().requires_grad_(False)
    critic = Critic(policy) if config.algorithm == "ppo" else None
    actor_opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=config.actor_lr,
                                  weight_decay=0.0)
    critic_opt = torch.optim.AdamW(critic.parameters(), lr=config.critic_lr, weight_decay=0.0) if critic else None
    start = 0
    if resume_from is not None:
        state = torch.load(resume_from / "trainer_state.pt", weights_only=False)
        actor_opt.load_state_dict(state["actor_opt"])
        if critic is not None:
            critic.load_state_dict(state["critic"])
            critic_opt.load_state_dict(state["critic_opt"])
        start = state["step"]
    write_json(out / "config.json", {"ppo": asdict(config), "rollout": asdict(rollout_config)})
    logger = MetricsLogger(out, resume_step=start, tensorboard=config.tensorboard)
    if engine is None:
        engine = Engine(policy, tokenizer, dtype=torch.bfloat16 if config.bf16 and on_cpu else None)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    history = []
    if evaluate_fn is not None and config.eval_every and start == 0:
        logger.log(0, _eval_entries(evaluate_fn(policy, 0)))
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), disable=not progress) as bar:
        task = bar.add_task(f"{config.algorithm} {rollout_config.env}", total=config.steps, completed=start,
                            info="")
        for step in range(start, config.steps):
            began = time.perf_counter()
            # 1. Roll out: a fresh block of training seeds per step, groups of samples per seed.
            seeds = train_seeds(config.groups, config.seed_start + step * config.groups)
            sampling = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                                      seed=config.seed * 1_000_003 + step)
            trajectories = rollout(engine, tokenizer, seeds, config.samples, rollout_config, sampling)
            metrics = rollout_metrics(trajectories)
            rollout_seconds = time.perf_counter() - began
            # 2. Keep the groups whose samples disagree most.
            kept = keep_groups(trajectories, config.keep_fraction)
            samples = turn_samples(kept)
            # 3. Advantages.
            if critic is not None:
                critic.eval()
                with autocast:
                    values = critic.values(collate(samples[i: i + config.micro_batch_size], pad_id)
                                           for i in range(0, len(samples), config.micro_batch_size))
                for s, v in zip(samples, values):
                    s.old_values = v.float()
                critic_advantages(samples, kept, config.advantage, config.reward, config.gamma, config.lam)
                v, mask = pad_responses([s.old_values for s in samples])
                r, _ = pad_responses([s.returns for s in samples])
                metrics["critic/explained_variance"] = core.explained_variance(v, r, mask)
            else:
                group_advantages(samples, kept, normalize_std=config.advantage == "grpo")
            # 4. Update.
            rng = np.random.default_rng([config.seed, step])
            metrics.update(update_actor(policy, reference, actor_opt, samples, config, pad_id, autocast, rng))
            if critic is not None:
                metrics.update(update_critic(critic, critic_opt, samples, config, pad_id, autocast,
                                             np.random.default_rng([config.seed, step, 1])))
            # 5. Log, evaluate, checkpoint.
            seconds = time.perf_counter() - began
            tokens = sum(len(s.ids) for s in samples)
            metrics.update({"charts/kept_groups": len({t.group for t in kept}), "charts/train_turns": len(samples),
                            "charts/rollout_seconds": rollout_seconds, "charts/step_seconds": seconds,
                            "charts/train_tokens_per_second": tokens / max(seconds - rollout_seconds, 1e-9)})
            done = step + 1
            if evaluate_fn is not None and config.eval_every and (done % config.eval_every == 0
                                                                   or done == config.steps):
                metrics.update(_eval_entries(evaluate_fn(policy, done)))
            logger.log(done, metrics)
            history.append({"step": done, **metrics})
            if done % config.save_every == 0 or done == config.steps:
                save_checkpoint(out, done, policy, tokenizer, critic, actor_opt, critic_opt)
            bar.update(task, completed=done, info=f"reward {metrics['rollout/reward_mean']:+.2f}  "
                                                  f"success {metrics['rollout/success']:.0%}")
    logger.close()
    return history


def _eval_entries(metrics: dict) -> dict:
    """The headline numbers of an evaluation, as ``eval/...`` scalars."""
    entries = {"eval/success": metrics["success_rate"], "eval/format_valid": metrics["format_valid_rate"]}
    entries.update({f"eval/{k}": v for k, v in metrics["pass_at_k"].items()})
    for k, v in metrics.get("world_model", {}).items():
        if isinstance(v, (int, float)):
            entries[f"eval/wm_{k}"] = v
    return entries
