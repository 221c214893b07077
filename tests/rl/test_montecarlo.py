"""Per-turn Monte-Carlo advantages (spa.rl.montecarlo) and the learner that trains on them.

Hand-computed values on a 2x2 lake that does not slip, ``SG/FF``: the goal is one move
Right of the start; from (1,0) no single move wins. Random play picks each of the four
moves with probability 1/4 (moves into the edge stay put and are valid).
"""

import copy

import numpy as np
import pytest
import torch

from spa.agent.prompts import PromptConfig
from spa.agent.rollout import RolloutConfig, Start, Trajectory, Turn, play_on, rollout
from spa.envs import make
from spa.envs.base import TextEnv
from spa.envs.lookahead import continuation_return
from spa.models.engine import SamplingParams
from spa.rl import core
from spa.rl.advantages import compute_advantages, draw_turns
from spa.rl.batch import turn_samples, unplayed_span
from spa.rl.config import PPOConfig
from spa.rl.montecarlo import (action_budgets, label_advantages, policy_advantages, random_advantages,
                               vine_advantages)
from spa.rl.ppo import train
from tests.scripted import ScriptedEngine

CORNER = {"desc": "SG/FF", "is_slippery": False}


def lake_rollout(max_turns=2, per_turn=1, **options):
    return RolloutConfig("frozenlake", {**CORNER, **options}, PromptConfig("base", max_turns=max_turns,
                                                                           max_actions_per_turn=per_turn))


def played(config, answers, engine_tokenizer=None):
    """One episode of the corner lake playing ``answers`` (one response a turn), via rollout."""
    tokenizer = engine_tokenizer
    script = [[text] for text in answers]
    (trajectory,) = rollout(ScriptedEngine(tokenizer, script), tokenizer, [0], 1, config, SamplingParams())
    return trajectory


def test_continuations_by_hand():
    """V_rand(start) over 2 random moves: Right wins at once (1/4); Left or Up stay, then 1/4
    (1/8); Down goes to (1,0), from which one move never wins: 3/8. Q(start, Down) with one
    more random move: 0. Q(start, Right) with any horizon: 1."""
    env = make("frozenlake", **CORNER)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    assert continuation_return(env, [], 8000, 2, rng) == pytest.approx(0.375, abs=0.02)
    assert continuation_return(env, ["Down"], 200, 1, rng) == 0.0
    assert continuation_return(env, ["Right"], 10, 5, rng) == 1.0
    assert continuation_return(env, [], 8000, 1, rng) == pytest.approx(0.25, abs=0.02)
    assert env.player == (0, 0)  # the look-ahead played on copies


def test_action_budgets_are_the_actions_left():
    """2 turns of up to 2 actions, at most 3 actions: turn 0 has 3 before it and plays 2,
    leaving 1; turn 1 has 1 and plays 1. A malformed turn uses none."""
    config = RolloutConfig("frozenlake", CORNER, PromptConfig("base", max_turns=2, max_actions_per_turn=2),
                           max_actions=3)
    t = Trajectory("frozenlake", CORNER, 0, 0, 0, "base")
    t.turns = [_turn(["Down", "Up"]), _turn(["Left"])]
    assert action_budgets(t, config) == [(3, 1), (1, 0)]
    t.turns = [_turn([]), _turn(["Left"])]
    assert action_budgets(t, config) == [(3, 3), (3, 2)]


def test_random_advantages_by_hand(tiny):
    """Turn 0 plays Down: Q = 0 (one random move from (1,0) never wins), V = 3/8, so A = -3/8.
    Turn 1 plays Right to (1,1): Q = V = 0 (no move left after it; one random move from
    (1,0) never wins): A = 0. A winning first move: A = 1 - 3/8 = 5/8. A malformed first
    turn gets its format penalty alone, -0.1, however random play would fare (in Sokoban,
    where random play's value is negative, saving its actions must not look like a gain)."""
    _, tokenizer = tiny
    config = lake_rollout()
    down = played(config, ["<answer>Down</answer>", "<answer>Right</answer>"], tokenizer)
    win = played(config, ["<answer>Right</answer>"], tokenizer)
    junk = played(config, ["junk", "<answer>Down</answer>"], tokenizer)
    values = random_advantages([down, win, junk], config, rollouts=8000, seed=(0,))
    assert values[0] == pytest.approx([-0.375, 0.0], abs=0.02)
    assert values[1] == pytest.approx([0.625], abs=0.02)
    assert values[2][0] == pytest.approx(-0.1)


