"""Model loading (default embedded model, Hugging Face folders and hub ids, tiny test model)."""

from spa.models.loading import (
    BUILTIN_MODELS,
    DEFAULT_MODEL,
    TINY_MODEL,
    build_tiny_model,
    load_model,
    spa_home,
)

__all__ = ["BUILTIN_MODELS", "DEFAULT_MODEL", "TINY_MODEL", "build_tiny_model", "load_model", "spa_home"]
