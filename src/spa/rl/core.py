"""The RL math of the PPO/GRPO trainer: pure functions over (B, T) tensors with masks.

Conventions shared by every function here:

- B rows (sequences or episodes), T token positions. ``mask`` (B, T), bool or 0/1, is 1 on
  the tokens the policy generated and 0 on prompt, environment and padding tokens. Inputs
  at masked positions are never read (they may hold anything, NaN included) and outputs
  there are 0.
- Work happens on the inputs' device in at least float32 (bf16/fp16 are upcast, float64
  stays float64), because advantages and losses are sums of many small terms.
- An empty mask gives 0, never NaN (explained_variance excepted: its answer is undefined).

Papers: PPO (Schulman et al. 2017, arXiv:1707.06347); GAE (Schulman et al. 2016,
arXiv:1506.02438); dual clip (Ye et al. 2020, arXiv:1912.09729); clip-higher and
token-mean aggregation (DAPO, Yu et al. 2025, arXiv:2503.14476); GRPO (DeepSeekMath,
Shao et al. 2024, arXiv:2402.03300); Dr. GRPO (Liu et al. 2025, arXiv:2503.20783);
KL estimators k1/k2/k3 (Schulman 2020, http://joschu.net/blog/kl-approx.html).
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch import Tensor

__all__ = [
    "ADVANTAGE_ESTIMATORS", "AGGREGATIONS", "KL_ESTIMATORS", "aggregate", "broadcast_to_tokens",
    "entropy_from_logits", "episode_balance", "exact_kl", "explained_variance", "gae", "get", "group_advantages",
    "kl_penalty",
    "magnitude_draw", "masked_mean", "masked_sum", "masked_whiten", "policy_loss", "turn_gae", "value_loss", "whiten_with",
]


def _up(*xs: Tensor) -> torch.dtype:
    """The common compute dtype of ``xs``: their promoted dtype, at least float32."""
    dtype = torch.float32
    for x in xs:
        dtype = torch.promote_types(dtype, x.dtype)
    return dtype


# ---------------------------------------------------------------------------- masked stats


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum_{i: mask_i=1} x_i over ``dim`` (all dims if None). x, mask broadcastable."""
    # where, not x * mask: 0 * NaN (or inf) at a masked position would poison the sum.
    y = torch.where(mask.bool(), x.to(_up(x)), 0.0)
    return y.sum() if dim is None else y.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum_{mask=1} x / #{mask=1} over ``dim``; 0 where the mask is empty (no NaN)."""
    count = torch.broadcast_to(mask.bool(), torch.broadcast_shapes(x.shape, mask.shape))
    count = count.sum() if dim is None else count.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def _masked_var(x: Tensor, mask: Tensor) -> Tensor:
    # Population variance (divide by n): defined for a single token, and whitening is
    # insensitive to the n/(n-1) factor anyway.
    return masked_mean((x.to(_up(x)) - masked_mean(x, mask)) ** 2, mask)


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(x - mu) / sqrt(var + eps) with mu, var (population) over the masked positions of the
    whole tensor; with shift_mean=False the mean is added back (scale only). 0 where masked."""
    return whiten_with(x, mask, masked_mean(x, mask), _masked_var(x, mask), shift_mean, eps)


def whiten_with(x: Tensor, mask: Tensor, mean: Tensor | float, var: Tensor | float, shift_mean: bool = True,
                eps: float = 1e-8) -> Tensor:
    """masked_whiten's transform with the moments given: (x - mean) / sqrt(var + eps) on the
    masked positions (+ mean again with shift_mean=False), 0 elsewhere.

    For moments gathered elsewhere: the PPO trainer whitens one step's advantages with the
    mean and variance of all processes' tokens. x, mask: broadcastable; mean, var: scalars.
    """
    dtype = _up(x)
    mean, var = torch.as_tensor(mean, dtype=dtype), torch.as_tensor(var, dtype=dtype)
    y = (x.to(dtype) - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        y = y + mean
    return torch.where(mask.bool(), y, 0.0)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var[R - V] / Var[R] over the masked positions (population variances).

    1 is a perfect critic, 0 no better than a constant, < 0 worse. nan if Var[R] == 0
    (including an empty mask), as the ratio is undefined there.
    """
    var_r = _masked_var(returns, mask)
    if var_r.item() == 0.0:
        return float("nan")
    diff = returns.to(_up(returns, values)) - values
    return float(1.0 - _masked_var(diff, mask) / var_r)