def test_random_advantages_do_not_depend_on_order_or_company(tiny):
    _, tokenizer = tiny
    config = lake_rollout()
    a = played(config, ["<answer>Down</answer>", "<answer>Up</answer>"], tokenizer)
    b = played(config, ["<answer>Left</answer>", "<answer>Right</answer>"], tokenizer)
    b.sample = 1
    both = random_advantages([a, b], config, rollouts=16, seed=(3, 1))
    assert random_advantages([b], config, rollouts=16, seed=(3, 1)) == [both[1]]
    assert random_advantages([b, a], config, rollouts=16, seed=(3, 1)) == [both[1], both[0]]


def test_label_advantages_by_hand(tiny, monkeypatch):
    """On the corner lake only Right is best at the start (it wins at once; with one action
    of look-ahead every other move is worth 0), so a first turn playing Right gets 1 and one
    playing Down 0. From (1,0) no single move reaches the goal, so no move stands out and
    the turn gets 0. A malformed turn gets 0. The labels call no solver."""
    _, tokenizer = tiny
    config = lake_rollout()
    down = played(config, ["<answer>Down</answer>", "<answer>Left</answer>"], tokenizer)
    win = played(config, ["<answer>Right</answer>"], tokenizer)
    junk = played(config, ["junk", "<answer>Right</answer>"], tokenizer)

    def no_solver(self):
        raise AssertionError("the solver was called on the path of RL from the reward")

    for cls in (TextEnv, *TextEnv.__subclasses__()):
        monkeypatch.setattr(cls, "best_actions", no_solver)
    assert label_advantages([down, win, junk], 400, 1, (0,)) == [[0.0, 0.0], [1.0], [0.0, 1.0]]


def test_log_objective_weights_a_best_move_by_its_state_share(tiny):
    """Three episodes start on the corner lake: one plays Right (the best move), two play
    Down. At the start 1 of 3 turns was best, so p = 1/3: Right gets 1 / (1/3) - 1 = 2 and
    each Down -1 (their sum is 0, a baseline per state). Both Downs then stand at (1,0),
    where no move stands out with one action of look-ahead: 0. A state played once gives 0."""
    _, tokenizer = tiny
    config = lake_rollout()
    right = played(config, ["<answer>Right</answer>"], tokenizer)
    downs = [played(config, ["<answer>Down</answer>", "<answer>Left</answer>"], tokenizer) for _ in range(2)]
    assert label_advantages([right, *downs], 400, 1, (0,), "log") == [[2.0], [-1.0, 0.0], [-1.0, 0.0]]
    assert label_advantages([right, *downs], 400, 1, (0,), "linear") == [[1.0], [0.0, 0.0], [0.0, 0.0]]
    assert label_advantages([right], 400, 1, (0,), "log") == [[0.0]]
    with pytest.raises(ValueError, match="objective 'square' is not known; valid: linear, log, state"):
        label_advantages([right], 400, 1, (0,), "square")
    with pytest.raises(ValueError, match="value_objective 'square' is not known; valid: linear, log, state"):
        PPOConfig(advantage="value", value_objective="square")


def test_state_objective_subtracts_the_share_of_best_moves_at_the_state(tiny, monkeypatch):
    """At the corner lake's start the four moves are legal and only Right is best: b = 1/4,
    so Right gets 1 - 1/4 and Down 0 - 1/4, pushed down although no turn of the step found
    Down best anywhere (per-move centring would leave it at 0). From (1,0) no move stands out
    with one action of look-ahead (b = 0, label 0): 0. A malformed turn gets 0; the turn
    after it, Right from the start again, 3/4. No solver is called."""
    _, tokenizer = tiny
    config = lake_rollout()
    right = played(config, ["<answer>Right</answer>"], tokenizer)
    down = played(config, ["<answer>Down</answer>", "<answer>Left</answer>"], tokenizer)
    junk = played(config, ["junk", "<answer>Right</answer>"], tokenizer)

    def no_solver(self):
        raise AssertionError("the solver was called on the path of RL from the reward")

    for cls in (TextEnv, *TextEnv.__subclasses__()):
        monkeypatch.setattr(cls, "best_actions", no_solver)
    assert label_advantages([right, down, junk], 400, 1, (0,), "state") == [[0.75], [-0.25, 0.0], [0.0, 0.75]]


