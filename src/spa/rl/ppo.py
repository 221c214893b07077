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
the minibatch's global count; the policy and the critic train wrapped in DDP, which sums
the gradients in each optimizer step's last backward pass (a process holding fewer
micro-batches of a minibatch pads with passes that add nothing). The result is the
single-process update whatever the number of processes. The evaluations are split by
level over the processes (:mod:`spa.agent.sharding`); the main process logs global
metrics, writes the evaluations' outputs and the checkpoints.
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from spa import distributed, interrupt
from spa.agent.parsing import split_actions
from spa.agent.rollout import RolloutConfig, Trajectory, Turn, rollout
from spa.agent.seeds import train_seeds
from spa.compute import for_model
from spa.eval.metrics import summarize
from spa.io import TRAINER_STATE, atomic_dir, write_json
from spa.models.device import model_device, on_device
from spa.models.engine import Engine, SamplingParams
from spa.models.recompute import enable_recompute
from spa.progress import Bar, quiet_hf_bars
from spa.rl import core, montecarlo
from spa.rl.advantages import compute_advantages, draw_turns, per_action
from spa.rl.batch import (Sample, collate, forward_with_kl, loss_masks, pad_responses, policy_forward,
                          turn_samples)
from spa.rl.config import ALGORITHMS, ESTIMATORS, PER_TURN, PPOConfig  # noqa: F401 (re-exported)
from spa.rl.critic import build_critic, restore_critic
from spa.rl.logger import MetricsLogger
from spa.rl.minibatches import Entry, group_spread, loss_units, minibatches, sample_table, top_groups

def warmup_factor(done: int, warmup_steps: int) -> float:
    """The share of the learning rate for the optimizer step after ``done`` steps: it rises
    linearly, ``(done + 1) / warmup_steps``, to 1 at step ``warmup_steps`` (1 when 0)."""
    return 1.0 if warmup_steps <= 0 else min(1.0, (done + 1) / warmup_steps)


# Below this a centred advantage (unit scale) is the rounding of a mean subtracted from
# equal values, not a signal: such a turn is skipped.
ZERO_ADVANTAGE = 1e-6


def centred(config: PPOConfig) -> bool:
    """Whether per-turn advantages are shifted after they are computed (``mc_center``,
    ``center_actions``), so that a turn whose raw value is 0 may still train."""
    return config.mc_center or config.center_actions


