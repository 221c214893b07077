"""The generation engine: equivalence with ``model.generate``, log-probs, stop strings,
eos, chunking, compaction, and the sampler's distribution. Tiny random models in fp32."""

import copy

import pytest
import torch
from transformers import TopPLogitsWarper

from spa.models.engine import (
    Engine,
    Generation,
    SamplingParams,
    _inverse_cdf,
    _StopChecker,
    _top_p_logprobs,
    sample_next,
)
from spa.models.llama_decoder import fast_path_problem

SYSTEM = (
    "You are an agent in a grid world. Push the box onto the target. "
    "Answer in <answer></answer>."
)
USERS = ["Hi", "State: #_P_X_O# and then some more text here", "A", "Grid:\n####\n#PX#\n####", "Go"]


def chat(tokenizer, user: str, system: str | None = SYSTEM) -> list[int]:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": user})
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


@pytest.fixture(scope="module")
def lm(tiny):
    """The tiny model with weights drawn at std 0.2: at the default init its greedy
    output is one token repeated, which would make the comparisons below vacuous."""
    model, tokenizer = tiny
    return scramble(copy.deepcopy(model)), tokenizer


def scramble(model, std: float = 0.2):
    """Redraw the matrices (and biases) of ``model`` at a larger scale, reproducibly."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 or name.endswith("proj.bias"):
                p.normal_(0.0, std, generator=gen)
    return model


@pytest.fixture(scope="module")
def prompts(tiny):
    _, tokenizer = tiny
    return [chat(tokenizer, u) for u in USERS]


def hf_greedy(model, tokenizer, prompts, n):
    """model.generate's greedy continuations, cut after the first eos (then padding)."""
    enc = tokenizer.pad({"input_ids": prompts}, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **enc, do_sample=False, max_new_tokens=n, pad_token_id=tokenizer.pad_token_id
        )
    width = enc["input_ids"].shape[1]
    result = []
    for row in out[:, width:].tolist():
        if tokenizer.eos_token_id in row:
            row = row[: row.index(tokenizer.eos_token_id) + 1]
        result.append(row)
    return result


