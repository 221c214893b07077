"""RL training cost per episode: the path spa used before against the cheaper one, in one run.

Both configurations play the same episodes (``--env``, ``--groups`` x ``--samples`` per
step, ``--max-turns``, ``--max-actions``, the same training seeds, ``keep_fraction``
1.0, the same learning rates and minibatches) from the same starting weights, through
``spa.rl.ppo.train`` itself, which times its own phases:

* ``baseline``, the earlier default path: PPO with a critic, the ``world_model`` prompt,
  200 new tokens per turn, state text in the policy loss, flat groups trained, advantages
  not whitened;
* ``spa``, by default (the flags below change it): GRPO's loss with per-turn Monte-Carlo
  advantages (``--advantage mc``, random continuations; no critic), the plain ``base``
  think/answer prompt (the SPA release's PPO stage uses it after world-model SFT), 64 new
  tokens per turn, advantages not centred (so the malformed turns of a briefly trained model
  train); the other RL settings are ``PPOConfig``'s defaults.

Each runs ``1 + --steps`` RL steps; the first is a warm-up (allocator, kernels, the
engine's packing) and is left out of every average. Per configuration the JSON gives
episodes per hour (episodes per step / mean step seconds), generated and trained tokens
per step, and seconds per phase: rollout, old log-probs (always 0: spa trains against
the sampler's own log-probs, no recompute pass), look-ahead (the Monte-Carlo continuations of
``advantage=mc``; ``lookahead_share`` is its share of the step), advantages (the critic's
value pass and GAE; GRPO only normalises scores in groups), actor update, critic update, and the rest of
the step (group filter, building the training turns). ``speedup`` = spa episodes per hour
/ baseline episodes per hour. Checkpoints are not written (``save_checkpoint`` is made a
no-op here): how often a run saves is a choice of ``save_every``, not a per-episode cost,
and ``charts/step_seconds`` never included it.

The start matters: a model that never writes the answer format generates to the token
cap, every group scores the same and nothing is trained. So by default the benchmark
first builds a format-bootstrapped checkpoint, as ``spa run`` does (random-exploration
turns, one SFT epoch), from ``--bootstrap-episodes`` episodes in *each* of the
``world_model`` and ``base`` modes, so that both configurations start from a model that
writes their format. It is cached under ``$SPA_HOME/bench/`` (keyed by the model, a
version string and the bootstrap settings) and reused (delete the folder to rebuild it).
For SmolLM2-135M on the 2-core machines, an estimate from the SFT and RL throughputs
(not measured here): building the bootstrap about 5-15 minutes, once; then 4 baseline
steps at about 150-180 s each and 4 much cheaper spa steps. ``--model PATH
--no-bootstrap`` uses a checkpoint as it is (e.g. a world-model SFT checkpoint of
``spa run``).

    python bench/rl_step.py                              # SmolLM2-135M, 3 timed steps each
    python bench/rl_step.py --steps 5 --threads 2        # longer, pinned threads
    python bench/rl_step.py --model runs/x/sft/epoch-2 --no-bootstrap   # a given checkpoint
    python bench/rl_step.py --algorithm ppo              # spa side: PPO in base mode, 64 tokens
    python bench/rl_step.py --only spa --mode world_model --max-new-tokens 128
    python bench/rl_step.py --spa-set minibatch_size=32 --baseline-set micro_batch_size=8
    python bench/rl_step.py --model tiny --steps 1 --groups 2 --samples 2 --max-turns 1 \\
        --bootstrap-episodes 2                           # smoke run (seconds)

The precision is ``auto`` unless ``--dtype`` says otherwise (bf16 where the device computes
it natively, fp32 elsewhere; ``spa.precision``); it is the RL compute precision (and the
bootstrap SFT's). ``--device`` is ``auto`` by default: the GPU where there is one, else the
CPU (``spa.compute``). On a GPU each configuration also gives its peak GPU memory
(``torch.cuda.max_memory_allocated`` from its model's load to the end of its steps: weights,
optimizer states, the critic where there is one, activations) and the JSON names the GPU.
The machine may be shared: compare the two configurations of one run, not figures of runs
at different times. Prints one JSON object (progress goes to stderr).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import platform
import re
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from spa import config as config_
from spa import precision
from spa.agent.prompts import MODES, PromptConfig
from spa.agent.rollout import RolloutConfig
from spa.compute import resolve_device
from spa.io import atomic_dir, write_json
from spa.models import load_model
from spa.models.loading import spa_home
from spa.rl import ppo
from spa.rl.config import ALGORITHMS, PPOConfig

#: Part of the bootstrap cache key: bump it when the bootstrap recipe below changes.
BOOTSTRAP_VERSION = "rl_step-bootstrap-v1"

#: The earlier default RL path (its numbers in docs/rl.md: about 350 episodes per hour).
BASELINE = {"algorithm": "ppo", "mode": "world_model", "max_new_tokens": 200, "state_tokens_in_loss": True,
            "drop_flat_groups": False, "whiten_advantages": False}

PHASES = {"rollout": "time/rollout_s", "old_logprobs": None, "lookahead": "time/lookahead_s",
          "advantages": "time/advantages_s", "actor_update": "time/actor_s", "critic_update": "time/critic_s"}


def log(message: str) -> None:
    print(f"[rl_step] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- the starting model


def bootstrap_key(args) -> str:
    """The cache folder's name: the model, the version and a hash of what shapes the weights."""
    settings = {"version": BOOTSTRAP_VERSION, "model": args.model, "env": args.env,
                "episodes": args.bootstrap_episodes, "max_turns": args.max_turns,
                "max_actions": args.max_actions, "seed": args.seed,
                # the precision the bootstrap SFT ran in, on the device it ran on (the same key
                # as before on a CPU)
                "dtype": precision.resolve(args.dtype, args.device).name}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", args.model).strip("_")[-60:] or "model"
    return f"{slug}-{BOOTSTRAP_VERSION}-{digest}"


