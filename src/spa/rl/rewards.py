"""Rewards of the world-model baselines, TRL style: ``(completions, **ctx) -> list[float]``.

* RWML (Yu et al., 2026, seed 003): the policy predicts the next state inside
  ``<prediction>..</prediction>`` and earns the binary sim-to-real reward
  ``1[1 - cos(E(pred), E(true)) < tau]`` (``prediction_embedding_reward``), with two
  deterministic alternatives for grids: exact match and per-cell accuracy, and one of
  ours, per-cell accuracy balanced between changed and unchanged cells, which does not
  pay a copy of the state before the actions.
* VAGEN-style online world modelling: a per-turn shaping reward for the
  ``<observation>`` and ``<prediction>`` spans plus a format reward
  (``vagen_turn_reward``). VAGEN asks an LLM judge whether a state is right; we use the
  deterministic matcher ``spa.agent.grids.state_match`` instead (DESIGN.md).

Every reward is 0 for a completion with no ``<prediction>`` block. Extra keyword
arguments (TRL passes ``prompts``, ``completion_ids``, dataset columns...) are ignored.
"""

from __future__ import annotations

from typing import Callable

from spa.agent.grids import aligned_cells, cell_accuracy, exact_match, grid_cells, split_state, state_match

#: RWML's threshold on the cosine distance. The paper's value is not in the seed
#: document, so it is calibrated for all-MiniLM-L6-v2 on our grid states, where the
#: embedding barely sees the grid: re-spacing or re-casing a state costs 0, dropping the
#: final period 0.0021, the player one step off 0.0055, and copying the state before the
#: move (the trivial wrong answer) a median 0.004-0.026 depending on the game.
#: 0.003 accepts the harmless variants and rejects the player one step off; it still
#: pays for 9-15% of copied states (measured on 60 seeds per game), the price of
#: judging grids with a sentence embedding, which is why "exact" and "cell" exist.
EMBEDDING_TAU = 0.003

_OPEN, _CLOSE = "<prediction>", "</prediction>"


def _text(completion) -> str:
    """A completion as text: TRL's conversational format is a list of messages."""
    if isinstance(completion, list):
        return str(completion[-1].get("content", "")) if completion else ""
    return completion if isinstance(completion, str) else ""


def extract_prediction(completion) -> str | None:
    """The content of the completion's last complete ``<prediction>`` block, or ``None``.

    The block may sit inside ``<think>`` (SPA's world-model format) or after it (the RWML
    prompt of ``spa.rl.rwml``). "Last complete block": the last opening tag that is closed
    later, up to the first closing tag after it, so the content holds no tag of its own.
    With several blocks the last one is the answer (a model that names the tag in its
    reasoning, "I will write the grid in <prediction>", or revises its guess, is judged on
    what it wrote last); nested tags give the innermost last block, and an opening tag
    never closed is ignored. (Reading from the first opening tag to the first closing one,
    as earlier versions did, returned ``a<prediction>b`` for
    ``<prediction>a<prediction>b</prediction></prediction>``.) An empty block counts as
    missing. ``parse_response`` keeps its own rule (a repeated tag is judged on its first
    use); this function is what the world-model rewards read.
    """
    text = _text(completion)
    last_close = text.rfind(_CLOSE)
    start = text.rfind(_OPEN, 0, last_close) if last_close >= 0 else -1
    if start < 0:
        return None
    start += len(_OPEN)
    return text[start : text.find(_CLOSE, start)].strip() or None


def _check_lengths(completions, states, name: str = "targets") -> None:
    if len(completions) != len(states):
        raise ValueError(
            f"got {len(completions)} completions but {len(states)} {name}; "
            f"give one state per completion in {name}"
        )


def prediction_exact_reward(completions, *, targets, **_) -> list[float]:
    """1.0 when the predicted state equals the target state, else 0.0.

    Equality is ``spa.agent.grids.exact_match`` (the evaluation's ``prediction_exact``):
    line ends may be ``\\n`` or ``\\r\\n``, blank lines and leading/trailing spaces of a
    line are ignored and runs of spaces count as one; every other character must match.
    """
    _check_lengths(completions, targets)
    out = []
    for completion, target in zip(completions, targets):
        prediction = extract_prediction(completion)
        out.append(float(prediction is not None and exact_match(prediction, target)))
    return out


def prediction_cell_reward(completions, *, targets, **_) -> list[float]:
    """Fraction of the target grid's cells that the prediction reproduces in place.

    The target's grid is its rows before the coordinate description (``split_state``);
    the prediction's grid is its first rows (``cell_accuracy``). 0 without a prediction.
    """
    _check_lengths(completions, targets)
    out = []
    for completion, target in zip(completions, targets):
        prediction = extract_prediction(completion)
        out.append(cell_accuracy(prediction, split_state(target)[0]) if prediction else 0.0)
    return out


