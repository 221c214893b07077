"""The RWML stage: train the policy as a world model with GRPO (Yu et al., 2026, seed 003).

RWML (Reinforcement World Model Learning) in three parts:

1. Data (``spa.rl.rwml.collect_triplets``): play training seeds, with the policy (the
   paper) or with random valid actions, turn the turns into ``<s_<=t, a_t, s_t+1>``
   triplets and subsample the "too easy" ones: those a filter model (the policy at the
   start, by default; ``sampling_predictor`` here) already predicts in all K samples
   (kept with p = 0.1).
2. GRPO (``train``), per step, top to bottom: a batch of triplets; ``group_size`` sampled
   predictions per triplet; the sim-to-real reward of each (default: RWML's binary
   ``1[1 - cos(E(pred), E(true)) < tau]``); group-normalised advantages on the
   prediction's tokens; the PPO clipped update of ``spa.rl.ppo.update_actor``; log,
   evaluate, checkpoint.
3. Evaluation (``prediction_accuracy``): greedy next-state prediction on held-out
   triplets from the evaluation seeds: exact match, per-cell accuracy, embedding-reward
   rate, and the share of copies. ``run`` does all three and compares the accuracy
   before and after training.

Paper settings (DESIGN.md): group size 8, lr 1e-6, keep easy triplets with p = 0.1. The
seed document gives no batch size, step count or clip values; ours are the PPO stage's
(clip 0.2 / 0.28, dual clip 3, entropy 1e-3, one epoch). Departures, each said where it
is made: triplets from malformed turns are kept (``require_format``), duplicate triplets
are dropped (``dedupe``), groups whose rewards are all equal are left out of the update
(``skip_flat_groups``), and the default filter distance is the deterministic grid
matcher rather than the embedding.

A run is resumable exactly like ``spa.rl.ppo.train``: ``out/checkpoint`` holds the policy
and the optimizer after the last saved step, and the batch, the sampling and the
minibatch order of a step depend only on (seed, step).
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from spa import distributed, interrupt
from spa.agent.grids import aligned_cells, exact_match, grid_cells, split_state, state_match
from spa.compute import Compute, for_model
from spa.io import TRAINER_STATE, write_json, write_jsonl
from spa.models import load_model
from spa.models.device import model_device
from spa.models.embedding import SentenceEmbedder
from spa.models.engine import Engine, Generation, SamplingParams
from spa.progress import Bar
from spa.rl import core
from spa.rl.batch import Sample
from spa.rl.logger import MetricsLogger
from spa.rl.minibatches import local_table
from spa.rl.config import PPOConfig
from spa.rl.ppo import resume_point, save_checkpoint, update_actor
from spa.rl.rewards import (EMBEDDING_TAU, extract_prediction, get_reward, prediction_cell_reward,
                            prediction_embedding_reward, prediction_exact_reward)
from spa.rl.rwml import (Triplet, collect_triplets, eval_triplets, fingerprint, load_triplets, prompt_ids,
                         save_triplets)
from spa.rl.rwml_config import RWMLConfig

#: Generation stops once the prediction block is closed: nothing after it is scored.
STOP = "</prediction>"


# ---------------------------------------------------------------------------- the filter model


def sampling_predictor(engine, tokenizer, max_new_tokens: int, temperature: float = 1.0, seed: int = 0):
    """``predict(triplets, k)`` for ``filter_too_easy``: k sampled predictions per triplet
    (extracted with ``extract_prediction``; ``None`` where the block is missing)."""
    def predict(triplets: list[Triplet], k: int) -> list[list[str | None]]:
        prompts = [prompt_ids(tokenizer, t) for t in triplets]
        sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, stop=(STOP,), seed=seed)
        generations = engine.generate([p for p in prompts for _ in range(k)], sampling)
        predictions = [extract_prediction(g.text) for g in generations]
        return [predictions[i * k:(i + 1) * k] for i in range(len(triplets))]
    return predict


# ---------------------------------------------------------------------------- evaluation


def is_copy(prediction: str, state_before: str) -> bool:
    """Whether ``prediction``'s grid is the grid before the actions, cell for cell.

    Grids only: a copy followed by other text (a second ``<prediction>`` holding the
    actions, say) is still a copy, and the coordinate lines add nothing the grid lacks.
    """
    grid = split_state(state_before)[0]
    return aligned_cells(split_state(prediction)[0], grid) == grid_cells(grid)


def _mean(values) -> float:
    values = list(values)
    return float(np.mean(values)) if values else 0.0


def prediction_accuracy(model, tokenizer, triplets: list[Triplet], *, max_new_tokens: int = 200,
                        embedder=None, tau: float = EMBEDDING_TAU, engine=None, compute: Compute | None = None,
                        records: str | Path | None = None) -> dict:
    """Greedy next-state prediction accuracy of ``model`` on ``triplets``.

    One greedy prediction per triplet (the RWML prompt, stop at ``</prediction>``), scored
    against the true next state: ``exact`` (``prediction_exact_reward``), ``cell`` (per-cell
    accuracy of the grid), ``state_match`` (grid + coordinates, ``spa.agent.grids``),
    ``embedding`` (rate of RWML's reward 1, only with an ``embedder``), ``found`` (share
    with a prediction block), ``copied`` (share whose grid repeats the grid before the
    actions, ``is_copy``: the trivial wrong answer) and ``changed_exact`` (``exact`` over the triplets
    whose actions change the state, ``changed`` of them: there a copy scores 0, so this
    is the rate of transitions actually predicted). ``records``: a JSONL file of every
    prediction. ``compute``: the precision the engine decodes in (None: ``auto`` on the
    model's device).
    """
    if not triplets:
        raise ValueError("prediction_accuracy needs at least one triplet")
    if engine is None:
        engine = Engine(model, tokenizer, dtype=(compute or for_model(model)).decode_dtype)
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop=(STOP,))
    generations = engine.generate([prompt_ids(tokenizer, t) for t in triplets], sampling)
    texts = [g.text for g in generations]
    targets = [t.next_state for t in triplets]
    predictions = [extract_prediction(text) for text in texts]
    exact = prediction_exact_reward(texts, targets=targets)
    cell = prediction_cell_reward(texts, targets=targets)
    match = [state_match(p, target) for p, target in zip(predictions, targets)]
    copied = [p is not None and is_copy(p, t.state_before) for p, t in zip(predictions, triplets)]
    changed = [i for i, t in enumerate(triplets) if not exact_match(t.next_state, t.state_before)]
    metrics = {"triplets": len(triplets), "exact": _mean(exact), "cell": _mean(cell), "state_match": _mean(match),
               "found": _mean(p is not None for p in predictions), "copied": _mean(copied),
               "changed": len(changed), "changed_exact": _mean(exact[i] for i in changed),
               "response_length": _mean(len(g.token_ids) for g in generations)}
    embedding = None
    if embedder is not None:
        embedding = prediction_embedding_reward(texts, targets=targets, embedder=embedder, tau=tau)
        metrics.update(embedding=_mean(embedding), tau=tau)
    if records is not None:
        write_jsonl(records, [{"seed": t.seed, "turn": t.turn, "actions": t.actions,
                               "state_before": t.state_before, "next_state": t.next_state, "response": text,
                               "exact": exact[i], "cell": cell[i],
                               **({"embedding": embedding[i]} if embedding is not None else {})}
                              for i, (t, text) in enumerate(zip(triplets, texts))])
    return metrics


# ---------------------------------------------------------------------------- GRPO pieces


def batch_indices(n: int, batch_size: int, step: int, seed: int) -> list[int]:
    """Indices of step ``step``'s triplets: positions ``step*B .. step*B+B-1`` of an endless
    stream in which epoch ``e`` is a permutation of ``range(n)`` seeded by (seed, e). Every
    triplet is seen once per epoch, and a step depends only on (seed, step)."""
    if n < 1:
        raise ValueError("no triplets to train on")
    positions = range(step * batch_size, (step + 1) * batch_size)
    orders = {e: np.random.default_rng([seed, e]).permutation(n) for e in {p // n for p in positions}}
    return [int(orders[p // n][p % n]) for p in positions]


def grpo_samples(prompts: list[list[int]], generations: list[Generation], rewards: list[float], group_size: int,
                 *, normalize_std: bool = True, skip_flat: bool = True) -> list[Sample]:
    """GRPO training sequences: one ``Sample`` per non-empty completion.

    ``generations`` holds ``group_size`` completions of each prompt, consecutively. The
    advantage of completion i of group g is ``(r_i - mean_g) / std_g`` (``normalize_std``,
    GRPO) or ``r_i - mean_g``, broadcast on the completion's tokens; the prompt gets none
    (``Sample.start``). A group whose rewards are all equal has advantage exactly 0 (set
    here: ``core.group_advantages`` leaves float noise of up to ~0.1 for a repeated
    non-dyadic score such as 29/36); with ``skip_flat`` its completions are left out.
    """
    if len(generations) != len(prompts) * group_size or len(rewards) != len(generations):
        raise ValueError(f"need {group_size} generations and rewards per prompt for {len(prompts)} prompts; "
                         f"got {len(generations)} generations and {len(rewards)} rewards")
    scores = torch.tensor(rewards, dtype=torch.float32)
    groups = torch.arange(len(prompts)).repeat_interleave(group_size)
    advantages = core.group_advantages(scores, groups, normalize_std).tolist()
    flat = [len(set(rewards[g * group_size:(g + 1) * group_size])) == 1 for g in range(len(prompts))]
    samples = []
    for i, (generation, advantage) in enumerate(zip(generations, advantages)):
        g = i // group_size
        if not generation.token_ids or (skip_flat and flat[g]):
            continue
        n = len(generation.token_ids)
        samples.append(Sample(list(prompts[g]) + list(generation.token_ids), len(prompts[g]),
                              torch.tensor(generation.logprobs, dtype=torch.float32), episode=g,
                              turn=i % group_size, advantages=torch.full((n,), 0.0 if flat[g] else advantage)))
    return samples


def update_policy(policy, optimizer, samples: list[Sample], actor: PPOConfig, pad_id: int, autocast,
                  rng: np.random.Generator) -> dict:
    """The RL stage's PPO clipped update (``spa.rl.ppo.update_actor``, no reference model).

    ``update_actor`` also takes the step's table of samples, its data-parallel bookkeeping
    (which process holds which sample); RWML runs on one process, which holds them all,
    in the order (group, sample) that a single process would have.
    """
    if distributed.world()[1] > 1:
        raise RuntimeError("the RWML stage runs on a single process; launch it without accelerate/torchrun")
    return update_actor(policy, None, optimizer, samples, local_table(samples, actor.aggregation), actor, pad_id,
                        autocast, rng)


def score(completions: list[str], targets: list[str], befores: list[str], config: RWMLConfig,
          embedder=None) -> list[float]:
    """The configured reward (``spa.rl.rewards``) of every completion, given its true next
    state and the state before its actions."""
    return get_reward(config.reward)(completions, targets=targets, befores=befores, embedder=embedder,
                                     tau=config.tau, binary=config.binary)


def load_embedder(config: RWMLConfig, required: bool, device: str | torch.device = "auto"):
    """The sentence embedder of the reward (``required``) or of the evaluation (optional:
    ``None`` when the packaged model is not installed), on ``device``."""
    try:
        return SentenceEmbedder(config.embedding_model, device=device)
    except ModuleNotFoundError:
        if required:
            raise
        return None


# ---------------------------------------------------------------------------- the loop


def train(policy, tokenizer, triplets: list[Triplet], config: RWMLConfig, out: str | Path, *,
          evaluate_fn: Callable | None = None, resume_from: Path | None = None, progress: bool = True,
          engine=None, embedder=None, compute: Compute | None = None) -> list[dict]:
    """RWML's GRPO on ``triplets``; returns the per-step metrics (also ``out/metrics.jsonl``).

    ``evaluate_fn(policy, step) -> dict`` is called at the start (not on resume), every
    ``eval_every`` steps and at the end; its numeric entries are logged as ``eval/...``.
    ``resume_from`` is a checkpoint whose weights ``policy`` already holds. ``engine``
    replaces the generation engine (tests script it); ``embedder`` the reward's embedder
    (loaded from ``config.embedding_model`` when the reward needs one). ``compute``: the
    device and precision the caller decided (None: ``config.precision`` on the policy's
    device).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not triplets:
        raise ValueError("no triplets to train on: collect more episodes, or use exploration 'random'")
    torch.manual_seed(config.seed)
    compute = compute or for_model(policy, config.precision)
    autocast = compute.autocast(model_device(policy))
    actor = config.actor_config()
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=config.lr,
                                  weight_decay=0.0)
    data = fingerprint(triplets)
    start = 0
    if resume_from is not None:
        state = torch.load(Path(resume_from) / TRAINER_STATE, weights_only=False)
        if state.get("data", data) != data:
            raise ValueError(f"{resume_from} was trained on other triplets (fingerprint {state['data']}, "
                             f"now {data}); resume with the run's own triplets.jsonl")
        optimizer.load_state_dict(state["actor_opt"])
        start = state["step"]
    write_json(out / "config.json", {"rwml": asdict(config), "triplets": len(triplets), "data": data})
    logger = MetricsLogger(out, resume_step=start, tensorboard=config.tensorboard)
    if engine is None:
        engine = Engine(policy, tokenizer, max_batch_size=config.engine_batch, dtype=compute.decode_dtype)
    if embedder is None and config.reward == "embedding":
        embedder = load_embedder(config, required=True, device=compute.device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    G = config.group_size
    history = []
    if evaluate_fn is not None and start == 0:
        logger.log(0, _eval_entries(evaluate_fn(policy, 0)))
    with contextlib.closing(logger), Bar(disable=not progress) as bar, interrupt.graceful() as requests:
        task = bar.add_task("rwml", total=config.steps, completed=start, info="")
        for step in range(start, config.steps):
            began = time.perf_counter()
            # 1. A batch of triplets, fixed by (seed, step).
            batch = [triplets[i] for i in batch_indices(len(triplets), config.batch_size, step, config.seed)]
            prompts = [prompt_ids(tokenizer, t) for t in batch]
            # 2. Sample a group of predictions per triplet.
            sampling = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                                      top_p=config.top_p, stop=(STOP,), seed=config.seed * 1_000_003 + step)
            generations = engine.generate([p for p in prompts for _ in range(G)], sampling)
            generation_seconds = time.perf_counter() - began
            # 3. Score them against the true next states.
            texts = [g.text for g in generations]
            targets = [t.next_state for t in batch for _ in range(G)]
            befores = [t.state_before for t in batch for _ in range(G)]
            rewards = score(texts, targets, befores, config, embedder)
            # 4. Group-normalised advantages on the completion tokens.
            samples = grpo_samples(prompts, generations, rewards, G, normalize_std=config.advantage == "grpo",
                                   skip_flat=config.skip_flat_groups)
            # 5. The PPO clipped update (update_actor of the RL stage).
            updated = time.perf_counter()
            rng = np.random.default_rng([config.seed, step])
            metrics = prediction_metrics(generations, rewards, targets, G)
            metrics.update(update_policy(policy, optimizer, samples, actor, pad_id, autocast, rng))
            # 6. Log, evaluate, checkpoint.
            seconds = time.perf_counter() - began
            metrics.update({
                "charts/train_samples": len(samples), "charts/epoch": step * config.batch_size / len(triplets),
                "charts/generation_seconds": generation_seconds, "charts/step_seconds": seconds,
                "charts/generation_tokens_per_second":
                    sum(len(g.token_ids) for g in generations) / max(generation_seconds, 1e-9),
                "charts/train_tokens_per_second":
                    sum(len(s.ids) for s in samples) / max(time.perf_counter() - updated, 1e-9)})
            done = step + 1
            periodic = config.eval_every and done % config.eval_every == 0
            if evaluate_fn is not None and (periodic or done == config.steps):
                metrics.update(_eval_entries(evaluate_fn(policy, done)))
            logger.log(done, metrics)
            history.append({"step": done, **metrics})
            stop, save_now = requests.take()
            if stop or save_now or done % config.save_every == 0 or done == config.steps:
                # spa.rl.ppo's layout, so resume_point finds it; the data fingerprint guards resume
                save_checkpoint(out, done, policy, tokenizer, None, optimizer, None, extra={"data": data})
            if stop:
                raise interrupt.stopped(f"step {done} of {config.steps} is saved in {out / 'checkpoint'}")
            bar.update(task, completed=done, info=f"reward {metrics['rollout/reward_mean']:.2f}  "
                                                  f"exact {metrics['rollout/exact']:.0%}")
    return history