# ---------------------------------------------------------------------------- advantages


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0,
        lam: float = 1.0) -> tuple[Tensor, Tensor]:
    """Token-level Generalised Advantage Estimation (Schulman et al. 2016) over policy tokens.

        delta_t = r_t + gamma * V_next(t) - V_t
        A_t     = delta_t + gamma * lam * A_next(t)
        R_t     = A_t + V_t

    where next(t) is the next position of the same row with mask == 1 (V, A = 0 after the
    last one). Masked positions (prompt, environment text between the turns of a
    multi-turn episode, padding) are skipped as if absent, so the episode is one chain of
    policy tokens; rewards placed on them are ignored. With gamma = lam = 1 and a single
    reward R on the last policy token, A_t = R - V_t for every policy token.

    rewards, values, mask: (B, T). Returns (advantages, returns), (B, T), 0 where masked.
    """
    dtype = _up(rewards, values)
    m = mask.bool()
    r, v = rewards.to(dtype), values.to(dtype)
    B, T = r.shape
    adv = torch.zeros(B, T, dtype=dtype, device=r.device)
    next_v = torch.zeros(B, dtype=dtype, device=r.device)
    next_a = torch.zeros(B, dtype=dtype, device=r.device)
    # Backward over T, carrying the value/advantage of the last policy token seen, so a
    # masked gap simply passes them through unchanged.
    for t in reversed(range(T)):
        mt = m[:, t]
        a_t = r[:, t] + gamma * next_v - v[:, t] + gamma * lam * next_a
        adv[:, t] = torch.where(mt, a_t, 0.0)
        next_v = torch.where(mt, v[:, t], next_v)
        next_a = torch.where(mt, a_t, next_a)
    returns = torch.where(m, adv + v, 0.0)
    return adv, returns


def turn_gae(rewards: Tensor, values: Tensor, mask: Tensor, turn_ids: Tensor,
             gamma: float = 1.0, lam: float = 1.0) -> tuple[Tensor, Tensor]:
    """Turn-level GAE: one decision per turn (the turn level of "bi-level GAE", VAGEN,
    Wang et al. 2025; turn-level critics as in ArCHer, Zhou et al. 2024).

    For each row and turn k: V_k = V at the turn's first policy token, r_k = sum of r over
    the turn's policy tokens; then gae over the turns (in increasing turn id, turns absent
    from a row skipped), and every token of turn k gets A_k and R_k = A_k + V_k.

    rewards, values, mask: (B, T); turn_ids: (B, T) long, the turn index (0, 1, ...) of each
    policy token, -1 (or anything) where mask == 0. Returns (advantages, returns), (B, T).
    """
    dtype = _up(rewards, values)
    m = mask.bool()
    B, T = m.shape
    dev = m.device
    idx = torch.where(m, turn_ids.long(), 0)  # masked positions scatter 0 into turn 0
    K = int(idx.max().item()) + 1 if idx.numel() else 1
    turn_r = torch.zeros(B, K, dtype=dtype, device=dev).scatter_add_(
        1, idx, torch.where(m, rewards.to(dtype), 0.0))
    # First token of each turn = the smallest position carrying its id; T marks "no token".
    pos = torch.where(m, torch.arange(T, device=dev).expand(B, T), T)
    first = torch.full((B, K), T, dtype=torch.long, device=dev).scatter_reduce_(
        1, idx, pos, "amin")
    turn_m = first < T
    turn_v = torch.where(turn_m, values.to(dtype).gather(1, first.clamp(max=max(T - 1, 0))), 0.0)
    turn_a, turn_ret = gae(turn_r, turn_v, turn_m, gamma, lam)
    adv = torch.where(m, turn_a.gather(1, idx), 0.0)
    returns = torch.where(m, turn_ret.gather(1, idx), 0.0)
    return adv, returns


