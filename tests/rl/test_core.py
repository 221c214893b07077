"""spa.rl.core: hand-computed values, loop-vs-vectorised equivalence, masking properties."""

import math

import pytest
import torch

from spa.rl import core
from spa.rl.core import (
    ADVANTAGE_ESTIMATORS, AGGREGATIONS, KL_ESTIMATORS, aggregate, broadcast_to_tokens,
    entropy_from_logits, explained_variance, gae, get, group_advantages, kl_penalty,
    masked_mean, masked_sum, masked_whiten, policy_loss, turn_gae, value_loss, whiten_with,
)

NAN = float("nan")


def t(*rows, dtype=torch.float64):
    return torch.tensor(rows, dtype=dtype)


def close(a, b, tol=1e-6):
    torch.testing.assert_close(a, torch.as_tensor(b, dtype=a.dtype), atol=tol, rtol=0)


# ---------------------------------------------------------------------------- masked stats


def test_masked_sum_mean_ignore_nan_and_handle_empty():
    x, m = t([1.0, 2.0], [3.0, NAN]), t([1, 0], [1, 0])
    close(masked_sum(x, m), 4.0)
    close(masked_mean(x, m), 2.0)
    close(masked_mean(x, m, dim=1), [1.0, 3.0])
    close(masked_mean(x, m, dim=0), [2.0, 0.0])  # empty column -> 0, not NaN
    close(masked_mean(x, torch.zeros_like(m)), 0.0)


def test_masked_whiten():
    x, m = t([1.0, 2.0, 3.0, 100.0]), t([1, 1, 1, 0])
    # mean 2, population var 2/3 -> (x-2)/sqrt(2/3) = +-1.2247449
    close(masked_whiten(x, m, eps=0.0), [[-1.2247449, 0.0, 1.2247449, 0.0]])
    close(masked_whiten(x, m, shift_mean=False, eps=0.0), [[0.7752551, 2.0, 3.2247449, 0.0]])


def test_whiten_with_given_moments():
    """masked_whiten's transform with moments from elsewhere (another process's tokens)."""
    x, m = t([1.0, 2.0, 3.0, 100.0]), t([1, 1, 1, 0])
    close(whiten_with(x, m, 2.0, 2 / 3, eps=0.0), masked_whiten(x, m, eps=0.0))
    close(whiten_with(x, m, 0.0, 4.0, eps=0.0), [[0.5, 1.0, 1.5, 0.0]])
    close(whiten_with(x, m, 1.0, 4.0, shift_mean=False, eps=0.0), [[1.0, 1.5, 2.0, 0.0]])
    assert whiten_with(x.float(), m, 2.0, 1.0).dtype == torch.float32


def test_explained_variance():
    r, m = t([1.0, 2.0, 3.0, 99.0]), t([1, 1, 1, 0])
    assert explained_variance(t([1.0, 2.0, 3.0, -99.0]), r, m) == pytest.approx(1.0)
    assert explained_variance(r + 5.0, r, m) == pytest.approx(1.0)  # a constant offset is free
    assert explained_variance(torch.zeros_like(r), r, m) == pytest.approx(0.0)
    assert math.isnan(explained_variance(r, torch.ones_like(r), m))  # Var[R] = 0
    assert math.isnan(explained_variance(r, r, torch.zeros_like(m)))


# ---------------------------------------------------------------------------- GAE by hand


def test_gae_by_hand_1x4():
    r, v, m = t([0.0, 0.0, 0.0, 1.0]), t([0.5, 0.4, 0.3, 0.2]), t([1, 1, 1, 1])
    adv, ret = gae(r, v, m, gamma=0.9, lam=0.8)
    # delta3 = 1 - .2 = .8;             A3 = .8
    # delta2 = .9*.2 - .3 = -.12;       A2 = -.12 + .72*.8     = .456
    # delta1 = .9*.3 - .4 = -.13;       A1 = -.13 + .72*.456   = .19832
    # delta0 = .9*.4 - .5 = -.14;       A0 = -.14 + .72*.19832 = .0027904
    close(adv, [[0.0027904, 0.19832, 0.456, 0.8]])
    close(ret, [[0.5027904, 0.59832, 0.756, 1.0]])


