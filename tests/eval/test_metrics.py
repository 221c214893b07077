from math import comb

import pytest

from spa.eval.metrics import bootstrap_difference, bootstrap_interval, pass_at_k, pooled_sd, runs_per_arm


@pytest.mark.parametrize("n,c,k", [(8, 0, 1), (8, 1, 1), (8, 3, 2), (8, 3, 4), (8, 5, 4), (8, 8, 8),
                                   (10, 2, 3), (200, 37, 8)])
def test_pass_at_k_matches_the_closed_form(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_pass_at_k_hand_cases():
    assert pass_at_k(8, 2, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)  # 1 - 1/6
    assert pass_at_k(8, 0, 8) == 0.0 and pass_at_k(8, 1, 8) == 1.0


@pytest.mark.parametrize("n,c,k", [(8, 9, 1), (8, 1, 9), (8, 1, 0), (0, 0, 1)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


def test_world_model_accuracy_scores_states_and_the_copy_floor():
    from types import SimpleNamespace

    from spa.eval.metrics import world_model_accuracy

    before, after = "_P\n__\nPlayer at (0,1).", "__\n_P\nPlayer at (1,1)."

    def turn(observation, prediction, state_after):
        grid_after = "\n".join(state_after.splitlines()[:2])
        return SimpleNamespace(observation=observation, prediction=prediction, state_before=before,
                               grid_before="_P\n__", state_after=state_after, grid_after=grid_after)

    right = turn(before, after, after)  # everything right
    copied = turn(before, before, after)  # the prediction copies the observation: wrong here
    blocked = turn(before, before, before)  # a move into the edge: copying is right
    scores = world_model_accuracy([right, copied, blocked])
    assert scores["observation_exact"] == 1.0
    assert scores["prediction_exact"] == 2 / 3
    assert scores["unchanged_rate"] == 1 / 3
    assert scores["prediction_cell_acc"] == (1 + 0.5 + 1) / 3
    assert scores["prediction_copied"] == 2 / 3  # the copy and the blocked move
    assert scores["prediction_changed_exact"] == 1 / 2  # of the two turns that moved, one predicted
    assert world_model_accuracy([blocked])["prediction_changed_exact"] is None


# ---------------------------------------------------------------- bootstrap over seeds and levels

def exact_distribution(per_seed):
    """The exact distribution of the two-stage bootstrap statistic, by enumeration: every
    draw of the seeds, then for each drawn seed every draw of its levels, all equally likely."""
    from collections import Counter
    from fractions import Fraction
    from itertools import product

    seeds, dist = len(per_seed), Counter()
    for drawn in product(range(seeds), repeat=seeds):
        # every slot resamples its seed's levels on its own: enumerate all level draws of all slots
        for draws in product(*[product(per_seed[s], repeat=len(per_seed[s])) for s in drawn]):
            value = sum(sum(map(Fraction, d)) / len(d) for d in draws) / seeds
            weight = Fraction(1, seeds ** seeds)
            for d in draws:
                weight /= len(d) ** len(d)
            dist[value] += weight
    return sorted(dist.items())


def exact_quantile(dist, q):
    """The atom holding the ``q`` quantile, and how far ``q`` is from the atom's edges."""
    cdf = 0
    for value, p in dist:
        if cdf < q < cdf + p:
            return value, float(min(q - cdf, cdf + p - q))
        cdf += p
    raise AssertionError("q falls on an edge between atoms")


def test_bootstrap_interval_of_equal_levels_has_zero_width():
    assert bootstrap_interval([[0.25] * 5, [0.25] * 3, [0.25]]) == (0.25, 0.25, 0.25)
    assert bootstrap_interval([[1.0, 1.0]]) == (1.0, 1.0, 1.0)


def test_bootstrap_interval_weighs_seeds_equally_and_is_reproducible():
    centre, low, high = bootstrap_interval([[1, 1, 1, 1], [0]], resamples=500)
    assert centre == 0.5  # not 4/5: each seed's mean over its levels counts once
    assert bootstrap_interval([[1, 1, 1, 1], [0]], resamples=500) == (centre, low, high)
    assert (low, high) == (0.0, 1.0)  # half the replicates draw one seed twice


def test_bootstrap_interval_on_one_seed_by_hand():
    # Two levels scoring 0 and 1: the resampled mean is 0, 1/2 or 1 with probability
    # 1/4, 1/2, 1/4, so the 2.5% and 97.5% percentiles are 0 and 1.
    assert bootstrap_interval([[0, 1]], resamples=4000) == (0.5, 0.0, 1.0)


@pytest.mark.parametrize("per_seed", [[[0, 1], [0, 0, 1]], [[0, 1, 1], [0.5, 1]]])
def test_bootstrap_interval_matches_the_exact_enumeration(per_seed):
    dist = exact_distribution(per_seed)
    centre, low, high = bootstrap_interval(per_seed, resamples=100_000)
    assert centre == pytest.approx(float(sum(v * p for v, p in dist)))  # the bootstrap is unbiased for the mean
    for q, bound in ((0.025, low), (0.975, high)):
        atom, margin = exact_quantile(dist, q)
        assert margin > 0.004  # ~9 standard errors of the empirical CDF at 100,000 replicates
        assert bound == pytest.approx(float(atom))


def test_bootstrap_interval_rejects_empty_input():
    for bad in ([], [[0.5], []]):
        with pytest.raises(ValueError, match="bootstrap_interval"):
            bootstrap_interval(bad)


# ---------------------------------------------------------------- seed spread

def test_pooled_sd_by_hand():
    # Deviations from each group's own mean: (-2, 0, 2) and (-1, 1); a group of one adds
    # nothing. Squares 8 + 2 = 10 over df 2 + 1 = 3. The groups' means (12 and 51) are
    # far apart, and that does not count as spread.
    sd, df = pooled_sd([[10, 12, 14], [50, 52], [99]])
    assert df == 3 and sd == pytest.approx((10 / 3) ** 0.5)


def test_pooled_sd_needs_a_group_of_two():
    with pytest.raises(ValueError, match=r"pooled_sd needs a group with at least 2 runs; got group sizes \[1, 1\]"):
        pooled_sd([[0.5], [0.7]])


def test_runs_per_arm_by_hand():
    # 2 (1.95996 + 0.84162)^2 = 15.70; sd 12: 15.70 * 144 / 100 = 22.6 -> 23 at a gap of 10,
    # 5.65 -> 6 at 20. sd = gap / 2 gives 3.92 -> 4; no spread still needs 2.
    assert [runs_per_arm(12.0, gap) for gap in (10, 20, 24)] == [23, 6, 4]
    assert runs_per_arm(5.0, 10.0) == 4 and runs_per_arm(0.0, 10.0) == 2
    assert runs_per_arm(12.0, 10, power=0.9) > runs_per_arm(12.0, 10) > runs_per_arm(12.0, 10, alpha=0.2)
    with pytest.raises(ValueError, match="gap=0"):
        runs_per_arm(12.0, 0)


# ---------------------------------------------------------------- best first action rate

def test_best_first_rate_is_over_the_scored_turns_and_absent_without_any():
    from types import SimpleNamespace

    from spa.agent.trajectory import Trajectory
    from spa.eval.metrics import summarize

    def episode(*marks):
        turns = [SimpleNamespace(best_first=mark, best_run=None, reward=0.0, actions_valid=[True], format_ok=True,
                                 response_ids=[])
                 for mark in marks]
        return Trajectory("frozenlake", {}, seed=0, group=0, sample=0, mode="state", turns=turns)

    # None (no solver, no solution) is left out of the mean rather than counted as a miss.
    assert summarize([episode(True, None), episode(False, True, None)])["best_first_rate"] == 2 / 3
    assert "best_first_rate" not in summarize([episode(None, None)])
    assert "best_first_rate" not in summarize([episode()])


def test_best_follow_rate_counts_second_actions_after_a_best_first_one():
    from types import SimpleNamespace

    from spa.agent.trajectory import Trajectory
    from spa.eval.metrics import summarize

    def turn(best_run, played):
        return SimpleNamespace(best_first=None if best_run is None else best_run > 0, best_run=best_run,
                               reward=0.0, actions_valid=[True] * played, format_ok=True, response_ids=[])

    # Counted: best first with a second played (run 2 and 3: second best; run 1: not).
    # Left out: a first action not best (run 0), one played action, no solver (None).
    turns = [turn(2, 2), turn(3, 3), turn(1, 3), turn(0, 3), turn(1, 1), turn(None, 2)]
    metrics = summarize([Trajectory("sokoban", {}, seed=0, group=0, sample=0, mode="base", turns=turns)])
    assert metrics["best_follow_rate"] == 2 / 3
    assert metrics["best_first_rate"] == 4 / 5
    alone = [turn(1, 1), turn(0, 2)]
    assert "best_follow_rate" not in summarize([Trajectory("sokoban", {}, 0, 0, 0, "base", alone)])


def test_first_valid_rate_splits_refused_moves_from_legal_ones_chosen_badly():
    from types import SimpleNamespace

    from spa.agent.trajectory import Trajectory
    from spa.eval.metrics import summarize

    def turn(best_first, valid):
        return SimpleNamespace(best_first=best_first, best_run=None, reward=0.0, actions_valid=valid,
                               format_ok=True, response_ids=[])

    # Scored: 6 turns; first action valid in 4 (the one with no action counts as not valid),
    # best in 1 of those 4. A valid second action after a refused first does not count.
    turns = [turn(True, [True]), turn(False, [True, False]), turn(False, [True]), turn(False, [True]),
             turn(False, [False, True]), turn(False, []), turn(None, [True])]
    metrics = summarize([Trajectory("sudoku", {}, seed=0, group=0, sample=0, mode="base", turns=turns)])
    assert metrics["best_first_rate"] == 1 / 6
    assert metrics["first_valid_rate"] == 4 / 6
    assert metrics["best_first_of_valid_rate"] == 1 / 4
    refused = summarize([Trajectory("sudoku", {}, 0, 0, 0, "base", [turn(False, [False])])])
    assert refused["first_valid_rate"] == 0.0 and "best_first_of_valid_rate" not in refused
    assert "first_valid_rate" not in summarize([Trajectory("sudoku", {}, 0, 0, 0, "base", [turn(None, [True])])])


def test_bootstrap_difference_shares_the_levels_between_the_groups():
    # Identical runs differ by 0 in every replicate: the levels are drawn once for both groups.
    assert bootstrap_difference([[1.0, 0.0, 1.0]], [[1.0, 0.0, 1.0]], resamples=200) == (0.0, 0.0, 0.0)


def test_bootstrap_difference_against_a_hand_computed_case():
    # One seed each, levels a = (1, 0), b = (0, 0): a replicate is the mean of two levels drawn
    # from (1, 0): 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4, so the 2.5% and 97.5%
    # percentiles are 0 and 1 around the difference 0.5.
    assert bootstrap_difference([[1.0, 0.0]], [[0.0, 0.0]], resamples=4000) == (0.5, 0.0, 1.0)
    # Two seeds of constant levels, 1 and 0, against one seed of 0: the difference is the mean
    # of two seeds drawn, 0, 0.5 or 1 (same probabilities), around 0.5.
    assert bootstrap_difference([[1.0, 1.0], [0.0, 0.0]], [[0.0, 0.0]], resamples=4000) == (0.5, 0.0, 1.0)
    middle = bootstrap_difference([[1.0, 1.0], [0.0, 0.0]], [[0.0, 0.0]], resamples=4000, level=0.4)
    assert middle[1:] == (0.5, 0.5)  # the 30% and 70% percentiles both fall on the middle half


def test_a_seed_sd_stands_in_for_the_seeds_a_group_of_one_run_lacks():
    # Constant levels: without seed_sd every replicate is the difference itself.
    one, three = [[0.5, 0.5]], [[0.3, 0.3]] * 3
    assert bootstrap_difference(one, three, resamples=500) == pytest.approx((0.2, 0.2, 0.2))
    # With it, one run against three identical ones: 0.2 + N(0, 0.1^2), so 0.2 -+ 1.96 x 0.1.
    difference, low, high = bootstrap_difference(one, three, resamples=40_000, seed_sd=0.1)
    assert difference == pytest.approx(0.2)
    assert (low, high) == pytest.approx((0.2 - 0.196, 0.2 + 0.196), abs=0.005)
    # Both sides of one run: two independent draws, sd 0.1 x sqrt(2).
    both = bootstrap_difference(one, [[0.3, 0.3]], resamples=40_000, seed_sd=0.1)
    assert both[1:] == pytest.approx((0.2 - 0.277, 0.2 + 0.277), abs=0.006)
    # Groups of two or more runs resample their own seeds, untouched by seed_sd.
    two = [[0.5, 0.5], [0.7, 0.7]]
    assert bootstrap_difference(two, three, resamples=500, seed_sd=0.1) == bootstrap_difference(two, three,
                                                                                                 resamples=500)
    with pytest.raises(ValueError, match="seed_sd >= 0; got 10, 0.95, -0.1"):
        bootstrap_difference(one, three, resamples=10, seed_sd=-0.1)


def test_bootstrap_difference_needs_runs_on_the_same_levels():
    with pytest.raises(ValueError, match=r"the same levels in every run; got level counts \[2, 3\]"):
        bootstrap_difference([[1.0, 0.0]], [[0.0, 0.0, 1.0]])
    with pytest.raises(ValueError, match="at least one seed in each group"):
        bootstrap_difference([], [[0.0]])