def group_advantages(scores: Tensor, group_ids: Tensor, normalize_std: bool = True,
                     eps: float = 1e-6) -> Tensor:
    """GRPO outcome advantages (Shao et al. 2024): A_i = (s_i - mean_g) / (std_g + eps).

    std_g is the *sample* std (divide by n_g - 1), as in DeepSeekMath's reference and
    verl (torch.std). normalize_std=False gives A_i = s_i - mean_g (Dr. GRPO, Liu et al.
    2025, who show the std division biases towards too-easy/too-hard groups). A group of
    one gets 0; a group with equal scores gets 0.

    scores: (N,) float, group_ids: (N,) long (any values). Returns (N,).
    """
    s = scores.to(_up(scores))
    _, inv = torch.unique(group_ids, return_inverse=True)
    G = int(inv.max().item()) + 1 if inv.numel() else 0
    count = torch.zeros(G, dtype=s.dtype, device=s.device).index_add_(0, inv, torch.ones_like(s))
    mean = torch.zeros_like(count).index_add_(0, inv, s) / count
    dev = s - mean[inv]
    # Equal scores must give exactly 0: the float mean can differ from them by an ulp,
    # which the std division (std ~ ulp, eps 1e-6) would blow up into a real advantage.
    lo = torch.full_like(count, float("inf")).scatter_reduce(0, inv, s, "amin")
    hi = torch.full_like(count, float("-inf")).scatter_reduce(0, inv, s, "amax")
    dev = torch.where((lo == hi)[inv], 0.0, dev)
    if not normalize_std:
        return dev
    var = torch.zeros_like(count).index_add_(0, inv, dev**2) / (count - 1).clamp(min=1)
    return dev / (var.sqrt()[inv] + eps)


def episode_balance(loss_tokens: Tensor, mean_tokens: float | None = None) -> Tensor:
    """Per-episode advantage scales that make a token-mean loss weigh every episode alike.

    w_e = mean_tokens / L_e, with L_e the episode's policy-loss tokens (over all its turns)
    and ``mean_tokens`` their mean over the episodes (by default those given). Scaling each
    episode's advantages by w_e scales its share of the clipped loss by w_e (the surrogate
    is positively homogeneous in A; the clip decisions depend only on its sign), so the
    token-mean then equals the mean over episodes of each episode's token-mean.

    Why: GRPO's advantages sum to zero within a group, but under a token-mean the longer
    episodes weigh more. In multi-turn play the losers are the longer ones (they wander
    until the turn limit, or ramble past the answer), so the step's advantage mass is
    negative on balance, and a step that mostly pushes the sampled tokens down moves
    probability to the already likely ones: the policy narrows onto one habit. Balanced,
    each group's mass is exactly zero. An episode with no loss token gets 0.

    loss_tokens: (E,) counts. Returns (E,) float.
    """
    n = loss_tokens.to(_up(loss_tokens))
    if mean_tokens is None:
        mean_tokens = float(n.mean()) if n.numel() else 0.0
    return torch.where(n > 0, mean_tokens / n.clamp(min=1), 0.0)


def weigh_negatives(advantages: Tensor, weight: float) -> Tensor:
    """``advantages`` with every negative entry multiplied by ``weight`` (positives kept).

    ``weight = 1`` is the plain policy gradient; ``weight = 0`` reinforces only what beat
    its baseline, which makes the update a likelihood step on the winners, as in
    rejection-sampling fine-tuning. Why one would try it: pushing a sampled answer down
    moves its probability to the answers the model already favours (the softmax gives
    the freed mass in proportion to the current probabilities), which could squeeze a
    model that cannot yet tell the states apart onto one likely answer. Measured on a
    one-move FrozenLake task, weight 0 did not stop that drift (docs/making-rl-learn.md,
    "RL on a one-move task"), so the default stays 1.
    """
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"negative weight {weight!r} must be from 0 to 1")
    return torch.where(advantages < 0, advantages * weight, advantages)