def test_gae_by_hand_masked_gap():
    # Positions 2-3 are environment text: skipped, so the chain is t=0 -> 1 -> 4.
    r, v = t([0.0, 0.5, 99.0, 99.0, 1.0]), t([0.5, 0.4, 99.0, 99.0, 0.2])
    adv, ret = gae(r, v, t([1, 1, 0, 0, 1]), gamma=0.9, lam=0.8)
    # A4 = 1 - .2 = .8; delta1 = .5 + .9*.2 - .4 = .28, A1 = .28 + .72*.8 = .856
    # delta0 = .9*.4 - .5 = -.14, A0 = -.14 + .72*.856 = .47632
    close(adv, [[0.47632, 0.856, 0.0, 0.0, 0.8]])
    close(ret, [[0.97632, 1.256, 0.0, 0.0, 1.0]])


def test_turn_gae_by_hand():
    m = t([0, 1, 1, 0, 1, 1])
    ids = torch.tensor([[-1, 0, 0, -1, 1, 1]])
    r, v = t([5.0, 0.1, 0.2, 7.0, 0.0, 1.0]), t([9.0, 0.5, 0.6, 9.0, 0.3, 0.4])
    adv, ret = turn_gae(r, v, m, ids, gamma=0.9, lam=0.8)
    # turn 0: r = .3, V = .5 ; turn 1: r = 1, V = .3
    # A1 = 1 - .3 = .7 ; delta0 = .3 + .9*.3 - .5 = .07, A0 = .07 + .72*.7 = .574
    close(adv, [[0.0, 0.574, 0.574, 0.0, 0.7, 0.7]])
    close(ret, [[0.0, 1.074, 1.074, 0.0, 1.0, 1.0]])


# ---------------------------------------------------------------------------- GAE vs loops


def ref_gae_row(r, v, m, gamma, lam):
    """Obviously-correct GAE over the list of policy positions of one row."""
    pos = [i for i, mi in enumerate(m) if mi]
    adv = [0.0] * len(r)
    next_v = next_a = 0.0
    for i in reversed(pos):
        next_a = r[i] + gamma * next_v - v[i] + gamma * lam * next_a
        next_v, adv[i] = v[i], next_a
    return adv, [(a + v[i]) if m[i] else 0.0 for i, a in enumerate(adv)]


def ref_turn_gae_row(r, v, m, ids, gamma, lam):
    turns = sorted({ids[i] for i in range(len(r)) if m[i]})
    toks = {k: [i for i in range(len(r)) if m[i] and ids[i] == k] for k in turns}
    tr = [sum(r[i] for i in toks[k]) for k in turns]
    tv = [v[toks[k][0]] for k in turns]
    ta, tret = ref_gae_row(tr, tv, [1] * len(turns), gamma, lam)
    adv, ret = [0.0] * len(r), [0.0] * len(r)
    for j, k in enumerate(turns):
        for i in toks[k]:
            adv[i], ret[i] = ta[j], tret[j]
    return adv, ret


def random_batch(seed, B=6, T=17):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(B, T, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, generator=g, dtype=torch.float64)
    m = (torch.rand(B, T, generator=g) < 0.6).long()
    m[0] = 0  # an empty row
    m[1] = 1  # a full row
    # A turn = a run of policy tokens; ids step by 2 so some turn ids are absent.
    starts = m & torch.cat([torch.ones(B, 1, dtype=torch.long), 1 - m[:, :-1]], 1)
    ids = torch.where(m.bool(), 2 * (starts.cumsum(1) - 1), -1)
    return r, v, m, ids