def forward_logits(model, prompt, tokens):
    """Full-forward logits [len(tokens), V] predicting each generated token."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    return logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]


GREEDY = SamplingParams(max_new_tokens=20, temperature=0.0, stop=())


# -- equivalence with model.generate ----------------------------------------------------


def test_tiny_model_uses_the_fast_path(lm):
    model, tokenizer = lm
    assert fast_path_problem(model) is None
    assert Engine(model, tokenizer).fast


@pytest.mark.parametrize("system", [SYSTEM, None], ids=["shared-prefix", "no-shared-prefix"])
def test_greedy_matches_hf_generate(lm, system):
    model, tokenizer = lm
    prompts = [chat(tokenizer, u, system) for u in USERS]
    assert len({len(p) for p in prompts}) > 1  # left padding is exercised
    gens = Engine(model, tokenizer).generate(prompts, GREEDY)
    expected = hf_greedy(model, tokenizer, prompts, 20)
    assert [g.token_ids for g in gens] == expected
    for g in gens:
        assert len(g.logprobs) == len(g.token_ids)
        assert g.finish_reason == ("eos" if g.token_ids[-1] == tokenizer.eos_token_id else "length")


def test_generic_path_matches_fast_path(lm, prompts):
    model, tokenizer = lm
    engine = Engine(model, tokenizer)
    fast = engine.generate(prompts, GREEDY)
    engine.fast = False
    generic = engine.generate(prompts, GREEDY)
    assert [g.token_ids for g in fast] == [g.token_ids for g in generic]
    for a, b in zip(fast, generic):
        torch.testing.assert_close(
            torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0
        )


def test_duplicate_and_nested_prompts(lm, prompts):
    """Identical prompts are prefilled once; a prompt that is a prefix of another caps
    the shared prefix. Each row must still equal its own batch-1 generation."""
    model, tokenizer = lm
    batch = [prompts[1], prompts[1], prompts[3], prompts[1][:-2], prompts[1]]
    engine = Engine(model, tokenizer)
    together = engine.generate(batch, GREEDY)
    alone = [engine.generate([p], GREEDY)[0] for p in batch]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]


# -- log-probs -----------------------------------------------------------------------------


def test_greedy_logprobs_are_log_softmax_of_full_forward(lm, prompts):
    model, tokenizer = lm
    for prompt, g in zip(prompts, Engine(model, tokenizer).generate(prompts, GREEDY)):
        logp = torch.log_softmax(forward_logits(model, prompt, g.token_ids), dim=-1)
        assert logp.argmax(-1).tolist() == g.token_ids
        expected = logp[torch.arange(len(g.token_ids)), g.token_ids]
        torch.testing.assert_close(torch.tensor(g.logprobs), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_are_tempered_log_softmax(lm, prompts, temperature):
    model, tokenizer = lm
    params = SamplingParams(max_new_tokens=12, temperature=temperature, stop=(), seed=3)
    for prompt, g in zip(prompts, Engine(model, tokenizer).generate(prompts, params)):
        logp = torch.log_softmax(forward_logits(model, prompt, g.token_ids) / temperature, dim=-1)
        expected = logp[torch.arange(len(g.token_ids)), g.token_ids]
        torch.testing.assert_close(torch.tensor(g.logprobs), expected, atol=1e-4, rtol=0)


def test_top_p_logprobs_are_renormalised_nucleus(lm, prompts):
    model, tokenizer = lm
    params = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.5, stop=(), seed=0)
    warper = TopPLogitsWarper(top_p=0.5)
    for prompt, g in zip(prompts, Engine(model, tokenizer).generate(prompts, params)):
        logits = forward_logits(model, prompt, g.token_ids)
        filtered = warper(None, logits)  # -inf outside the nucleus
        logp = torch.log_softmax(filtered, dim=-1)
        expected = logp[torch.arange(len(g.token_ids)), g.token_ids]
        assert torch.isfinite(expected).all()  # sampled tokens are inside the nucleus
        torch.testing.assert_close(torch.tensor(g.logprobs), expected, atol=1e-4, rtol=0)


def test_tiny_top_p_equals_greedy(lm, prompts):
    model, tokenizer = lm
    engine = Engine(model, tokenizer)
    greedy = engine.generate(prompts, GREEDY)
    params = SamplingParams(max_new_tokens=20, top_p=1e-6, stop=(), seed=1)
    nucleus = engine.generate(prompts, params)
    assert [g.token_ids for g in nucleus] == [g.token_ids for g in greedy]
    assert all(lp == 0.0 for g in nucleus for lp in g.logprobs)  # one token: probability 1


# -- ends of sequences -----------------------------------------------------------------------


def test_stop_string_cuts_text_and_tokens(lm, prompts):
    model, tokenizer = lm
    engine = Engine(model, tokenizer)
    free = engine.generate(prompts[:1], GREEDY)[0]
    assert len(free.text) > 12
    stop = free.text[6:10]  # some text the model will produce
    # the token that first completes the stop string, decoding prefix after prefix
    ids = free.token_ids
    k = next(k for k in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:k]))
    full = tokenizer.decode(free.token_ids[:k], skip_special_tokens=True)
    params = SamplingParams(max_new_tokens=20, temperature=0.0, stop=("#never#", stop))
    g = engine.generate(prompts[:1], params)[0]
    assert g.finish_reason == "stop"
    assert g.token_ids == free.token_ids[:k]
    assert len(g.logprobs) == k
    assert g.text == full[: full.index(stop) + len(stop)]
    assert g.text.endswith(stop) and g.text.count(stop) == 1


def test_stop_checker_on_known_text(tiny):
    _, tokenizer = tiny
    checker = _StopChecker(tokenizer, ("</answer>",))
    ids = tokenizer("<think>go right</think><answer>Right</answer> and more")["input_ids"]
    hits = []
    for k in range(1, len(ids) + 1):
        stopped = checker.check([ids[:k]], [0])
        if stopped:
            hits.append((k, stopped[0][1]))
    k, text = hits[0]
    assert text == "<think>go right</think><answer>Right</answer>"
    assert "</answer>" not in tokenizer.decode(ids[: k - 1])


def test_eos_ends_a_sequence(lm, prompts):
    model, tokenizer = lm
    engine = Engine(model, tokenizer)
    assert tokenizer.eos_token_id in engine.eos_token_ids
    free = engine.generate(prompts, GREEDY)
    # declare a token that prompt 0 first produces at step k >= 2 an end-of-sequence token
    first = free[0].token_ids
    k = next(i for i in range(2, len(first)) if first[i] not in first[:i])
    eos = first[k]
    engine.eos_token_ids = {eos}
    ended = engine.generate(prompts, GREEDY)
    for f, g in zip(free, ended):
        cut = f.token_ids.index(eos) + 1 if eos in f.token_ids else len(f.token_ids)
        assert g.token_ids == f.token_ids[:cut]
        assert g.finish_reason == ("eos" if eos in f.token_ids else "length")
        assert g.logprobs == pytest.approx(f.logprobs[:cut], abs=1e-5)
    assert ended[0].finish_reason == "eos" and len(ended[0].token_ids) == k + 1


def test_compaction_keeps_rows_independent(lm, monkeypatch):
    """Rows that end early are dropped from the batch; the others must be unaffected."""
    from spa.models import llama_decoder

    model, tokenizer = lm
    prompts = [chat(tokenizer, f"Prompt number {i} " + "x" * i) for i in range(12)]
    engine = Engine(model, tokenizer)
    free = engine.generate(prompts, GREEDY)
    # end-of-sequence tokens chosen so that rows finish at different steps
    engine.eos_token_ids = {f.token_ids[2 + i % 5] for i, f in enumerate(free[:6])}
    kept = []
    keep = llama_decoder.LlamaSession.keep

    def counting_keep(self, rows):
        kept.append(len(rows))
        keep(self, rows)

    monkeypatch.setattr(llama_decoder.LlamaSession, "keep", counting_keep)
    together = engine.generate(prompts, GREEDY)
    assert kept and kept == sorted(kept, reverse=True)  # the batch shrank, maybe more than once
    reasons = [g.finish_reason for g in together]
    assert reasons.count("eos") >= 6
    alone = [engine.generate([p], GREEDY)[0] for p in prompts]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert [g.logprobs for g in together] == [pytest.approx(g.logprobs, abs=1e-4) for g in alone]
    engine.fast = False  # the generic path compacts HF's cache
    generic = engine.generate(prompts, GREEDY)
    assert [g.token_ids for g in generic] == [g.token_ids for g in alone]


@pytest.mark.parametrize("grow", [None, 1], ids=["cache-grows-in-blocks", "cache-grows-every-step"])
def test_overlapped_steps_give_the_same_outputs_bit_for_bit(lm, monkeypatch, grow):
    """With overlap (the CUDA default) each step is launched before the host reads the tokens
    of the step before, and taken back when the batch shrinks: tokens, texts, log-probs and
    finish reasons must equal those without it, for sampling, top-p and greedy, with stop
    strings, eos and compactions (with GROW = 1 every compaction falls on a cache growth)."""
    from spa.models import llama_decoder

    model, tokenizer = lm
    if grow is not None:
        monkeypatch.setattr(llama_decoder, "GROW", grow)
    prompts = [chat(tokenizer, f"Prompt number {i} " + "x" * i) for i in range(12)]
    engine = Engine(model, tokenizer, max_batch_size=5)
    assert not engine.overlap  # a CPU model: one thread would do both
    # end-of-sequence tokens that rows of the sampled and the greedy runs meet at different steps
    for free in (engine.generate(prompts, SamplingParams(max_new_tokens=30, stop=(), seed=3)),
                 engine.generate(prompts, SamplingParams(max_new_tokens=30, temperature=0.0, stop=()))):
        engine.eos_token_ids |= {g.token_ids[1 + i % 6] for i, g in enumerate(free[:4])}
    taken_back = []
    unstep = llama_decoder.LlamaSession.unstep
    monkeypatch.setattr(llama_decoder.LlamaSession, "unstep", lambda self: (taken_back.append(1), unstep(self)))
    reasons = set()
    for params in (SamplingParams(max_new_tokens=40, seed=3, stop=("an", "</answer>")),
                   SamplingParams(max_new_tokens=40, temperature=0.7, top_p=0.9, seed=4, stop=("be",)),
                   SamplingParams(max_new_tokens=40, temperature=0.0, stop=("xy",))):
        engine.overlap = False
        plain = engine.generate(prompts, params)
        engine.overlap = True
        assert engine.generate(prompts, params) == plain
        reasons |= {g.finish_reason for g in plain}
    assert reasons == {"eos", "stop", "length"} and taken_back  # compactions happened under overlap
    engine.fast = False  # the generic path (whose session cannot take a step back) does not overlap
    engine.overlap = False
    plain = engine.generate(prompts, params)
    engine.overlap = True
    assert engine.generate(prompts, params) == plain


def test_a_step_taken_back_leaves_the_session_as_before(lm, prompts):
    from spa.models.llama_decoder import LlamaSession, LlamaWeights

    model, tokenizer = lm
    session = LlamaSession(LlamaWeights(model), prompts, 8)
    tokens = session.prefill().argmax(-1)
    before = (session.length, session.next_pos.clone(), session.bias.clone())
    logits = session.step(tokens)
    session.unstep()
    assert session.length == before[0] and torch.equal(session.next_pos, before[1])
    assert torch.equal(session.bias[..., : before[2].shape[-1]], before[2])
    assert torch.equal(session.step(tokens), logits)


def test_max_new_tokens_gives_length(lm, prompts):
    model, tokenizer = lm
    engine = Engine(model, tokenizer)
    engine.eos_token_ids = set()
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=7, stop=(), seed=0))
    assert all(len(g.token_ids) == 7 and g.finish_reason == "length" for g in gens)
    assert engine.generate(prompts[:2], SamplingParams(max_new_tokens=0)) == [
        Generation([], "", [], "length")
    ] * 2


def test_on_chunk_reports_the_prompts_answered_after_each_batch(lm, prompts):
    model, tokenizer = lm
    engine = Engine(model, tokenizer, max_batch_size=2)
    calls = []
    engine.on_chunk = lambda answered, total: calls.append((answered, total))
    engine.generate(prompts, SamplingParams(max_new_tokens=2, seed=0))
    assert calls == [(2, 5), (4, 5), (5, 5)]


def test_long_generation_grows_the_cache(lm, prompts):
    model, tokenizer = lm
    engine = Engine(model, tokenizer)
    engine.eos_token_ids = set()
    params = SamplingParams(max_new_tokens=100, temperature=0.0, stop=())
    fast = engine.generate(prompts[:3], params)
    engine.fast = False
    generic = engine.generate(prompts[:3], params)
    assert [g.token_ids for g in fast] == [g.token_ids for g in generic]


# -- batching, seeds, weights -------------------------------------------------------------------


def test_seed_makes_sampling_reproducible(lm, prompts):
    model, tokenizer = lm
    engine = Engine(model, tokenizer)
    a = engine.generate(prompts, SamplingParams(max_new_tokens=15, stop=(), seed=7))
    b = engine.generate(prompts, SamplingParams(max_new_tokens=15, stop=(), seed=7))
    c = engine.generate(prompts, SamplingParams(max_new_tokens=15, stop=(), seed=8))
    assert a == b
    assert [g.token_ids for g in a] != [g.token_ids for g in c]


def test_batches_larger_than_max_batch_size_are_chunked_in_order(lm, prompts):
    model, tokenizer = lm
    many = prompts * 3  # 15 prompts
    whole = Engine(model, tokenizer, max_batch_size=64).generate(many, GREEDY)
    chunked = Engine(model, tokenizer, max_batch_size=4).generate(many, GREEDY)
    assert [g.token_ids for g in chunked] == [g.token_ids for g in whole]
    assert [g.token_ids for g in whole[:5]] == [g.token_ids for g in whole[5:10]]


def test_empty_prompt_list(lm):
    model, tokenizer = lm
    assert Engine(model, tokenizer).generate([], GREEDY) == []


def test_invalid_params_are_rejected(lm, prompts):
    model, tokenizer = lm
    engine = Engine(model, tokenizer)
    bad_params = [SamplingParams(top_p=0.0), SamplingParams(temperature=-1.0)]
    for bad in bad_params + [SamplingParams(max_new_tokens=-1)]:
        with pytest.raises(ValueError):
            engine.generate(prompts, bad)
    with pytest.raises(ValueError):
        engine.generate([[]], GREEDY)


def test_engine_uses_current_weights(lm, prompts):
    """Training updates parameters in place between calls: no stale fused copies."""
    model, tokenizer = lm
    model = copy.deepcopy(model)  # a private copy: it is modified
    engine = Engine(model, tokenizer)
    before = engine.generate(prompts, GREEDY)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.k_proj.weight.mul_(3.0)
            layer.mlp.up_proj.weight.add_(0.05 * torch.randn_like(layer.mlp.up_proj.weight))
    after = engine.generate(prompts, GREEDY)
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    assert [g.token_ids for g in after] == hf_greedy(model, tokenizer, prompts, 20)


@pytest.fixture
def builds(monkeypatch):
    """Counts the fused-weight builds of every engine."""
    from spa.models import engine as engine_module

    count = []

    class Counting(engine_module.LlamaWeights):
        def __init__(self, *args, **kwargs):
            count.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(engine_module, "LlamaWeights", Counting)
    return count


def test_fused_weights_are_built_once_while_the_weights_stand_still(lm, prompts, builds):
    model, tokenizer = lm
    engine = Engine(model, tokenizer)
    first = engine.generate(prompts, GREEDY)
    engine.generate(prompts[:2], SamplingParams(max_new_tokens=5, seed=0))
    assert engine.generate(prompts, GREEDY) == first
    assert len(builds) == 1
    engine.dtype = torch.bfloat16  # another decoding precision is another build
    engine.generate(prompts[:1], GREEDY)
    assert len(builds) == 2
    engine.release_weights()
    engine.generate(prompts[:1], GREEDY)
    assert len(builds) == 3


def test_an_optimizer_step_reaches_the_next_generation(lm, prompts, builds):
    """The trainer's loop: generate, step the optimizer, generate again with the new weights."""
    model, tokenizer = lm
    model = copy.deepcopy(model)
    engine = Engine(model, tokenizer)
    before = engine.generate(prompts, GREEDY)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    ids = torch.tensor([prompts[1] + before[1].token_ids])
    model(ids, labels=torch.roll(ids, 1)).loss.backward()  # any loss that moves every weight
    optimizer.step()
    after = engine.generate(prompts, GREEDY)
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    assert [g.token_ids for g in after] == hf_greedy(model, tokenizer, prompts, 20)
    assert len(builds) == 2
    state = copy.deepcopy(model.state_dict())
    model.load_state_dict({k: v * 1.5 if v.dim() == 2 else v for k, v in state.items()})
    scaled = engine.generate(prompts, GREEDY)
    assert [g.token_ids for g in scaled] == hf_greedy(model, tokenizer, prompts, 20) != [g.token_ids for g in after]
    assert len(builds) == 3


