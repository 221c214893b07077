"""Fast batched KV-cache decoding for Llama-family models (Llama, Mistral, Qwen2).

Why this exists: on a small CPU, ``model.generate`` for SmolLM2-135M at batch 64 spends
most of its time outside the matmuls: SDPA attention over an expanded padding mask,
growing the KV cache by concatenation, a prefill that reads the shared system prompt
64 times, and ``torch.multinomial`` over the vocabulary. This module runs the same
network, reading the Hugging Face module weights (so it always uses the model's
*current* weights), with:

* **A preallocated KV cache written in place.** Each layer's per-sequence cache is one
  contiguous ``[B, kv_heads, capacity, head_dim]`` tensor; attention reads the whole
  capacity with a ``-inf`` bias on unwritten columns. Attending to a slice
  ``cache[:, :, :t]`` instead would be a strided view, which torch's bf16 batched
  matmul copies first (measured ~10x slower at t = 500). The capacity grows in blocks
  of ``GROW`` columns, so at most ``GROW`` wasted columns are read.
* **A shared prompt prefix** ("cascade" / "hydragen" attention). Rollout prompts in a
  batch start with the same long system prompt; its K/V are computed once (prefill of
  one sequence instead of B), stored once (``[kv_heads, P, head_dim]``) and attended
  with one matmul per kv-head for all queries of the batch, instead of being read
  once per sequence. Shared and per-sequence scores go through one softmax
  (concatenated), which is exactly attention to the concatenated keys.
* **Grouped-query attention as batched matmuls**: queries of the ``G`` heads that share
  a kv-head are stacked as the rows of one matmul, so K/V are never repeated.
* **Fused QKV and gate/up projections**, prepacked for oneDNN (fp32, and bf16 on CPUs
  with native bf16). Building them takes ~0.1 s for SmolLM2-135M; the engine keeps them
  until a source tensor changes (:func:`weights_key`), since the weights change only when
  a trainer steps its optimizer while a rollout calls ``generate()`` once per turn.
* **Prefill in micro-batches sorted by length** (little padding, attention scores
  that fit in cache), and identical prompts (samples of one prompt) prefilled once.
* **Batch compaction**: the caller drops finished rows with :meth:`LlamaSession.keep`.

Numerics follow HF's eager bf16 path (scores in the model dtype, softmax accumulated
in float32, RMSNorm rounded as the module does); log-probs differ from a full HF
forward by about as much as HF's own eager and SDPA paths differ from each other.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
GROW = 32  # KV-cache capacity grows by this many columns
MIN_SHARED_PREFIX = 16  # shorter common prefixes are not worth the extra attention ops
PREFILL_SCORE_BUDGET = 2 * 2**20  # attention-score elements per prefill micro-batch (cache-sized)


def fast_path_problem(model: nn.Module, max_total_len: int | None = None) -> str | None:
    """Why ``model`` cannot use :class:`LlamaSession` (``None`` when it can).

    ``max_total_len`` (prompt + new tokens) matters for sliding-window models: the fast
    path has no window, which is exact only while sequences fit inside it.
    """
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} is not silu"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = "default"
    if isinstance(rope, dict):
        rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type in ("dynamic", "longrope"):
        return f"rope type {rope_type!r} depends on the sequence length"
    inner = getattr(model, "model", None)
    try:
        layers = list(inner.layers)
        _ = inner.embed_tokens.weight, inner.norm.weight, inner.rotary_emb
        out = model.get_output_embeddings()
        if type(out) is not nn.Linear:
            return "the output head is not a plain nn.Linear"
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            linears = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj]
            linears += [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
            # adapters (LoRA...) replace nn.Linear by wrappers whose .weight is not the
            # whole story: those go through the generic path
            if any(type(m) is not nn.Linear for m in linears):
                return "a projection is not a plain nn.Linear (adapter?)"
            if any(hasattr(attn, n) for n in ("q_norm", "k_norm")):
                return "attention has q/k norms"
            _ = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
    except AttributeError as err:
        return f"unexpected module layout ({err})"
    window = _sliding_window(config)
    if window is not None and (max_total_len is None or max_total_len > window):
        return f"sliding-window attention ({window}) with sequences longer than the window"
    return None


def _sliding_window(config) -> int | None:
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return window if any(t != "full_attention" for t in layer_types) else None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return window


def _norm_eps(norm: nn.Module) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


def _cat_bias(*linears: nn.Linear) -> Tensor | None:
    if all(m.bias is None for m in linears):
        return None
    zeros = [m.weight.new_zeros(m.out_features) for m in linears]
    return torch.cat([m.bias if m.bias is not None else z for m, z in zip(linears, zeros)])


class _Layer:
    """One decoder layer's weights; QKV and gate/up concatenated for one matmul each."""

    def __init__(self, layer: nn.Module, pack: bool, cast):
        attn, mlp = layer.self_attn, layer.mlp
        self.norm1 = cast(layer.input_layernorm.weight)
        self.eps1 = _norm_eps(layer.input_layernorm)
        wqkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        self.qkv = _Linear(cast(wqkv), cast(_cat_bias(attn.q_proj, attn.k_proj, attn.v_proj)), pack)
        self.o = _Linear(cast(attn.o_proj.weight), cast(attn.o_proj.bias), pack)
        self.norm2 = cast(layer.post_attention_layernorm.weight)
        self.eps2 = _norm_eps(layer.post_attention_layernorm)
        wgu = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
        self.gate_up = _Linear(cast(wgu), cast(_cat_bias(mlp.gate_proj, mlp.up_proj)), pack)
        self.down = _Linear(cast(mlp.down_proj.weight), cast(mlp.down_proj.bias), pack)