def prediction_metrics(generations: list[Generation], rewards: list[float], targets: list[str],
                       group_size: int) -> dict:
    """Reward statistics of a step's groups, and what the predictions look like."""
    groups = [rewards[i:i + group_size] for i in range(0, len(rewards), group_size)]
    texts = [g.text for g in generations]
    return {"rollout/reward_mean": _mean(rewards), "rollout/reward_std": float(np.std(rewards)),
            "rollout/flat_groups": _mean(len(set(g)) == 1 for g in groups),
            "rollout/exact": _mean(prediction_exact_reward(texts, targets=targets)),
            "rollout/prediction_found": _mean(extract_prediction(t) is not None for t in texts),
            "rollout/truncated": _mean(g.finish_reason == "length" for g in generations),
            "rollout/response_length": _mean(len(g.token_ids) for g in generations)}


def _eval_entries(metrics: dict) -> dict:
    return {f"eval/{k}": v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


# ---------------------------------------------------------------------------- the stage


def run(policy, tokenizer, env: str, env_config: dict, config: RWMLConfig, out: str | Path, *,
        resume: bool = False, progress: bool = True, log: Callable[[str], None] = print,
        compute: Compute | None = None) -> dict:
    """The whole RWML stage in ``out``: data, held-out triplets, GRPO, accuracy before/after.

    Files: ``triplets.jsonl`` (+ ``.stats.json``), ``eval_triplets.jsonl``, ``eval/step-N.json``
    (+ ``.predictions.jsonl``), ``eval/summary.json`` (before, after, after - before), and
    ``train``'s ``metrics.jsonl``, ``config.json``, ``checkpoint/``. With ``resume`` the
    saved triplets are reused (the filter model was the policy *before* training) and
    training continues from ``out/checkpoint``, whose weights ``policy`` must hold.
    ``compute``: the device and precision the caller decided (None: ``config.precision`` on
    the policy's device); the filter model and the embedder load there too. Returns the
    summary.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = resume_point(out) if resume else None
    needs_embedding = config.reward == "embedding" or (config.filter and config.filter_distance == "embedding")
    compute = compute or for_model(policy, config.precision)
    embedder = load_embedder(config, required=needs_embedding, device=compute.device)
    dtype = compute.decode_dtype

    # 1. Training triplets, collected once per run.
    data_path = out / "triplets.jsonl"
    if resume and data_path.is_file():
        triplets = load_triplets(data_path)
        log(f"reusing {len(triplets)} triplets from {data_path}")
    else:
        if checkpoint is not None:
            log(f"{data_path} is missing: collecting with the checkpoint's policy")
        engine = Engine(policy, tokenizer, max_batch_size=config.engine_batch, dtype=dtype)
        predict = None
        if config.filter:
            filter_engine, filter_tokenizer = engine, tokenizer
            if config.filter_model:
                filter_lm, filter_tokenizer = load_model(config.filter_model, compute.dtype, compute.device)
                filter_engine = Engine(filter_lm, filter_tokenizer, max_batch_size=config.engine_batch)
            predict = sampling_predictor(filter_engine, filter_tokenizer, config.max_new_tokens,
                                         seed=config.seed + 1)
        triplets, stats = collect_triplets(env, env_config, config, engine, tokenizer, predict, embedder)
        save_triplets(data_path, triplets)
        write_json(data_path.with_suffix(".stats.json"), stats)
        log(f"{stats['triplets']} triplets from {stats['episodes']} episodes ({stats['exploration']}; "
            f"{stats['duplicates']} duplicates"
            + (f", {stats['filter']['dropped']} too easy dropped" if "filter" in stats else "") + ")")
    if not triplets:
        raise ValueError("no usable triplets: no turn applied a valid action; "
                         "use exploration 'random' or more episodes")

    # 2. Held-out triplets (random exploration of the evaluation seeds: model-independent).
    held_out = eval_triplets(env, env_config, config)
    if held_out:
        save_triplets(out / "eval_triplets.jsonl", held_out)

    def evaluate_fn(model, step: int) -> dict:
        folder = out / "eval"
        engine = Engine(model, tokenizer, max_batch_size=config.engine_batch, dtype=compute.decode_dtype)
        metrics = prediction_accuracy(model, tokenizer, held_out, max_new_tokens=config.max_new_tokens,
                                      embedder=embedder, tau=config.tau, engine=engine,
                                      records=folder / f"step-{step}.predictions.jsonl")
        write_json(folder / f"step-{step}.json", {"step": step, **metrics})
        return metrics

    # 3. GRPO, evaluated at the start and at the end.
    train(policy, tokenizer, triplets, config, out, evaluate_fn=evaluate_fn if held_out else None,
          resume_from=checkpoint, progress=progress, embedder=embedder, compute=compute)

    # 4. Next-state accuracy before and after.
    before, after = (_read(out / "eval" / f"step-{s}.json") for s in (0, config.steps))
    delta = {k: after[k] - before[k] for k in after if k in before and k not in ("step", "triplets", "tau")} \
        if before and after else {}
    summary = {"triplets": len(triplets), "eval_triplets": len(held_out), "before": before, "after": after,
               "delta": delta}
    write_json(out / "eval" / "summary.json", summary)
    return summary


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

