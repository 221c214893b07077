"""``spa run``: the stages of a recipe into ``runs/NAME/``, resumable at any point.

Stages, in order (the SPA-only ones are skipped for the baselines):

    bootstrap   random-exploration data + SFT that teaches the format (optional; every method, in the
                world-model prompt for spa, rwml and vagen, in its RL prompt for vanilla and
                state_estimation)
    selfplay    world-model self-play with ground-truth replacement (spa)
    sft         world-model SFT on the self-play data (spa)
    bridge      a format bridge when RL's prompt mode is not world_model (spa with prompt.mode=base
                or state): random-exploration turns in the RL mode, so the SFT'd model writes that
                mode's answers with actions of its own instead of copying the prompt's example
    eval_base   the base model, before any training
    eval_bootstrap
                the format-bootstrap checkpoint where RL starts from it (vanilla, state_estimation,
                vagen with a bootstrap): the "before RL" model of those methods
    eval_sft    the SFT checkpoint, after the bridge when there is one (spa)
    rwml        RWML: GRPO of the policy as a world model (rwml, rwml+ppo)
    eval_rwml   the RWML checkpoint as an agent (rwml+ppo)
    rl          PPO / GRPO from the SFT or RWML checkpoint, else the bootstrap one, else the base model;
                with ``rl: iterate``, expert iteration from there, every round evaluated like eval_final
    eval_final  the last model: the RL policy (the RWML one for rwml)
    report      report.md and plots

``runs/NAME/stages.json`` records each finished stage (outputs and wall time, summed over
the processes that ran it: :mod:`spa.pipeline.clock`), written atomically after the
stage; running the same command again skips finished stages and resumes an interrupted
SFT (last resume point, at most 10 minutes back), play or evaluation (last finished turn)
or RL stage (last checkpoint). The resolved recipe is saved as ``config.yaml``; a rerun
with a different recipe is refused.

Under a launcher (``accelerate launch``, ``torchrun``: several processes) every process
runs ``spa run`` and the main one alone writes the run folder (each process keeps its own
log of the turns it plays there while it plays). The data-parallel stages (the fine-tuning
of bootstrap, sft and bridge, and ``rl`` with PPO/GRPO) train on every process
(:mod:`spa.distributed`); the model's self-play and the evaluations (the eval stages and
PPO's evaluations inside rl) are split by level over the processes, the main process
summarising and writing them (:mod:`spa.agent.sharding`); the rest (the random-exploration
data, RWML, expert iteration, the report) runs on the main process while the others wait
for its result. What the processes must agree on comes from the main process: the finished
stages, each stage's outputs and where a stage resumes. ``stages.json`` records each
stage's ``world_size``.

Once a training stage is recorded as finished, its checkpoints lose their trainer state
(``trainer_state.pt``: optimizer, scheduler, the RL critic), unless the recipe sets
``keep_optimizer: true``; weights, tokenizer, data and metrics stay. Only the stage itself
ever reads that file, to resume, and a finished stage is skipped; a later stage starts
from the earlier one's weights alone. Without the file, ``last_checkpoint`` and
``resume_point`` do not see the folder, so a stage redone by hand starts afresh.
"""

from __future__ import annotations

import json
import shutil
from contextlib import nullcontext
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Callable

from spa import distributed, heap
from spa.agent.prompts import PromptConfig
from spa.agent.rollout import RolloutConfig
from spa.agent.sharding import Played, finish_log, own_log
from spa.agent.turnlog import TurnLog
from spa.compute import Compute, decide
from spa.config import read_yaml, save, to_dict, with_defaults
from spa.eval.evaluate import EvalConfig, evaluate
from spa.io import drop_trainer_states, write_json, write_jsonl
from spa.models import load_model
from spa.models.engine import Engine
from spa.pipeline.clock import StageClock
from spa.pipeline.layout import BEFORE_RL, eval_dir
from spa.pipeline.recipe import RESULT_NEUTRAL_KEYS, Recipe
from spa.pipeline.report import write_report
from spa.rl import expert_iteration, rwml_train
from spa.rl.logger import MetricsLogger
from spa.rl.ppo import resume_point
from spa.rl.ppo import train as train_rl
from spa.rl.rewards import vagen_turn_reward
from spa.worldmodel.selfplay import SelfPlayConfig, build_examples, collect_by_level
from spa.worldmodel.sft import last_checkpoint, load_examples, resume_model
from spa.worldmodel.sft import train as train_sft

