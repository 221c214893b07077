"""The PPO critic: a copy of the policy's transformer with a scalar value head.

A separate model rather than a value head on the policy, because the paper trains the two
at different rates (actor 1e-6, critic 1e-5): a shared trunk would move the policy's
features at the critic's rate, or starve the critic. It starts from the policy's weights
(the usual choice in verl and RAGEN) so it reads states as well as the policy does; the
head starts at zero, so the first advantages are the plain returns.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from spa.rl.batch import _unflatten, hidden_before_targets


class Critic(nn.Module):
    """V(prefix) at every response position: the value before each token is generated."""

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.decoder = copy.deepcopy(policy.get_decoder())
        self.decoder.requires_grad_(True)
        hidden = policy.config.hidden_size
        self.head = nn.Linear(hidden, 1, dtype=next(self.decoder.parameters()).dtype)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, ids: Tensor, attention: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """Values (B, R) of the response positions of ``collate``'s batch, and their mask."""
        hidden = hidden_before_targets(self.decoder, ids, attention, targets)
        values = self.head(hidden).float()[:, 0]
        return _unflatten(values, targets.sum(1).tolist())

    @torch.no_grad()
    def values(self, batches) -> list[Tensor]:
        """Per-sample (R,) values for an iterable of ``(ids, attention, targets)`` batches."""
        out = []
        for ids, attention, targets in batches:
            values, mask = self(ids, attention, targets)
            out += [row[m] for row, m in zip(values, mask)]
        return out