def _optimizer_step(params, optimizer, max_norm: float, lr: float, warmup_steps: int = 0) -> float:
    """Clip the (already summed: :func:`spa.distributed.accumulation`) gradients, step at
    the warmed-up ``lr``.

    The steps done are Adam's own count, which the checkpoint keeps, so a resumed run
    continues the warm-up where it stopped."""
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
    With ``target_kl`` the step stops before the first minibatch whose approx_kl to the
    playing policy exceeds it (``actor/kl_stop`` 1; ``actor/updates`` the optimizer steps
    taken), as CleanRL and Stable-Baselines3 do: a bound on each step's move, whatever the
    learning rate. ``policy``: the model as :func:`spa.distributed.wrap` returned it (the
    model itself on one process).
    """
    params = [p for p in policy.parameters() if p.requires_grad]
    policy.train()
    totals: dict[str, float] = {}
    first: dict[str, float] = {}
    count, first_count, norms, stopped = 0, 0, [], 0.0
    exact = reference is not None and config.kl_estimator == core.EXACT_KL
    for index, (micro_batches, total) in enumerate(minibatches(samples, table, config, rng)):
        batch_kl: dict[str, float] = {"kl": 0.0}
        batch_tokens = 0
        for mb, context in distributed.accumulation(policy, micro_batches):
            with context:
                if mb is None:  # another process holds more micro-batches of this minibatch
                    _padding_pass(policy, _logprobs, pad_id, autocast)
                    continue
                loss, stats, mask = _actor_loss(policy, reference, mb, config, pad_id, autocast, exact)
                (loss * loss_units(mb, config.aggregation) / total).backward()
            n = int(mask.sum())
            for k, v in stats.items():
                totals[k] = totals.get(k, 0.0) + v * n
            count += n
            batch_kl["kl"] += stats["approx_kl"] * n
            batch_tokens += n
            if index == 0:
                first["ratio"] = first.get("ratio", 0.0) + stats["ratio_mean"] * n
                first["clipfrac"] = first.get("clipfrac", 0.0) + stats["clipfrac"] * n
                first_count += n
        if config.target_kl:
            # The policy has moved this far from the one that played the step (this
            # minibatch's KL, before its own update): stop the step's updates here.
            batch_kl, batch_tokens = distributed.sum_stats(batch_kl, batch_tokens)
            if batch_kl["kl"] / max(batch_tokens, 1) > config.target_kl:
                optimizer.zero_grad(set_to_none=True)
                stopped = 1.0
                break
        norms.append(_optimizer_step(params, optimizer, config.max_grad_norm, config.actor_lr,
                                     config.warmup_steps))
    totals, count = distributed.sum_stats(totals, count)
    first, first_count = distributed.sum_stats(first, first_count)
    stats = {f"actor/{k}": v / max(count, 1) for k, v in totals.items()}
    stats.update({f"actor/first_{k}": v / max(first_count, 1) for k, v in first.items()})
    return {**stats, "actor/grad_norm": float(np.mean(norms)) if norms else 0.0,
            "actor/lr": optimizer.param_groups[0]["lr"], "actor/updates": float(len(norms)),
            "actor/kl_stop": stopped}


def _actor_loss(policy, reference, mb: list[Sample], config: PPOConfig, pad_id: int, autocast, exact: bool
                ) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
    """The micro-batch's actor loss (clipped surrogate - entropy bonus + KL to the
    reference; ``exact``: the exact KL), its stats and the mask of the tokens they cover."""
    batch = on_device(collate(mb, pad_id), policy)
    with autocast:
        if exact:
            logprobs, entropy, kl_tokens, mask = forward_with_kl(policy, reference, *batch,
                                                                 temperature=config.temperature)
        else:
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
        if not exact:
            with torch.no_grad(), autocast:
                ref, _, _ = policy_forward(reference, *batch, entropy=False, temperature=config.temperature)
            kl_tokens = core.kl_penalty(logprobs, ref, config.kl_estimator)
        kl = core.aggregate(kl_tokens, mask, config.aggregation)
        kl_loss = config.kl_coef * kl
        stats["kl_ref"] = kl.item()
    loss = pg_loss + entropy_loss + kl_loss
    stats.update(policy_loss=pg_loss.item(), entropy_loss=entropy_loss.item(), kl_loss=kl_loss.item(),
                 loss=loss.item(), entropy=ent.item())
    return loss, stats, mask


def update_critic(critic, optimizer, samples: list[Sample], table: list[Entry], config: PPOConfig,
                  pad_id: int, autocast, rng: np.random.Generator) -> dict:
    """Clipped value loss towards the GAE returns, over minibatches. ``critic``: the
    critic of either kind (:func:`spa.rl.critic.build_critic`) as :func:`spa.distributed.wrap`
    returned it; its parameters are all it trains (a value head's are the head's alone)."""
    params = [p for p in critic.parameters() if p.requires_grad]
    critic.train()
    totals, count = {"value_loss": 0.0, "vf_clipfrac": 0.0}, 0
    for micro_batches, total in minibatches(samples, table, config, rng):
        for mb, context in distributed.accumulation(critic, micro_batches):
            with context:
                if mb is None:  # another process holds more micro-batches of this minibatch
                    _padding_pass(critic, _values, pad_id, autocast)
                    continue
                batch = on_device(collate(mb, pad_id), critic)
                with autocast:
                    values, mask = distributed.forward(critic, _value_pass, *batch)
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


def _padding_pass(model, output: Callable, pad_id: int, autocast) -> None:
    """A forward and backward of ``model`` (the policy or the critic, as trained) that adds
    nothing to the gradients (see :func:`spa.distributed.accumulation`): a two-token
    sequence whose second token is the response, ``output(model, *batch)`` multiplied by 0.
    Every parameter is in its graph, as in a real micro-batch's."""
    filler = Sample([pad_id, pad_id], 1, torch.zeros(1), episode=-1, turn=-1)
    batch = on_device(collate([filler], pad_id), model)
    with autocast:
        out = output(model, *batch)
    (out.sum() * 0.0).backward()


