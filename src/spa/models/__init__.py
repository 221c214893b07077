"""Model loading (default embedded model, Hugging Face folders and hub ids, tiny test model).

The names below are imported from :mod:`spa.models.loading` on first use (PEP 562):
importing it loads transformers, and every submodule import (``spa.models.engine``, which
the stage configs read their batch size from) would otherwise pay for it, so would the
start of every ``spa`` command, whose options are built from those configs.
"""

from importlib import import_module

__all__ = ["BUILTIN_MODELS", "DEFAULT_MODEL", "TINY_MODEL", "build_tiny_model", "load_model", "spa_home"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(import_module("spa.models.loading"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