def bootstrap(args) -> dict:
    """A format-bootstrapped checkpoint (built once, then cached): one SFT epoch on
    random-exploration turns in both the world_model and the base prompt modes."""
    from spa.worldmodel.selfplay import SelfPlayConfig, build_examples, collect
    from spa.worldmodel.sft import SFTConfig, last_checkpoint
    from spa.worldmodel.sft import train as train_sft

    folder = spa_home() / "bench" / bootstrap_key(args)
    info = {"kind": "bootstrap", "path": str(folder), "version": BOOTSTRAP_VERSION,
            "episodes_per_mode": args.bootstrap_episodes, "modes": ["world_model", "base"], "sft_epochs": 1}
    if (folder / "bootstrap.json").is_file():
        return {**info, **json.loads((folder / "bootstrap.json").read_text()), "cached": True}
    log(f"building the format bootstrap of {args.model} into {folder} (once)")
    began = time.perf_counter()
    examples, turns = [], 0
    for offset, mode in enumerate(("world_model", "base")):
        sp = SelfPlayConfig(env=args.env, episodes=args.bootstrap_episodes, samples=1,
                            seed_start=offset * args.bootstrap_episodes, max_turns=args.max_turns,
                            max_actions_per_turn=args.max_actions, exploration="random", seed=args.seed, mode=mode)
        made, stats = build_examples(collect(None, None, sp), sp)
        examples += made
        turns += stats["turns"]
    model, tokenizer = load_model(args.model, dtype="fp32", device=args.device)
    # no held-out split: the benchmark needs the format, not a validation score
    sft = SFTConfig(epochs=1, val_fraction=0.0, precision=args.dtype, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="rl_step-bootstrap-") as tmp:
        history = train_sft(model, tokenizer, examples, sft, tmp, progress=False)
        checkpoint = last_checkpoint(Path(tmp))
        record = {"examples": len(examples), "turns": turns, "train_loss": round(history[-1]["train_loss"], 4),
                  "build_seconds": round(time.perf_counter() - began, 1)}
        with atomic_dir(folder) as out:  # the weights and tokenizer, not the optimizer state
            for item in checkpoint.iterdir():
                if item.name != "trainer_state.pt" and item.is_file():
                    shutil.copy2(item, out / item.name)
            write_json(out / "bootstrap.json", record)
    del model
    gc.collect()
    return {**info, **record, "cached": False}


# ---------------------------------------------------------------------- one configuration


def rl_config(args, settings: dict, overrides: list[str]) -> PPOConfig:
    data = {"algorithm": settings["algorithm"], "max_new_tokens": settings["max_new_tokens"],
            "steps": 1 + args.steps, "groups": args.groups, "samples": args.samples, "keep_fraction": 1.0,
            "actor_lr": args.actor_lr, "critic_lr": args.critic_lr, "minibatch_size": args.minibatch_size,
            "micro_batch_size": args.micro_batch_size, "precision": args.dtype, "tensorboard": False,
            "eval_every": 0, "save_every": 1 + args.steps, "seed": args.seed}
    data.update({k: settings[k] for k in ("advantage", "state_tokens_in_loss", "drop_flat_groups",
                                          "whiten_advantages", "mc_center") if k in settings})
    return config_.load(PPOConfig, data, overrides)