@pytest.mark.parametrize("gamma,lam", [(0.9, 0.8), (1.0, 1.0), (0.99, 0.95)])
@pytest.mark.parametrize("seed", range(4))
def test_gae_and_turn_gae_match_loops(seed, gamma, lam):
    r, v, m, ids = random_batch(seed)
    adv, ret = gae(r, v, m, gamma, lam)
    tadv, tret = turn_gae(r, v, m, ids, gamma, lam)
    for b in range(r.shape[0]):
        row = (r[b].tolist(), v[b].tolist(), m[b].tolist())
        ea, er = ref_gae_row(*row, gamma, lam)
        close(adv[b], ea, 1e-9)
        close(ret[b], er, 1e-9)
        ea, er = ref_turn_gae_row(*row, ids[b].tolist(), gamma, lam)
        close(tadv[b], ea, 1e-9)
        close(tret[b], er, 1e-9)


def test_gae_terminal_reward_gives_r_minus_v():
    _, v, m, _ = random_batch(7)
    last = (m * torch.arange(m.shape[1])).argmax(1)  # last policy position of each row
    R = torch.tensor([0.0, 1.0, -2.0, 3.0, 0.5, 10.0], dtype=torch.float64)
    r = torch.zeros_like(v).scatter_(1, last[:, None], R[:, None])
    adv, ret = gae(r, v, m)
    close(adv, (R[:, None] - v) * m, 1e-9)
    close(ret, R[:, None] * m, 1e-9)


def test_masked_positions_never_influence_outputs():
    r, v, m, ids = random_batch(3)
    junk = torch.full_like(r, NAN)
    r2, v2 = torch.where(m.bool(), r, junk), torch.where(m.bool(), v, -junk)
    for f, extra in [(gae, ()), (turn_gae, (ids,))]:
        for a, b in zip(f(r, v, m, *extra, 0.9, 0.8), f(r2, v2, m, *extra, 0.9, 0.8)):
            torch.testing.assert_close(a, b)
    lp = torch.randn_like(r)
    l1, _ = policy_loss(lp, lp - 0.1, r, m)
    l2, _ = policy_loss(torch.where(m.bool(), lp, junk), lp - 0.1, r2, m)
    torch.testing.assert_close(l1, l2)


def test_bf16_inputs_computed_in_float32():
    r, v, m, ids = random_batch(5)
    adv, _ = gae(r.bfloat16(), v.bfloat16(), m.bool())
    assert adv.dtype == torch.float32
    ref, _ = gae(r.bfloat16().double(), v.bfloat16().double(), m)
    close(adv.double(), ref, 1e-5)


# ---------------------------------------------------------------------------- GRPO


def test_group_advantages_by_hand():
    s = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 2.0, 2.0])
    g = torch.tensor([0, 0, 0, 0, 5, 7, 7])
    # group 0: mean .5, sample std sqrt(4 * .25 / 3) = .5774 -> +-.5/.5774 = +-.8660254;
    # group 5 has one member and group 7 equal scores: both 0.
    close(group_advantages(s, g), [0.8660254, -0.8660254, -0.8660254, 0.8660254, 0, 0, 0], 1e-5)
    close(group_advantages(s, g, normalize_std=False), [0.5, -0.5, -0.5, 0.5, 0, 0, 0])
    close(ADVANTAGE_ESTIMATORS["grpo_no_std"](s, g), [0.5, -0.5, -0.5, 0.5, 0, 0, 0])


def test_broadcast_to_tokens():
    out = broadcast_to_tokens(torch.tensor([2.0, 3.0]), torch.tensor([[1, 0, 1], [0, 1, 1]]))
    close(out, [[2.0, 0.0, 2.0], [0.0, 3.0, 3.0]])


# ---------------------------------------------------------------------------- losses


def _pl_batch():
    # (A, ratio): clip-higher active, inside clip-higher (1.25 < 1.28), dual clip, low clip
    a = t([1.0, 1.0, -1.0, -1.0])
    old = torch.zeros_like(a)
    lp = torch.log(t([1.5, 1.25, 10.0, 0.5])).requires_grad_()
    return lp, old, a, torch.ones_like(a)