def magnitude_draw(advantages: Tensor, draws: int, generator: torch.Generator | None = None
                   ) -> tuple[Tensor, Tensor]:
    """Which turns to train and their new advantages: ``draws`` draws with replacement,
    turn i with probability ``|A_i| / sum_j |A_j|``; returns the indices drawn (each once,
    ascending) and their advantages ``c_i * sign(A_i) * mean_j |A_j|``, with ``c_i`` the
    times turn i was drawn.

    A draw lands on turn i with probability ``|A_i| / S`` (``S = sum_j |A_j|``), so
    ``E[sign(A) g]`` over one draw is ``sum_i A_i g_i / S``, and the mean over the draws of
    ``sign(A) g * S / N`` is an unbiased estimate of the mean over all N turns of ``A g``:
    a mean loss over the drawn turns (the trainer's token-mean, when the turns are about as
    long as each other) estimates the whole step's at the cost of ``draws`` turns. Turns with a large advantage carry most of a step's signal, and per-turn
    Monte-Carlo advantages leave many turns near 0: training on all of them buys little,
    and training a turn costs about 8x playing it on a CPU (docs/rl.md).

    advantages: (N,) one advantage per turn. With ``draws >= N``, or all advantages 0,
    every turn is returned unchanged.
    """
    n = advantages.numel()
    magnitude = advantages.abs().double()
    total = float(magnitude.sum())
    if draws >= n or total == 0.0:
        return torch.arange(n), advantages.clone()
    picks = torch.multinomial(magnitude / total, draws, replacement=True, generator=generator)
    counts = torch.bincount(picks, minlength=n)
    chosen = counts.nonzero()[:, 0]
    scale = total / n
    return chosen, (counts[chosen] * advantages[chosen].sign() * scale).to(advantages.dtype)


def key_means(sums: Tensor, counts: Tensor, keys: Tensor, num_keys: int) -> Tensor:
    """(num_keys,) ``out[k] = sum_{i: keys_i = k} sums_i / sum_{i: keys_i = k} counts_i``
    (0 for a key with no count).

    With ``sums_i`` a turn's advantage summed over its policy-loss tokens and ``counts_i``
    its loss tokens, keyed by the turn's first action, ``out[k]`` is the mean advantage of
    a token of action k's turns. Subtracting it from those turns leaves each action's
    total push zero, so a token-mean step no longer moves the share of first actions as a
    whole (the part of the gradient any state-blind policy would follow) and keeps what
    tells the states apart: in this state, this action did better than it does on average.
    An action-dependent baseline, so a biased policy gradient; see ``spa.rl.advantages.center_actions``.
    ``sums``, ``counts``: (N,); ``keys``: (N,) long in ``[0, num_keys)``.
    """
    totals = torch.zeros(num_keys, dtype=torch.float64).index_add_(0, keys, sums.double())
    tokens = torch.zeros(num_keys, dtype=torch.float64).index_add_(0, keys, counts.double())
    return torch.where(tokens > 0, totals / tokens.clamp(min=1e-12), 0.0)


def broadcast_to_tokens(per_sequence: Tensor, mask: Tensor) -> Tensor:
    """(N,) -> (N, T): each sequence's scalar on its policy tokens, 0 elsewhere."""
    x = per_sequence.to(_up(per_sequence))
    return torch.where(mask.bool(), x[:, None], 0.0)


# ---------------------------------------------------------------------------- losses


def _agg_token_mean(loss: Tensor, mask: Tensor) -> Tensor:
    return masked_mean(loss, mask)


def _agg_seq_mean(loss: Tensor, mask: Tensor, per_row: Callable) -> Tensor:
    # Mean over the rows that have a token: an empty row (e.g. a truncated sample) should
    # not dilute the others.
    nonempty = mask.bool().any(-1)
    return masked_mean(per_row(loss, mask, -1), nonempty)


AGGREGATIONS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    # Every token weighs the same (DAPO): long answers are not down-weighted.
    "token-mean": _agg_token_mean,
    # Every sequence weighs the same (original GRPO): a length bias, kept for comparison.
    "seq-mean-token-mean": functools.partial(_agg_seq_mean, per_row=masked_mean),
    # Per-sequence sums, averaged (Dr. GRPO-like, no length normalisation).
    "seq-mean-token-sum": functools.partial(_agg_seq_mean, per_row=masked_sum),
}