def test_vine_advantages_by_hand():
    assert vine_advantages([-0.1, 0.0, 1.0], [0.5, 0.6, 0.9]) == pytest.approx([0.0, 0.3, 0.1])
    with pytest.raises(ValueError, match="3 turns need as many values"):
        vine_advantages([0.0, 0.0, 1.0], [0.5])


def test_policy_continuations_by_hand(tiny):
    """The policy (scripted) always answers Right. Episode: Down, then Right (to (1,1), no
    win). V(start) = 1 (Right wins), V((1,0)) = 0 (Right goes to (1,1) and the turns end).
    A_0 = 0 + 0 - 1 = -1, A_1 = 0 + 0 - 0 = 0. The continuations were played from the
    episode's states: 2 rollouts x 2 states, in one call per turn."""
    _, tokenizer = tiny
    config = lake_rollout()
    episode = played(config, ["<answer>Down</answer>", "<answer>Right</answer>"], tokenizer)
    engine = ScriptedEngine(tokenizer, [["<answer>Right</answer>"] * 4])
    values = policy_advantages(engine, tokenizer, [episode], config, rollouts=2, sampling=SamplingParams(seed=0))
    assert values == [pytest.approx([-1.0, 0.0])]
    assert engine.calls == 1  # from the start Right wins; from (1,0) the last turn is played


def test_play_on_keeps_the_episode_limits(tiny):
    """From the start with one turn already used (history of one), only one turn is left."""
    _, tokenizer = tiny
    env = make("frozenlake", **CORNER)
    env.reset(seed=0)
    engine = ScriptedEngine(tokenizer, [["<answer>Down</answer>"], ["<answer>Right</answer>"]])
    returns = play_on(engine, tokenizer, [Start(env, [("s", "r", 0.0)], 1)], lake_rollout(), SamplingParams())
    assert returns == [0.0] and engine.calls == 1


def test_mc_advantages_share_one_scale_across_the_step():
    """Review item 2: one centre and one scale for the whole step (no per-group std), so a
    malformed turn stays 0.1 below a neutral one where a win is 1 above it; and every turn
    keeps its own advantage whatever its episode's length (item 5). Without ``mc_center``
    the advantages are divided by their root mean square and keep their signs."""
    long = _episode(0, [0.0, 0.0, 0.0], lengths=[3, 3, 3])
    short = _episode(0, [0.0], sample=1, lengths=[3])
    kept = [long, short]
    raw = [[-0.1, 0.0, 1.0], [1.0]]
    flat = [-0.1, 0.0, 1.0, 1.0]
    for center in (True, False):
        samples = turn_samples(kept)
        config = PPOConfig(algorithm="grpo", advantage="mc", mc_center=center)
        compute_advantages(samples, kept, None, config, 0, None, raw)
        mean = np.mean(flat) if center else 0.0
        scale = np.sqrt(np.mean((np.array(flat) - mean) ** 2))
        got = [float(s.advantages[0]) for s in samples]
        assert got == pytest.approx([(a - mean) / scale for a in flat])
        assert (got[1] - got[0]) / (got[2] - got[1]) == pytest.approx(0.1)
        assert all(torch.all(s.advantages == s.advantages[0]) for s in samples)


def test_unplayed_actions_are_left_out_of_the_loss(tiny):
    """Review item 4: a turn that named three actions but played one (the per-turn cap) gets
    no loss on the two it never played; the played one and the closing tag keep it."""
    _, tokenizer = tiny
    text = "<think>go</think><answer>Right || Up || Left</answer>"
    span = unplayed_span(text, 1)
    assert text[span[0]:span[1]] == " || Up || Left"
    assert unplayed_span(text, 3) is None and unplayed_span(text, 0) is None
    config = lake_rollout(max_turns=1)
    (episode,) = rollout(ScriptedEngine(tokenizer, [[text]]), tokenizer, [0], 1, config, SamplingParams())
    assert episode.turns[0].actions == ["Right"]
    (sample,) = turn_samples([episode], tokenizer)
    ids = episode.turns[0].response_ids
    kept = tokenizer.decode([i for i, keep in zip(ids, sample.loss_mask) if keep])
    dropped = tokenizer.decode([i for i, keep in zip(ids, sample.loss_mask) if not keep])
    assert "Up" not in kept and "Left" not in kept and "Right" in kept and "</answer>" in kept
    assert "Up" in dropped and "Left" in dropped