def test_replaced_weights_reach_the_next_generation(lm, prompts):
    """A tensor replaced whole changes the key. (The weights that spa.distributed.wrap copies
    from the main process bump the version counters: tests/test_distributed.py.)"""
    model, tokenizer = lm
    model = copy.deepcopy(model)
    engine = Engine(model, tokenizer)
    before = engine.generate(prompts, GREEDY)
    layer = model.model.layers[0].self_attn
    layer.q_proj.weight.data = layer.q_proj.weight.data * 4.0
    replaced = engine.generate(prompts, GREEDY)
    assert [g.token_ids for g in replaced] == hf_greedy(model, tokenizer, prompts, 20)
    assert [g.token_ids for g in replaced] != [g.token_ids for g in before]


def test_decoding_dtype_equals_a_model_in_that_dtype(lm, prompts):
    """A trainer keeps fp32 weights and samples in bf16: same tokens and log-probs as a
    bf16 copy of the model, and the fp32 parameters stay untouched."""
    model, tokenizer = lm
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    # .to() also rounds the rotary frequencies, which a bf16 checkpoint loads in fp32
    bf16.model.rotary_emb.inv_freq = model.model.rotary_emb.inv_freq.clone()
    reference = Engine(bf16, tokenizer).generate(prompts, GREEDY)
    engine = Engine(model, tokenizer, dtype=torch.bfloat16)
    outputs = engine.generate(prompts, GREEDY)
    assert [g.token_ids for g in outputs] == [g.token_ids for g in reference]
    assert [g.logprobs for g in outputs] == [g.logprobs for g in reference]
    assert next(model.parameters()).dtype == torch.float32


