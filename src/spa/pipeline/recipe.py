"""Recipes: one typed config for a whole run (method x environment x budget).

A recipe YAML names the method and the environment; a preset (``learn``, the default:
a CPU budget in which RL can show a curve; ``quick``: a CPU smoke run of every stage;
``paper``: the paper's sizes) supplies the budget; ``key=value`` overrides change
anything. Unknown keys are errors (see :mod:`spa.config`).

Methods (the paper's comparison, Table 2):

* ``vanilla``: PPO from the base model with the ``base`` prompt (raw grid).
* ``state_estimation``: PPO from the base model with the ``state`` prompt (grid + coordinates).
* ``spa``: self-play in world-model mode -> ground-truth replacement -> world-model SFT ->
  PPO from the SFT checkpoint (the shipped recipes keep the world-model format in RL).

Baselines with a world model of their own:

* ``rwml``: RWML (the policy trained as a world model with GRPO on next-state
  predictions, embedding reward); ``rwml+ppo``: then PPO from the RWML checkpoint.
* ``vagen``: PPO in ``world_model`` mode whose turn rewards add a format reward and the
  match of ``<observation>`` / ``<prediction>`` with the true states (VAGEN-style
  online world modelling, deterministic grid matcher), with turn-level GAE. Under ``rl: iterate``
  the same reward is a loss mask: ``iterate.keep: best_grounded`` keeps the turns whose move
  a solver labels best, each own observation and prediction in the loss only where right.

The RL stage (``rl``): ``ppo`` (PPO or GRPO, the ``ppo`` section) or ``iterate``: expert
iteration (:mod:`spa.rl.expert_iteration`), rounds in which the policy plays fresh
training levels, the turns that pass the ``iterate.keep`` filter become SFT data and one
SFT epoch gives the next round's policy, each round evaluated like the final model. On
slippery 4x4 lakes it is the one RL stage measured to raise Pass@1 past random play, with
``keep: best``, a solver's per-turn label (docs/expert-iteration.md, "Expert iteration").

Seeds: the recipe's ``seed`` is the seed of every stage that does not set its own.
``selfplay.seed`` (self-play and format-bootstrap data), ``sft.seed`` (the bootstrap's and
the world-model SFT's data order and split), ``ppo.seed``, ``rwml.seed`` and ``iterate.seed`` default to
null, which means "the recipe's seed"; a number there wins (0 included). The evaluations
(fixed levels) sample with the recipe's seed, so runs that differ only in a stage seed
are evaluated alike. (Earlier versions silently overwrote every stage's seed with the
recipe's.)

With ``selfplay.bootstrap_episodes > 0`` (the ``learn`` and ``quick`` presets), every method first
fine-tunes on random-exploration turns so that the model can write the format: spa, rwml
and vagen in the world-model format, vanilla and state_estimation in their own prompt
mode (a short reasoning and the actions). The paper's base models write the format from
the start; SmolLM2-135M does not, and without the bootstrap plain RL gets no signal.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from spa import compute, precision
from spa.agent.keep import FILTERS, LABELLED, keep_help
from spa.config import load, read_yaml
from spa.models.engine import DEFAULT_BATCH, check_batch
from spa.models.loading import DEFAULT_MODEL
from spa.rl.expert_iteration import IterateConfig
from spa.rl.config import PPOConfig
from spa.rl.rwml_config import RWMLConfig
from spa.worldmodel.selfplay import check_value_settings
from spa.worldmodel.sft import SFTConfig

_ENGINE_BATCH_HELP = ("Prompts the generation engine decodes together (>= 1). A GPU wants more than the default: "
                      "on an H100 with SmolLM2-135M, 256 gave about 4.4x the tokens/s of 64. Seeded samples differ "
                      "between batch sizes.")

METHODS = ("vanilla", "state_estimation", "spa", "rwml", "rwml+ppo", "vagen")
RL_STAGES = ("ppo", "iterate")
RL_MODE = {"vanilla": "base", "state_estimation": "state", "vagen": "world_model"}
CONFIGS = Path(__file__).resolve().parents[3] / "configs"


@dataclass
class EnvSection:
    name: str = field(default="sokoban", metadata={"help": "Environment: sokoban, frozenlake, sudoku."})
    options: dict[str, Any] = field(default_factory=dict, metadata={"help": "Options of spa.envs.make."})
    rl_options: dict[str, Any] | None = field(
        default=None, metadata={"help": "Options for RL and evaluation when they differ from the world-model "
                                        "data's (easy-to-hard transfer: SFT on 4x4, RL on 6x6)."})


@dataclass
class PromptSection:
    mode: str = field(default="", metadata={"help": "Prompt mode of RL and evaluation; empty: the method's "
                                                    "(vanilla base, state_estimation state, spa state)."})
    max_turns: int = field(default=5, metadata={"help": "Turns per episode (paper: 5)."})
    max_actions: int = field(default=3, metadata={"help": "Actions per turn."})


@dataclass
class SelfPlaySection:
    episodes: int = field(default=1280, metadata={"help": "Self-play episodes (paper: 1,280)."})
    samples: int = field(default=8, metadata={"help": "Episodes per seed."})
    max_new_tokens: int = field(default=400, metadata={"help": "New-token cap per turn."})
    states: str = field(default="ground_truth", metadata={"help": "ground_truth or self_belief (ablation)."})
    exploration: str = field(default="self_play", metadata={"help": "self_play, random (ablation) or oracle."})
    coords: str = field(default="true", metadata={"help": "true or random (ablation)."})
    bootstrap_episodes: int = field(default=0, metadata={
        "help": "Format bootstrap: > 0 first fine-tunes on this many random-exploration episodes, so a "
                "model that cannot write the world-model format yet can self-play (a departure from the "
                "paper, needed by models as small as SmolLM2-135M)."})
    bootstrap_epochs: int = field(default=1, metadata={"help": "Epochs of the format bootstrap."})
    bootstrap_actions: int = field(default=0, metadata={
        "help": "Most actions a turn in the format bootstrap's and the bridge's random-exploration "
                "targets, drawn uniformly from 1 up to it; 0: up to prompt.max_actions. 1 teaches "
                "one-move answers."})
    bridge: bool = field(default=True, metadata={
        "help": "spa with RL in another prompt mode than world_model (prompt.mode=base or state): after SFT, "
                "fine-tune bootstrap_epochs on bootstrap_episodes random-exploration episodes in the RL mode, "
                "so the agent writes that mode's answers (needs bootstrap_episodes > 0)."})
    seed: int | None = field(default=None, metadata={
        "help": "Seed of the self-play and format-bootstrap data (sampling, random exploration); "
                "null: the recipe's seed."})
    engine_batch: int = field(default=DEFAULT_BATCH, metadata={"help": _ENGINE_BATCH_HELP})

    def __post_init__(self) -> None:
        check_batch(self.engine_batch)


#: Recipe keys a rerun of a run folder may change and replicates may differ in: they change
#: no result of any stage (``eval.base`` only whether the base model is evaluated too;
#: ``device`` only where the same computation runs, as ``auto`` on two machines does; a run
#: started on a GPU may go on on the CPU; ``spa.pipeline.run``, ``spa.pipeline.replicates``).
RESULT_NEUTRAL_KEYS = ("keep_optimizer", "eval.base", "device")

_STAGE_SEED_HELP = "Seed of this stage; null: the recipe's seed (a number here wins, 0 included)."


# The stage configs as recipe sections: the same fields, except that the seed may be left
# unset (null), so that the recipe can tell "derive it from the recipe's seed" from an
# explicit value. Standalone (spa sft, spa rl, spa rwml) a stage's seed is always a number.
@dataclass
class SFTSection(SFTConfig):
    seed: int | None = field(default=None, metadata={"help": _STAGE_SEED_HELP})


@dataclass
class PPOSection(PPOConfig):
    seed: int | None = field(default=None, metadata={"help": _STAGE_SEED_HELP})


@dataclass
class RWMLSection(RWMLConfig):
    seed: int | None = field(default=None, metadata={"help": _STAGE_SEED_HELP})


@dataclass
class IterateSection:
    """Expert iteration as the RL stage (``rl: iterate``): :class:`spa.rl.expert_iteration.IterateConfig`."""

    rounds: int = field(default=IterateConfig.rounds, metadata={
        "help": "Rounds of play, filter and one SFT epoch."})
    episodes: int = field(default=IterateConfig.episodes, metadata={
        "help": "Episodes played per round (a multiple of samples)."})
    samples: int = field(default=IterateConfig.samples, metadata={"help": "Episodes per training level."})
    keep: str = field(default=IterateConfig.keep, metadata={
        "help": "Turns trained on, by a label per turn: " + keep_help(LABELLED) + " Method vagen needs "
                "best_grounded."})
    value_rollouts: int = field(default=IterateConfig.value_rollouts, metadata={
        "help": "keep: value: random continuations per action and state."})
    value_horizon: int = field(default=IterateConfig.value_horizon, metadata={
        "help": "keep: value: actions per continuation, the first one included."})
    value_tolerance: float = field(default=IterateConfig.value_tolerance, metadata={
        "help": "keep: value: actions within this of the highest value count as best."})
    lr: float = field(default=SFTConfig.lr, metadata={"help": "Peak SFT learning rate of each round."})
    mask_states: bool = field(default=False, metadata={
        "help": "Leave the turns' own <observation> and <prediction> out of each round's SFT loss, so that "
                "only the reasoning and the answer are trained (world-model prompt; in the others a no-op)."})
    max_new_tokens: int = field(default=IterateConfig.max_new_tokens, metadata={
        "help": "New-token cap per turn while playing."})
    seed: int | None = field(default=None, metadata={
        "help": "Sampling seed of round 1 (round r uses seed + r - 1); null: the recipe's seed."})
    engine_batch: int = field(default=IterateConfig.engine_batch, metadata={"help": _ENGINE_BATCH_HELP})

    def __post_init__(self) -> None:
        self.config(seed=0)  # the same checks as spa iterate, at load time

    def config(self, seed: int, precision_name: str = "auto") -> IterateConfig:
        sft = replace(IterateConfig().sft, lr=self.lr, mask_states=self.mask_states, precision=precision_name)
        return IterateConfig(rounds=self.rounds, episodes=self.episodes, samples=self.samples, keep=self.keep,
                             value_rollouts=self.value_rollouts, value_horizon=self.value_horizon,
                             value_tolerance=self.value_tolerance, max_new_tokens=self.max_new_tokens, seed=seed,
                             sft=sft, engine_batch=self.engine_batch)


@dataclass
class EvalSection:
    num_envs: int = field(default=128, metadata={"help": "Evaluation seeds (paper: 128)."})
    samples: int = field(default=8, metadata={"help": "Samples per seed (paper: 8)."})
    max_new_tokens: int = field(default=400, metadata={"help": "New-token cap per turn."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (paper: 1)."})
    world_model: bool = field(default=True, metadata={
        "help": "Also evaluate the world-model accuracy (world_model mode) before and after."})
    base: bool = field(default=True, metadata={
        "help": "Evaluate the base model (stage eval_base); false leaves it out. SmolLM2-135M scores 0 in every "
                "mode (it never writes the answer format) and its answers run to the token cap, so this is "
                "the slowest evaluation of a run (15 min at 128 x 8 on one Zen 4 core)."})
    engine_batch: int = field(default=DEFAULT_BATCH, metadata={"help": _ENGINE_BATCH_HELP})

    def __post_init__(self) -> None:
        check_batch(self.engine_batch)


@dataclass
class VagenSection:
    beta_s: float = field(default=0.5, metadata={"help": "Weight of the observation match (VAGEN: 0.5)."})
    beta_w: float = field(default=0.5, metadata={"help": "Weight of the prediction match (VAGEN: 0.5)."})
    format_reward: float = field(default=0.5, metadata={"help": "Reward of a well-formed turn."})


@dataclass
class Recipe:
    method: str = field(default="spa", metadata={"help": f"One of {', '.join(METHODS)}."})
    model: str = field(default=DEFAULT_MODEL, metadata={"help": "Base model: built-in name, folder or hub id."})
    env: EnvSection = field(default_factory=EnvSection)
    prompt: PromptSection = field(default_factory=PromptSection)
    selfplay: SelfPlaySection = field(default_factory=SelfPlaySection)
    sft: SFTSection = field(default_factory=SFTSection)
    rl: str = field(default="ppo", metadata={
        "help": f"The RL stage: {' or '.join(RL_STAGES)}: PPO or GRPO (the ppo section), or expert iteration "
                "(the iterate section: rounds of play, keep the turns that pass a filter, one SFT epoch)."})
    ppo: PPOSection = field(default_factory=PPOSection)
    iterate: IterateSection = field(default_factory=IterateSection)
    rwml: RWMLSection = field(default_factory=RWMLSection)
    vagen: VagenSection = field(default_factory=VagenSection)
    eval: EvalSection = field(default_factory=EvalSection)
    seed: int = field(default=0, metadata={
        "help": "Seed of every stage whose own seed (selfplay.seed, sft.seed, ppo.seed, rwml.seed, "
                "iterate.seed) is null, and of every evaluation."})
    precision: str = field(default="auto", metadata={
        "help": precision.FIELD_HELP + " Every stage uses it, except one whose own precision (sft.precision, "
                                       "ppo.precision, rwml.precision) is set to other than auto."})
    device: str = field(default="auto", metadata={
        "help": compute.FIELD_HELP + " Every stage loads, trains and plays there, the RWML embedder included."})
    keep_optimizer: bool = field(default=False, metadata={
        "help": "Keep the optimizer state (and the RL critic) in the checkpoints of finished stages; false "
                "deletes it once a stage is recorded as finished, keeping weights, tokenizer and results. "
                "It only serves to resume a stage, and a finished stage is never resumed."})

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method {self.method!r} is not known; valid: {', '.join(METHODS)}")
        if self.rl not in RL_STAGES:
            raise ValueError(f"rl {self.rl!r} is not known; valid: {', '.join(RL_STAGES)}")
        if self.rl == "iterate" and self.method == "rwml":
            raise ValueError("rl: iterate does not apply to method 'rwml' (it has no RL stage); use rwml+ppo")
        if self.rl == "iterate" and self.method == "vagen" and self.iterate.keep != "best_grounded":
            raise ValueError(f"iterate.keep={self.iterate.keep!r} with method 'vagen': under rl: iterate, vagen's "
                             "reward for grounded states is the loss mask of iterate.keep: best_grounded")
        self.precision = precision.check(self.precision)
        self.device = compute.check_device(self.device)
        if not 0 <= self.selfplay.bootstrap_actions <= self.prompt.max_actions:
            raise ValueError(f"selfplay.bootstrap_actions={self.selfplay.bootstrap_actions} must be 0 (up to "
                             f"prompt.max_actions) or 1..{self.prompt.max_actions}")
        if self.prompt.mode and self.prompt.mode not in ("base", "state", "world_model"):
            raise ValueError(f"prompt.mode {self.prompt.mode!r} is not one of base, state, world_model")
        if self.rl == "iterate":  # spa iterate's checks of the label, at load time rather than after SFT
            label = FILTERS[self.iterate.keep]
            if self.rl_mode not in label.modes:
                prompts = " or ".join(mode.replace("_", "-") for mode in label.modes)
                raise ValueError(f"iterate.keep: {label.name} needs the {prompts} prompt in RL (prompt.mode "
                                 f"{self.rl_mode!r} {label.modes_why})")
            label.check_env(self.env.name)
            if label.signal == "value":
                check_value_settings(self.iterate.value_rollouts, self.iterate.value_horizon,
                                     self.iterate.value_tolerance)

    def stage_precision(self, stage: SFTConfig | PPOConfig | RWMLConfig) -> str:
        """A stage's own precision where it sets one, else the recipe's."""
        return self.precision if stage.precision == "auto" else stage.precision

    def stage_seed(self, stage: SelfPlaySection | SFTSection | PPOSection | RWMLSection | IterateSection) -> int:
        """A stage's own seed where it sets one, else the recipe's."""
        return self.seed if stage.seed is None else stage.seed

    @property
    def bootstrap_mode(self) -> str:
        """The prompt mode of the format bootstrap: the RL mode for the methods without a
        world model (vanilla, state_estimation), world_model for the others."""
        return self.rl_mode if self.method in ("vanilla", "state_estimation") else "world_model"

    @property
    def bridged(self) -> bool:
        """Whether a spa run bridges its world-model SFT to another RL prompt mode."""
        return (self.method == "spa" and self.rl_mode != "world_model" and self.selfplay.bridge
                and self.selfplay.bootstrap_episodes > 0)

    @property
    def rl_mode(self) -> str:
        return self.prompt.mode or RL_MODE.get(self.method, "state")

    @property
    def rl_env_options(self) -> dict[str, Any]:
        return self.env.options if self.env.rl_options is None else self.env.rl_options


def preset_path(name: str, recipe: str | Path | None = None) -> Path:
    """A preset by file path, or by name: ``presets/NAME.yaml`` beside the recipe, then in
    the project's ``configs/presets``. An unknown name lists the available ones."""
    if Path(name).suffix in (".yaml", ".yml"):
        if not Path(name).is_file():
            raise ValueError(f"preset file {name!r} does not exist")
        return Path(name)
    folders = ([Path(recipe).parent / "presets"] if recipe else []) + [CONFIGS / "presets"]
    for folder in folders:
        if (folder / f"{name}.yaml").is_file():
            return folder / f"{name}.yaml"
    known = sorted({p.stem for folder in folders for p in folder.glob("*.yaml")})
    raise ValueError(f"preset {name!r} is not known; valid: {', '.join(known) or '(none found)'}")


def load_recipe(path: str | Path, overrides: list[str] = (), preset: str | None = "learn") -> Recipe:
    """The recipe at ``path`` over the preset's budget, with ``key=value`` overrides."""
    base = read_yaml(preset_path(preset, path)) if preset else None
    return load(Recipe, path, list(overrides), base=base)
