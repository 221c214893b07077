"""Batched multi-turn rollouts: many environments side by side, one generation per turn.

Each turn, every unfinished episode contributes one prompt, and all of them are
generated in one batched call to the engine. The parsed actions are applied in order;
a turn with no valid action costs the format penalty. An episode ends when the
environment terminates or truncates, after ``max_turns`` turns, or once it has used
``max_actions`` actions.

Groups: ``samples`` episodes share each seed (the same level), which Pass@k and
PPO/GRPO groups need.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from spa.agent.parsing import parse_response
from spa.agent.prompts import PromptConfig, build_messages, state_block
from spa.agent.trajectory import Trajectory, Turn
from spa.agent.turnlog import TurnLog, fingerprint
from spa.envs import make
from spa.models.engine import Engine, SamplingParams


@dataclass
class RolloutConfig:
    """Everything a rollout needs besides the model and the seeds."""

    env: str = "sokoban"
    env_config: dict[str, Any] = field(default_factory=dict)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    max_actions: int | None = None  # actions per episode; None: max_turns x per-turn cap
    format_penalty: float = -0.1  # added to a turn that applied no valid action
    # Label each turn with the environment's solver (Turn.best_first, best_run: metrics). RL
    # from the task's reward turns it off, so that no solver is called on its path.
    solver_labels: bool = True


def rollout(
    engine: Engine,
    tokenizer,
    seeds: list[int],
    samples: int,
    config: RolloutConfig,
    sampling: SamplingParams,
    on_turn: Callable[[int, int], None] | None = None,
    log: TurnLog | None = None,
) -> list[Trajectory]:
    """Play ``samples`` episodes of every seed; returns them grouped by seed, in order.

    ``on_turn(turn, active)`` is called before each turn's generation (progress display).
    ``log`` writes every finished turn to disk; a log that already holds turns of this
    rollout is replayed first and play goes on from the next turn (:mod:`spa.agent.turnlog`).
    """
    prompt_cfg = config.prompt
    max_actions = config.max_actions or prompt_cfg.max_turns * prompt_cfg.max_actions_per_turn
    envs, trajectories = [], []
    for group, seed in enumerate(seeds):
        for sample in range(samples):
            env = make(config.env, **config.env_config)
            env.reset(seed=seed)
            envs.append(env)
            trajectories.append(
                Trajectory(config.env, dict(config.env_config), seed, group, sample, prompt_cfg.mode)
            )
    histories: list[list[tuple[str, str, float]]] = [[] for _ in envs]
    active = list(range(len(envs)))

    def record(i: int, shown: str, turn: Turn, done: bool) -> bool:
        """Add a played turn to episode i; whether the episode goes on."""
        trajectory = trajectories[i]
        trajectory.turns.append(turn)
        histories[i].append((shown, turn.response, turn.reward))
        trajectory.success = envs[i].is_success()
        trajectory.terminated = done
        return not done and trajectory.num_actions < max_actions

    start = 0
    if log is not None:
        settings = {"seeds": list(seeds), "samples": samples, "rollout": asdict(config),
                    "sampling": asdict(sampling), "dtype": str(engine.decode_dtype()),
                    "model": fingerprint(engine.model)}
        for start, saved in enumerate(log.open(settings), start=1):
            if [i for i, _ in saved] != active:
                raise RuntimeError(f"{log.path}: turn {start} does not hold the episodes that played it; "
                                   "delete the file to play from the start")
            active = [i for i, turn in saved if record(i, state_block(envs[i], prompt_cfg.mode),
                                                       *_replay(envs[i], turn, log.path))]
    for turn_index in range(start, prompt_cfg.max_turns):
        if not active:
            break
        if on_turn is not None:
            on_turn(turn_index, len(active))
        messages = [build_messages(envs[i], prompt_cfg, histories[i]) for i in active]
        prompt_ids = [_prompt_ids(tokenizer, m) for m in messages]
        generations = engine.generate(prompt_ids, sampling)
        still_active, played = [], []
        for i, msgs, ids, gen in zip(active, messages, prompt_ids, generations):
            budget = max_actions - trajectories[i].num_actions
            shown = state_block(envs[i], prompt_cfg.mode)
            turn, done = play_turn(envs[i], msgs, ids, gen, prompt_cfg, budget, config.format_penalty,
                                    config.solver_labels)
            played.append((i, turn))
            if record(i, shown, turn, done):
                still_active.append(i)
        if log is not None:
            log.append(played)
        active = still_active
    return trajectories


@dataclass
class Start:
    """A point to play on from: an environment in some state (a fork, played in place), the
    episode's earlier turns as ``(state shown, response, reward)`` and the actions it used."""

    env: Any
    history: list[tuple[str, str, float]]
    actions_used: int


