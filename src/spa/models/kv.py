"""The KV cache of a transformers forward, under whichever name the installed version uses.

transformers 5 renamed the forward argument and output field ``past_key_values`` to
``cache``; the old name still works but warns, and goes away in 5.40. The engine, SFT
and perplexity pass and read the cache through these helpers, so the same code runs
from 4.57 (the oldest version supported) to the newest.
"""

from __future__ import annotations

from dataclasses import fields
from functools import cache
from typing import Any


@cache
def cache_name() -> str:
    """``"cache"`` where this transformers calls it so, else ``"past_key_values"``."""
    from transformers.modeling_outputs import BaseModelOutputWithPast

    return "cache" if any(f.name == "cache" for f in fields(BaseModelOutputWithPast)) else "past_key_values"


def cache_arg(kv: Any) -> dict[str, Any]:
    """The keyword argument that hands ``kv`` to a model's forward: ``model(..., **cache_arg(kv))``."""
    return {cache_name(): kv}


def returned_cache(out: Any) -> Any:
    """The cache a forward with ``use_cache=True`` returned."""
    return getattr(out, cache_name())