def test_policy_loss_by_hand():
    lp, old, a, m = _pl_batch()
    loss, st = policy_loss(lp, old, a, m)
    # per token: max(-1.5, -1.28) = -1.28 ; -1.25 ; min(max(10, 1.28), 3) = 3 ; max(.5, .8) = .8
    close(loss, (-1.28 - 1.25 + 3 + 0.8) / 4)
    assert st["clipfrac"] == pytest.approx(0.75) and st["clipfrac_dual"] == pytest.approx(0.25)
    assert st["ratio_mean"] == pytest.approx(13.25 / 4)
    assert st["advantage_mean"] == 0.0
    assert policy_loss(lp, old, a, t([1, 1, 1, 0]))[1]["advantage_mean"] == pytest.approx(1 / 3)
    # k3 = rho - 1 - log rho: .0945349 + .0268564 + 6.6974149 + .1931472
    assert st["approx_kl"] == pytest.approx(7.0119534 / 4)
    loss.backward()
    # Clipped tokens get no gradient; the free one gets d(-A rho)/d logp / 4 = -1.25 / 4.
    close(lp.grad, [[0.0, -0.3125, 0.0, 0.0]])


def test_policy_loss_without_dual_clip_and_symmetric():
    lp, old, a, m = _pl_batch()
    loss, _ = policy_loss(lp, old, a, m, dual_clip=None)
    close(loss, (-1.28 - 1.25 + 10 + 0.8) / 4)
    loss, st = policy_loss(lp, old, a, m, clip_high=0.2, dual_clip=None)
    close(loss, (-1.2 - 1.2 + 10 + 0.8) / 4)  # 1.25 is now clipped to 1.2
    assert st["clipfrac"] == pytest.approx(0.75)  # tokens 0, 1, 3
    with pytest.raises(ValueError):
        policy_loss(lp, old, a, m, dual_clip=1.0)


def test_value_loss_by_hand():
    v, old, ret, m = t([1.0, 0.0]), t([0.0, 0.0]), t([1.0, 0.3]), t([1, 1])
    loss, st = value_loss(v, old, ret, m, clip=0.5)
    # tok0: (V-R)^2 = 0 but clipped V = .5 gives .25 -> .5*.25 ; tok1: .5*.09
    close(loss, (0.125 + 0.045) / 2)
    assert st["vf_clipfrac"] == pytest.approx(0.5)
    loss, st = value_loss(v, old, ret, m, clip=None)
    close(loss, 0.045 / 2)
    assert st["vf_clipfrac"] == 0.0


def test_values_inside_the_clip_range_are_never_clipped():
    """V_old + (V - V_old) rounds away from V for some floats; before, about 0.3% of such
    tokens were counted as clipped (and took the rounded term), so the count depended on
    the summation order, e.g. on the number of processes."""
    g = torch.Generator().manual_seed(0)
    v = torch.randn(1, 10000, generator=g)
    old, ret = v + 0.4 * (torch.rand(1, 10000, generator=g) - 0.5), torch.randn(1, 10000, generator=g)
    loss, st = value_loss(v, old, ret, torch.ones(1, 10000), clip=0.5)
    assert st["vf_clipfrac"] == 0.0
    assert torch.equal(loss, value_loss(v, old, ret, torch.ones(1, 10000), clip=None)[0])


def test_entropy_from_logits():
    inf = float("inf")
    z = torch.tensor([[[0.0, 0.0], [0.0, -inf], [0.0, math.log(3.0)], [1e4, 1e4]]])
    # log 2 ; 0 ; -(.25 ln .25 + .75 ln .75) = .5623351 ; log 2 without overflow
    close(entropy_from_logits(z), [[0.6931472, 0.0, 0.5623351, 0.6931472]])
    z = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0))
    close(entropy_from_logits(z.bfloat16()), torch.distributions.Categorical(
        logits=z.bfloat16().float()).entropy(), 1e-5)