def mean(values) -> float:
    values = list(values)
    return statistics.fmean(values) if values else 0.0


def measure(name: str, start: str, mode: str, config: PPOConfig, args) -> dict:
    """Run ``1 + steps`` RL steps of one configuration; averages over the steps after the first."""
    on_gpu = args.device.type == "cuda"
    if on_gpu:  # this configuration's own peak, not the one run before it
        torch.cuda.reset_peak_memory_stats(args.device)
    model, tokenizer = load_model(start, dtype="fp32", device=args.device)
    rollout_config = RolloutConfig(args.env, {}, PromptConfig(mode, args.max_turns, args.max_actions,
                                                              history_turns=0))
    log(f"{name}: {config.algorithm}, {mode} mode, {config.max_new_tokens} new tokens, {config.steps} steps")
    with tempfile.TemporaryDirectory(prefix=f"rl_step-{name}-") as out:
        history = ppo.train(model, tokenizer, rollout_config, config, out, progress=False)
    del model
    gc.collect()
    timed = history[1:]
    episodes = config.groups * config.samples
    step_s = mean(h["charts/step_seconds"] for h in timed)
    phases = {phase: 0.0 if key is None else mean(h.get(key, 0.0) for h in timed) for phase, key in PHASES.items()}
    phases["other"] = step_s - sum(phases.values())
    generated = [h["rollout/response_length"] * h["rollout/turns"] * episodes for h in timed]
    # the step's prompt + response tokens of its training turns (train() logs them as a rate)
    trained = [h["charts/train_tokens_per_second"] * (h["charts/step_seconds"] - h["charts/rollout_seconds"])
               if h["charts/train_turns"] else 0.0 for h in timed]
    result = {
        "settings": {"algorithm": config.algorithm, "mode": mode, "max_new_tokens": config.max_new_tokens,
                     "state_tokens_in_loss": config.state_tokens_in_loss,
                     "drop_flat_groups": config.drop_flat_groups, "whiten_advantages": config.whiten_advantages,
                     "minibatch_size": config.minibatch_size, "micro_batch_size": config.micro_batch_size,
                     "actor_lr": config.actor_lr, "critic_lr": config.critic_lr, "critic": config.uses_critic,
                     "advantage": config.advantage, "mc_rollouts": config.mc_rollouts},
        "episodes_per_hour": round(episodes * 3600 / step_s, 1),
        "step_seconds": round(step_s, 2),
        "phases_s": {k: round(v, 4) for k, v in phases.items()},
        "lookahead_share": round(phases["lookahead"] / step_s, 4) if step_s else 0.0,
        "generated_tokens_per_step": round(mean(generated)),
        "generated_tokens_per_episode": round(mean(generated) / episodes, 1),
        "trained_tokens_per_step": round(mean(trained)),
        "train_turns_per_step": round(mean(h["charts/train_turns"] for h in timed), 1),
        "updated_steps": sum(1 for h in timed if h["charts/kept_groups"]),
        "kept_groups": round(mean(h["charts/kept_groups"] for h in timed), 2),
        "response_length": round(mean(h["rollout/response_length"] for h in timed), 1),
        "turns_per_episode": round(mean(h["rollout/turns"] for h in timed), 2),
        "rollout_success": round(mean(h["rollout/success"] for h in timed), 3),
        "format_valid": round(mean(h["rollout/format_valid"] for h in timed), 3),
        "warmup_step_seconds": round(history[0]["charts/step_seconds"], 2),
        "per_step_seconds": [round(h["charts/step_seconds"], 2) for h in timed],
        "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated(args.device) / 2**30, 3) if on_gpu else None,
    }
    if result["updated_steps"] < len(timed):
        result["note"] = (f"{len(timed) - result['updated_steps']} of {len(timed)} timed steps trained nothing "
                          "(every group flat): their update phases are 0, so this side looks cheaper than it is")
    log(f"{name}: {result['episodes_per_hour']} episodes/hour ({step_s:.1f} s per step of {episodes})")
    return result


