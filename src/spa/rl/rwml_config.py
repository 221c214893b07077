"""The settings of the RWML stage (:class:`RWMLConfig`), apart from its data (:mod:`spa.rl.rwml`)
and its training loop (:mod:`spa.rl.rwml_train`), which both read them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from spa import precision as precision_
from spa.rl import core
from spa.rl.config import PPOConfig
from spa.models.engine import DEFAULT_BATCH
from spa.rl.rewards import EMBEDDING_TAU, get_reward
from spa.worldmodel.selfplay import EXPLORATION

FILTER_DISTANCES = ("state", "embedding")
ADVANTAGES = ("grpo", "grpo_no_std")


@dataclass
class RWMLConfig:
    """Hyper-parameters of the RWML stage: data, filter, GRPO and evaluation."""

    # -- data: rollouts -> triplets
    exploration: str = field(default="self_play", metadata={"help": (
        "Data: self_play (the policy plays, paper) or random (random valid actions; for models that "
        "rarely act).")})
    episodes: int = field(default=1280, metadata={"help": (
        "Data episodes, a multiple of samples (as SPA's self-play: 160 levels x 8).")})
    samples: int = field(default=8, metadata={"help": "Episodes per training level."})
    seed_start: int = 0  # first training seed
    max_turns: int = field(default=5, metadata={"help": "Turns per episode (one triplet per turn)."})
    max_actions_per_turn: int = field(default=3, metadata={"help": (
        "Actions per turn (one triplet per turn holds them all).")})
    rollout_max_new_tokens: int = 400  # new-token cap per self-play turn
    history_turns: int = 0  # earlier turns in the prompt: 0, the states are fully observable
    # A malformed turn's actions were still applied, so its transition is true: keep it
    # (the tiny default model rarely writes a well-formed turn). True drops it.
    require_format: bool = False
    # Identical triplets (same prompt, same next state) are kept once: they would fill a
    # batch with copies of one prompt. Slippery outcomes differ in next state and stay.
    dedupe: bool = True
    # -- the too-easy filter (paper: K samples all within tau -> keep with p = 0.1)
    filter: bool = field(default=True, metadata={"help": (
        "Subsample too-easy triplets (paper); costs K predictions per triplet.")})
    filter_model: str = field(default="", metadata={"help": (
        "Model of the too-easy filter; empty: the policy at the start.")})
    filter_k: int = 8  # predictions per triplet (paper: K; 8 = the group size)
    filter_distance: str = "state"  # state: 1 - state_match (deterministic) | embedding: 1 - cos
    filter_tau: float = 0.0  # 0: the distance's default (state 0.05, embedding: tau)
    filter_keep_prob: float = 0.1  # paper: 0.1
    # -- GRPO
    # steps: not in the seed document; about one pass over the default data at batch 32
    steps: int = field(default=100, metadata={"help": "GRPO steps."})
    batch_size: int = field(default=32, metadata={"help": (
        "Triplets per step, each a group of group_size predictions.")})
    group_size: int = field(default=8, metadata={"help": (
        "Predictions per triplet: the group whose rewards GRPO compares (paper: 8).")})
    reward: str = field(default="embedding", metadata={"help": (
        "embedding (paper: 1[1 - cos < tau]), exact, cell, or change (cell accuracy balanced over "
        "changed and kept cells: a copy scores 0.5).")})
    tau: float = field(default=EMBEDDING_TAU, metadata={"help": (
        "Cosine-distance threshold of the embedding reward (spa.rl.rewards).")})
    binary: bool = True  # embedding reward: 1[d < tau] (paper); False: the cosine (ablation)
    embedding_model: str = "all-minilm-l6-v2"  # E of the reward: the packaged model or a folder
    advantage: str = "grpo"  # grpo: (r - mean) / std | grpo_no_std: r - mean (Dr. GRPO)
    skip_flat_groups: bool = True  # groups with all-equal rewards have zero advantage: skip them
    lr: float = field(default=1e-6, metadata={"help": (
        "Learning rate (paper: 1e-6; CPU quick budgets need ~1e-5 to move in a few steps).")})
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float = 3.0
    entropy_coef: float = 1e-3
    aggregation: str = "token-mean"
    ppo_epochs: int = 1
    minibatch_size: int = 64  # completions per optimizer step (a step has batch x group)
    micro_batch_size: int = 8  # completions per forward/backward
    max_grad_norm: float = 1.0
    temperature: float = 1.0  # sampling of the group (paper: 1)
    top_p: float = 1.0
    max_new_tokens: int = 200  # per prediction: a state is ~45-70 tokens, the rest is for reasoning
    # -- evaluation, checkpoints
    eval_seeds: int = field(default=32, metadata={"help": (
        "Evaluation levels explored at random for next-state accuracy; 0: no evaluation.")})
    eval_every: int = field(default=0, metadata={"help": (
        "Also evaluate every N steps (the start and the end always are).")})
    save_every: int = 10  # checkpoint every N steps (and at the end)
    precision: str = field(default="auto", metadata={"help": precision_.FIELD_HELP})
    tensorboard: bool = True
    seed: int = 0
    engine_batch: int = DEFAULT_BATCH  # prompts the generation engine decodes together (spa.models.engine)

    RENAMED_KEYS: ClassVar[dict] = dict([precision_.RENAMED_BF16])

    def __post_init__(self) -> None:
        self.precision = precision_.check(self.precision)
        get_reward(self.reward)  # an unknown name lists the valid ones
        core.get(core.AGGREGATIONS, self.aggregation, "aggregation")
        choices = {"exploration": EXPLORATION, "filter_distance": FILTER_DISTANCES, "advantage": ADVANTAGES}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} is not known; valid: {', '.join(allowed)}")
        checks = {
            "episodes": self.episodes >= 1 and self.episodes % max(self.samples, 1) == 0,
            "samples": self.samples >= 1, "seed_start": self.seed_start >= 0,
            "max_turns": self.max_turns >= 1, "max_actions_per_turn": self.max_actions_per_turn >= 1,
            "rollout_max_new_tokens": self.rollout_max_new_tokens >= 1, "history_turns": self.history_turns >= 0,
            "filter_k": self.filter_k >= 1, "filter_tau": self.filter_tau >= 0,
            "filter_keep_prob": 0 <= self.filter_keep_prob <= 1, "steps": self.steps >= 1,
            "batch_size": self.batch_size >= 1, "group_size": self.group_size >= 2, "tau": self.tau > 0,
            "lr": self.lr >= 0, "dual_clip": self.dual_clip > 1, "ppo_epochs": self.ppo_epochs >= 1,
            "minibatch_size": self.minibatch_size >= 1, "micro_batch_size": self.micro_batch_size >= 1,
            "temperature": self.temperature > 0, "top_p": 0 < self.top_p <= 1,
            "max_new_tokens": self.max_new_tokens >= 1, "eval_seeds": self.eval_seeds >= 0,
            "eval_every": self.eval_every >= 0, "save_every": self.save_every >= 1,
            "engine_batch": self.engine_batch >= 1,
        }
        hints = {"episodes": f" (a positive multiple of samples={self.samples})",
                 "group_size": " (GRPO compares at least 2 predictions)", "temperature": " (GRPO samples)"}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} is out of range{hints.get(name, '')}")

    def actor_config(self) -> PPOConfig:
        """The ``PPOConfig`` that ``update_actor`` reads: clip, entropy, minibatches; no KL."""
        return PPOConfig(algorithm="grpo", advantage=self.advantage, actor_lr=self.lr, clip_low=self.clip_low,
                         clip_high=self.clip_high, dual_clip=self.dual_clip, entropy_coef=self.entropy_coef,
                         kl_coef=0.0, aggregation=self.aggregation, ppo_epochs=self.ppo_epochs,
                         minibatch_size=self.minibatch_size, micro_batch_size=self.micro_batch_size,
                         max_grad_norm=self.max_grad_norm, precision=self.precision, temperature=self.temperature,
                         tensorboard=False, seed=self.seed)
