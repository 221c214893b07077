"""PPO with a critic, and GRPO, for multi-turn text agents.

One loop, top to bottom, per step: roll out ``groups`` training seeds x ``samples``
episodes; drop the groups whose samples all scored the same (they teach nothing) and
keep those whose rewards vary most (a step with none left skips the update); compute
advantages (critic + GAE for PPO, whitened over the step; group normalised scores for
GRPO); update the actor (and the critic) on minibatches of turns with gradient
accumulation, the policy loss on the response tokens outside ``<observation>`` and
``<prediction>`` by default; log; evaluate every ``eval_every`` steps; checkpoint.

Defaults are the paper's PPO settings (DESIGN.md): actor lr 1e-6, critic lr 1e-5,
gamma = lambda = 1, clip 0.2 / 0.28, dual clip 3, value clip 0.5, entropy 1e-3, KL 0,
1 PPO epoch, 32 groups x 8 samples, keep 25% of the groups, episode reward on the last
token. Old log-probs are the rollout's sampling log-probs at the sampling temperature,
which the recompute applies too (the engine decodes in the compute precision from the
fp32 master weights: with bf16 the first ratio is close to, not exactly, 1; in fp32 it
is 1; ``actor/first_ratio`` shows it). Departures, each a switch: whitened PPO
advantages (verl's default), flat groups dropped, state text out of the policy loss;
and, off by default (on in the learn preset), every episode weighing alike in the loss
(``balance_episodes``). The group filter and the minibatches are in
:mod:`spa.rl.minibatches`, the step's advantages in :mod:`spa.rl.advantages`.

A run is resumable: ``out/checkpoint`` holds the policy, the critic and both optimizers
after the last saved step (Ctrl-C or SIGTERM saves the current step's end before stopping,
SIGUSR1 without stopping: :mod:`spa.interrupt`); the seeds, sampling and minibatch order
of a step depend only on (seed, step), so a resumed run repeats what the uninterrupted
run would have done.

Under ``accelerate launch`` (see :mod:`spa.distributed`) each process plays its share of
the step's seeds (group ids stay global, so a group lives on one process); the group
filter is decided on all groups' reward spreads; advantages are computed where the
episodes are (GAE runs per episode, GRPO per group); the minibatches are those of the
global sample list, each process training the members it holds with losses weighted by
the minibatch's global count, and the gradients are summed before each optimizer step.
The result is the single-process update whatever the number of processes. The main
process logs global metrics, runs the evaluations and writes the checkpoints.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, ClassVar

import numpy as np
import torch

from spa import distributed, interrupt
from spa import precision as precision_
from spa.agent.parsing import split_actions
from spa.agent.rollout import RolloutConfig, Trajectory, Turn, rollout
from spa.agent.seeds import train_seeds
from spa.eval.metrics import summarize
from spa.io import TRAINER_STATE, atomic_dir, write_json
from spa.models.device import model_device, on_device
from spa.models.engine import Engine, SamplingParams
from spa.progress import Bar, quiet_hf_bars
from spa.rl import core
from spa.rl.advantages import compute_advantages
from spa.rl.batch import (REWARD_PLACEMENTS, Sample, collate, loss_masks, pad_responses, policy_forward,
                          turn_samples)
from spa.rl.critic import Critic
from spa.rl.logger import MetricsLogger
from spa.rl.minibatches import Entry, group_spread, loss_units, minibatches, sample_table, top_groups

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
    drop_flat_groups: bool = field(default=True, metadata={"help": (
        "Leave out, of the keep_fraction groups with the highest reward std, those whose samples all "
        "scored the same (std <= 1e-8): they carry no signal, only critic error. A step left with no "
        "group skips the update (charts/kept_groups 0).")})
    reward: str = "episode"  # episode: total reward on the last token; turn: per-turn rewards
    actor_lr: float = 1e-6
    critic_lr: float = 1e-5
    warmup_steps: int = field(default=0, metadata={"help": (
        "Optimizer steps over which the actor's and critic's learning rates rise linearly to their "
        "values (0: none). Adam's first steps move every weight by about the full learning rate "
        "whatever the gradient's size, so a rate that is safe later can wreck the policy at once.")})
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
    temperature: float = field(default=1.0, metadata={"help": (
        "Sampling temperature (> 0). The trainer's log-probs and entropy use logits / temperature, "
        "as the sampler's do. Top-p is not offered: the recompute cannot reproduce the truncation.")})
    whiten_advantages: bool = field(default=True, metadata={"help": (
        "PPO: whiten the step's advantages (zero mean, unit variance over the policy-loss tokens of "
        "all processes), as verl does by default. GRPO is left as is: its group normalisation already "
        "scales the advantages, and a token-weighted shift would flip the sign of near-mean episodes "
        "by their length (and undo grpo_no_std's choice not to divide by the std).")})
    state_tokens_in_loss: bool = field(default=False, metadata={"help": (
        "False: the tokens inside <observation> and <prediction> get no policy-gradient loss (nor "
        "entropy bonus); the tags, the reasoning and the answer keep it. In world_model mode they "
        "are about 95 of 126 response tokens, which would otherwise all carry the action's "
        "advantage. True trains them too (VAGEN, whose rewards pay for those states). The critic "
        "values every token either way.")})
    balance_episodes: bool = field(default=False, metadata={"help": (
        "Scale each episode's advantages by (mean loss tokens per episode) / (its loss tokens), so "
        "that under a token-mean every episode weighs the same and a GRPO group's advantage mass is "
        "zero. Off, the longer episodes weigh more; in multi-turn play those are mostly losers, and "
        "the step's net push on the sampled tokens is negative, which narrows the policy.")})
    negative_weight: float = field(default=1.0, metadata={"help": (
        "Multiply every negative advantage by this, from 0 to 1 (1: the plain policy gradient; 0: "
        "only the episodes that beat their baseline are reinforced, like rejection-sampling "
        "fine-tuning). A diagnostic: pushing a sampled answer down hands its probability to the answers "
        "the model already favours; on a one-move FrozenLake task 0 did not stop the narrowing.")})
    center_actions: bool = field(default=False, metadata={"help": (
        "Subtract from each turn's advantages the step's mean advantage per loss token of the turns "
        "with the same first action (over all processes; turns with no action are left as they are), "
        "so that no first action gains or loses on balance and only its advantage relative to its "
        "own average, i.e. where it was the better choice, is trained. Against the drift onto one "
        "move that a policy not yet reading the state takes under on-policy RL; an action-dependent "
        "baseline, so a biased gradient, and not a method of the paper. Applied after whitening.")})
    best_move_reward: float = field(default=0.0, metadata={"help": (
        "Add this to a turn's reward when its first action begins a shortest solution (the "
        "environment's best_actions; Turn.best_first). A dense reward from a solver, to test whether "
        "RL can learn with a label on every turn; not a method of the paper. 0: off.")})
    excess_action_penalty: float = field(default=0.0, metadata={"help": (
        "Subtract this from a turn's reward when its answer names more actions than a turn may "
        "play (prompt.max_actions): the extra ones are never played, yet their tokens carry the "
        "turn's advantage. SFT on the model's own correct moves taught more without such answers "
        "(docs/making-rl-learn.md, \"Correct moves from the model's own samples\"). Not a method "
        "of the paper; 0: off.")})
    max_new_tokens: int = 400  # per turn (paper: 400)
    seed_start: int = 0  # first training seed (steps use consecutive blocks of seeds)
    eval_every: int = 0  # evaluate every N steps (and at the start and end); 0: never
    save_every: int = 10  # checkpoint every N steps (and at the end)
    precision: str = field(default="auto", metadata={"help": precision_.FIELD_HELP})
    tensorboard: bool = True
    seed: int = 0

    RENAMED_KEYS: ClassVar[dict] = dict([precision_.RENAMED_BF16])

    def __post_init__(self) -> None:
        self.precision = precision_.check(self.precision)
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
                  "warmup_steps": self.warmup_steps >= 0, "negative_weight": 0 <= self.negative_weight <= 1,
                  "reward": self.reward in REWARD_PLACEMENTS, "temperature": self.temperature > 0}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} is out of range")


def warmup_factor(done: int, warmup_steps: int) -> float:
    """The share of the learning rate for the optimizer step after ``done`` steps: it rises
    linearly, ``(done + 1) / warmup_steps``, to 1 at step ``warmup_steps`` (1 when 0)."""
    return 1.0 if warmup_steps <= 0 else min(1.0, (done + 1) / warmup_steps)


def _optimizer_step(params, optimizer, max_norm: float, lr: float, warmup_steps: int = 0) -> float:
    """Sum the processes' gradients (nothing alone), clip, step at the warmed-up ``lr``.

    The steps done are Adam's own count, which the checkpoint keeps, so a resumed run
    continues the warm-up where it stopped."""
    distributed.all_reduce_grads(params)
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    state = optimizer.state.get(params[0], {})
    done = int(state["step"]) if "step" in state else 0
    for group in optimizer.param_groups:
        group["lr"] = lr * warmup_factor(done, warmup_steps)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)


def update_actor(policy, reference, optimizer, samples: list[Sample], table: list[Entry], config: PPOConfig,
                 pad_id: int, autocast, rng: np.random.Generator) -> dict:
    """PPO clipped policy loss - entropy bonus (+ KL to the reference), over minibatches.

    The loss, the entropy and the stats cover each sample's ``loss_mask`` tokens. The
    terms are logged apart: ``actor/policy_loss`` the clipped surrogate alone (it once
    included the other two), ``actor/entropy_loss`` the entropy term as added to the
    loss (``-entropy_coef * entropy``), ``actor/kl_loss`` the KL term (``kl_coef * KL``,
    0 without a reference) and ``actor/loss`` their sum, the loss that is minimised.
    Besides the averages over all minibatches, ``actor/first_ratio`` and
    ``actor/first_clipfrac`` are those of the first minibatch, before any optimizer step:
    how far the trainer's log-probs are from the sampler's (1 and 0 when they agree).
    """
    params = [p for p in policy.parameters() if p.requires_grad]
    policy.train()
    totals: dict[str, float] = {}
    first: dict[str, float] = {}
    count, first_count, norms = 0, 0, []
    for index, (micro_batches, total) in enumerate(minibatches(samples, table, config, rng)):
        for mb in micro_batches:
            batch = on_device(collate(mb, pad_id), policy)
            with autocast:
                logprobs, entropy, mask = policy_forward(policy, *batch, temperature=config.temperature)
            old, adv, in_loss = on_device([pad_responses([s.old_logprobs for s in mb])[0],
                                            pad_responses([s.advantages for s in mb])[0], loss_masks(mb)], policy)
            mask = mask & in_loss
            pg_loss, stats = core.policy_loss(logprobs, old, adv, mask, config.clip_low, config.clip_high,
                                              config.dual_clip, config.aggregation)
            ent = core.aggregate(entropy, mask, config.aggregation)
            entropy_loss = -config.entropy_coef * ent
            kl_loss = torch.zeros_like(entropy_loss)
            if reference is not None:
                with torch.no_grad(), autocast:
                    ref, _, _ = policy_forward(reference, *batch, entropy=False, temperature=config.temperature)
                kl = core.aggregate(core.kl_penalty(logprobs, ref, config.kl_estimator), mask, config.aggregation)
                kl_loss = config.kl_coef * kl
                stats["kl_ref"] = kl.item()
            loss = pg_loss + entropy_loss + kl_loss
            (loss * loss_units(mb, config.aggregation) / total).backward()
            stats.update(policy_loss=pg_loss.item(), entropy_loss=entropy_loss.item(), kl_loss=kl_loss.item(),
                         loss=loss.item(), entropy=ent.item())
            n = int(mask.sum())
            for k, v in stats.items():
                totals[k] = totals.get(k, 0.0) + v * n
            count += n
            if index == 0:
                first["ratio"] = first.get("ratio", 0.0) + stats["ratio_mean"] * n
                first["clipfrac"] = first.get("clipfrac", 0.0) + stats["clipfrac"] * n
                first_count += n
        norms.append(_optimizer_step(params, optimizer, config.max_grad_norm, config.actor_lr,
                                     config.warmup_steps))
    totals, count = distributed.sum_stats(totals, count)
    first, first_count = distributed.sum_stats(first, first_count)
    stats = {f"actor/{k}": v / max(count, 1) for k, v in totals.items()}
    stats.update({f"actor/first_{k}": v / max(first_count, 1) for k, v in first.items()})
    return {**stats, "actor/grad_norm": float(np.mean(norms)) if norms else 0.0,
            "actor/lr": optimizer.param_groups[0]["lr"]}


def update_critic(critic: Critic, optimizer, samples: list[Sample], table: list[Entry], config: PPOConfig,
                  pad_id: int, autocast, rng: np.random.Generator) -> dict:
    """Clipped value loss towards the GAE returns, over minibatches."""
    params = [p for p in critic.parameters() if p.requires_grad]
    critic.train()
    totals, count = {"value_loss": 0.0, "vf_clipfrac": 0.0}, 0
    for micro_batches, total in minibatches(samples, table, config, rng):
        for mb in micro_batches:
            with autocast:
                values, mask = critic(*on_device(collate(mb, pad_id), critic))
            old, returns = on_device([pad_responses([s.old_values for s in mb])[0],
                                       pad_responses([s.returns for s in mb])[0]], critic)
            loss, stats = core.value_loss(values, old, returns, mask, config.value_clip, config.aggregation)
            (loss * loss_units(mb, config.aggregation) / total).backward()
            n = int(mask.sum())
            totals["value_loss"] += loss.item() * n
            totals["vf_clipfrac"] += stats["vf_clipfrac"] * n
            count += n
        _optimizer_step(params, optimizer, config.max_grad_norm, config.critic_lr, config.warmup_steps)
    totals, count = distributed.sum_stats(totals, count)
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
    metrics.update({"rollout/best_first": summary["best_first_rate"]} if "best_first_rate" in summary else {})
    return metrics


def save_checkpoint(out: Path, step: int, policy, tokenizer, critic, actor_opt, critic_opt,
                    extra: dict | None = None) -> Path:
    """``out/checkpoint``, replaced atomically: policy (HF folder), critic and optimizers,
    and ``extra`` entries in the trainer state (RWML's data fingerprint)."""
    with atomic_dir(out / "checkpoint") as tmp, quiet_hf_bars():
        policy.save_pretrained(tmp / "policy")
        tokenizer.save_pretrained(tmp / "policy")
        torch.save({"step": step, "actor_opt": actor_opt.state_dict(),
                    "critic": critic.state_dict() if critic is not None else None,
                    "critic_opt": critic_opt.state_dict() if critic_opt is not None else None, **(extra or {})},
                   tmp / TRAINER_STATE)
    return out / "checkpoint"


def resume_point(out: str | Path) -> Path | None:
    """The checkpoint folder to resume from, if a complete one exists."""
    path = Path(out) / "checkpoint"
    return path if (path / TRAINER_STATE).is_file() else None


def train(policy, tokenizer, rollout_config: RolloutConfig, config: PPOConfig, out: str | Path,
          evaluate_fn=None, resume_from: Path | None = None, progress: bool = True,
          engine=None, turn_reward: Callable[[Turn], float] | None = None) -> list[dict]:
    """Run PPO or GRPO; returns the per-step metrics (also in ``out/metrics.jsonl``).

    ``evaluate_fn(policy, step) -> dict`` runs the periodic evaluation (its flat numeric
    entries are logged under ``eval/``). ``resume_from`` is a checkpoint whose policy
    weights ``policy`` already holds; the critic and optimizers are restored from it.
    ``engine`` replaces the generation engine (tests script the responses with it).
    ``turn_reward(turn)`` is added to every turn's reward before the advantages (VAGEN-style
    world-model rewards, :func:`spa.rl.rewards.vagen_turn_reward`); ``rollout/reward_mean``
    stays the environment's reward, the bonus is logged as ``rollout/shaping_reward``; a
    ``best_move_reward`` is added to it and ``excess_action_penalty`` taken from it.
    Launched on several processes, they train one policy together (module docstring).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    policy = distributed.place(policy)
    distributed.sync_params(policy)
    device = model_device(policy)
    compute = precision_.for_model(config.precision, policy)
    autocast = compute.autocast(device)
    reference = None
    if config.kl_coef > 0:
        import copy

        reference = copy.deepcopy(policy).eval().requires_grad_(False)
    critic = Critic(policy).to(device) if config.algorithm == "ppo" else None
    actor_opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=config.actor_lr,
                                  weight_decay=0.0)
    critic_opt = torch.optim.AdamW(critic.parameters(), lr=config.critic_lr, weight_decay=0.0) if critic else None
    start = 0
    if resume_from is not None:
        state = torch.load(resume_from / TRAINER_STATE, weights_only=False, map_location="cpu")
        actor_opt.load_state_dict(state["actor_opt"])
        if critic is not None:
            critic.load_state_dict(state["critic"])
            critic_opt.load_state_dict(state["critic_opt"])
        start = state["step"]
    if critic is not None:
        distributed.sync_params(critic)
    main = distributed.is_main()
    if main:
        write_json(out / "config.json", {"ppo": asdict(config), "rollout": asdict(rollout_config)})
    logger = MetricsLogger(out, resume_step=start, tensorboard=config.tensorboard) if main else _NoLogger()
    if engine is None:
        engine = Engine(policy, tokenizer, dtype=compute.decode_dtype)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    history = []
    if evaluate_fn is not None and config.eval_every and start == 0:
        logger.log(0, distributed.on_main(lambda: _eval_entries(evaluate_fn(policy, 0))))
    with contextlib.closing(logger), Bar(disable=not progress or not main) as bar, \
            interrupt.graceful() as requests:
        task = bar.add_task(f"{config.algorithm} {rollout_config.env}", total=config.steps, completed=start,
                            info="")
        for step in range(start, config.steps):
            began = time.perf_counter()
            # 1. Roll out: a fresh block of training seeds per step, groups of samples per
            # seed; each process plays its share of the seeds.
            trajectories = _play(engine, tokenizer, rollout_config, config, step)
            metrics = rollout_metrics(_everyone(trajectories))
            shaping = _shaping(turn_reward, config.best_move_reward, config.excess_action_penalty,
                               rollout_config.prompt.max_actions_per_turn)
            if shaping is not None:
                metrics["rollout/shaping_reward"] = shape_rewards(trajectories, shaping)
            rollout_seconds = time.perf_counter() - began
            # 2. Drop the flat groups, keep those whose samples disagree most (ranked over all
            # processes' groups).
            kept_ids = top_groups(dict(distributed.gather(list(group_spread(trajectories).items()))),
                                  config.keep_fraction, config.drop_flat_groups)
            kept = [t for t in trajectories if t.group in kept_ids]
            samples = turn_samples(kept, tokenizer, config.state_tokens_in_loss)
            table = sample_table(samples, kept, config.aggregation)
            # Every process sees the same kept_ids: with no group left (all flat), all skip
            # the update together; the step is still logged and checkpointed.
            phases = {"time/rollout_s": rollout_seconds}
            if kept_ids:
                # 3. Advantages, where the episodes are: whole groups live on one process.
                with _timed(phases, "time/advantages_s"):
                    metrics.update(compute_advantages(samples, kept, critic, config, pad_id, autocast))
                # 4. Update.
                rng = np.random.default_rng([config.seed, step])
                with _timed(phases, "time/actor_s"):
                    metrics.update(update_actor(policy, reference, actor_opt, samples, table, config, pad_id,
                                                autocast, rng))
                if critic is not None:
                    with _timed(phases, "time/critic_s"):
                        metrics.update(update_critic(critic, critic_opt, samples, table, config, pad_id,
                                                     autocast, np.random.default_rng([config.seed, step, 1])))
            # 5. Log, evaluate, checkpoint.
            metrics.update(phases)
            seconds = time.perf_counter() - began
            tokens = sum(e.tokens for e in table)
            metrics.update({"charts/kept_groups": len(kept_ids), "charts/train_turns": len(table),
                            "charts/rollout_seconds": rollout_seconds, "charts/step_seconds": seconds,
                            "charts/train_tokens_per_second": tokens / max(seconds - rollout_seconds, 1e-9)})
            done = step + 1
            if evaluate_fn is not None and config.eval_every and (done % config.eval_every == 0
                                                                   or done == config.steps):
                metrics.update(distributed.on_main(lambda at=done: _eval_entries(evaluate_fn(policy, at))))
            logger.log(done, metrics)
            history.append({"step": done, **metrics})
            stop, save_now = requests.take()
            if stop or save_now or done % config.save_every == 0 or done == config.steps:
                if main:
                    save_checkpoint(out, done, policy, tokenizer, critic, actor_opt, critic_opt)
                distributed.wait()
            if stop:
                raise interrupt.stopped(f"step {done} of {config.steps} is saved in {out / 'checkpoint'}")
            bar.update(task, completed=done, info=f"reward {metrics['rollout/reward_mean']:+.2f}  "
                                                  f"success {metrics['rollout/success']:.0%}"
                                                  + ("" if kept_ids else "  no group with spread: no update"))
    return history


@contextlib.contextmanager
def _timed(phases: dict, name: str):
    """Add the seconds the block takes to ``phases[name]`` (the step's per-phase breakdown)."""
    began = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - began


def _shaping(turn_reward: Callable[[Turn], float] | None, best_move: float, excess_penalty: float = 0.0,
             max_actions: int | None = None) -> Callable[[Turn], float] | None:
    """The per-turn bonus: ``turn_reward``, plus ``best_move`` for a turn whose first action
    was a best one, minus ``excess_penalty`` for an answer naming more than ``max_actions``
    actions; ``None`` when there is none of them."""
    if not best_move and not excess_penalty:
        return turn_reward

    def bonus(turn: Turn) -> float:
        excess = max_actions is not None and len(split_actions(turn.answer)) > max_actions
        return ((turn_reward(turn) if turn_reward else 0.0) + (best_move if turn.best_first else 0.0)
                - (excess_penalty if excess else 0.0))

    return bonus


def shape_rewards(trajectories: list[Trajectory], turn_reward: Callable[[Turn], float]) -> float:
    """Add ``turn_reward(turn)`` to the reward of every turn; returns the mean bonus per turn
    (of this process's turns)."""
    bonuses = []
    for trajectory in trajectories:
        for turn in trajectory.turns:
            bonus = float(turn_reward(turn))
            turn.reward += bonus
            bonuses.append(bonus)
    return float(np.mean(bonuses)) if bonuses else 0.0


def _play(engine, tokenizer, rollout_config: RolloutConfig, config: PPOConfig, step: int) -> list[Trajectory]:
    """This process's episodes of the step: seeds ``rank, rank + N, ...`` of the step's block.

    Group ids are renumbered to the seed's index in the whole block, as one process
    would number them. The sampling seed is ``(base) * N + rank``: the single-process
    seed alone, a distinct stream per process otherwise.
    """
    rank, size = distributed.world()
    seeds = train_seeds(config.groups, config.seed_start + step * config.groups)
    sampling = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                              seed=(config.seed * 1_000_003 + step) * size + rank)
    trajectories = rollout(engine, tokenizer, seeds[rank::size], config.samples, rollout_config, sampling)
    for t in trajectories:
        t.group = rank + size * t.group
    return trajectories


def _everyone(trajectories: list[Trajectory]) -> list[Trajectory]:
    """All processes' trajectories, in the single-process order, for the rollout metrics.

    Sent without the prompts and log-probs, which the metrics do not read (a step's
    prompts are megabytes).
    """
    if distributed.world()[1] == 1:
        return trajectories
    light = [replace(t, turns=[replace(turn, prompt_messages=[], prompt_ids=[], logprobs=[]) for turn in t.turns])
             for t in trajectories]
    return sorted(distributed.gather(light), key=lambda t: (t.group, t.sample))


class _NoLogger:
    """The logger of the processes other than the main one: they write nothing."""

    def log(self, step: int, metrics: dict) -> None:
        pass

    def close(self) -> None:
        pass


def _eval_entries(metrics: dict) -> dict:
    """The headline numbers of an evaluation, as ``eval/...`` scalars: each Pass@k with
    its 95% interval as ``eval/pass@k_lo`` / ``_hi`` where the evaluation has one."""
    entries = {"eval/success": metrics["success_rate"], "eval/format_valid": metrics["format_valid_rate"]}
    entries.update({f"eval/{k}": v for k, v in metrics["pass_at_k"].items()})
    entries.update({"eval/best_first": metrics["best_first_rate"]} if "best_first_rate" in metrics else {})
    for k, (low, high) in metrics.get("pass_at_k_ci95", {}).items():
        entries[f"eval/{k}_lo"], entries[f"eval/{k}_hi"] = low, high
    for k, v in metrics.get("world_model", {}).items():
        if isinstance(v, (int, float)):
            entries[f"eval/wm_{k}"] = v
    return entries