def test_training_mode_is_restored(lm, prompts):
    model, tokenizer = lm
    model.train()
    try:
        Engine(model, tokenizer).generate(prompts[:1], GREEDY)
        assert model.training
    finally:
        model.eval()


# -- other architectures -----------------------------------------------------------------------


def _tiny(config_cls, model_cls, tokenizer, **kwargs):
    ids = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
               bos_token_id=tokenizer.bos_token_id)
    config = config_cls(vocab_size=len(tokenizer), **ids, **kwargs)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = scramble(model_cls(config).eval())
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def test_qwen2_with_qkv_bias_matches_hf_generate(tiny, prompts):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    _, tokenizer = tiny
    sizes = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = _tiny(Qwen2Config, Qwen2ForCausalLM, tokenizer, **sizes)
    assert model.model.layers[0].self_attn.q_proj.bias.abs().sum() > 0  # scrambled too
    engine = Engine(model, tokenizer)
    assert engine.fast
    gens = engine.generate(prompts, GREEDY)
    assert [g.token_ids for g in gens] == hf_greedy(model, tokenizer, prompts, 20)


def test_other_architectures_use_the_generic_path(tiny, prompts):
    from transformers import GPT2Config, GPT2LMHeadModel

    _, tokenizer = tiny
    model = _tiny(GPT2Config, GPT2LMHeadModel, tokenizer, n_embd=64, n_layer=2, n_head=4)
    engine = Engine(model, tokenizer)
    assert not engine.fast and "gpt2" in engine.fast_problem
    gens = engine.generate(prompts, GREEDY)
    assert [g.token_ids for g in gens] == hf_greedy(model, tokenizer, prompts, 20)