#: Training stages: each writes its checkpoints into the run folder's subfolder of its name.
CHECKPOINT_STAGES = ("bootstrap", "sft", "bridge", "rwml", "rl")

#: Stages that run on every process: the data-parallel training and the play split by
#: level; the others run on the main process alone.
EVERY_PROCESS = ("bootstrap", "selfplay", "sft", "bridge", "eval_base", "eval_bootstrap", "eval_sft", "eval_rwml",
                 "eval_final")

STAGES = ("bootstrap", "selfplay", "sft", "bridge", "eval_base", "eval_bootstrap", "eval_sft", "rwml", "eval_rwml",
          "rl", "eval_final", "report")
METHOD_STAGES = {
    # With selfplay.bootstrap_episodes > 0 every method starts from a format bootstrap, in
    # its own RL prompt mode for vanilla and state_estimation (short reasoning + actions),
    # evaluated as the model RL starts from.
    "vanilla": {"bootstrap", "eval_base", "eval_bootstrap", "rl", "eval_final", "report"},
    "state_estimation": {"bootstrap", "eval_base", "eval_bootstrap", "rl", "eval_final", "report"},
    # vagen's turn rewards are paid only for well-formed world-model turns, which a small
    # base model never writes: like rwml it starts from the format bootstrap when there is one.
    "vagen": {"bootstrap", "eval_base", "eval_bootstrap", "rl", "eval_final", "report"},
    "spa": {"bootstrap", "selfplay", "sft", "bridge", "eval_base", "eval_sft", "rl", "eval_final", "report"},
    "rwml": {"bootstrap", "eval_base", "rwml", "eval_final", "report"},
    "rwml+ppo": {"bootstrap", "eval_base", "rwml", "eval_rwml", "rl", "eval_final", "report"},
}