def play_on(engine: Engine, tokenizer, starts: list[Start], config: RolloutConfig,
            sampling: SamplingParams) -> list[float]:
    """The return (rewards and format penalties) each start collects when the policy plays
    it on to the episode's end, under the episode's limits (turns, actions), all starts
    batched turn by turn. Monte-Carlo values from the policy's own continuations
    (:mod:`spa.rl.montecarlo`) use it."""
    prompt_cfg = config.prompt
    max_actions = config.max_actions or prompt_cfg.max_turns * prompt_cfg.max_actions_per_turn
    histories = [list(start.history) for start in starts]
    used = [start.actions_used for start in starts]
    returns = [0.0] * len(starts)

    def goes_on(i: int) -> bool:
        return len(histories[i]) < prompt_cfg.max_turns and used[i] < max_actions

    active = [i for i in range(len(starts)) if goes_on(i)]
    while active:
        messages = [build_messages(starts[i].env, prompt_cfg, histories[i]) for i in active]
        generations = engine.generate([_prompt_ids(tokenizer, m) for m in messages], sampling)
        still_active = []
        for i, msgs, gen in zip(active, messages, generations):
            env = starts[i].env
            shown = state_block(env, prompt_cfg.mode)
            turn, done = play_turn(env, msgs, [], gen, prompt_cfg, max_actions - used[i], config.format_penalty,
                                    solver_labels=False)
            returns[i] += turn.reward
            used[i] += len(turn.actions_valid)
            histories[i].append((shown, turn.response, turn.reward))
            if not done and goes_on(i):
                still_active.append(i)
        active = still_active
    return returns


def _prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return ids["input_ids"] if hasattr(ids, "keys") else list(ids)


def _replay(env, saved: dict, source) -> tuple[Turn, bool]:
    """Apply a saved turn's actions to ``env``; the turn and whether the episode ended.
    Raises if the environment does not reach the state the turn saved."""
    turn = Turn.from_json(saved)
    done = False
    for action in turn.actions:
        _, _, terminated, truncated, _ = env.step(action)
        done = terminated or truncated
    if env.state_text() != turn.state_after:
        raise RuntimeError(f"{source}: replaying a saved turn did not reach its saved state (was the "
                           "environment changed?); delete the file to play from the start")
    return turn, done


def play_turn(env, messages, prompt_ids, generation, cfg: PromptConfig, budget: int,
               format_penalty: float, solver_labels: bool = True) -> tuple[Turn, bool]:
    """Apply one response's actions to ``env``; returns the turn and whether the episode ended.
    ``solver_labels``: label the turn with the environment's solver (``best_first``)."""
    parsed = parse_response(generation.text, world_model=cfg.world_model,
                            max_actions=min(cfg.max_actions_per_turn, budget))
    state_before, grid_before = env.state_text(), env.render()
    best = env.best_actions() if solver_labels else None  # before any action changes the state
    first = env.canonical_action(parsed.actions[0]) if parsed.actions else None  # the agent's spelling varies
    env_reward, valid, done = 0.0, [], False
    run, best_here = (None, None) if best is None else (0, best)  # best_here: None once the run ended
    for action in parsed.actions:
        if best_here is not None and env.canonical_action(action) in best_here:
            run += 1
        else:
            best_here = None
        _, reward, terminated, truncated, info = env.step(action)
        env_reward += reward
        valid.append(bool(info["action_valid"]))
        if terminated or truncated:
            done = True
            break
        if best_here is not None:
            best_here = env.best_actions()
    penalty = 0.0 if any(valid) else format_penalty
    turn = Turn(
        prompt_messages=messages, prompt_ids=list(prompt_ids), response=generation.text,
        response_ids=list(generation.token_ids), logprobs=list(generation.logprobs),
        finish_reason=generation.finish_reason, think=parsed.think,
        observation=parsed.observation, prediction=parsed.prediction, answer=parsed.answer,
        actions=parsed.actions[: len(valid)], actions_valid=valid, format_ok=parsed.format_ok,
        state_before=state_before, grid_before=grid_before,
        state_after=env.state_text(), grid_after=env.render(),
        env_reward=env_reward, reward=env_reward + penalty,
        best_first=None if best is None else first in best,  # no action, or an unparsable one: False
        best_run=run,
    )
    return turn, done
