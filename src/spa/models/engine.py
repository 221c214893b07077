"""Batched sampling with a KV cache: the generation engine behind rollouts and evaluation.

``Engine.generate`` takes chat-templated prompts (token ids), samples continuations in
batches of ``max_batch_size`` and returns, per prompt, the tokens, their text, their
log-probabilities under the sampling distribution and why generation ended.

Two backends do the forward passes:

* Llama-family models (Llama, Mistral, Qwen2) use :class:`~spa.models.llama_decoder.LlamaSession`,
  a forward written for CPU throughput (in-place KV cache, shared-prefix attention,
  fused prepacked projections; see that module). On SmolLM2-135M bf16, batch 64,
  ~365-token rollout-like prompts and 128 new tokens, it generates about 3.5x the
  tokens/s of ``model.generate`` on a 2-core CPU (``bench/generation.py``): prefill
  ~6x faster (the shared system prompt is run once), decode steps ~3x.
* Any other causal LM uses :class:`HFSession`, the model's own forward with its cache.

Both use the model's current weights on every call (training updates them in place
between calls). The fast path's fused copies of them are kept from one call to the next
until a weight changes (:func:`~spa.models.llama_decoder.weights_key`: torch's version
counters see every optimizer step), so a rollout's turns build them once per update.

Sampling, stop strings, end-of-sequence and batch compaction are handled here, the same
way for both backends. Prefill, decode steps and sampling run under profiler labels
(``spa.prefill``, ``spa.step``, ``spa.sample``) so ``torch.profiler`` can split the
time; ``bench/generation.py --profile`` does.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn
from torch.profiler import record_function

from spa.heap import tune_malloc
from spa.models.device import model_device
from spa.models.kv import cache_arg, returned_cache
from spa.models.llama_decoder import LlamaSession, LlamaWeights, fast_path_problem, weight_sources, weights_key

__all__ = ["DEFAULT_BATCH", "Engine", "Generation", "SamplingParams", "check_batch", "sample_next"]

# Drop finished rows from the batch once at least this fraction of it has finished:
# compaction copies the KV cache (about the cost of one step's attention), so it is
# done in batches rather than for every finished row.
COMPACT_FRACTION = 0.125
# Top-p first looks for the nucleus among this many top tokens; a full sort of the
# vocabulary (slow on CPU: ~50 ms for 64 x 49k) only runs for rows whose nucleus is wider.
TOP_P_CANDIDATES = 64
# Prompts decoded together (a call with more runs them in chunks of this many). 64 is
# where a 2-core CPU's decoder runs its linear layers near peak (docs/agents.md,
# "Generation engine"). A GPU wants more: on an H100 with SmolLM2-135M, batch 256 gave
# about 4.4x the tokens/s of batch 64 (10,694 against 2,440), but that is one model on one
# GPU, so the batch is a setting (``engine_batch`` of the configs that build an engine)
# rather than a CUDA default. A different batch draws the sampling's random numbers in a
# different order, so seeded samples differ between batch sizes.
DEFAULT_BATCH = 64


@dataclass
class SamplingParams:
    """How to sample. ``temperature=0`` is greedy decoding."""

    max_new_tokens: int = 400
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    # generation for a sequence ends once its decoded text contains any stop string; the
    # text is cut right after the stop string and the tokens kept are those up to and
    # including the token that completed it
    stop: tuple[str, ...] = ("</answer>",)
    seed: int | None = None  # seeds a torch.Generator so sampling is reproducible


@dataclass
class Generation:
    """One sampled continuation."""

    token_ids: list[int]  # generated tokens only (eos included if produced, padding never)
    text: str  # decoded text of token_ids, special tokens skipped, cut after a stop string
    # per token in token_ids: log-prob under the SAMPLING distribution (after temperature
    # and top-p); for greedy, the log-softmax of the raw logits
    logprobs: list[float]
    finish_reason: str  # "stop" (stop string), "eos", or "length"


class Engine:
    """Batched generation for a causal LM and its tokenizer.

    ``eos_token_ids`` (the tokenizer's eos and the model's generation-config eos ids)
    end a sequence; it is a plain attribute, so a caller may change it (the benchmark
    empties it to generate a fixed number of tokens). ``fast`` says whether the
    Llama-family decoder is used; set it to False to force the generic path. ``on_chunk``,
    when set, is called after each batch of ``max_batch_size`` prompts with (prompts
    answered so far, prompts of the call): one call answering 1,600 prompts takes minutes
    on a CPU, and a progress display (:func:`spa.progress.turn_progress`) shows it move.
    ``overlap`` (default: on a CUDA model) launches each decode step of the fast path before
    the host reads the tokens of the step before: the GPU computes while the host checks
    stop strings, instead of idling through every step's bookkeeping. A step whose batch
    then shrinks is taken back and run again on the rows kept, so the outputs are the same
    bit for bit either way (a test holds them together), at the cost of one wasted step
    per compaction and per chunk; on a CPU one thread does both, so it would only waste.

    The fast path's fused weights are kept between calls, about one copy of the model in the
    decoding precision, until a weight changes; :meth:`release_weights` frees them.
    """

    def __init__(self, model: nn.Module, tokenizer, max_batch_size: int = DEFAULT_BATCH,
                 dtype: torch.dtype | None = None):
        check_batch(max_batch_size, "max_batch_size")
        self.model = model
        self.dtype = dtype  # decoding precision of the fast path; None: the model's own
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.eos_token_ids: set[int] = _eos_ids(model, tokenizer)
        self.fast_problem = fast_path_problem(model)
        self.fast = self.fast_problem is None
        self.overlap = model_device(model).type == "cuda"
        self.on_chunk: Callable[[int, int], None] | None = None
        # (key, fused weights, their sources): the sources are held so that a replaced
        # tensor's storage cannot be freed and reused at the same address under the key
        self._weights: tuple[tuple, LlamaWeights, list[Tensor]] | None = None
        if model_device(model).type == "cpu":
            tune_malloc()

    def release_weights(self) -> None:
        """Drop the kept decoding weights: frees their memory, and the next call rebuilds
        them. Needed after writes torch's version counters miss (``p.data.copy_(...)``);
        optimizer steps, ``copy_`` and ``load_state_dict`` are seen without it."""
        self._weights = None

    def _fast_weights(self) -> LlamaWeights:
        """The fused decoding weights of the model as it is now, built only if it changed."""
        sources = weight_sources(self.model)
        key = weights_key(sources, self.dtype)
        if self._weights is None or self._weights[0] != key:
            self._weights = None  # the stale copies go before the new ones are made
            self._weights = (key, LlamaWeights(self.model, self.dtype), [t.detach() for t in sources])
        return self._weights[1]

    def decode_dtype(self) -> torch.dtype:
        """The precision the decoding runs in (a resumed rollout must use the same one)."""
        return self.dtype if self.dtype is not None and self.fast else next(self.model.parameters()).dtype

    @torch.inference_mode()
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, progress: bool = False
    ) -> list[Generation]:
        """prompts are token-id lists of varying length (already chat-templated); returns
        one Generation per prompt, same order. Splits into chunks of max_batch_size."""
        _check_params(params)
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if params.max_new_tokens == 0:
            return [Generation([], "", [], "length") for _ in prompts]
        device = model_device(self.model)
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=device)
            generator.manual_seed(params.seed)
        max_total = max(len(p) for p in prompts) + params.max_new_tokens
        fast = self.fast and fast_path_problem(self.model, max_total) is None
        was_training = self.model.training
        self.model.eval()  # no dropout in the generic path
        bar = _progress_bar(len(prompts), progress)
        try:
            weights = self._fast_weights() if fast else None
            results: list[Generation] = []
            for lo in range(0, len(prompts), self.max_batch_size):
                chunk = [list(p) for p in prompts[lo : lo + self.max_batch_size]]
                if weights is not None:
                    session = LlamaSession(weights, chunk, params.max_new_tokens)
                else:
                    session = HFSession(self.model, chunk, self.tokenizer.pad_token_id)
                results.extend(self._run(session, len(chunk), params, generator, bar))
                if self.on_chunk is not None:
                    self.on_chunk(len(results), len(prompts))
        finally:
            self.model.train(was_training)
            if bar is not None:
                bar.close()
        return results

    def _run(self, session, n: int, params: SamplingParams, generator, bar) -> list[Generation]:
        """Decode one chunk of ``n`` prompts to the end."""
        device = model_device(self.model)
        stops = _StopChecker(self.tokenizer, params.stop)
        eos = self.eos_token_ids
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        finish: list[str | None] = [None] * n
        texts: list[str | None] = [None] * n
        rows = list(range(n))  # prompt index of each row of the session's batch
        alive = [True] * n  # per session row: still generating
        overlap = self.overlap and isinstance(session, LlamaSession)  # which can take a step back
        with record_function("spa.prefill"):
            logits = session.prefill()
        for step in range(params.max_new_tokens):
            with record_function("spa.sample"):
                next_tokens, next_logprobs = sample_next(
                    logits, params.temperature, params.top_p, generator
                )
            last_step = step + 1 == params.max_new_tokens
            on_host = _copy_to_host(next_tokens, next_logprobs)
            ahead = None  # the next step's logits
            if overlap and not last_step:
                # launched before the host reads these tokens: the device works through
                # the bookkeeping below
                with record_function("spa.step"):
                    ahead = session.step(next_tokens)
            tok_list, lp_list = on_host()
            check = []  # prompt indices whose text may now contain a stop string
            for j, i in enumerate(rows):
                if not alive[j]:
                    continue
                tokens[i].append(tok_list[j])
                logprobs[i].append(lp_list[j])
                if tok_list[j] in eos:
                    finish[i] = "eos"
                elif stops:
                    check.append(i)
            for i, text in stops.check(tokens, check):
                finish[i], texts[i] = "stop", text
            for j, i in enumerate(rows):
                if alive[j] and finish[i] is None and last_step:
                    finish[i] = "length"
                if alive[j] and finish[i] is not None:
                    alive[j] = False
                    if bar is not None:
                        bar.update(1)
            if last_step or not any(alive):
                break
            dead = alive.count(False)
            if dead >= max(1, COMPACT_FRACTION * len(rows)):
                if ahead is not None:
                    # run again below on the rows kept: a matmul's rounding can depend on
                    # its row count, and the outputs must not depend on overlap
                    session.unstep()
                    ahead = None
                keep = [j for j, a in enumerate(alive) if a]
                index = torch.tensor(keep).to(device, non_blocking=True)  # no wait for the device
                session.keep(index)
                next_tokens = next_tokens.index_select(0, index)
                rows = [rows[j] for j in keep]
                alive = [True] * len(rows)
            if ahead is None:
                with record_function("spa.step"):
                    ahead = session.step(next_tokens)
            logits = ahead
        out = []
        for i in range(n):
            text = texts[i]
            if text is None:
                text = self.tokenizer.decode(tokens[i], skip_special_tokens=True)
            out.append(Generation(tokens[i], text, logprobs[i], finish[i] or "length"))
        return out


# -- sampling ------------------------------------------------------------------------


def sample_next(
    logits: Tensor, temperature: float, top_p: float = 1.0, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Sample one token per row of ``logits`` [B, V]; return (tokens [B], logprobs [B]).

    The log-prob is that of the distribution actually sampled from: ``log_softmax(logits
    / T)`` (in float32) restricted to the top-p nucleus and renormalised. Greedy
    (``T = 0``) returns the argmax and the log-softmax of the raw logits.

    Sampling is by inverse CDF with one uniform number per row (see
    :func:`_inverse_cdf`): ``torch.multinomial`` and the exponential-race trick draw one
    random number per vocabulary entry, which costs ~60 ms for 64 x 49k on a CPU's
    single-threaded generator, more than a whole model step.
    """
    if temperature == 0:
        logp, chosen = torch.log_softmax(logits, dim=-1, dtype=torch.float32).max(dim=-1)
        return chosen, logp
    if temperature != 1.0:
        logits = logits.float() / temperature
    if top_p < 1.0:
        logp = _top_p_logprobs(torch.log_softmax(logits, dim=-1, dtype=torch.float32), top_p)
        probs = logp.exp()
        chosen = _inverse_cdf(probs, generator)
        return chosen, logp.gather(-1, chosen[:, None])[:, 0]
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    chosen = _inverse_cdf(probs, generator)
    # the chosen token's probability is never 0 (see _inverse_cdf), so its log is finite
    return chosen, probs.gather(-1, chosen[:, None])[:, 0].log()