def _logprobs(policy, ids: torch.Tensor, attention: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The response tokens' log-probs (the padding pass of the actor)."""
    return policy_forward(policy, ids, attention, targets, entropy=False)[0]


def _values(critic, ids: torch.Tensor, attention: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The response positions' values (the padding pass of the critic)."""
    return distributed.forward(critic, _value_pass, ids, attention, targets)[0]


def _value_pass(critic, ids: torch.Tensor, attention: torch.Tensor, targets: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The critic's values and mask, whichever its kind (the training pass DDP runs)."""
    return critic(ids, attention, targets)


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
        policy.save_pretrained(tmp / "policy", state_dict=distributed.state_dict(policy))  # whole under FSDP
        tokenizer.save_pretrained(tmp / "policy")
        torch.save({"step": step, "actor_opt": distributed.optimizer_state(actor_opt),
                    "critic": critic.state_dict() if critic is not None else None,
                    "critic_opt": critic_opt.state_dict() if critic_opt is not None else None, **(extra or {})},
                   tmp / TRAINER_STATE)
    return out / "checkpoint"


def resume_point(out: str | Path) -> Path | None:
    """The checkpoint folder to resume from, if a complete one exists."""
    path = Path(out) / "checkpoint"
    return path if (path / TRAINER_STATE).is_file() else None


def frozen_reference(policy: torch.nn.Module) -> torch.nn.Module:
    """The KL term's reference: a frozen copy of ``policy`` as loaded, before
    :func:`spa.distributed.wrap`, holding the main process's weights on every process.

    Every process loads the same weights, but one whose weights differ (a seed-dependent
    init, a checkpoint read from another disk) would otherwise keep its own reference: the
    main process's tensors are broadcast, as wrapping does for the policy. The reference
    stays whole under every strategy, FSDP included: sharded, each of its passes would
    gather every layer from all processes, so every process would have to run it as often,
    and the padding passes (:func:`spa.distributed.accumulation`) do not run it. That costs
    one more whole model per process, in the policy's dtype (its fp32 master weights where
    training computes in bf16 under autocast): under FSDP more than the policy's own shard.
    """
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    distributed.copy_from_main(reference)
    return reference


def train(policy, tokenizer, rollout_config: RolloutConfig, config: PPOConfig, out: str | Path,
          evaluate_fn=None, resume_from: Path | None = None, progress: bool = True,
          engine=None, turn_reward: Callable[[Turn], float] | None = None, compute=None) -> list[dict]:
    """Run PPO or GRPO; returns the per-step metrics (also in ``out/metrics.jsonl``).

    ``evaluate_fn(policy, step) -> dict`` runs the periodic evaluation (its flat numeric
    entries are logged under ``eval/``); launched, every process calls it and must get the
    same result, as :func:`spa.eval.evaluate.evaluate` gives (each process plays its share
    of the levels, the main process writes). ``resume_from`` is a checkpoint whose policy
    weights ``policy`` already holds; the critic and optimizers are restored from it.
    ``engine`` replaces the generation engine (tests script the responses with it).
    ``turn_reward(turn)`` is added to every turn's reward before the advantages (VAGEN-style
    world-model rewards, :func:`spa.rl.rewards.vagen_turn_reward`); ``rollout/reward_mean``
    stays the environment's reward, the bonus is logged as ``rollout/shaping_reward``; a
    ``best_move_reward`` is added to it and ``excess_action_penalty`` taken from it.
    ``compute`` (:class:`spa.compute.Compute`): the caller's decided precision; None decides
    ``config.precision`` on the policy's device.
    Launched on several processes, they train one policy together (module docstring).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    policy = distributed.place(policy)
    if config.gradient_checkpointing:
        enable_recompute(policy)  # the critic copies the policy's decoder, and this switch with it
    # Copied before wrapping, which under FSDP shards the policy in place (module copies then fail).
    reference = frozen_reference(policy) if config.kl_coef > 0 else None
    # The training passes go through ``actor`` (DDP or FSDP under a launcher, ``policy`` alone);
    # generation, evaluation and checkpoints use ``policy``. Wrapping first copies the main
    # process's weights to the others, so the critic copies those.
    actor = distributed.wrap(policy, config.parallel)
    device = model_device(policy)
    compute = compute or for_model(policy, config.precision)
    autocast = compute.autocast(device)
    # critic=head reads the policy's own decoder (no second copy; spa.rl.critic)
    critic = build_critic(policy, config.critic).to(device) if config.uses_critic else None
    actor_opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=config.actor_lr,
                                  weight_decay=0.0)
    critic_opt = torch.optim.AdamW(critic.parameters(), lr=config.critic_lr, weight_decay=0.0) if critic else None
    start = 0
    if resume_from is not None:
        state = torch.load(resume_from / TRAINER_STATE, weights_only=False, map_location="cpu")
        distributed.load_optimizer_state(actor_opt, state["actor_opt"])
        if critic is not None:
            restore_critic(critic, state["critic"])  # a ValueError if it was saved by the other kind
            critic_opt.load_state_dict(state["critic_opt"])
        start = state["step"]
    trained_critic = distributed.wrap(critic) if critic is not None else None  # the restored one
    main = distributed.is_main()
    if main:
        write_json(out / "config.json", {"ppo": asdict(config), "rollout": asdict(rollout_config)})
    logger = MetricsLogger(out, resume_step=start, tensorboard=config.tensorboard) if main else _NoLogger()
    if engine is None:
        engine = Engine(policy, tokenizer, max_batch_size=config.engine_batch, dtype=compute.decode_dtype)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    history = []
    if evaluate_fn is not None and config.eval_every and start == 0:
        logger.log(0, _evaluation(evaluate_fn, policy, actor, 0))
    with contextlib.closing(logger), Bar(disable=not progress or not main) as bar, \
            interrupt.graceful() as requests:
        task = bar.add_task(f"{config.algorithm} {rollout_config.env}", total=config.steps, completed=start,
                            info="")
        for step in range(start, config.steps):
            began = time.perf_counter()
            # 1. Roll out: a fresh block of training seeds per step, groups of samples per
            # seed; each process plays its share of the seeds.
            with distributed.gathered(actor):  # FSDP: the engine reads the whole weights
                trajectories = _play(engine, tokenizer, rollout_config, config, step)
            metrics = rollout_metrics(_everyone(trajectories))
            shaping = _shaping(turn_reward, config.best_move_reward, config.excess_action_penalty,
                               rollout_config.prompt.max_actions_per_turn)
            if shaping is not None:
                metrics["rollout/shaping_reward"] = shape_rewards(trajectories, shaping)
            rollout_seconds = time.perf_counter() - began
            phases = {"time/rollout_s": rollout_seconds}
            # 2. Which turns train. Per-turn Monte-Carlo advantages: every turn whose
            # advantage is not 0, in every group (a group whose samples all played the same
            # losing move is pushed down, not dropped), or train_turns of them drawn by the
            # size of their advantage. Otherwise: drop the flat groups and
            # keep those whose samples disagree most (ranked over all processes' groups).
            turn_values = None
            if config.advantage in PER_TURN:
                kept = trajectories
                with _timed(phases, "time/lookahead_s"), distributed.gathered(actor):
                    turn_values = _turn_values(engine, tokenizer, kept, rollout_config, config, step)
                samples = turn_samples(kept, tokenizer, config.state_tokens_in_loss,
                                       action_tokens=config.value_actions == "each")
                if not centred(config):  # a raw 0 stays 0: skip those turns before the step's moments
                    samples = [s for s in samples if any(per_action(turn_values[s.episode][s.turn]))]
                metrics["charts/zero_advantage_turns"] = sum(not any(per_action(v)) for vs in turn_values for v in vs)
                with _timed(phases, "time/advantages_s"):
                    metrics.update(compute_advantages(samples, kept, None, config, pad_id, autocast, turn_values))
                # Centred, a turn whose raw value was 0 (the value label's 0) is pushed down by
                # the centre; only a turn whose final advantage is 0 carries nothing.
                samples = [s for s in samples if float(s.advantages.abs().max()) > ZERO_ADVANTAGE]
                if config.train_turns:  # the turns that carry the step's signal, by its size
                    rank, world = distributed.world()
                    samples = draw_turns(samples, -(-config.train_turns // world), (config.seed, step, rank))
            else:
                kept_ids = top_groups(dict(distributed.gather(list(group_spread(trajectories).items()))),
                                      config.keep_fraction, config.drop_flat_groups)
                kept = [t for t in trajectories if t.group in kept_ids]
                samples = turn_samples(kept, tokenizer, config.state_tokens_in_loss)
            table = sample_table(samples, kept, config.aggregation)
            # Every process sees the same table: with nothing to train (all groups flat, or
            # every advantage 0), all skip the update together; the step is still logged and
            # checkpointed.
            if table:
                # 3. Advantages, where the episodes are: whole groups live on one process.
                if config.advantage not in PER_TURN:
                    with _timed(phases, "time/advantages_s"):
                        metrics.update(compute_advantages(samples, kept, critic, config, pad_id, autocast))
                # 4. Update.
                rng = np.random.default_rng([config.seed, step])
                with _timed(phases, "time/actor_s"):
                    metrics.update(update_actor(actor, reference, actor_opt, samples, table, config, pad_id,
                                                autocast, rng))
                if critic is not None:
                    with _timed(phases, "time/critic_s"):
                        metrics.update(update_critic(trained_critic, critic_opt, samples, table, config, pad_id,
                                                     autocast, np.random.default_rng([config.seed, step, 1])))
            # 5. Log, evaluate, checkpoint.
            metrics.update(phases)
            seconds = time.perf_counter() - began
            tokens = sum(e.tokens for e in table)
            metrics.update({"charts/kept_groups": len({e.key[0] for e in table}), "charts/train_turns": len(table),
                            "charts/rollout_seconds": rollout_seconds, "charts/step_seconds": seconds,
                            "charts/train_tokens_per_second": tokens / max(seconds - rollout_seconds, 1e-9)})
            done = step + 1
            if evaluate_fn is not None and config.eval_every and (done % config.eval_every == 0
                                                                   or done == config.steps):
                metrics.update(_evaluation(evaluate_fn, policy, actor, done))
            logger.log(done, metrics)
            history.append({"step": done, **metrics})
            stop, save_now = requests.take()
            if stop or save_now or done % config.save_every == 0 or done == config.steps:
                with distributed.gathered(actor, actor_opt):
                    if main:
                        save_checkpoint(out, done, policy, tokenizer, critic, actor_opt, critic_opt)
                distributed.wait()
            if stop:
                raise interrupt.stopped(f"step {done} of {config.steps} is saved in {out / 'checkpoint'}")
            bar.update(task, completed=done, info=f"reward {metrics['rollout/reward_mean']:+.2f}  "
                                                  f"success {metrics['rollout/success']:.0%}"
                                                  + ("" if table else "  nothing to train: no update"))
    return history


def _evaluation(evaluate_fn, policy, actor, step: int) -> dict:
    """The periodic evaluation's ``eval/`` entries, on every process: each calls
    ``evaluate_fn`` with the whole weights (under FSDP gathered from the shards first), and
    :func:`spa.eval.evaluate.evaluate` there plays each process's share of the levels while
    the main process alone writes the outputs."""
    with distributed.gathered(actor):
        return _eval_entries(evaluate_fn(policy, step))


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


def _turn_values(engine, tokenizer, trajectories: list[Trajectory], rollout_config: RolloutConfig,
                 config: PPOConfig, step: int) -> list[list[float | tuple[float, ...]]]:
    """Each turn's Monte-Carlo advantage (:mod:`spa.rl.montecarlo`), or with ``advantage="value"``
    its value label (1 when its first action is among the best by Monte-Carlo value), before any scaling."""
    if config.advantage == "value":
        return montecarlo.label_advantages(trajectories, config.mc_rollouts, config.value_horizon,
                                           (config.seed, step), config.value_objective, config.value_actions)
    if config.mc_continuation == "random":
        return montecarlo.random_advantages(trajectories, rollout_config, config.mc_rollouts, (config.seed, step))
    sampling = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                              seed=(config.seed * 1_000_003 + step) * 7919 + 1)
    return montecarlo.policy_advantages(engine, tokenizer, trajectories, rollout_config, config.mc_rollouts,
                                        sampling)


def _play(engine, tokenizer, rollout_config: RolloutConfig, config: PPOConfig, step: int) -> list[Trajectory]:
    """This process's episodes of the step: seeds ``rank, rank + N, ...`` of the step's block.

    Group ids are renumbered to the seed's index in the whole block, as one process
    would number them. The sampling seed is ``(base) * N + rank``: the single-process
    seed alone, a distinct stream per process otherwise.
    """
    rank, size = distributed.world()
    # No solver on the path of RL from the task's reward: its per-turn label is asked for
    # only as the (diagnostic) best_move_reward.
    rollout_config = replace(rollout_config, solver_labels=bool(config.best_move_reward))
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