def weight_sources(model: nn.Module) -> list[Tensor]:
    """Every tensor :class:`LlamaWeights` reads from ``model`` (weights, biases, norms)."""
    inner = model.model
    head = model.get_output_embeddings()
    sources = [inner.embed_tokens.weight, head.weight, head.bias, inner.norm.weight]
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        sources += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
        for linear in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj,
                       mlp.down_proj):
            sources += [linear.weight, linear.bias]
    return [t for t in sources if t is not None]


def weights_key(sources: list[Tensor], dtype: torch.dtype | None) -> tuple:
    """What :class:`LlamaWeights` built from ``sources`` depends on: equal keys, same weights.

    Per tensor its storage address, shape, dtype and device, and its version counter,
    which torch bumps on every in-place write it sees (optimizer steps, ``copy_``,
    ``load_state_dict``); a tensor replaced whole (``module.to``, ``p.data = ...``) has
    another address as long as the old storage is alive, so the caller keeps the sources
    referenced with the weights. Writes torch cannot see (through ``p.data``, or raw
    pointers) bump no counter: their authors call ``torch.autograd.graph.increment_version``
    or the engine's ``release_weights``. (DDP's copy of the main process's weights, in
    :func:`spa.distributed.wrap`, bumps the counters itself.)
    """
    return (dtype, PACK) + tuple((t.data_ptr(), _version(t), t.shape, t.dtype, t.device) for t in sources)


def _version(t: Tensor) -> int | object:
    # a tensor made under inference_mode has no version counter: a fresh object never
    # compares equal, so such weights are rebuilt on every call (as they always were)
    return object() if t.is_inference() else t._version