# -- the sampler ---------------------------------------------------------------------------------


def test_inverse_cdf_sampling_follows_the_distribution():
    gen = torch.Generator().manual_seed(0)
    probs = torch.zeros(1000)
    probs[[3, 300, 301, 999]] = torch.tensor([0.5, 0.3, 0.15, 0.05])  # across blocks, with zeros
    draws = _inverse_cdf(probs.expand(40000, -1).contiguous(), gen)
    counts = torch.bincount(draws, minlength=1000).float() / len(draws)
    assert set(draws.unique().tolist()) == {3, 300, 301, 999}  # never a zero-probability token
    support = [3, 300, 301, 999]
    torch.testing.assert_close(counts[support], probs[support], atol=0.01, rtol=0)


def test_sample_next_greedy_and_top_p_against_hf_warper():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 5000, generator=gen) * 3
    tokens, logprobs = sample_next(logits, 0.0)
    assert tokens.tolist() == logits.argmax(-1).tolist()
    torch.testing.assert_close(logprobs, torch.log_softmax(logits, -1).max(-1).values)
    for top_p in (0.3, 0.9, 0.999):  # nuclei inside the top-64 candidates and wider
        expected = torch.isfinite(TopPLogitsWarper(top_p=top_p)(None, logits.clone()))
        filtered = _top_p_logprobs(torch.log_softmax(logits, -1), top_p)
        kept = torch.isfinite(filtered)
        # the same sets, up to one token at the boundary (sums in another order round differently)
        assert (kept != expected).sum(-1).max() <= 1
        torch.testing.assert_close(torch.logsumexp(filtered, -1), torch.zeros(6), atol=1e-5, rtol=0)
        tokens, logprobs = sample_next(logits, 1.0, top_p, gen)
        assert kept.gather(-1, tokens[:, None]).all()
        torch.testing.assert_close(logprobs, filtered.gather(-1, tokens[:, None])[:, 0])


