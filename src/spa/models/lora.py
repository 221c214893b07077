"""LoRA adapters through peft: train a few low-rank matrices instead of every weight.

Checkpoints stay usable as plain models: :func:`merged_copy` folds the adapters into a
copy of the weights, which is what gets saved as the Hugging Face folder (``spa eval``
and the fast generation engine read it like any model); the adapters themselves are
saved beside it (``adapter/``) so that training can resume exactly.
"""

from __future__ import annotations

import copy
from pathlib import Path

from torch import nn


def add_lora(model: nn.Module, rank: int, alpha: float | None = None, dropout: float = 0.0) -> nn.Module:
    """``model`` with LoRA adapters of ``rank`` on every linear layer of the transformer
    (not the output head); only the adapters are trainable. ``alpha`` defaults to 2 x rank."""
    from peft import LoraConfig, get_peft_model

    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    config = LoraConfig(r=rank, lora_alpha=alpha or 2 * rank, lora_dropout=dropout,
                        target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def is_lora(model: nn.Module) -> bool:
    return hasattr(model, "peft_config")


def merged_copy(model: nn.Module) -> nn.Module:
    """A plain model with the adapters folded in (``model`` itself is left as it is)."""
    return copy.deepcopy(model).merge_and_unload() if is_lora(model) else model


def load_adapter(model: nn.Module, folder: str | Path) -> nn.Module:
    """``model`` (the base weights) with trainable adapters read from ``folder``."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(folder), is_trainable=True)