def test_kl_penalty_by_hand():
    lp, ref = torch.log(t([0.5])), torch.log(t([0.25]))
    close(kl_penalty(lp, ref, "k1"), [[0.6931472]])  # log 2
    close(kl_penalty(lp, ref, "k2"), [[0.2402265]])  # .5 log^2 2
    close(kl_penalty(lp, ref, "k3"), [[0.1931472]])  # q/p - log(q/p) - 1 = .5 + log 2 - 1
    close(kl_penalty(ref, lp, "abs"), [[0.6931472]])
    x = torch.randn(3, 5)
    close(kl_penalty(x, x, "k3"), torch.zeros(3, 5))


def test_exact_kl_by_hand():
    """p = (1/2, 1/2, 0), q = (1/4, 1/4, 1/2): KL = 2 * (1/2) log 2 = log 2; the token p gives
    probability 0 (a -inf logit) adds nothing. Zero for equal rows, also shifted ones."""
    logits = torch.log(t([0.5, 0.5, 0.0]))
    close(core.exact_kl(logits, torch.log(t([0.25, 0.25, 0.5]))), [math.log(2)])
    x = torch.randn(2, 4, 7)
    close(core.exact_kl(x, x + 3.0), torch.zeros(2, 4))


def test_exact_kl_pulls_back_a_token_the_policy_stopped_sampling():
    """The exact KL's gradient raises the logit of a token at probability ~0 that the
    reference plays, where a sampled estimator never sees that token at all."""
    logits = torch.tensor([[8.0, 0.0, -12.0]], requires_grad=True)
    core.exact_kl(logits, torch.zeros(1, 3)).sum().backward()
    assert logits.grad[0, 2] < 0  # descent raises it
    assert logits.grad[0, 0] > 0  # and lowers the token the policy over-plays


def test_aggregation_modes_on_ragged_mask():
    loss = t([1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0], [5.0, 5.0, 5.0, NAN])
    m = t([1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0])
    close(aggregate(loss, m, "token-mean"), (1 + 2 + 3 + 10) / 4)
    close(aggregate(loss, m, "seq-mean-token-mean"), (2 + 10) / 2)  # empty row not counted
    close(aggregate(loss, m, "seq-mean-token-sum"), (6 + 10) / 2)
    for mode in AGGREGATIONS:
        close(aggregate(loss, torch.zeros_like(m), mode), 0.0)
        lp, old, a, _ = _pl_batch()
        out, st = policy_loss(lp, old, a, torch.zeros_like(a), agg=mode)
        assert out.item() == 0.0 and not any(math.isnan(x) for x in st.values())


# ---------------------------------------------------------------------------- registries


def test_registries():
    assert set(ADVANTAGE_ESTIMATORS) == {"gae", "turn_gae", "grpo", "grpo_no_std"}
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3", "abs"}
    assert get(KL_ESTIMATORS, "k3", "KL estimator") is KL_ESTIMATORS["k3"]
    msg = r"^KL estimator 'k9' is not known; valid: abs, k1, k2, k3$"
    with pytest.raises(ValueError, match=msg):
        get(KL_ESTIMATORS, "k9", "KL estimator")
    msg = "'bogus'.*seq-mean-token-mean, seq-mean-token-sum, token-mean"
    with pytest.raises(ValueError, match=msg):
        aggregate(t([1.0]), t([1]), "bogus")
    with pytest.raises(ValueError, match="'k4'"):
        kl_penalty(t([1.0]), t([1.0]), "k4")
    assert set(core.__all__) >= {"gae", "turn_gae", "policy_loss", "get"}


def test_group_of_equal_inexact_scores_gets_exactly_zero():
    """Eight equal scores like 29/36 or 0.7 are not exactly their float mean; the std
    division must not turn that rounding into an advantage."""
    for value in (29 / 36, 0.7, 0.1, -0.30000000000000004):
        scores = torch.full((8,), value, dtype=torch.float32)
        groups = torch.zeros(8, dtype=torch.long)
        assert group_advantages(scores, groups).abs().max().item() == 0.0
        assert group_advantages(scores, groups, normalize_std=False).abs().max().item() == 0.0