# -- the real model ------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_model_logprobs_track_hf_forward(smollm):
    """In bf16 (the fixture's precision where the CPU has native bf16) the fast path rounds
    differently from HF's SDPA forward; the gap stays at the level of HF's own eager-vs-SDPA
    difference (measured ~0.05 mean). In fp32 it is far smaller."""
    model, tokenizer = smollm
    engine = Engine(model, tokenizer)
    assert engine.fast
    prompts = [chat(tokenizer, u) for u in USERS[:4]]
    params = SamplingParams(max_new_tokens=24, temperature=1.0, stop=(), seed=0)
    diffs = []
    for prompt, g in zip(prompts, engine.generate(prompts, params)):
        logp = torch.log_softmax(forward_logits(model, prompt, g.token_ids), dim=-1)
        reference = logp[torch.arange(len(g.token_ids)), g.token_ids]
        diffs.append((torch.tensor(g.logprobs) - reference).abs())
    assert torch.cat(diffs).mean() < 0.15


def test_fp32_linear_layers_are_prepacked_and_agree_with_the_unpacked_path(lm, prompts, monkeypatch):
    """fp32 decoding prepacks its linear layers for oneDNN (where torch has it); the
    packed and plain paths give the same greedy tokens and log-probs to rounding."""
    from spa.models import llama_decoder

    model, tokenizer = lm
    assert model.dtype == torch.float32
    if not torch.backends.mkldnn.is_available():
        pytest.skip("torch was built without oneDNN")
    weights = llama_decoder.LlamaWeights(model)
    assert weights.layers[0].qkv.packed is not None and weights.lm_head.packed is not None
    packed = Engine(model, tokenizer).generate(prompts, GREEDY)
    monkeypatch.setattr(llama_decoder, "PACK", False)
    assert llama_decoder.LlamaWeights(model).layers[0].qkv.packed is None
    plain = Engine(model, tokenizer).generate(prompts, GREEDY)
    assert [g.token_ids for g in packed] == [g.token_ids for g in plain]
    for a, b in zip(packed, plain):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=1e-4)


def test_bf16_is_packed_only_where_the_cpu_computes_it(monkeypatch):
    from spa.models import llama_decoder

    weight = torch.randn(8, 8, dtype=torch.bfloat16)
    monkeypatch.setattr(llama_decoder, "_PACK_WORKS", {})
    monkeypatch.setattr("spa.precision.cpu_has_native_bf16", lambda: False)
    assert not llama_decoder._can_pack(weight)
    assert not llama_decoder._can_pack(weight.half())
