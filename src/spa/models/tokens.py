"""Token ids of a text with a mask over chosen character spans: what SFT trains on and what
perplexity scores, decided from the tokenizer's character offsets so that the mask does
not depend on how the tokenizer splits the text."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenizedExample:
    input_ids: list[int]
    loss_mask: list[bool]  # True where the token is a training target

    def __len__(self) -> int:
        return len(self.input_ids)


def encode_with_mask(tokenizer, text: str, include: list[tuple[int, int]],
                     exclude: list[tuple[int, int]] = ()) -> TokenizedExample:
    """Token ids of ``text``; a token is marked when its characters lie entirely inside
    an ``include`` span and not entirely inside an ``exclude`` span."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)

    def inside(a: int, b: int, spans) -> bool:
        return any(lo <= a and b <= hi for lo, hi in spans)

    mask = [b > a and inside(a, b, include) and not inside(a, b, exclude)
            for a, b in encoded["offset_mapping"]]
    return TokenizedExample(list(encoded["input_ids"]), mask)