def aggregate(loss: Tensor, mask: Tensor, mode: str = "token-mean") -> Tensor:
    """Reduce a per-token loss (B, T) to a scalar. Modes (see AGGREGATIONS):
    "token-mean" sum(l*m)/sum(m); "seq-mean-token-mean" mean over non-empty rows of the
    row's token mean; "seq-mean-token-sum" mean over non-empty rows of the row's token sum."""
    return get(AGGREGATIONS, mode, "aggregation")(loss, mask)


def policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                clip_low: float = 0.2, clip_high: float = 0.28, dual_clip: float | None = 3.0,
                agg: str = "token-mean") -> tuple[Tensor, dict]:
    """PPO clipped surrogate with asymmetric clip (DAPO clip-higher) and dual clip.

        rho = exp(logp - logp_old)
        L   = max(-A * rho, -A * clip(rho, 1 - clip_low, 1 + clip_high))   (PPO)
        L   = min(L, -dual_clip * A)  where A < 0                          (Ye et al. 2020)

    The dual clip bounds the loss of a negative-advantage token whose ratio has exploded
    (rho > dual_clip), which would otherwise dominate the batch. dual_clip=None disables it.

    logprobs, old_logprobs, advantages, mask: (B, T). Returns (scalar loss, stats) with
    float stats: clipfrac (share of policy tokens where either clip cut the gradient),
    clipfrac_dual (share where the dual clip did), approx_kl (k3 of KL[old || new]:
    rho - 1 - log rho, masked mean), ratio_mean, advantage_mean (the masked mean of A:
    below 0 the step pushes the sampled tokens down on balance, which moves probability
    to tokens that were not sampled, mostly to the already likely ones).
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
    dtype = _up(logprobs, old_logprobs, advantages)
    m = mask.bool()
    # Clamp the log-ratio so a stray token cannot overflow exp(); the loss there is clipped.
    # Zeroing masked inputs first keeps garbage there out of the gradients too (torch.where
    # alone would still send 0 * NaN = NaN back through the unselected branch).
    log_ratio = torch.where(m, logprobs.to(dtype) - old_logprobs.to(dtype), 0.0).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    a = torch.where(m, advantages.to(dtype), 0.0)
    pg1 = -a * ratio
    pg2 = -a * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(pg1, pg2)
    clipped = pg2 > pg1
    dual = torch.zeros_like(clipped)
    if dual_clip is not None:
        pg3 = -a * dual_clip
        dual = (a < 0) & (pg3 < loss)
        loss = torch.where(dual, pg3, loss)
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean((clipped | dual).to(dtype), mask).item(),
            "clipfrac_dual": masked_mean(dual.to(dtype), mask).item(),
            "approx_kl": masked_mean(ratio - 1.0 - log_ratio, mask).item(),
            "ratio_mean": masked_mean(ratio, mask).item(),
            "advantage_mean": masked_mean(a, mask).item(),
        }
    return aggregate(loss, mask, agg), stats


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor,
               clip: float | None = 0.5, agg: str = "token-mean") -> tuple[Tensor, dict]:
    """PPO clipped value loss: L = 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2).

    The clipped term keeps the critic from moving more than c from the rollout's value in
    one update; clip=None gives the plain 0.5 * (V - R)^2. values, old_values, returns,
    mask: (B, T). Returns (scalar loss, {"vf_clipfrac": share of tokens where the clipped
    term was the larger one}).
    """
    dtype = _up(values, old_values, returns)
    m = mask.bool()
    v, r = torch.where(m, values.to(dtype), 0.0), torch.where(m, returns.to(dtype), 0.0)
    vf1 = (v - r) ** 2
    if clip is None:
        loss, clipped = vf1, torch.zeros_like(vf1, dtype=torch.bool)
    else:
        v_old = torch.where(m, old_values.to(dtype), 0.0)
        vf2 = (v_old + (v - v_old).clamp(-clip, clip) - r) ** 2
        # Inside the clip range the two terms are equal but for rounding (V_old + (V - V_old)
        # is not always V), so only a value beyond the range can be clipped.
        clipped = ((v - v_old).abs() > clip) & (vf2 > vf1)
        loss = torch.where(clipped, vf2, vf1)
    with torch.no_grad():
        stats = {"vf_clipfrac": masked_mean(clipped.to(dtype), mask).item()}
    return aggregate(0.5 * loss, mask, agg), stats


def entropy_from_logits(logits: Tensor) -> Tensor:
    """H = logsumexp(z) - sum_v softmax(z)_v z_v, per position. (B, T, V) -> (B, T).

    The logsumexp form needs no log of small probabilities; shifting by the row max (H is
    shift-invariant) avoids cancellation between two large terms; -inf logits (banned
    tokens) contribute 0 rather than 0 * -inf = NaN.
    """
    z = logits.to(_up(logits))
    shift = z.detach().amax(-1, keepdim=True)
    z = z - torch.where(torch.isfinite(shift), shift, 0.0)
    p = torch.softmax(z, dim=-1)
    pz = torch.where(p > 0, p * z, 0.0)
    return torch.logsumexp(z, dim=-1) - pz.sum(-1)


# ---------------------------------------------------------------------------- KL


def _kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return logprobs - ref_logprobs


def _kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return 0.5 * (logprobs - ref_logprobs) ** 2


def _kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    # Clamped so exp() cannot overflow on a token the reference finds absurd.
    d = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return torch.exp(d) - d - 1.0


def _kl_abs(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return (logprobs - ref_logprobs).abs()


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "k1": _kl_k1, "k2": _kl_k2, "k3": _kl_k3, "abs": _kl_abs,
}
# Not a function of the sampled tokens' log-probs: the whole distributions (exact_kl).
EXACT_KL = "full"


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k1") -> Tensor:
    """Per-token estimate of KL[p || q] from tokens sampled from p (the policy), q = ref.

    With d = log q - log p:  k1 = -d (unbiased, high variance, can be negative);
    k2 = 0.5 d^2 (biased, low variance); k3 = exp(d) - d - 1 (unbiased, low variance,
    always >= 0; Schulman 2020); abs = |d|. (B, T) -> (B, T); mask it yourself.
    """
    dtype = _up(logprobs, ref_logprobs)
    return get(KL_ESTIMATORS, kind, "KL estimator")(logprobs.to(dtype), ref_logprobs.to(dtype))


def exact_kl(logits: Tensor, ref_logits: Tensor) -> Tensor:
    """KL[p || q] = sum_v p_v (log p_v - log q_v) per position, over the whole vocabulary,
    with p = softmax(logits) (the policy) and q = softmax(ref_logits). (..., V) -> (...).

    The sampled estimators (:data:`KL_ESTIMATORS`) only see the tokens the policy samples,
    so a move whose probability has fallen toward 0 while the reference still plays it is
    never sampled and never pulled back; the exact sum pulls it back wherever it is
    compared. Tokens with p_v = 0 (-inf logits) contribute 0.
    """
    dtype = _up(logits, ref_logits)
    logp = torch.log_softmax(logits.to(dtype), -1)
    logq = torch.log_softmax(ref_logits.to(dtype), -1)
    p = logp.exp()
    return torch.where(p > 0, p * (logp - logq), 0.0).sum(-1)


# ---------------------------------------------------------------------------- registries


ADVANTAGE_ESTIMATORS: dict[str, Callable] = {
    # (rewards, values, mask[, turn_ids], gamma, lam) -> (advantages, returns)
    "gae": gae,
    "turn_gae": turn_gae,
    # (scores, group_ids) -> per-episode advantages (N,); spread with broadcast_to_tokens
    "grpo": functools.partial(group_advantages, normalize_std=True),
    "grpo_no_std": functools.partial(group_advantages, normalize_std=False),
}


def get(registry: dict, name: str, what: str) -> Callable:
    """registry[name], or a ValueError naming ``what`` and listing the valid names."""
    if name not in registry:
        raise ValueError(f"{what} {name!r} is not known; valid: {', '.join(sorted(registry))}")
    return registry[name]
