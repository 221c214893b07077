"""The RL stage's settings: :class:`PPOConfig`, read by the trainer (:mod:`spa.rl.ppo`),
the advantages (:mod:`spa.rl.advantages`) and the minibatches (:mod:`spa.rl.minibatches`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from spa import distributed
from spa import precision as precision_
from spa.envs.lookahead import VALUE_HORIZON
from spa.models.engine import DEFAULT_BATCH, check_batch
from spa.rl import core

ALGORITHMS = ("ppo", "grpo")
#: Advantage estimators by algorithm, the first the default. ``mc``: per-turn Monte-Carlo
#: advantages from copies of the environment (:mod:`spa.rl.montecarlo`), with either loss.
ESTIMATORS = {"ppo": ("gae", "turn_gae", "mc", "value"), "grpo": ("grpo", "grpo_no_std", "mc", "value")}
#: What advantage=value trains (spa.rl.montecarlo.label_advantages).
VALUE_OBJECTIVES = ("linear", "log", "state")
#: Which actions of a turn the value label judges (``PPOConfig.value_actions``).
VALUE_ACTIONS = ("first", "each")
#: The estimators that give each turn its own advantage from copies of the environment.
PER_TURN = ("mc", "value")
CONTINUATIONS = ("random", "policy")
#: Where the reward sits on the response tokens (:func:`spa.rl.advantages.place_rewards`).
REWARD_PLACEMENTS = ("episode", "turn")
#: The PPO critic's kinds (:mod:`spa.rl.critic`), the first the default.
CRITICS = ("copy", "head")


@dataclass
class PPOConfig:
    """Hyper-parameters of the RL stage (the paper's PPO settings by default)."""

    algorithm: str = field(default="ppo", metadata={"help": (
        "ppo (with a critic: GAE advantages) or grpo (no critic: each episode against its group's mean).")})
    advantage: str = field(default="", metadata={"help": (
        "ppo: gae | turn_gae | mc; grpo: grpo | grpo_no_std | mc; empty: the first. mc gives each turn "
        "A = Q(s, its played actions) - V(s), both the mean return of mc_rollouts continuations on copies "
        "of the environment at the turn's state (spa.rl.montecarlo); no critic is built, every group "
        "trains, and the advantages are divided by their root mean square over the step. value gives a "
        "turn 1 when its first action is among the best at its state by Monte-Carlo value (mc_rollouts "
        "random continuations of value_horizon actions for every legal action: the label the "
        "Monte-Carlo-value rounds keep, spa.agent.labels), else 0; then centred and scaled as mc.")})
    mc_continuation: str = field(default="random", metadata={"help": (
        "advantage=mc: who plays the continuations. random: uniformly random valid actions (no model "
        "call; Q and V of random play after the turn, slips drawn afresh); policy: the policy itself, "
        "sampled at the rollout temperature (VinePPO: A = r + V(s') - V(s), unbiased, costs "
        "mc_rollouts generations per turn).")})
    mc_center: bool = field(default=True, metadata={"help": (
        "advantage=mc or value: subtract the step's mean advantage (over all its turns: a turn whose raw value "
        "is 0, such as the value label's 0, then trains, pushed down) before the scaling, "
        "a baseline constant over the step, so unbiased. Off, the turns whose raw value is 0 are skipped. Without it a policy that plays worse than random "
        "(a negative mean) pushes every sampled token down on balance, its format tokens included: on 3x3 "
        "lakes the entropy rose from 0.06 to 0.19 and the format began to break within 9 steps.")})
    mc_rollouts: int = field(default=16, metadata={"help": (
        "advantage=mc: continuations per estimate (random: for Q and for V at every turn; policy: for V "
        "at every state); advantage=value: per legal action and state.")})
    value_horizon: int = field(default=VALUE_HORIZON, metadata={"help": (
        "advantage=value: actions per continuation, the first one included (the value rounds' 5).")})
    value_objective: str = field(default="linear", metadata={"help": (
        "advantage=value: linear trains the expected label (A = the label, 1 or 0), whose ascent "
        "takes a policy blind to the state to the one move best most often; log trains the sum over "
        "states of log pi(best | s), behaviour cloning's objective (A = label / p_s - 1, p_s the share "
        "of the step's turns at that state whose move was best; spa.rl.montecarlo.label_advantages); state "
        "trains the linear objective with a baseline of the state (A = the label - the share of the state's "
        "legal moves that are best), so every move that was not best where it was played is pushed down.")})
    value_actions: str = field(default="first", metadata={"help": (
        "advantage=value: first gives a turn's every token the label of its first action; each labels every "
        "played action at the state it was played in and gives each action's tokens its own advantage (the "
        "think text goes with the first action), so the later actions of a turn no longer ride on the first "
        "one's label (linear and state objectives; not with center_actions or train_turns).")})
    train_turns: int = field(default=0, metadata={"help": (
        "advantage=mc or value: train on this many turns a step (0: all), drawn with replacement with probability "
        "proportional to the size of their advantage, each given sign(A) x (times drawn) x the step's mean |A| "
        "(spa.rl.core.magnitude_draw): an unbiased estimate of the whole step's gradient at a fixed training "
        "cost, so a step can play many more episodes than it trains turns (a turn costs about 8x as much to "
        "train as to play). Split evenly over the processes.")})
    steps: int = field(default=1000, metadata={"help": "Training steps (paper: 1,000)."})
    groups: int = field(default=32, metadata={"help": (
        "Training levels per step, each a group of samples episodes (paper: 32).")})
    samples: int = field(default=8, metadata={"help": "Episodes per level: the group (paper: 8)."})
    keep_fraction: float = 0.25  # share of groups kept, highest reward std first (paper: 0.25)
    drop_flat_groups: bool = field(default=True, metadata={"help": (
        "Leave out, of the keep_fraction groups with the highest reward std, those whose samples all "
        "scored the same (std <= 1e-8): they carry no signal, only critic error. A step left with no "
        "group skips the update (charts/kept_groups 0).")})
    reward: str = "episode"  # episode: total reward on the last token; turn: per-turn rewards
    actor_lr: float = 1e-6
    critic_lr: float = 1e-5
    critic: str = field(default="copy", metadata={"help": (
        "PPO's critic (spa.rl.critic). copy: a copy of the policy's decoder with a value head, trained "
        "apart (two decoders in memory). head: a value head alone on the policy's own decoder hidden "
        "states, detached, so the value loss never reaches the policy and critic_lr trains the head "
        "alone: one decoder in memory, but the head reads features trained for the policy, not for "
        "values. A checkpoint resumes only with the kind it was written with.")})
    warmup_steps: int = field(default=0, metadata={"help": (
        "Optimizer steps over which the actor's and critic's learning rates rise linearly to their "
        "values (0: none). Adam's first steps move every weight by about the full learning rate "
        "whatever the gradient's size, so a rate that is safe later can wreck the policy at once.")})
    target_kl: float = field(default=0.0, metadata={"help": (
        "Stop a step's actor updates before the first minibatch whose approx_kl to the policy that "
        "played the step exceeds this (0: never). Bounds each step's move whatever the learning rate: "
        "on 3x3 lakes lr 1e-4 reached approx_kl 0.05 by step 4 and broke the format at step 6 (0.68, "
        "then 3.4), where 2e-5 moved the policy too little (about 5e-4 a step).")})
    gamma: float = 1.0
    lam: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float = 3.0
    value_clip: float = 0.5
    entropy_coef: float = 1e-3
    kl_coef: float = 0.0  # > 0 loads a frozen reference model
    kl_estimator: str = field(default="k3", metadata={"help": (
        "kl_coef > 0: the per-token KL to the reference. k1, k2, k3, abs: estimates from the sampled "
        "tokens' log-probs (spa.rl.core.kl_penalty); full: the exact sum over the vocabulary "
        "(spa.rl.core.exact_kl), which also pulls back a move the policy no longer samples while the "
        "reference still plays it (costs the reference's full logits per micro-batch).")})
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
        "baseline, so a biased gradient, and not a method of the paper. Applied after whitening; with "
        "advantage=mc or value the mean covers every turn of the step, those whose raw value is 0 included.")})
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
    eval_every: int = field(default=0, metadata={"help": (
        "Evaluate every N steps (and at the start and end); 0: never.")})
    save_every: int = 10  # checkpoint every N steps (and at the end)
    precision: str = field(default="auto", metadata={"help": precision_.FIELD_HELP})
    tensorboard: bool = True
    seed: int = 0
    engine_batch: int = field(default=DEFAULT_BATCH, metadata={"help": (
        "Prompts the generation engine decodes together (>= 1; spa.models.engine.DEFAULT_BATCH). A GPU "
        "wants more: on an H100 with SmolLM2-135M, 256 gave about 4.4x the tokens/s of 64. Seeded samples "
        "differ between batch sizes.")})
    gradient_checkpointing: bool = field(default=False, metadata={"help": (
        "Recompute each layer's activations in the backward pass instead of keeping them (the policy's "
        "and the critic's): much less activation memory for about a third more compute "
        "(spa.models.recompute).")})
    parallel: str = field(default="ddp", metadata={"help": distributed.PARALLEL_HELP + (
        " fsdp trains no critic (grpo, or advantage mc or value); with kl_coef > 0 each process also holds "
        "the whole reference model.")})

    RENAMED_KEYS: ClassVar[dict] = dict([precision_.RENAMED_BF16])

    def __post_init__(self) -> None:
        self.precision = precision_.check(self.precision)
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm {self.algorithm!r} is not known; valid: {', '.join(ALGORITHMS)}")
        self.advantage = self.advantage or ESTIMATORS[self.algorithm][0]
        if self.advantage not in ESTIMATORS[self.algorithm]:
            raise ValueError(f"advantage {self.advantage!r} does not go with {self.algorithm}; valid: "
                             f"{', '.join(ESTIMATORS[self.algorithm])}")
        if self.value_objective not in VALUE_OBJECTIVES:
            raise ValueError(f"value_objective {self.value_objective!r} is not known; valid: "
                             f"{', '.join(VALUE_OBJECTIVES)}")
        if self.value_actions not in VALUE_ACTIONS:
            raise ValueError(f"value_actions {self.value_actions!r} is not known; valid: {', '.join(VALUE_ACTIONS)}")
        if self.value_actions == "each" and (self.advantage != "value" or self.value_objective == "log"
                                             or self.center_actions or self.train_turns):
            raise ValueError("value_actions=each needs advantage=value with value_objective linear or state, "
                             "and neither center_actions nor train_turns (they read one advantage per turn)")
        if self.mc_continuation not in CONTINUATIONS:
            raise ValueError(f"mc_continuation {self.mc_continuation!r} is not known; valid: "
                             f"{', '.join(CONTINUATIONS)}")
        if self.critic not in CRITICS:
            raise ValueError(f"critic {self.critic!r} is not known; valid: {', '.join(CRITICS)}")
        distributed.check_strategy(self.parallel)
        if self.parallel == "fsdp" and self.uses_critic:
            raise ValueError("parallel=fsdp trains no critic: it does not go with algorithm=ppo with "
                             f"advantage={self.advantage}, whose critic is built from a copy of the policy after "
                             "wrapping, and FSDP's sharded modules cannot be copied; use grpo or advantage=mc or "
                             "value, or parallel=ddp")
        if self.train_turns and self.advantage not in PER_TURN:
            raise ValueError("train_turns needs advantage=mc or value: it draws turns by their own advantage, "
                             "and the other estimators give every turn of an episode (or a token) its own share "
                             "of one score")
        if self.advantage in PER_TURN and self.balance_episodes:
            raise ValueError(f"balance_episodes does not go with advantage={self.advantage}: per-turn advantages "
                             "need no episode weights, and scaling a turn by its episode's length biases the gradient")
        check_batch(self.engine_batch)
        core.get({**core.KL_ESTIMATORS, core.EXACT_KL: None}, self.kl_estimator, "KL estimator")
        core.get(core.AGGREGATIONS, self.aggregation, "aggregation")
        checks = {"steps": self.steps >= 1, "groups": self.groups >= 1, "samples": self.samples >= 1,
                  "keep_fraction": 0 < self.keep_fraction <= 1, "ppo_epochs": self.ppo_epochs >= 1,
                  "minibatch_size": self.minibatch_size >= 1, "micro_batch_size": self.micro_batch_size >= 1,
                  "save_every": self.save_every >= 1, "eval_every": self.eval_every >= 0,
                  "warmup_steps": self.warmup_steps >= 0, "mc_rollouts": self.mc_rollouts >= 1,
                  "value_horizon": self.value_horizon >= 1,
                  "target_kl": self.target_kl >= 0, "train_turns": self.train_turns >= 0,
                  "negative_weight": 0 <= self.negative_weight <= 1,
                  "reward": self.reward in REWARD_PLACEMENTS, "temperature": self.temperature > 0}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} is out of range")

    @property
    def uses_critic(self) -> bool:
        """Whether the trainer builds and trains a critic: PPO with a GAE estimator."""
        return self.algorithm == "ppo" and self.advantage not in PER_TURN
