"""The PPO critic, of one of two kinds (``PPOConfig.critic``).

``copy`` (the default): a copy of the policy's transformer with a scalar value head. A
separate model rather than a value head on the policy, because the paper trains the two
at different rates (actor 1e-6, critic 1e-5): a shared trunk trained by both losses would
move the policy's features at the critic's rate, or starve the critic. It starts from the
policy's weights (the usual choice in verl and RAGEN) so it reads states as well as the
policy does.

``head``: a value head alone, reading the policy's own decoder hidden states, detached.
No gradient of the value loss reaches the policy, so the policy's update is exactly the
one it would be beside a copy critic with the same values, and the critic's optimizer
trains the head's ``hidden_size + 1`` weights only. PPO then holds one decoder instead of
two (with the reference, two instead of three): the copy's weights, gradients and Adam
moments are gone. The cost: the head sees features trained for the policy, not for
values, and can only weigh them linearly.

Either way the head starts at zero, so the first advantages are the plain returns.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from spa.rl.batch import _unflatten, hidden_before_targets


class _ValueModel(nn.Module):
    """V(prefix) at every response position: the value before each token is generated.

    A subclass sets ``kind`` (its ``PPOConfig.critic`` name), ``head`` and :meth:`hidden`.
    """

    kind: str

    def hidden(self, ids: Tensor, attention: Tensor, targets: Tensor) -> Tensor:
        """The hidden states (N, H) the head reads, at the positions that predict the response."""
        raise NotImplementedError

    def forward(self, ids: Tensor, attention: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """Values (B, R) of the response positions of ``collate``'s batch, and their mask."""
        values = self.head(self.hidden(ids, attention, targets)).float()[:, 0]
        return _unflatten(values, targets.sum(1).tolist())

    @torch.no_grad()
    def values(self, batches) -> list[Tensor]:
        """Per-sample (R,) values for an iterable of ``(ids, attention, targets)`` batches."""
        out = []
        for ids, attention, targets in batches:
            values, mask = self(ids, attention, targets)
            out += [row[m] for row, m in zip(values, mask)]
        return out


def _zero_head(policy: nn.Module, decoder: nn.Module) -> nn.Linear:
    """The scalar value head over ``policy``'s hidden size, in ``decoder``'s dtype, at zero."""
    head = nn.Linear(policy.config.hidden_size, 1, dtype=next(decoder.parameters()).dtype)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return head


class Critic(_ValueModel):
    """``critic=copy``: a trained copy of the policy's decoder under the value head."""

    kind = "copy"

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.decoder = copy.deepcopy(policy.get_decoder())
        self.decoder.requires_grad_(True)
        self.head = _zero_head(policy, self.decoder)

    def hidden(self, ids: Tensor, attention: Tensor, targets: Tensor) -> Tensor:
        return hidden_before_targets(self.decoder, ids, attention, targets)


class ValueHead(_ValueModel):
    """``critic=head``: the value head on the policy's own decoder, detached from it.

    The decoder is held as a plain attribute, not a submodule: the policy owns and trains
    it, and registering it here would put its weights into this module's parameters, state
    dict, optimizer and DDP wrapper. This module's parameters are the head's alone, and
    every pass uses all of them (as :func:`spa.distributed.wrap` requires). The decoder
    runs as it is (train or eval mode is the policy's), under the caller's autocast.
    """

    kind = "head"

    def __init__(self, policy: nn.Module):
        super().__init__()
        object.__setattr__(self, "decoder", policy.get_decoder())  # not registered: see above
        self.head = _zero_head(policy, self.decoder)

    def hidden(self, ids: Tensor, attention: Tensor, targets: Tensor) -> Tensor:
        # A pass of its own without a graph: the value loss cannot reach the policy's
        # weights, and the pass keeps no activations for a backward.
        with torch.no_grad():
            return hidden_before_targets(self.decoder, ids, attention, targets)


KINDS = {cls.kind: cls for cls in (Critic, ValueHead)}


def build_critic(policy: nn.Module, kind: str) -> _ValueModel:
    """The critic of ``kind`` (``copy`` or ``head``) for ``policy``."""
    if kind not in KINDS:
        raise ValueError(f"critic {kind!r} is not known; valid: {', '.join(KINDS)}")
    return KINDS[kind](policy)


def saved_kind(state: dict | None) -> str | None:
    """The kind of critic whose ``state_dict`` a checkpoint holds (None: no critic).
    Only a copy saves a decoder; checkpoints written before the switch are copies."""
    if state is None:
        return None
    return "copy" if any(key.startswith("decoder.") for key in state) else "head"


def restore_critic(critic: _ValueModel, state: dict | None) -> None:
    """Load a checkpoint's critic ``state`` into ``critic``; a ValueError when the checkpoint
    holds no critic or one of the other kind (a copy's decoder cannot become a head, nor the
    reverse: resuming would silently start the critic afresh)."""
    found = saved_kind(state)
    if found != critic.kind:
        held = "no critic" if found is None else f"a critic={found} critic"
        raise ValueError(f"the checkpoint holds {held}, and this run asks for critic={critic.kind}; "
                         f"resume with the critic the checkpoint was written with")
    critic.load_state_dict(state)