def _inverse_cdf(probs: Tensor, generator: torch.Generator | None, block: int = 256) -> Tensor:
    """Draw one index per row of ``probs`` [B, V] (rows need not sum exactly to 1).

    With ``u`` uniform on [0, total), the index is the first whose cumulative sum exceeds
    ``u``; it never has probability 0. A cumulative sum over the whole vocabulary is slow
    on CPU (and float32 sums of 49k terms drift), so it runs in two levels: over block
    sums to find the block, then inside that block only (float32 sums of 256 terms,
    float64 cumulative sums).
    """
    B, V = probs.shape
    pad = -V % block
    if pad:
        probs = torch.nn.functional.pad(probs, (0, pad))
    blocks = probs.view(B, -1, block)  # [B, nb, block]
    rows = torch.arange(B, device=probs.device)
    block_cdf = blocks.sum(-1).double().cumsum(-1)  # [B, nb]
    u = torch.rand(B, 1, generator=generator, device=probs.device, dtype=torch.float64)
    u = u * block_cdf[:, -1:]
    b = torch.searchsorted(block_cdf, u, right=True).clamp_(max=block_cdf.shape[1] - 1)  # [B, 1]
    before = torch.where(b > 0, block_cdf.gather(-1, (b - 1).clamp(min=0)), 0.0)
    inner_cdf = blocks[rows, b[:, 0]].to(torch.float64).cumsum(-1)  # [B, block]
    # the block's two sums may differ in the last bit: stay strictly inside its mass
    rest = torch.minimum(u - before, inner_cdf[:, -1:] * (1 - 1e-12))
    i = torch.searchsorted(inner_cdf, rest, right=True).clamp_(max=block - 1)
    return (b * block + i)[:, 0].clamp_(max=V - 1)