class LlamaWeights:
    """A Llama-family model's current weights, laid out for decoding.

    The fused tensors are copies, so they go stale when training updates the parameters
    in place: the engine keeps one only while :func:`weights_key` is unchanged. ``dtype``
    decodes in another precision than the model's (a trainer keeps fp32 master weights but samples in bf16,
    about 4x faster on CPU); ``None`` keeps the model's.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype | None = None):
        config, inner = model.config, model.model
        self.n_heads = config.num_attention_heads
        self.n_kv = getattr(config, "num_key_value_heads", None) or self.n_heads
        self.groups = self.n_heads // self.n_kv
        attn = inner.layers[0].self_attn
        self.head_dim = getattr(attn, "head_dim", None) or config.hidden_size // self.n_heads
        self.scale = float(getattr(attn, "scaling", self.head_dim**-0.5))
        dtype = dtype or inner.embed_tokens.weight.dtype

        def cast(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.detach().to(dtype)

        self.embed = cast(inner.embed_tokens.weight)  # [V, H]
        head = model.get_output_embeddings()
        pack = _can_pack(self.embed)
        self.lm_head = _Linear(cast(head.weight), cast(head.bias), pack)  # [V, H] (tied: the embedding)
        self.norm, self.norm_eps = cast(inner.norm.weight), _norm_eps(inner.norm)
        self.rotary = inner.rotary_emb
        self.layers = [_Layer(layer, pack, cast) for layer in inner.layers]
        self.dtype, self.device = self.embed.dtype, self.embed.device

    def rope_table(self, length: int) -> tuple[Tensor, Tensor]:
        """cos and sign-folded sin for positions ``0..length-1``, each ``[length, D]``.

        Computed by the model's own rotary module (so rope scaling variants match) and
        rearranged for :func:`_rope`: ``sin`` gets its first half negated.
        """
        positions = torch.arange(length, device=self.device)[None]
        probe = torch.empty(0, dtype=self.dtype, device=self.device)
        cos, sin = self.rotary(probe, positions)
        cos, sin = cos[0], sin[0]
        half = self.head_dim // 2
        sin = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)
        return cos.contiguous(), sin.contiguous()


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding, HF's ``x * cos + rotate_half(x) * sin``.

    ``rotate_half(x) = cat(-x2, x1)``; with ``sin`` sign-folded (``cat(-s, s)``) that is
    ``swap_halves(x) * sin``, one flip instead of a slice, a negation and a cat.
    x: [..., N, D]; cos, sin: broadcastable to x.
    """
    d = x.shape[-1]
    swapped = x.unflatten(-1, (2, d // 2)).flip(-2).flatten(-2)
    return torch.addcmul(x * cos, swapped, sin)


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """HF's LlamaRMSNorm: normalise in float32, round to the model dtype, then scale.

    Same values as the module (``F.rms_norm`` rounds once instead of twice, an ulp
    away in bf16); in-place ops on the float32 temporary save a third of its time.
    """
    h = x.to(torch.float32, copy=True)  # a copy even for float32 x: h is modified below
    rstd = h.square().mean(-1, keepdim=True).add_(eps).rsqrt_()
    return weight * h.mul_(rstd).to(x.dtype)


class _Linear:
    """``y = x W^T + b``, with W prepacked for oneDNN when that is faster.

    oneDNN's linear on a weight reordered once into its blocked layout beats ``F.linear``
    at decode shapes: in bf16 on CPUs with AVX-512 BF16 by 15-35% (64 x 576 x 49152: 10 ms
    instead of 14), and in fp32 on AVX-512 and AVX2 CPUs alike (docs/agents.md, "Generation
    engine"). The packed copy lives as long as the fused weights (:class:`LlamaWeights`).
    Anything else (fp16, bf16 without native support, GPU, no oneDNN) uses ``F.linear``.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None, pack: bool):
        self.weight, self.bias, self.packed = weight, bias, None
        if pack:
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 64)
            except (RuntimeError, AttributeError):  # oneDNN not built in, or refused
                self.packed = None

    def __call__(self, x: Tensor) -> Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


PACK = True  # False restores F.linear everywhere (bench/generation.py --no-pack compares)
_PACK_WORKS: dict[torch.dtype, bool] = {}


def _can_pack(weight: Tensor) -> bool:
    """Whether to prepack: CPU weights in fp32, or in bf16 where the CPU computes bf16
    natively (emulated bf16 is slow either way).

    The two ops are private to torch (they back inductor's CPU linears), so they are
    checked once per dtype against ``F.linear`` before being trusted.
    """
    dtype = weight.dtype
    if not PACK or weight.device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return False
    if dtype not in _PACK_WORKS:
        try:
            works = torch.backends.mkldnn.is_available()
            if dtype == torch.bfloat16:
                from spa.precision import cpu_has_native_bf16

                works = works and cpu_has_native_bf16() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
            if works:
                w = torch.randn(48, 32, dtype=dtype)
                x = torch.randn(5, 32, dtype=dtype)
                packed = _Linear(w, None, pack=True)
                works = packed.packed is not None and torch.allclose(
                    packed(x).float(), F.linear(x, w).float(), atol=1e-2, rtol=1e-2
                )
            _PACK_WORKS[dtype] = bool(works)
        except (RuntimeError, AttributeError):
            _PACK_WORKS[dtype] = False
    return _PACK_WORKS[dtype]


def _cascade_attention(
    q: Tensor, shared_k: Tensor | None, shared_v: Tensor | None, k: Tensor, v: Tensor, bias: Tensor
) -> Tensor:
    """Attention of queries to [shared prefix | own keys], in one softmax.

    q: [B, kv, R, D], pre-scaled; R rows per kv-head (its G query heads, times the
    positions in prefill). shared_k, shared_v: [kv, P, D], the same for every row and
    visible to every query, or None. k, v: [B, kv, T, D], contiguous (a strided view
    would be copied by bmm). bias: additive mask (0 / -inf) on the own keys,
    broadcastable to [B, kv, R, T]. Returns [B, kv, R, D].

    The shared part is one [B*R, D] x [D, P] matmul per kv-head: every query of the
    batch against the prefix keys, which are read once for the whole batch instead of
    once per row. The own part is a batched matmul per (row, kv-head). Concatenated
    scores go through one softmax, so this equals attention to the concatenated keys.
    Scores are in the model dtype and the softmax accumulates in float32, as in HF's
    eager attention.
    """
    B, nkv, R, D = q.shape
    scores = torch.matmul(q, k.transpose(-1, -2)).add_(bias)  # [B, kv, R, T]
    P = 0
    if shared_k is not None:
        P = shared_k.shape[1]
        qs = q.transpose(0, 1).reshape(nkv, B * R, D)
        shared = torch.matmul(qs, shared_k.transpose(-1, -2))  # [kv, B*R, P]
        scores = torch.cat([shared.view(nkv, B, R, P).transpose(0, 1), scores], dim=-1)
    probs = torch.softmax(scores, dim=-1)  # [B, kv, R, P+T]
    out = torch.matmul(probs[..., P:], v)  # [B, kv, R, D]
    if P:
        ps = probs[..., :P].transpose(0, 1).reshape(nkv, B * R, P)
        out = out + torch.matmul(ps, shared_v).view(nkv, B, R, D).transpose(0, 1)
    return out


def _shared_prefix_len(prompts: list[list[int]]) -> int:
    """Length of the longest common prefix, leaving at least one token per prompt."""
    first = prompts[0]
    limit = min(len(p) for p in prompts) - 1
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n


class LlamaSession:
    """One batch of prompts being decoded: its KV caches and positions.

    Usage: ``logits = s.prefill()``, then ``logits = s.step(next_tokens)`` per token,
    ``s.keep(rows)`` to drop finished sequences and ``s.unstep()`` to take a step back. Logits are ``[B, V]`` in the model
    dtype, for the rows still kept, in order.

    Cache layout per layer: the shared prefix ``[kv, P, D]`` (one copy for the batch) and
    the per-sequence part ``[B, kv, capacity, D]``, whose first ``S`` columns are the
    left-padded prompt suffixes and column ``S + t`` the ``t``-th generated token.
    """

    def __init__(self, weights: LlamaWeights, prompts: list[list[int]], max_new_tokens: int):
        self.w = weights
        self.prompts = prompts
        self.shared = _shared_prefix_len(prompts) if len(prompts) > 1 else 0
        if self.shared < MIN_SHARED_PREFIX:
            self.shared = 0
        max_len = max(len(p) for p in prompts) + max_new_tokens + 1
        self.cos, self.sin = weights.rope_table(max_len)
        # multiplies the rope tables: the attention scale applied to the query heads
        n = weights.n_heads + weights.n_kv
        scale = torch.ones(n, 1, dtype=weights.dtype, device=weights.device)
        scale[: weights.n_heads] = weights.scale
        self.head_scale = scale  # [Hq+kv, 1]

    # -- prefill -------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self) -> Tensor:
        """Run the prompts; return the logits after each prompt's last token, ``[B, V]``."""
        w, P = self.w, self.shared
        dev = w.device
        # K/V of the shared prefix, per layer [kv, P, D]
        self.shared_k: list[Tensor | None] = [None] * len(w.layers)
        self.shared_v: list[Tensor | None] = [None] * len(w.layers)
        if P:
            ids = torch.tensor(self.prompts[0][:P], device=dev)[None]
            self._forward_prefix(ids)

        # identical suffixes (several samples of one prompt) are computed once; unique
        # suffixes are sorted by length so that micro-batches carry little padding
        suffixes = [tuple(p[P:]) for p in self.prompts]
        unique: dict[tuple[int, ...], int] = {}
        for s in sorted(set(suffixes), key=len, reverse=True):
            unique[s] = len(unique)
        inverse = torch.tensor([unique[s] for s in suffixes], device=dev)  # prompt -> unique row
        uniq = list(unique)
        S = len(uniq[0])  # longest suffix: the own cache's prompt columns
        self.suffix_len = S
        cap = S + GROW
        n = len(uniq)
        shape = (n, w.n_kv, cap, w.head_dim)
        self.k = [torch.zeros(shape, dtype=w.dtype, device=dev) for _ in w.layers]
        self.v = [torch.zeros(shape, dtype=w.dtype, device=dev) for _ in w.layers]
        lengths = torch.tensor([len(s) for s in uniq], device=dev)

        # micro-batches: padded to their own longest suffix, sized so that attention
        # scores (rows x heads x S x (P + S)) stay cache-sized
        last_hidden = []
        lo = 0
        while lo < n:
            width = len(uniq[lo])
            per_row = w.n_heads * width * (P + width)
            hi = min(n, lo + max(1, PREFILL_SCORE_BUDGET // per_row))
            ids = torch.zeros((hi - lo, width), dtype=torch.long, device=dev)
            for i, s in enumerate(uniq[lo:hi]):
                ids[i, width - len(s) :] = torch.tensor(s, device=dev)
            last_hidden.append(self._forward_suffix(ids, width - lengths[lo:hi], lo))
            lo = hi

        # decode-time state, from unique sorted rows to the prompts' rows
        self.k = [k.index_select(0, inverse) for k in self.k]
        self.v = [v.index_select(0, inverse) for v in self.v]
        lengths = lengths[inverse]
        pad = S - lengths  # left padding of each row in the own cache
        hidden = torch.cat(last_hidden).index_select(0, inverse)
        B = len(self.prompts)
        self.length = S  # next column to write, the same for every row
        self.next_pos = P + lengths  # [B] position of the next token
        # additive attention bias over the own cache: -inf on padding and on columns
        # not written yet
        cols = torch.arange(cap, device=dev)
        own_ok = (cols[None] >= pad[:, None]) & (cols[None] < S)
        bias = torch.zeros(B, 1, 1, cap, dtype=w.dtype, device=dev)
        self.bias = bias.masked_fill_(~own_ok[:, None, None], float("-inf"))  # [B, 1, 1, cap]
        return self._logits(hidden)

    def _forward_prefix(self, ids: Tensor) -> None:
        """Causal forward over the shared prefix (batch 1), keeping its K/V."""
        w = self.w
        P = ids.shape[1]
        x = F.embedding(ids, w.embed)  # [1, P, H]
        cos, sin = self.cos[:P, None], self.sin[:P, None]  # [P, 1, D]
        for i, layer in enumerate(w.layers):
            q, k, v = self._qkv(x, layer, cos, sin)  # [1, heads, P, D]
            self.shared_k[i], self.shared_v[i] = k[0].contiguous(), v[0].contiguous()
            a = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=w.scale, enable_gqa=True
            )
            x = self._finish_layer(x, a, layer)

    def _forward_suffix(self, ids: Tensor, pad: Tensor, row0: int) -> Tensor:
        """Forward over left-padded prompt suffixes (after the shared prefix).

        ids: [b, S] (S: this micro-batch's longest suffix); pad: [b] padding per row.
        Writes K/V into own-cache rows ``row0 .. row0 + b``, right-aligned on the
        cache's prompt columns; returns the final hidden state of the last column [b, H].
        Attention is :func:`_cascade_attention` (CPU SDPA with a mask is several times
        slower).
        """
        w, P = self.w, self.shared
        b, S = ids.shape
        dev = ids.device
        G, nkv, D = w.groups, w.n_kv, w.head_dim
        first = self.suffix_len - S  # first cache column of this micro-batch
        cols = torch.arange(S, device=dev)
        positions = (P + cols[None] - pad[:, None]).clamp(min=0)  # [b, S]
        cos = self.cos[positions][:, :, None] * self.head_scale  # [b, S, Hq+kv, D]
        sin = self.sin[positions][:, :, None] * self.head_scale
        # query i sees own key j when j <= i and j is not padding; a padding query sees
        # itself too, so that no row is fully masked (its output is never used)
        causal = cols[None, :] <= cols[:, None]  # [S, S]
        real = cols[None] >= pad[:, None]  # [b, S]
        own = causal[None] & (real[:, None, :] | torch.eye(S, dtype=torch.bool, device=dev)[None])
        bias = torch.zeros(b, S, S, dtype=w.dtype, device=dev).masked_fill_(~own, float("-inf"))
        # the G query heads of a kv-head are stacked as rows: [b, 1, G*S, S]
        bias = bias[:, None].expand(b, G, S, S).reshape(b, 1, G * S, S)
        x = F.embedding(ids, w.embed)  # [b, S, H]
        for i, layer in enumerate(w.layers):
            q, k, v = self._qkv(x, layer, cos, sin)  # q [b, Hq, S, D], k/v [b, kv, S, D]
            self.k[i][row0 : row0 + b, :, first : first + S] = k
            self.v[i][row0 : row0 + b, :, first : first + S] = v
            q = q.reshape(b, nkv, G * S, D)
            sk, sv = self.shared_k[i], self.shared_v[i]
            a = _cascade_attention(q, sk, sv, k.contiguous(), v.contiguous(), bias)
            x = self._finish_layer(x, a.view(b, nkv * G, S, D), layer)
        return x[:, -1]

    def _qkv(
        self, x: Tensor, layer: _Layer, cos: Tensor, sin: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x [b, S, H] -> q [b, Hq, S, D], k and v [b, kv, S, D], rope applied."""
        w = self.w
        h = _rms_norm(x, layer.norm1, layer.eps1)
        qkv = layer.qkv(h).unflatten(-1, (w.n_heads + 2 * w.n_kv, w.head_dim))
        qk = _rope(qkv[:, :, : w.n_heads + w.n_kv], cos, sin)  # [b, S, Hq+kv, D]
        q, k = qk[:, :, : w.n_heads], qk[:, :, w.n_heads :]
        v = qkv[:, :, w.n_heads + w.n_kv :]
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def _finish_layer(self, x: Tensor, attn: Tensor, layer: _Layer) -> Tensor:
        """Output projection, residual, MLP, residual. attn: [b, Hq, S, D]; x: [b, S, H]."""
        x = x + layer.o(attn.transpose(1, 2).flatten(2))
        return x + self._mlp(x, layer)

    def _mlp(self, x: Tensor, layer: _Layer) -> Tensor:
        h = _rms_norm(x, layer.norm2, layer.eps2)
        gate, up = layer.gate_up(h).chunk(2, dim=-1)
        return layer.down(F.silu(gate) * up)

    def _logits(self, hidden: Tensor) -> Tensor:
        """Final norm and output head, [b, V] in the model dtype (as HF computes them)."""
        return self.w.lm_head(_rms_norm(hidden, self.w.norm, self.w.norm_eps))

    # -- decode --------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, tokens: Tensor) -> Tensor:
        """Feed one token per row ``[B]``; return the next-token logits ``[B, V]``."""
        w = self.w
        B = tokens.shape[0]
        c = self.length
        if c >= self.bias.shape[-1]:
            self._grow()
        self.bias[:, :, :, c] = 0.0  # the column written below becomes visible
        nq, nkv, G, D = w.n_heads, w.n_kv, w.groups, w.head_dim
        # rope tables for this step, with the attention scale folded into the query
        # heads' rows: one rope op then yields scaled q and plain k for every layer
        cos = self.cos.index_select(0, self.next_pos)[:, None] * self.head_scale  # [B, Hq+kv, D]
        sin = self.sin.index_select(0, self.next_pos)[:, None] * self.head_scale
        x = F.embedding(tokens, w.embed)  # [B, H]
        for i, layer in enumerate(w.layers):
            h = _rms_norm(x, layer.norm1, layer.eps1)
            qkv = layer.qkv(h).view(B, nq + 2 * nkv, D)
            qk = _rope(qkv[:, : nq + nkv], cos, sin)  # [B, Hq+kv, D]
            self.k[i][:, :, c] = qk[:, nq:]
            self.v[i][:, :, c] = qkv[:, nq + nkv :]
            q = qk[:, :nq].view(B, nkv, G, D)
            sk, sv = self.shared_k[i], self.shared_v[i]
            a = _cascade_attention(q, sk, sv, self.k[i], self.v[i], self.bias)  # [B, kv, G, D]
            x = x + layer.o(a.reshape(B, nq * D))
            x = x + self._mlp(x, layer)
        self.length += 1
        self.next_pos += 1
        return self._logits(x)

    @torch.inference_mode()
    def unstep(self) -> None:
        """Take back the last :meth:`step`: its cache column is hidden again and written
        anew by the next step (the capacity it may have grown stays, as it would have)."""
        self.length -= 1
        self.next_pos -= 1
        self.bias[:, :, :, self.length] = float("-inf")

    def _grow(self) -> None:
        """Add ``GROW`` zeroed columns to every cache (zeros: masked, and 0 * 0 is no NaN)."""
        self.k = [F.pad(k, (0, 0, 0, GROW)) for k in self.k]
        self.v = [F.pad(v, (0, 0, 0, GROW)) for v in self.v]
        self.bias = F.pad(self.bias, (0, GROW), value=float("-inf"))

    def keep(self, rows: Tensor) -> None:
        """Keep only ``rows`` (indices into the current batch), in that order."""
        self.k = [k.index_select(0, rows) for k in self.k]
        self.v = [v.index_select(0, rows) for v in self.v]
        self.bias = self.bias.index_select(0, rows)
        self.next_pos = self.next_pos.index_select(0, rows)