class Run:
    """A run folder and its record of finished stages.

    The recipe's device and precision are decided once, here (:func:`spa.compute.decide`:
    a bad device is a ValueError before any stage runs); every stage loads its models on
    that device and computes in that precision, or in its own where it sets one.
    Under a launcher only the main process reads and writes the folder and logs (module
    docstring).
    """

    def __init__(self, recipe: Recipe, folder: str | Path, log: Callable[[str], None] = print):
        self.recipe, self.dir = recipe, Path(folder)
        # Before the process group starts (below): under a launcher it picks CPU or GPU processes.
        self.compute = decide(recipe.device, recipe.precision)
        self.world_size = distributed.world()[1]
        self.log = log if distributed.is_main() else _quiet
        self.stages: dict = distributed.on_main(self._open)

    def _open(self) -> dict:
        """Create or check the run folder; the stages finished so far."""
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "config.yaml"
        if config.exists():
            # Keys a newer version added are not in the saved file and read as their defaults.
            saved = with_defaults(Recipe, _stage_seeds_as_used(read_yaml(config)))
            changed = sorted(_diff(saved, to_dict(self.recipe)) - set(RESULT_NEUTRAL_KEYS))
            if changed:
                raise ValueError(f"{self.dir} holds a run of another recipe (differs in: {', '.join(changed)}); "
                                 "choose another run name or delete the folder")
        else:
            save(self.recipe, config)
        path = self.dir / "stages.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def stage_list(self) -> list[str]:
        keep = set(METHOD_STAGES[self.recipe.method])
        if not self.recipe.selfplay.bootstrap_episodes:
            keep -= {"bootstrap", "eval_bootstrap"}
        if not self.recipe.bridged:
            keep.discard("bridge")
        if not self.recipe.eval.base:
            keep.discard("eval_base")
        return [s for s in STAGES if s in keep]

    def run(self, until: str | None = None) -> dict:
        """Run the stages not finished yet, in order; ``until`` stops after that stage."""
        stages = self.stage_list()
        if until is not None:
            if until not in stages:
                raise ValueError(f"stage {until!r} is not a stage of method {self.recipe.method!r}; "
                                 f"valid: {', '.join(stages)}")
            stages = stages[: stages.index(until) + 1]
        # finished earlier: by a run that crashed before dropping, or an older version
        distributed.on_main(lambda: [self._drop_trainer_state(stage) for stage in self.stages])
        for stage in stages:
            if stage in self.stages:
                self.log(f"stage {stage}: done earlier, skipped")
                continue
            self.log(f"stage {stage}: running")
            # counts on across resumes; the main process's clock is the stage's
            with StageClock(self.dir / "clock.json", stage) if distributed.is_main() else nullcontext() as clock:
                outputs = self._run_stage(stage)
            self.stages[stage] = distributed.on_main(lambda: self._record(stage, outputs, clock.seconds()))
            heap.release()  # the stage's models and optimizer, back to the system (spa.heap)
            self.log(f"stage {stage}: finished in {self.stages[stage]['seconds']} s")
        return self.stages

    def _run_stage(self, stage: str) -> dict:
        """A stage's outputs, as the main process has them: a data-parallel or split stage
        runs on every process, the others on the main one alone (module docstring)."""
        fn = getattr(self, f"_{stage}")
        if stage in EVERY_PROCESS or (stage == "rl" and self.recipe.rl == "ppo"):
            return distributed.broadcast_value(fn())
        return distributed.on_main(fn)

    def _record(self, stage: str, outputs: dict, seconds: float) -> dict:
        """Record a finished stage in ``stages.json`` (main process), then drop its trainer state."""
        record = {"outputs": outputs, "seconds": round(seconds, 1), "world_size": self.world_size}
        write_json(self.dir / "stages.json", {**self.stages, stage: record})
        # After the record: a crash before it leaves the stage resumable, one after it a
        # file that the sweep at the start deletes on the next start.
        self._drop_trainer_state(stage)
        return record

    # ------------------------------------------------------------------ helpers

    def _drop_trainer_state(self, stage: str) -> None:
        """Delete a finished stage's trainer states (unless the recipe keeps them)."""
        if self.recipe.keep_optimizer or stage not in CHECKPOINT_STAGES:
            return
        freed = drop_trainer_states(self.dir / stage)
        if freed:
            self.log(f"stage {stage}: dropped its optimizer state ({freed / 1e9:.2f} GB; keep_optimizer: false)")

    def output(self, stage: str, key: str = "model"):
        return self.stages[stage]["outputs"][key]

    def start_model(self) -> str:
        """Where RL starts: the SFT checkpoint (spa; after the bridge when there is one), the
        RWML one (rwml+ppo), the format bootstrap (vagen), or the base model (vanilla,
        state_estimation)."""
        for stage in ("bridge", "sft", "rwml"):
            if stage in self.stages:
                return self.output(stage)
        return self.bootstrapped()

    def bootstrapped(self) -> str:
        """The format-bootstrap checkpoint when there is one, else the base model."""
        return self.output("bootstrap") if "bootstrap" in self.stages else self.recipe.model

    def stage_compute(self, stage) -> Compute:
        """A training stage's compute: the run's, in the stage's own precision where it sets one."""
        name = self.recipe.stage_precision(stage)
        return self.compute if name == self.recipe.precision else self.compute.with_precision(name)

    def load(self, model: str, master: bool = False):
        """``(model, tokenizer)`` on the run's device: in the run's precision to play, or fp32
        master weights (``master``) for a stage that trains them under autocast."""
        return load_model(model, dtype="fp32" if master else self.compute.dtype, device=self.compute.device)

    def prompt(self, mode: str) -> PromptConfig:
        p = self.recipe.prompt
        return PromptConfig(mode, p.max_turns, p.max_actions, history_turns=0)

    def _selfplay_data(self, model: str | None, out: Path, exploration: str, episodes: int, samples: int,
                       mode: str = "world_model", exploration_actions: int = 0) -> dict:
        """Play data into ``out`` (every process calls it): the model's self-play split by level
        over the processes, random exploration on the main process (``collect_by_level``)."""
        r = self.recipe
        s = r.selfplay
        config = SelfPlayConfig(env=r.env.name, env_config=dict(r.env.options), episodes=episodes, samples=samples,
                                max_turns=r.prompt.max_turns, max_actions_per_turn=r.prompt.max_actions,
                                max_new_tokens=s.max_new_tokens, states=s.states, exploration=exploration,
                                coords=s.coords, seed=r.stage_seed(s), mode=mode,
                                exploration_actions=exploration_actions, engine_batch=s.engine_batch)
        engine = tokenizer = None
        if exploration == "self_play":
            lm, tokenizer = self.load(model)
            engine = Engine(lm, tokenizer, max_batch_size=config.engine_batch)
        # an interrupted play resumes from its last turn
        with TurnLog(own_log(out.with_suffix(".partial.jsonl"))) as log:
            played = collect_by_level(engine, tokenizer, config, log=log)
        data = distributed.on_main(partial(_write_examples, played, config, out))
        finish_log(log)
        if not data["kept"]:
            raise RuntimeError(f"self-play kept no example ({data['malformed']} of {data['turns']} "
                               "turns malformed): the model cannot write the world-model format yet; set "
                               "selfplay.bootstrap_episodes > 0 for a format bootstrap")
        return data

    def _fine_tune(self, model: str, data: str, out: Path, epochs: int, **overrides) -> str:
        """Fine-tune ``model`` on ``data`` into ``out`` (on every process), from the main
        process's last resume point there."""
        final = out / f"epoch-{epochs}"
        # written atomically, so whole
        done, checkpoint = distributed.on_main(
            lambda: (final.is_dir(), last_checkpoint(out) if out.exists() else None))
        lm, tokenizer = resume_model(partial(self.load, master=True), model, checkpoint)
        config = replace(self.recipe.sft, epochs=epochs, seed=self.recipe.stage_seed(self.recipe.sft),
                         precision=self.recipe.stage_precision(self.recipe.sft), **overrides)
        if not done:
            train_sft(lm, tokenizer, load_examples(data), config, out, resume_from=checkpoint,
                      compute=self.stage_compute(self.recipe.sft))
        return str(final)

    def _eval_config(self, mode: str) -> EvalConfig:
        r = self.recipe
        return EvalConfig(r.env.name, dict(r.rl_env_options), self.prompt(mode), r.eval.num_envs, r.eval.samples,
                          r.eval.temperature, max_new_tokens=r.eval.max_new_tokens, seed=r.seed,
                          engine_batch=r.eval.engine_batch)

    def _evaluate(self, model: str, name: str) -> dict:
        """Evaluate ``model`` in the RL mode (and world_model mode when asked) into
        ``eval/NAME-MODE``; a mode whose ``metrics.json`` is there already (an interrupted
        stage, or one copied in from the RL stage) is read, not played again."""
        r = self.recipe
        lm = tokenizer = None
        results = {}
        modes = [r.rl_mode] + (["world_model"] if r.eval.world_model and r.rl_mode != "world_model" else [])
        for mode in modes:
            out = eval_dir(self.dir, f"eval_{name}", mode)
            metrics = distributed.on_main(partial(_saved_metrics, out))  # every process plays, or none
            if metrics is None:
                if lm is None:
                    lm, tokenizer = self.load(model)
                metrics = evaluate(lm, tokenizer, self._eval_config(mode), out, model_name=model)
            results[mode] = {"metrics": str(out / "metrics.json"), "success": metrics["success_rate"],
                             **metrics["pass_at_k"], "seconds": metrics["wall_seconds"]}
        return results

    # ------------------------------------------------------------------ stages

    def _bootstrap(self) -> dict:
        s = self.recipe.selfplay
        data = self._selfplay_data(None, self.dir / "data" / "bootstrap.jsonl", "random", s.bootstrap_episodes, 1,
                                   mode=self.recipe.bootstrap_mode, exploration_actions=s.bootstrap_actions)
        model = self._fine_tune(self.recipe.model, data["data"], self.dir / "bootstrap", s.bootstrap_epochs)
        return {**data, "model": model}

    def _selfplay(self) -> dict:
        s = self.recipe.selfplay
        return self._selfplay_data(self.bootstrapped(), self.dir / "data" / "selfplay.jsonl", s.exploration,
                                   s.episodes, s.samples)

    def _sft(self) -> dict:
        model = self._fine_tune(self.bootstrapped(), self.output("selfplay", "data"), self.dir / "sft",
                                self.recipe.sft.epochs)
        return {"model": model, "history": json.loads((self.dir / "sft" / "metrics.json").read_text())["epochs"]}

    def _bridge(self) -> dict:
        # Without it the SFT'd model meets the RL prompt for the first time at RL: SmolLM2-135M
        # then answers a third of its turns with the format example's actions
        # (docs/making-rl-learn.md, "The learn preset on FrozenLake"). No held-out split: the
        # targets are random actions.
        s = self.recipe.selfplay
        data = self._selfplay_data(None, self.dir / "data" / "bridge.jsonl", "random", s.bootstrap_episodes, 1,
                                   mode=self.recipe.rl_mode, exploration_actions=s.bootstrap_actions)
        model = self._fine_tune(self.output("sft"), data["data"], self.dir / "bridge", s.bootstrap_epochs,
                                val_fraction=0.0)
        return {**data, "model": model}

    def _eval_base(self) -> dict:
        return self._evaluate(self.recipe.model, "base")

    def _eval_bootstrap(self) -> dict:
        return self._evaluate(self.output("bootstrap"), "bootstrap")

    def _eval_sft(self) -> dict:
        return self._evaluate(self.output("bridge" if "bridge" in self.stages else "sft"), "sft")

    def _rwml(self) -> dict:
        r, out = self.recipe, self.dir / "rwml"
        checkpoint = resume_point(out)
        lm, tokenizer = self.load(str(checkpoint / "policy") if checkpoint else self.bootstrapped(), master=True)
        config = replace(r.rwml, seed=r.stage_seed(r.rwml), max_turns=r.prompt.max_turns,
                         max_actions_per_turn=r.prompt.max_actions,
                         precision=r.stage_precision(r.rwml))
        summary = rwml_train.run(lm, tokenizer, r.env.name, dict(r.env.options), config, out,
                                 resume=checkpoint is not None, log=self.log, compute=self.stage_compute(r.rwml))
        return {"model": str(out / "checkpoint" / "policy"), "summary": summary}

    def _eval_rwml(self) -> dict:
        return self._evaluate(self.output("rwml"), "rwml")

    def _rl(self) -> dict:
        if self.recipe.rl == "iterate":
            return self._iterate()
        r = self.recipe
        out = self.dir / "rl"
        checkpoint = distributed.on_main(partial(resume_point, out))
        lm, tokenizer = self.load(str(checkpoint / "policy") if checkpoint else self.start_model(), master=True)
        rollout_config = RolloutConfig(r.env.name, dict(r.rl_env_options), self.prompt(r.rl_mode))
        config = replace(r.ppo, seed=r.stage_seed(r.ppo), precision=r.stage_precision(r.ppo))
        probe = EvalConfig(r.env.name, dict(r.rl_env_options), self.prompt(r.rl_mode),
                           num_envs=max(1, r.eval.num_envs // 4), samples=r.eval.samples,
                           max_new_tokens=r.eval.max_new_tokens, seed=r.seed, engine_batch=r.eval.engine_batch)

        compute = self.stage_compute(r.ppo)

        def evaluate_fn(policy, step: int) -> dict:
            return evaluate(policy, tokenizer, probe, out / "eval" / f"step-{step}", progress=False,
                            dtype=compute.decode_dtype)

        turn_reward = None
        if r.method == "vagen":
            turn_reward = partial(vagen_turn_reward, beta_s=r.vagen.beta_s, beta_w=r.vagen.beta_w,
                                  format_reward=r.vagen.format_reward)
        train_rl(lm, tokenizer, rollout_config, config, out, evaluate_fn=evaluate_fn, resume_from=checkpoint,
                 turn_reward=turn_reward, compute=compute)
        return {"model": str(out / "checkpoint" / "policy"), "metrics": str(out / "metrics.jsonl"),
                "start": self.start_model()}

    def _iterate(self) -> dict:
        r, out = self.recipe, self.dir / "rl"
        config = r.iterate.config(r.stage_seed(r.iterate), r.stage_precision(r.sft))
        rollout = RolloutConfig(r.env.name, dict(r.rl_env_options), self.prompt(r.rl_mode))
        eval_config = self._eval_config(r.rl_mode)
        start = out / "round-0" / "eval"
        evaluated = next((s for s in BEFORE_RL if s in self.stages), None)
        if evaluated and not (start / "metrics.json").is_file():  # the same model on the same levels
            shutil.copytree(eval_dir(self.dir, evaluated, r.rl_mode), start, dirs_exist_ok=True)

        def evaluate_fn(lm, tokenizer, folder: Path) -> dict:
            return evaluate(lm, tokenizer, eval_config, folder, model_name=f"rl/{folder.parent.name}",
                            dtype=self.compute.decode_dtype, label=f"{folder.parent.name} eval")

        logger = MetricsLogger(out, resume_step=-1, tensorboard=False)  # a resumed run reports every round again
        rounds = expert_iteration.run(self.start_model(), partial(self.load, master=True), config, rollout, out,
                                      evaluate=evaluate_fn, on_round=lambda record: self._log_round(logger, record),
                                      compute=self.stage_compute(r.sft))
        logger.close()
        return {"model": rounds[-1]["model"], "metrics": str(out / "metrics.jsonl"), "start": self.start_model(),
                "rounds": str(out / "rounds.json"), "final_eval": str(out / f"round-{config.rounds}" / "eval")}

    def _log_round(self, logger: MetricsLogger, record: dict) -> None:
        """A round of expert iteration as a line of ``rl/metrics.jsonl`` (the round is the step),
        in the names of PPO's log, so that the report tables and plots it alike."""
        metrics = {}
        if "kept" in record:
            metrics.update({"rollout/success": record["play_success"], "iterate/kept": record["kept"],
                            "iterate/turns": record["turns"]})
        if record.get("eval_best_first") is not None:
            metrics["eval/best_first"] = record["eval_best_first"]
        for name, value in record.get("eval", {}).items():
            metrics[f"eval/{name}"] = value
            if name in record.get("eval_ci95", {}):
                metrics[f"eval/{name}_lo"], metrics[f"eval/{name}_hi"] = record["eval_ci95"][name]
        logger.log(record["round"], metrics)
        self.log(f"stage rl: {expert_iteration.describe_round(record)}")

    def _eval_final(self) -> dict:
        if self.recipe.rl == "iterate":  # never with rwml, the one method without an rl stage
            # The last round was evaluated on these levels with these settings already.
            done = Path(self.output("rl", "final_eval"))
            distributed.on_main(partial(shutil.copytree, done, eval_dir(self.dir, "eval_final", self.recipe.rl_mode),
                                        dirs_exist_ok=True))
        return self._evaluate(self.output("rl" if "rl" in self.stage_list() else "rwml"), "final")

    def _report(self) -> dict:
        return {"report": str(write_report(self.dir))}


def _saved_metrics(out: Path) -> dict | None:
    """The metrics of an evaluation written into ``out`` already (None: not there)."""
    path = out / "metrics.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _write_examples(played: Played, config: SelfPlayConfig, out: Path) -> dict:
    """The SFT examples of a play written to ``out`` (and its counts beside it); the stage's
    record of them."""
    examples, stats = build_examples(played.trajectories, config)
    stats.update(played.by_process())
    write_jsonl(out, examples)
    write_json(out.with_suffix(".stats.json"), stats)
    return {"data": str(out), "kept": stats["kept"], "turns": stats["turns"],
            "malformed": stats["dropped_malformed"], "success_rate": stats["success_rate"]}


def _quiet(text: str) -> None:
    """The log of a process other than the main one: the main process says it once."""


def _stage_seeds_as_used(saved: dict) -> dict:
    """A saved recipe with its stage seeds as the run used them.

    Runs saved before stage seeds were honoured (their selfplay section has no ``seed``)
    ran every stage on the recipe's seed, whatever ``sft.seed``, ``ppo.seed`` or
    ``rwml.seed`` said: those read as unset (null, "the recipe's seed"), so such a run
    resumes under the same recipe and is refused under one that sets a stage seed.
    """
    if "seed" in (saved.get("selfplay") or {}):
        return saved
    return {**saved, **{k: {**saved[k], "seed": None} for k in ("sft", "ppo", "rwml")
                        if isinstance(saved.get(k), dict) and "seed" in saved[k]}}


def _diff(a: dict, b: dict, prefix: str = "") -> set[str]:
    """Dotted keys of ``a`` whose values differ in ``b``."""
    out = set()
    for k in a:
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            out |= _diff(x, y, f"{prefix}{k}.")
        elif x != y:
            out.add(f"{prefix}{k}")
    return out