def test_a_collapsed_group_is_pushed_down_not_dropped(tiny, tmp_path, monkeypatch):
    """Review item 3: every sample of every group plays the same losing move (Down, then
    Left into the edge), so every group is flat; GRPO's outcome advantages would drop them
    all, while the Monte-Carlo advantages train every turn, pushed down. The path calls no
    solver (best_actions raises here)."""
    model, tokenizer = tiny

    def no_solver(self):
        raise AssertionError("the solver was called on the path of RL from the reward")

    monkeypatch.setattr(TextEnv, "best_actions", no_solver)
    for cls in TextEnv.__subclasses__():
        monkeypatch.setattr(cls, "best_actions", no_solver)
    script = [["<answer>Down</answer>"] * 4, ["<answer>Left</answer>"] * 4]
    # mc_center off: every turn keeps its sign (centred, one level's identical turns would all be 0;
    # across the levels of a real step they are pushed down relative to the step's mean)
    config = PPOConfig(algorithm="grpo", advantage="mc", mc_center=False, mc_rollouts=64, steps=1, groups=2,
                       samples=2, max_new_tokens=6, minibatch_size=4, micro_batch_size=2, actor_lr=1e-3,
                       tensorboard=False, precision="fp32")
    flat = train(copy.deepcopy(model), tokenizer, lake_rollout(), PPOConfig(**{**vars(config), "advantage": "grpo"}),
                 tmp_path / "grpo", progress=False, engine=ScriptedEngine(tokenizer, script))
    assert flat[0]["charts/train_turns"] == 0
    policy = copy.deepcopy(model)
    (step,) = train(policy, tokenizer, lake_rollout(), config, tmp_path / "mc", progress=False,
                    engine=ScriptedEngine(tokenizer, script))
    # The first turns (Down: Q 0, V 3/8) train; the second (Left from (1,0): Q = V = 0) is 0 and skipped.
    assert step["charts/train_turns"] == 4 and step["charts/zero_advantage_turns"] == 4
    assert step["advantages/mc_positive"] == 0.0 and step["actor/advantage_mean"] < 0
    assert any(not torch.equal(a, b) for a, b in zip(policy.parameters(), model.parameters()))


def test_mc_is_offered_with_both_losses_and_refuses_episode_balancing():
    assert not PPOConfig(algorithm="ppo", advantage="mc").uses_critic
    assert not PPOConfig(algorithm="ppo", advantage="value").uses_critic
    with pytest.raises(ValueError, match="balance_episodes does not go with advantage=value"):
        PPOConfig(algorithm="grpo", advantage="value", balance_episodes=True)
    assert PPOConfig(algorithm="ppo").uses_critic
    assert PPOConfig(algorithm="grpo", advantage="mc").advantage == "mc"
    with pytest.raises(ValueError, match="balance_episodes does not go with advantage=mc"):
        PPOConfig(algorithm="grpo", advantage="mc", balance_episodes=True)
    with pytest.raises(ValueError, match="mc_continuation 'solver' is not known; valid: random, policy"):
        PPOConfig(advantage="mc", mc_continuation="solver")


@pytest.mark.parametrize("advantage, continuation", [("mc", "random"), ("mc", "policy"), ("value", "random")])
def test_training_with_mc_advantages_runs_under_both_losses(tiny, tmp_path, advantage, continuation):
    model, tokenizer = tiny
    for algorithm in ("ppo", "grpo"):
        config = PPOConfig(algorithm=algorithm, advantage=advantage, mc_continuation=continuation, mc_rollouts=2,
                           steps=1, groups=2, samples=2, max_new_tokens=6, minibatch_size=4, micro_batch_size=2,
                           actor_lr=1e-3, tensorboard=False, precision="fp32")
        (step,) = train(copy.deepcopy(model), tokenizer, lake_rollout(), config, tmp_path / algorithm / continuation,
                        progress=False)
        assert "time/lookahead_s" in step and "critic/value_loss" not in step