def prediction_change_reward(completions, *, targets, befores, **_) -> list[float]:
    """Per-cell accuracy balanced between the cells the actions change and those they keep.

    The mean of the prediction's accuracy on the target grid's cells that differ from the
    state before the actions (``befores``) and its accuracy on the cells that do not; with
    nothing changed, just the latter. A copy of the state before therefore scores 0.5 on
    any transition that changes something (``cell`` pays it 1 - changed/total, close to
    1), and only the true next state scores 1. Not in the RWML paper: a grid reward that
    does not pay the copy shortcut. 0 without a prediction.
    """
    _check_lengths(completions, targets)
    _check_lengths(completions, befores, "befores")
    out = []
    for completion, target, before in zip(completions, targets, befores):
        prediction = extract_prediction(completion)
        if not prediction:
            out.append(0.0)
            continue
        true_grid = split_state(target)[0]
        truth, old = grid_cells(true_grid), grid_cells(split_state(before)[0])
        predicted = aligned_cells(prediction, true_grid)
        changed, kept = [], []
        for i, row in enumerate(truth):
            for j, cell in enumerate(row):
                hit = i < len(predicted) and j < len(predicted[i]) and predicted[i][j] == cell
                same = i < len(old) and j < len(old[i]) and old[i][j] == cell
                (kept if same else changed).append(hit)
        parts = [sum(group) / len(group) for group in (changed, kept) if group]
        out.append(sum(parts) / len(parts) if parts else 0.0)
    return out


def prediction_embedding_reward(completions, *, targets, embedder, tau: float = EMBEDDING_TAU,
                                binary: bool = True, **_) -> list[float]:
    """RWML's sim-to-real reward ``1[1 - cos(E(pred), E(true)) < tau]`` (seed 003).

    ``embedder`` has ``encode(list[str]) -> (N, D)`` unit-norm tensor
    (``spa.models.embedding.SentenceEmbedder``). ``binary=False`` returns the cosine
    itself (clamped to [0, 1]), a dense ablation; the paper found the binary reward
    more stable. See ``EMBEDDING_TAU`` for how the default was chosen.
    """
    _check_lengths(completions, targets)
    if not tau > 0:
        raise ValueError(f"tau={tau!r} must be > 0: the reward needs a distance below tau")
    predictions = [extract_prediction(c) for c in completions]
    distances = embedding_distances(embedder)(predictions, list(targets))
    if binary:
        return [float(d < tau) for d in distances]
    return [min(max(1.0 - d, 0.0), 1.0) for d in distances]


def embedding_distances(embedder) -> Callable[[list, list], list[float]]:
    """RWML's distance ``1 - cos(E(pred), E(true))`` as a batched function of
    ``(predictions, truths)``: one ``encode`` call for all pairs. A missing prediction
    (``None`` or empty) is at distance 2, the largest a cosine distance can be."""
    def distances(predictions: list, truths: list) -> list[float]:
        scored = [i for i, p in enumerate(predictions) if p]
        out = [2.0] * len(predictions)
        if scored:
            texts = [predictions[i] for i in scored] + [truths[i] for i in scored]
            vectors = embedder.encode(texts)
            cosines = (vectors[: len(scored)] * vectors[len(scored):]).sum(-1).tolist()
            for i, cos in zip(scored, cosines):
                out[i] = 1.0 - cos
        return out
    return distances


WORLD_MODEL_REWARDS: dict[str, Callable[..., list[float]]] = {
    "embedding": prediction_embedding_reward,
    "exact": prediction_exact_reward,
    "cell": prediction_cell_reward,
    "change": prediction_change_reward,
}


def get_reward(name: str) -> Callable[..., list[float]]:
    """The world-model reward registered under ``name``; an unknown name lists the valid ones."""
    try:
        return WORLD_MODEL_REWARDS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown world-model reward {name!r}; valid names: {', '.join(WORLD_MODEL_REWARDS)}"
        ) from None


def vagen_turn_reward(turn, beta_s: float = 0.5, beta_w: float = 0.5,
                      format_reward: float = 0.5) -> float:
    """VAGEN-style shaping reward of one ``spa.agent.trajectory.Turn``, added to its env reward.

    ``format_reward * 1[format_ok] + beta_s * state_match(observation, state_before)
    + beta_w * state_match(prediction, state_after)``, with VAGEN's beta_s = beta_w = 0.5
    and its Sokoban default format reward 0.5.

    Departure from a plain sum: a turn whose format is broken earns nothing, state terms
    included. Otherwise a policy could collect up to ``beta_s + beta_w`` per turn by
    copying the state it is shown and never answering, which VAGEN's parser also
    prevents (no valid format, no state reward).
    """
    if not turn.format_ok:
        return 0.0
    return (format_reward
            + beta_s * state_match(turn.observation, turn.state_before)
            + beta_w * state_match(turn.prediction, turn.state_after))
