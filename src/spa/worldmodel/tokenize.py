"""Turn SFT examples into token ids and a loss mask.

The loss mask covers exactly the assistant's ``<think>...</think><answer>...</answer>``
tokens, states included: the paper's world-model SFT. The
prompt, the chat template's role markers and the end-of-turn token never carry loss.
With ``mask_states`` the contents of ``<observation>`` and ``<prediction>`` are taken
out of the loss too (the public release's behaviour and the paper's "no transition
learning" ablation); ``masked`` names such tags for one example alone (expert iteration's
``best_grounded``: the states the policy got wrong).

Token membership is decided from the tokenizer's character offsets, so it does not
depend on how the template splits text into tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from spa.models.tokens import TokenizedExample, encode_with_mask


def _span(text: str, open_tag: str, close_tag: str, start: int = 0) -> tuple[int, int] | None:
    """Character span from the start of ``open_tag`` to the end of ``close_tag``."""
    begin = text.find(open_tag, start)
    end = text.find(close_tag, begin + len(open_tag)) if begin >= 0 else -1
    return (begin, end + len(close_tag)) if begin >= 0 and end >= 0 else None


def _content(text: str, tag: str, start: int) -> tuple[int, int] | None:
    """Character span of the content between ``<tag>`` and ``</tag>``."""
    span = _span(text, f"<{tag}>", f"</{tag}>", start)
    return (span[0] + len(tag) + 2, span[1] - len(tag) - 3) if span else None


def tokenize_example(tokenizer, messages: list[dict], response: str,
                     mask_states: bool = False, masked: Sequence[str] = ()) -> TokenizedExample:
    """Chat-template ``messages`` + the assistant ``response``; mask the trained tokens."""
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    text = prompt + response
    # One span from <think> to </answer>: a token may straddle "</think><answer>".
    spans = [s for s in (_span(text, "<think>", "</think>", len(prompt)),
                         _span(text, "<answer>", "</answer>", len(prompt))) if s]
    trained = [(min(s[0] for s in spans), max(s[1] for s in spans))] if spans else []
    tags = ("observation", "prediction") if mask_states else masked
    excluded = [s for s in (_content(text, tag, len(prompt)) for tag in tags) if s]
    return encode_with_mask(tokenizer, text, trained, excluded)