def test_magnitude_draw_is_an_unbiased_estimate_of_the_whole_step():
    """Over many draws, the drawn turns' advantages, averaged over the draws, average to
    the advantages averaged over all turns (so a mean loss over the drawn turns estimates the
    mean loss over all of them); a turn at 0 is never drawn; with as many draws as turns
    nothing changes."""
    a = torch.tensor([0.9, -0.3, 0.0, 0.05, -1.2, 0.4])
    generator = torch.Generator().manual_seed(0)
    total = torch.zeros_like(a, dtype=torch.float64)
    trials = 20000
    for _ in range(trials):
        chosen, values = core.magnitude_draw(a, 3, generator)
        assert 2 not in chosen.tolist() and torch.equal(values.sign(), a[chosen].sign())
        total[chosen] += values.double()
    assert (total / trials / 3).tolist() == pytest.approx((a / 6).tolist(), abs=0.01)
    chosen, values = core.magnitude_draw(a, 6, generator)
    assert chosen.tolist() == list(range(6)) and torch.equal(values, a)
    # by hand: 2 draws of [0, -3, 0] both land on turn 1: it weighs 2 x -1 x mean |A| = -2
    chosen, values = core.magnitude_draw(torch.tensor([0.0, -3.0, 0.0]), 2, generator)
    assert chosen.tolist() == [1] and values.tolist() == pytest.approx([-2.0])


def test_draw_turns_keeps_the_drawn_samples_and_refuses_nothing_else():
    samples = turn_samples([_episode(0, [0.0, 0.0, 0.0], lengths=[2, 3, 4])])
    for s, a in zip(samples, [0.5, 0.0, -1.0]):
        s.advantages = torch.full((s.response_length,), a)
    assert draw_turns(samples, 5, (0, 1)) == samples
    drawn = draw_turns(samples, 2, (0, 1))
    assert 1 <= len(drawn) <= 2 and samples[1] not in drawn
    assert all(torch.all(s.advantages == s.advantages[0]) and s.advantages.numel() == s.response_length
               for s in drawn)
    assert draw_turns(samples, 2, (0, 1))[0].turn == drawn[0].turn  # seeded
    with pytest.raises(ValueError, match="train_turns needs advantage=mc"):
        PPOConfig(algorithm="grpo", train_turns=8)


def test_training_on_drawn_turns_trains_no_more_than_asked(tiny, tmp_path):
    model, tokenizer = tiny
    config = PPOConfig(algorithm="grpo", advantage="mc", mc_rollouts=8, train_turns=2, steps=1, groups=2, samples=4,
                       max_new_tokens=6, minibatch_size=4, micro_batch_size=2, actor_lr=1e-3, tensorboard=False,
                       precision="fp32")
    script = [["<answer>Right</answer>", "<answer>Down</answer>"] * 4]
    (step,) = train(copy.deepcopy(model), tokenizer, lake_rollout(max_turns=1), config, tmp_path / "drawn",
                    progress=False, engine=ScriptedEngine(tokenizer, script))
    # 8 first turns, none at 0 (Right wins, Down does not, V is between): 2 draws train 1 or 2 of them
    assert step["charts/zero_advantage_turns"] == 0 and 1 <= step["charts/train_turns"] <= 2


def _turn(actions):
    return Turn(prompt_messages=[], prompt_ids=[1], response="", response_ids=[5], logprobs=[-1.0],
                finish_reason="stop", think="", observation="", prediction="", answer="", actions=list(actions),
                actions_valid=[True] * len(actions), format_ok=True, state_before="", grid_before="",
                state_after="", grid_after="", env_reward=0.0, reward=0.0)


def _episode(group, rewards, sample=0, lengths=None):
    t = Trajectory("frozenlake", CORNER, seed=group, group=group, sample=sample, mode="base")
    t.turns = [Turn(prompt_messages=[], prompt_ids=[1, 2], response="", response_ids=[7] * n, logprobs=[-1.0] * n,
                    finish_reason="stop", think="", observation="", prediction="", answer="", actions=[],
                    actions_valid=[], format_ok=True, state_before="", grid_before="", state_after="",
                    grid_after="", env_reward=r, reward=r) for r, n in zip(rewards, lengths)]
    return t



def _value_step(tiny, tmp_path, script, max_turns, **settings):
    model, tokenizer = tiny
    config = PPOConfig(algorithm="grpo", advantage="value", mc_rollouts=64, value_horizon=1, steps=1, groups=1,
                       samples=4, max_new_tokens=6, minibatch_size=8, micro_batch_size=2, actor_lr=1e-3,
                       tensorboard=False, precision="fp32", **settings)
    (step,) = train(copy.deepcopy(model), tokenizer, lake_rollout(max_turns=max_turns), config,
                    tmp_path / str(sorted(settings.items())), progress=False, engine=ScriptedEngine(tokenizer, script))
    return step