# ---------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--no-bootstrap", action="store_true",
                        help="start RL from --model as it is (no format bootstrap)")
    parser.add_argument("--bootstrap-episodes", type=int, default=64,
                        help="random-exploration episodes per prompt mode for the bootstrap SFT (default 64)")
    parser.add_argument("--dtype", default="auto", help="compute precision: auto (default), bf16, fp16 or fp32")
    parser.add_argument("--device", default="auto", help="auto (default: the GPU where there is one), cpu or cuda")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--env", default="frozenlake")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=5)
    parser.add_argument("--max-actions", type=int, default=3, help="actions per turn")
    parser.add_argument("--steps", type=int, default=3, help="timed RL steps per configuration (+1 warm-up)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--actor-lr", type=float, default=1e-5, help="both sides (the quick preset's)")
    parser.add_argument("--critic-lr", type=float, default=1e-4, help="where there is a critic")
    parser.add_argument("--minibatch-size", type=int, default=16, help="turns per optimizer step")
    parser.add_argument("--micro-batch-size", type=int, default=4, help="turns per forward/backward")
    parser.add_argument("--algorithm", default="grpo", choices=ALGORITHMS, help="spa side (default grpo)")
    parser.add_argument("--advantage", default="mc", help="spa side's advantage estimator (default mc: "
                        "per-turn Monte-Carlo advantages, random continuations)")
    parser.add_argument("--mode", default="base", choices=MODES, help="spa side's prompt mode (default base)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="spa side, per turn (default 64)")
    parser.add_argument("--spa-set", action="append", default=[], metavar="KEY=VALUE",
                        help="any other PPOConfig field of the spa side (repeatable)")
    parser.add_argument("--baseline-set", action="append", default=[], metavar="KEY=VALUE",
                        help="any PPOConfig field of the baseline (repeatable)")
    parser.add_argument("--only", choices=("spa", "baseline"), help="run one configuration (no speedup)")
    args = parser.parse_args()
    if args.steps < 1 or args.bootstrap_episodes < 1:
        parser.error("--steps and --bootstrap-episodes must be at least 1")

    if args.threads:
        torch.set_num_threads(args.threads)
    args.device = resolve_device(args.device)
    compute = precision.decide(args.dtype, args.device)
    ppo.save_checkpoint = lambda *a, **k: None  # checkpoints are no per-episode cost (docstring)

    start = {"kind": "given", "path": args.model} if args.no_bootstrap else bootstrap(args)
    # Uncentred: a bench's short-trained model writes mostly malformed turns, all worth the same
    # penalty, which centring would set to 0 (and a turn at 0 does not train): nothing to time.
    spa_settings = {"algorithm": args.algorithm, "mode": args.mode, "max_new_tokens": args.max_new_tokens,
                    "advantage": args.advantage, "mc_center": False}
    runs = {"baseline": (BASELINE, args.baseline_set), "spa": (spa_settings, args.spa_set)}
    configs = {name: rl_config(args, settings, overrides) for name, (settings, overrides) in runs.items()}
    results = {}
    for name, (settings, _) in runs.items():
        if args.only in (None, name):
            results[name] = measure(name, start["path"], settings["mode"], configs[name], args)

    speedup = None
    if len(results) == 2:
        speedup = round(results["spa"]["episodes_per_hour"] / results["baseline"]["episodes_per_hour"], 2)
    notes = [f"{name}: {r['note']}" for name, r in results.items() if "note" in r]
    print(json.dumps({
        "benchmark": "rl_step",
        "model": args.model,
        "start": start,
        "dtype": compute.name,
        "dtype_reason": compute.reason,
        "device": str(args.device),
        "gpu": torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else None,
        "cpu_capability": precision.cpu_capability(),
        "cpu_native_bf16": precision.cpu_has_native_bf16(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "episodes": {"env": args.env, "groups": args.groups, "samples": args.samples,
                     "per_step": args.groups * args.samples, "max_turns": args.max_turns,
                     "max_actions_per_turn": args.max_actions, "keep_fraction": 1.0, "seed": args.seed},
        "steps": {"warmup": 1, "timed": args.steps},
        "phases_note": ("seconds per step, means over the timed steps; old_logprobs is 0 by construction: "
                        "spa trains against the sampler's own log-probs (no recompute pass); advantages is "
                        "the critic's value pass + GAE (PPO), the group normalisation (GRPO) or the scaling (mc); "
                        "lookahead is the Monte-Carlo continuations (mc); other is the "
                        "group filter and building the training turns; checkpoints are not written"),
        "tokens_note": ("generated: response tokens of every turn of the step's episodes; trained: prompt + "
                        "response tokens of the turns the update ran on (the kept groups')"),
        "configs": results,
        "speedup": speedup,
        "warnings": notes,
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }, indent=2))


if __name__ == "__main__":
    main()