def _top_p_logprobs(logp: Tensor, top_p: float) -> Tensor:
    """Restrict log-probs [B, V] to the top-p nucleus and renormalise (-inf outside).

    Same rule as transformers' ``TopPLogitsWarper``: a token is kept when the probability
    mass of the tokens ranked above it is below ``top_p`` (so the top token always is).
    The nucleus is looked for among the top ``TOP_P_CANDIDATES`` tokens; rows whose
    candidates hold less than ``top_p`` of the mass are sorted in full.
    """
    k = min(TOP_P_CANDIDATES, logp.shape[-1])
    values, index = torch.topk(logp, k, dim=-1)  # descending
    wide = values.exp().sum(-1) < top_p  # [B] nucleus not inside the candidates
    keep = torch.zeros_like(logp, dtype=torch.bool)
    keep.scatter_(-1, index, _nucleus(values, top_p))
    if wide.any():
        rows = wide.nonzero()[:, 0]
        values, index = torch.sort(logp[rows], dim=-1, descending=True)
        full = torch.zeros_like(values, dtype=torch.bool)
        full.scatter_(-1, index, _nucleus(values, top_p))
        keep[rows] = full
    masked = logp.masked_fill(~keep, float("-inf"))
    return masked - torch.logsumexp(masked, dim=-1, keepdim=True)