def test_a_centred_value_label_pushes_its_zero_label_turns_down(tiny, tmp_path):
    """On the corner lake, first turns playing Right are labelled 1 and those playing Down
    0. Uncentred, only the label-1 turns train (a 0 pushes nothing); centred on the step's
    mean, the label-0 turns train too, pushed down, and the label-1 turns up. Skipping the
    raw zeros before centring left every remaining turn at the same label, so centring
    zeroed all of them and the step trained nothing."""
    script = [["<answer>Right</answer>", "<answer>Down</answer>"] * 2]
    plain = _value_step(tiny, tmp_path, script, 1, mc_center=False)
    assert plain["charts/train_turns"] == 2 and plain["advantages/mc_positive"] == 1.0
    centred = _value_step(tiny, tmp_path, script, 1, mc_center=True)
    assert centred["charts/train_turns"] == 4 and centred["charts/zero_advantage_turns"] == 2
    assert centred["actor/advantage_mean"] == pytest.approx(0.0, abs=1e-6)


def test_the_state_baseline_trains_a_move_that_was_best_nowhere_where_per_move_centring_cannot(tiny, tmp_path):
    """Every episode plays Down at the corner lake's start, where Right alone is best: Down's
    label is 0 in every turn. Centred per move, Down's mean is 0 and so is every turn's
    advantage: nothing trains. With the state's baseline (1/4 of the legal moves best) each
    Down turn gets -1/4 and trains, pushed down."""
    script = [["<answer>Down</answer>"] * 4]
    per_move = _value_step(tiny, tmp_path, script, 1, mc_center=False, center_actions=True)
    assert per_move["charts/train_turns"] == 0
    state = _value_step(tiny, tmp_path, script, 1, mc_center=False, value_objective="state")
    assert state["charts/train_turns"] == 4 and state["advantages/mc_mean"] == pytest.approx(-0.25)
    assert state["actor/advantage_mean"] < 0


def test_centring_per_move_trains_a_move_where_it_beat_its_own_mean(tiny, tmp_path):
    """Episodes alternate Right (best at the start: label 1) and Down then Right (Down 0 at
    the start; from (1,0) no move reaches the goal in one action, so Right is 0 there).
    Per first move: Right's turns average 1/2, so the start's two go up and the two from
    (1,0) down; Down's two are all 0, its own mean, and carry nothing. So 4 turns train,
    their advantages summing to 0; uncentred only the two label-1 turns would."""
    script = [["<answer>Right</answer>", "<answer>Down</answer>", "<answer>Right</answer>",
               "<answer>Down</answer>"], ["<answer>Right</answer>"] * 2]  # the winners have ended
    step = _value_step(tiny, tmp_path, script, 2, mc_center=False, center_actions=True)
    assert step["charts/train_turns"] == 4 and step["charts/zero_advantage_turns"] == 4
    assert step["actor/advantage_mean"] == pytest.approx(0.0, abs=1e-6)


# -- a label for every action of a turn (value_actions=each) -------------------------

LINE = {"desc": "SFG/FFF/FFF", "is_slippery": False}  # the goal two moves Right of the start


def test_each_action_of_a_turn_gets_the_label_of_its_own_state(tiny, monkeypatch):
    """On the 3x3 lake ``SFG/FFF/FFF`` with one action of look-ahead, no move wins from the
    start (no move stands out: label 0, share 0), and from (0,1) only Right wins (share 1/4).
    A turn ``Right || Right`` thus gets (0, 3/4) under the state objective and ``Right ||
    Down`` (0, -1/4): the second action is judged where it was played, not by the first
    one's label, which alone (value_actions=first) gives both turns 0. No solver is called."""
    _, tokenizer = tiny
    config = RolloutConfig("frozenlake", LINE, PromptConfig("base", max_turns=1, max_actions_per_turn=2))
    right = played(config, ["<answer>Right || Right</answer>"], tokenizer)
    down = played(config, ["<answer>Right || Down</answer>"], tokenizer)
    junk = played(config, ["junk"], tokenizer)

    def no_solver(self):
        raise AssertionError("the solver was called on the path of RL from the reward")

    for cls in (TextEnv, *TextEnv.__subclasses__()):
        monkeypatch.setattr(cls, "best_actions", no_solver)
    episodes = [right, down, junk]
    assert label_advantages(episodes, 400, 1, (0,), "state", "each") == [[(0.0, 0.75)], [(0.0, -0.25)], [(0.0,)]]
    assert label_advantages(episodes, 400, 1, (0,), "linear", "each") == [[(0.0, 1.0)], [(0.0, 0.0)], [(0.0,)]]
    assert label_advantages(episodes, 400, 1, (0,), "state") == [[0.0], [0.0], [0.0]]
    with pytest.raises(ValueError, match="linear and state objectives, not 'log'"):
        label_advantages(episodes, 400, 1, (0,), "log", "each")


