"""Gradient (activation) checkpointing: recompute each layer's activations in the backward
pass instead of keeping them from the forward.

The activations a backward pass needs grow with the batch's tokens and the model's
depth; with checkpointing each transformer layer keeps only its input and runs its
forward again when the backward reaches it: much less memory for about a third more
compute. Off by default (``SFTConfig.gradient_checkpointing``,
``PPOConfig.gradient_checkpointing``).

Non-reentrant checkpointing (``use_reentrant=False``): it works whether or not the
layer's inputs require gradients (LoRA freezes the embeddings) and under DDP.
"""

from __future__ import annotations

import torch
from torch import nn


def enable_recompute(model: nn.Module) -> None:
    """Switch on the Hugging Face model's gradient checkpointing, non-reentrant.

    ``model`` is a transformers causal LM (or a peft model around one). transformers 5
    renamed the switch ``activation_checkpointing_enable`` and warns on the old name.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if hasattr(base, "activation_checkpointing_enable"):
        base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def recomputes(decoder: nn.Module) -> bool:
    """Whether ``decoder``'s layers recompute their forward in this pass's backward:
    checkpointing on, the module training and gradients enabled. Such a layer runs
    without a KV cache (transformers drops it: the recompute would write it twice)."""
    return (decoder.training and torch.is_grad_enabled()
            and any(getattr(m, "gradient_checkpointing", False) for m in decoder.modules()))