def _nucleus(sorted_logp: Tensor, top_p: float) -> Tensor:
    """Which of the descending-sorted entries [B, k] belong to the nucleus."""
    p = sorted_logp.exp()
    mass_above = p.cumsum(-1) - p
    return mass_above < top_p


def _copy_to_host(*tensors: Tensor) -> Callable[[], list[list]]:
    """Start copying ``tensors`` to the host; the returned function waits for the copies
    and gives them as lists. From a CUDA device the copy goes into pinned memory without
    blocking the host, so work queued after it runs on while the host waits (an event
    marks where the copies end); elsewhere it is an ordinary copy (none from the CPU)."""
    cuda = tensors[0].is_cuda
    copies = [t.to("cpu", non_blocking=cuda) for t in tensors]
    done = None
    if cuda:
        done = torch.cuda.Event()
        done.record()

    def lists() -> list[list]:
        if done is not None:
            done.synchronize()
        return [c.tolist() for c in copies]

    return lists


# -- stop strings ----------------------------------------------------------------------


class _StopChecker:
    """Finds the step at which a sequence's decoded text first contains a stop string.

    Decoding every sequence in full at every step costs O(length) per step, so each step
    decodes only a tail of the last few tokens (one batched call) and decodes in full
    only when the tail shows a stop string, to cut the text exactly. The tail is long
    enough to hold any stop string unless it decodes to few characters (special
    tokens), in which case the full text is checked.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...]):
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.longest = max((len(s) for s in self.stop), default=0)
        # tokens decoded per step: enough that the tail text (>= 1 character per
        # ordinary token) covers the longest stop string plus the margin checked below
        self.window = self.longest + 24

    def __bool__(self) -> bool:
        return bool(self.stop)

    def check(self, tokens: list[list[int]], which: list[int]) -> list[tuple[int, str]]:
        """Return ``(index, cut text)`` for the sequences in ``which`` that just stopped."""
        if not which:
            return []
        tails = [tokens[i][-self.window :] for i in which]
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=True)
        stopped = []
        for i, tail, text in zip(which, tails, texts):
            # the tail must span the stop string, the last token's own text and a few
            # characters that decode differently at the cut; if not, check the full text
            short = len(text) < self.longest + 16 and len(tokens[i]) > len(tail)
            if short or any(s in text for s in self.stop):
                full = self.tokenizer.decode(tokens[i], skip_special_tokens=True)
                ends = [full.find(s) + len(s) for s in self.stop if s in full]
                if ends:
                    stopped.append((i, full[: min(ends)]))
        return stopped


# -- the generic backend ---------------------------------------------------------------


class HFSession:
    """The generic backend: the model's own forward and KV cache, left-padded batch.

    Same protocol as :class:`~spa.models.llama_decoder.LlamaSession`: ``prefill()``,
    ``step(tokens)``, ``keep(rows)``; logits ``[B, V]``.
    """

    def __init__(self, model: nn.Module, prompts: list[list[int]], pad_id: int | None):
        self.model = model
        self.prompts = prompts
        self.pad_id = 0 if pad_id is None else pad_id
        params = inspect.signature(model.forward).parameters
        self.extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    def prefill(self) -> Tensor:
        device = model_device(self.model)
        width = max(len(p) for p in self.prompts)
        ids = torch.full((len(self.prompts), width), self.pad_id, dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(self.prompts):
            ids[i, width - len(p) :] = torch.tensor(p, device=device)
            mask[i, width - len(p) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **self.extra
        )
        self.cache, self.mask, self.pos = returned_cache(out), mask, positions[:, -1]
        return out.logits[:, -1]

    def step(self, tokens: Tensor) -> Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)
        self.pos = self.pos + 1
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.mask,
            position_ids=self.pos[:, None],
            use_cache=True,
            **cache_arg(self.cache),
            **self.extra,
        )
        self.cache = returned_cache(out)
        return out.logits[:, -1]

    def keep(self, rows: Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.mask, self.pos = self.mask[rows], self.pos[rows]


# -- helpers ---------------------------------------------------------------------------

def _eos_ids(model: nn.Module, tokenizer) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(tokenizer, "eos_token_id", None),
                   getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if source is None:
            continue
        ids.update([source] if isinstance(source, int) else list(source))
    return ids


def check_batch(value: int, name: str = "engine_batch") -> None:
    """The configs' ``engine_batch`` check, at load time rather than when the engine is built."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be an integer >= 1 (prompts the generation engine decodes together)")


def _check_params(params: SamplingParams) -> None:
    if params.max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {params.max_new_tokens}")
    if params.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    if isinstance(params.stop, str):
        raise TypeError("stop must be a tuple of strings, not a string")


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="generate", unit="seq")
