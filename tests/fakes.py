"""Stand-ins shared by tests and by the launched test script (tests/dist_script.py)."""

import zlib
from collections import Counter
from collections.abc import Callable

from spa.models.engine import Generation


def hashed_answers(tokenizer, prompts, answers: tuple[str, ...], logprobs: Callable[[int], list[float]]
                   ) -> list[Generation]:
    """One of ``answers`` per prompt, by the hash of its tokens plus how often it came before
    in the call (a level's samples share their first prompt and must still differ): the
    answers depend on the episode alone, not on which episodes share the batch."""
    seen: Counter = Counter()
    out = []
    for prompt in prompts:
        key = tuple(prompt)
        text = answers[(zlib.crc32(str(key).encode()) + seen[key]) % len(answers)]
        seen[key] += 1
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        out.append(Generation(ids, text, logprobs(len(ids)), "stop"))
    return out