def test_the_first_action_gets_the_same_label_whether_or_not_the_others_are_labelled(tiny):
    _, tokenizer = tiny
    config = lake_rollout(per_turn=2)
    episodes = [played(config, [answer, "<answer>Up || Right</answer>"], tokenizer)
                for answer in ("<answer>Down || Up</answer>", "<answer>Right</answer>", "<answer>Left || Down</answer>")]
    first = label_advantages(episodes, 200, 2, (3,), "state")
    each = label_advantages(episodes, 200, 2, (3,), "state", "each")
    assert [[turn[0] for turn in episode] for episode in each] == first
    assert [len(turn) for turn in each[0]] == [2, 2]


def test_each_action_s_tokens_carry_its_own_advantage(tiny):
    """The think text and the first action's tokens get the first action's advantage; the
    separator and the second action's name the second's; the closing tag goes with the last."""
    from spa.rl.batch import action_index

    _, tokenizer = tiny
    config = RolloutConfig("frozenlake", LINE, PromptConfig("base", max_turns=1, max_actions_per_turn=2))
    episode = played(config, ["<think>go</think><answer>Right || Down</answer>"], tokenizer)
    (sample,) = turn_samples([episode], tokenizer, action_tokens=True)
    ids = episode.turns[0].response_ids
    parts = [tokenizer.decode([i for i, a in zip(ids, sample.action_of) if a == k]) for k in (0, 1)]
    assert "go" in parts[0] and "Right" in parts[0] and "Down" not in parts[0]
    assert "||" in parts[1] and "Down" in parts[1] and "</answer>" in parts[1] and "Right" not in parts[1]
    decode = lambda tokens: tokenizer.decode(tokens)  # noqa: E731
    assert action_index(ids, decode, 1).tolist() == [0] * len(ids)  # one action played: all with it
    config = PPOConfig(algorithm="grpo", advantage="value", value_objective="state", value_actions="each",
                       mc_center=False)
    compute_advantages([sample], [episode], None, config, 0, torch.autocast("cpu", enabled=False),
                       [[(0.0, -0.25)]])
    # One scale for the step: the root mean square of its actions' values, (0 + 1/16) / 2.
    rms = (0.0625 / 2) ** 0.5
    assert sample.advantages[sample.action_of == 0].eq(0.0).all()
    assert sample.advantages[sample.action_of == 1].eq(-0.25 / rms).all()


def test_value_actions_each_is_checked_and_trains(tiny, tmp_path):
    with pytest.raises(ValueError, match="value_actions 'both' is not known; valid: first, each"):
        PPOConfig(advantage="value", value_actions="both")
    with pytest.raises(ValueError, match="neither center_actions nor train_turns"):
        PPOConfig(advantage="value", value_objective="state", value_actions="each", center_actions=True)
    with pytest.raises(ValueError, match="needs advantage=value"):
        PPOConfig(algorithm="grpo", advantage="mc", value_actions="each")
    model, tokenizer = tiny
    config = PPOConfig(algorithm="grpo", advantage="value", value_objective="state", value_actions="each",
                       mc_center=False, mc_rollouts=64, value_horizon=1, steps=1, groups=1, samples=2,
                       max_new_tokens=8, minibatch_size=8, micro_batch_size=2, actor_lr=1e-3, tensorboard=False,
                       precision="fp32")
    rollout_config = RolloutConfig("frozenlake", LINE, PromptConfig("base", max_turns=1, max_actions_per_turn=2))
    script = [["<answer>Right || Right</answer>", "<answer>Right || Down</answer>"]]
    (step,) = train(copy.deepcopy(model), tokenizer, rollout_config, config, tmp_path / "each", progress=False,
                    engine=ScriptedEngine(tokenizer, script))
    assert step["charts/train_turns"] == 2 and step["advantages/mc_mean"] == pytest.approx(0.125)
